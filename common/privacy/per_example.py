"""Per-example gradients and per-example clipping for sample-level DP-SGD on a device (the loop: dpsgd.py).

Two ways to the clipped sum. "bookkeeping" (the default for the gaussian mechanism): ghost norms from one
forward and one backward, never holding a [B, P] matrix of per-example gradients. "vmap": per-example
gradients from torch.func (vmap of grad over functional_call), needed by the wavelet mechanism, which
clips in the coefficient domain only where a layer is neither Linear nor Conv2d (else book-keeping too: see
wavelet_norms.py, "DP-SGD-WAV without [B, P]"). benchmarks/bench_dpsgd.py, batch 64, 2 shared CPU cores, per-example
gradients per second, torch.func vs Opacus 1.6 GradSampleModule: mlp 350 vs 200, mnist-cnn 6510 vs 5085,
cifar-cnn 73 vs 47, so torch.func is kept (Opacus is not a dependency). A "layer" for per-layer clipping is
one parameter tensor (weight and bias separately, Opacus' convention), in model.parameters() order.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from .wavelet import WaveletLayout
from .wavelet_norms import wavelet_part_norms


def layer_sizes(model: nn.Module) -> list[int]:
    return [p.numel() for p in model.parameters()]


def per_example_gradients(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients of the cross-entropy at `params` (name -> tensor, as model.named_parameters()).

    Returns (G [B, P] float32, the flat gradients in parameter order; losses [B])."""
    def loss_one(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    grads, losses = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(len(y), -1) for g in grads.values()], dim=1), losses


def _segment_slices(sizes: Sequence[int] | None, width: int) -> list[slice]:
    if sizes is None:
        return [slice(0, width)]
    bounds = np.cumsum([0] + list(sizes))
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def row_norms(v: torch.Tensor, sizes: Sequence[int] | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """||weights (.) v_segment||_2 of each row of v [B, D] for each contiguous segment (`sizes`; None: one
    segment, the whole row). Returns [B, segments]."""
    w = v if weights is None else v * weights
    return torch.stack([torch.linalg.vector_norm(w[:, sl], dim=1) for sl in _segment_slices(sizes, v.shape[1])], 1)


def clip_factors(norms: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """min(1, C_j / norm): the per-row, per-segment factors of g / max(1, ||g|| / C) (paper 002 Sec. III-A).

    One segment is flat clipping (sensitivity C); one segment per layer is per-layer clipping, sensitivity
    sqrt(sum_j C_j^2) (the paper prints sqrt(sum_j C_j); corrected per digest P3)."""
    n = norms.to(torch.float64)
    b = bounds.to(torch.float64)
    # float32 norms can be a few ulps low: clipped rows get an extra 2^-16 shrink so that the true norm of
    # the clipped row stays <= C (a 1.5e-5 relative bias on clipped rows, far below the noise)
    return torch.where(n > b, b / n * (1.0 - 2.0 ** -16), torch.ones_like(n)).to(norms.dtype)


def clip_rows(v: torch.Tensor, bounds: torch.Tensor, sizes: Sequence[int] | None = None,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each row of v [B, D] so that ||weights (.) v_segment||_2 <= bound for every segment.

    Returns (clipped v, norms before clipping [B, segments])."""
    norms = row_norms(v, sizes, weights)
    scale = clip_factors(norms, bounds)
    if sizes is None:
        return v * scale, norms
    return v * torch.repeat_interleave(scale, torch.tensor(list(sizes)), dim=1), norms


def clipped_sum(v: torch.Tensor, scale: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """sum_i scale_i (.) v_i without materialising the scaled rows (a [B] @ [B, D] product per segment)."""
    slices = _segment_slices(sizes, v.shape[1])
    return torch.cat([scale[:, j] @ v[:, sl] for j, sl in enumerate(slices)])


def _bookkeeping_layers(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The parameterised modules, if all are Linear or plain Conv2d (else None: use torch.func)."""
    layers = []
    for name, module in model.named_modules():
        if not list(module.parameters(recurse=False)):
            continue
        if isinstance(module, nn.Linear):
            layers.append((name, module))
        elif (isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"
              and not isinstance(module.padding, str)):
            layers.append((name, module))
        else:
            return None
    return layers


def _bookkeeping_parts(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                       layers: list[tuple[str, nn.Module]], squares: bool = True) -> tuple[dict, dict, torch.Tensor]:
    """One forward and one backward with hooks: per parameter name, the per-example squared gradient
    norms [B] (an empty dict without `squares`: the wavelet norms do not use them) and the factors of the per-example
    gradients (see bookkeeping_clipped_sum)."""
    acts, outs = {}, {}

    def keep(module, inputs, output):
        acts[module] = inputs[0].detach()
        outs[module] = output

    handles = [m.register_forward_hook(keep) for _, m in layers]
    try:
        own = dict(model.named_parameters())
        if all(own.get(k) is v for k, v in params.items()):  # the module's own parameters: no reparametrisation
            losses = F.cross_entropy(model(x), y, reduction="none")
        else:
            leaf = {k: v.detach().requires_grad_() for k, v in params.items()}
            losses = F.cross_entropy(functional_call(model, leaf, (x,)), y, reduction="none")
    finally:
        for h in handles:
            h.remove()
    deltas = torch.autograd.grad(losses.sum(), [outs[m] for _, m in layers])

    sq, parts = {}, {}  # per parameter name: per-example squared norms [B]; what the clipped sum needs
    for (name, m), d in zip(layers, deltas):
        a = acts[m]
        if isinstance(m, nn.Linear):
            if a.dim() != 2:
                raise ValueError(f"bookkeeping supports Linear layers on [B, features] inputs, got {tuple(a.shape)}")
            parts[name + ".weight"] = ("linear", d, a)
            if m.bias is not None:
                parts[name + ".bias"] = ("rows", d)
            if squares:
                d2 = d.square().sum(1)
                sq[name + ".weight"] = d2 * a.square().sum(1)
                if m.bias is not None:
                    sq[name + ".bias"] = d2
        else:
            g = conv_example_grads(m, a, d)  # [B, out, in k k]
            parts[name + ".weight"] = ("rows", g.flatten(1))
            if m.bias is not None:
                parts[name + ".bias"] = ("rows", d.sum((2, 3)))
            if squares:
                sq[name + ".weight"] = g.square().sum((1, 2))
                if m.bias is not None:
                    sq[name + ".bias"] = parts[name + ".bias"][1].square().sum(1)
    if set(params) != set(parts):
        raise ValueError("bookkeeping needs every parameter to belong to a Linear or Conv2d layer")
    return sq, parts, losses.detach()


def conv_example_grads(m: nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Per-example weight gradients [B, out, in k k] of a plain Conv2d (groups 1, zero padding given as numbers: the
    layers _bookkeeping_layers admits) from its input `a` and the gradient `d` at its output: one convolution
    backward with the batch as groups, example i's gradient being group i's (Opacus unfolds the input and forms
    d_i U_i^T instead: 2.9x the CPU on mnist-cnn's second layer, 1.3x on its first, one thread)."""
    b, o = a.shape[0], m.out_channels
    shape = (b * o, *m.weight.shape[1:])  # the weight the grouped backward has: only its shape is read
    g = torch.ops.aten.convolution_backward(
        d.reshape(1, b * o, *d.shape[2:]), a.reshape(1, -1, *a.shape[2:]), m.weight.detach().new_empty(shape), None,
        list(m.stride), list(m.padding), list(m.dilation), False, [0, 0], b, [False, True, False])[1]
    return g.reshape(b, o, -1)


def bookkeeping_clipped_sum(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                            bounds: torch.Tensor, per_layer: bool, layers: list[tuple[str, nn.Module]],
                            layout: WaveletLayout | None = None, calibration: str = "sound",
                            out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sum of clipped per-example gradients from one forward and one backward, never holding [B, P].

    Book-keeping / ghost norms (Goodfellow 2015; Li et al. 2022; Bu et al. 2023): with a_i a layer's input
    and d_i the gradient of example i's loss at the layer's output, a Linear layer's per-example weight
    gradient is d_i a_i^T, so ||.||^2 = ||d_i||^2 ||a_i||^2, and the clipped sum is (s (.) d)^T a. Conv2d
    gradients are formed per example (conv_example_grads); they are small here.
    With a wavelet `layout` the norms are those of the Haar coefficients the calibration clips (wavelet_part_norms,
    still without [B, P]); the HWT is linear, so the clipped sum is the same gradient-domain sum.
    Returns (flat clipped sum [P] in parameter order, per-example losses [B], norms [B, segments]); with `out` ([P])
    the sum is added into it (each layer's product accumulated in place, no concatenation) and `out` is returned."""
    sq, parts, losses = _bookkeeping_parts(model, params, x, y, layers, squares=layout is None)
    names = list(params)
    if layout is not None:
        norms = wavelet_part_norms([parts[k] for k in names], layout, calibration).to(torch.float32)
        if not per_layer and norms.shape[1] > 1:  # a flat clip over per-layer transforms
            norms = torch.linalg.vector_norm(norms, dim=1, keepdim=True)
    else:
        per_param = torch.stack([sq[k] for k in names], 1)
        norms = per_param.sqrt() if per_layer else per_param.sum(1, keepdim=True).sqrt()
    scale = clip_factors(norms, bounds)
    total = torch.zeros(sum(p.numel() for p in params.values())) if out is None else out
    start = 0
    for j, k in enumerate(names):
        s = scale[:, j if per_layer else 0]
        part = parts[k]
        if part[0] == "linear":
            d, a = part[1], part[2]
            size = d.shape[1] * a.shape[1]
            total[start:start + size].view(d.shape[1], a.shape[1]).addmm_((d * s[:, None]).T, a)
        else:
            size = part[1].shape[1]
            total[start:start + size].addmv_(part[1].T, s)
        start += size
    return total, losses, norms


def example_norms(g: torch.Tensor, layout: WaveletLayout | None, calibration: str,
                  segments: Sequence[int] | None) -> torch.Tensor:
    """[B, segments] norms the clip bounds apply to: ||g_i|| (flat) or per layer; with a wavelet layout ||W (.) H_i||
    (sound) or ||H_i|| (paper) per transformed segment, and one norm over all of them when the clip is flat."""
    if layout is None:
        return row_norms(g, segments)
    norms = layout.row_norms(g, calibration)
    if segments is None and norms.shape[1] > 1:  # a flat clip over per-layer transforms
        norms = torch.linalg.vector_norm(norms, dim=1, keepdim=True)
    return norms
