"""Sample-level DP-SGD on a device: per-example gradients, per-example clipping, lots, noise once per lot.

Vanilla DP-SGD is Abadi et al. 2016 Algorithm 1 (paper 002 Sec. II-B, Eq. 3, digest Sec. 2.4); DP-SGD-WAV is
paper 002 Algorithm 1 (digest Sec. 2.2), with the noise added once per lot on the sum of the clipped
per-example vectors and the noisy sum divided by the EXPECTED lot size q n (digest P5: the pseudo-code nests
the noise in the per-sample loop; the text's "same methodology as standard DP-SGD" reading is taken).

Two ways to the clipped sum. "bookkeeping" (the default for the gaussian mechanism): ghost norms from one
forward and one backward, never holding a [B, P] matrix of per-example gradients. "vmap": per-example
gradients from torch.func (vmap of grad over functional_call), needed by the wavelet mechanism, which
clips in the coefficient domain only where a layer is neither Linear nor Conv2d (else book-keeping too: see
"DP-SGD-WAV without [B, P]" below). benchmarks/bench_dpsgd.py, batch 64, 2 shared CPU cores, per-example
gradients per second, torch.func vs Opacus 1.6 GradSampleModule: mlp 350 vs 200, mnist-cnn 6510 vs 5085,
cifar-cnn 73 vs 47, so torch.func is kept (Opacus is not a dependency). A "layer" for per-layer clipping is
one parameter tensor (weight and bias separately, Opacus' convention), in model.parameters() order.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from hfl.common.models import num_parameters, set_flat
from hfl.common.secret_random import as_draws

from .optimizers import OPTIMIZERS
from .wavelet import CALIBRATIONS, SCOPES, WaveletLayout, effective_multiplier

MECHANISMS = ("gaussian", "wavelet")
LOTS = ("poisson", "fixed")
GRAD_METHODS = ("auto", "vmap", "bookkeeping")
# float32 rounding can leave a scaled row a few ulps over its bound; clipped rows are shrunk by this factor
# (2.4e-7 relative) so that every clipped norm is <= C exactly.
_SHRINK = 1.0 - 2.0 ** -22


def _check(name: str, ok: bool, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


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


# ---- DP-SGD-WAV without [B, P] ---------------------------------------------------------------------------------
# What is exploited (paper 002's unnormalised Haar transform, wavelet.py; P values zero-padded to m = 2^n).
# Let S_j,k(g) be the sum of g over the k-th block of 2^j coordinates (S_0 = g) and Q_j = sum_k S_j,k^2
# (Q_0 = ||g||^2). Level j's detail is d(j)_k = (S_j-1,2k - S_j-1,2k+1) / 2^j and H_0 = S_n,0 / m, so with the
# level's energy E_j = sum_k (S_j-1,2k - S_j-1,2k+1)^2 = 2 Q_j-1 - Q_j:
#     ||W (.) H(g)||^2 = sum_{j=1..n} E_j + Q_n = 2 Q_0 + Q_1 + ... + Q_n-1      (sound: W_c d(j)_k = S_L - S_R)
#     ||H(g)||^2       = sum_{j=1..n} 4^-j E_j + Q_n / m^2                        (paper)
# The sound norm is a positive sum of the block sums' squared norms: one pair-sum and one norm per level, no
# differences, no cancellation; the paper norm keeps the differences (its weights would cancel). (The transform is
# orthogonal up to a scale per level, not one scale, so neither norm is ||g||: the levels must be visited, but not
# the coefficients of each example.)
# A Linear layer's per-example gradient is the outer product d a^T (row-major [out, in]). When 2^j divides `in`
# and the layer's offset in the transformed vector, every block of 2^j lies inside one row, S_j(d a^T) = d (x)
# S_j(a), and
#     Q_j(d a^T) = ||d||^2 Q_j(a),   E_j(d a^T) = ||d||^2 E_j(a),
# so levels 1..J cost O(B (out + in)) and the first array of the layer's size class is its level-J block sums
# [B, out in / 2^J] (2^J = 16 for the mlp's 784 inputs: 1/16 of [B, P]); the coarser levels run on those.
# Other parameters (biases, Conv2d weights that book-keeping forms per example, small Linear layers) are dense
# rows. Clipping scales an example's whole gradient (or one layer of it) and the HWT is linear:
#     sum_i s_i HWT(g_i) = HWT(sum_i s_i g_i),
# so the clipped sum is the book-keeping one ((s (.) d)^T a per Linear layer). The noise is transformed, not the sum:
#     IHWT(HWT(t) + z)[:P] = t + IHWT(z)[:P]     (linear; HWT(pad(t)) inverts exactly),
# and a coefficient whose block lies in the zero padding reaches only dropped coordinates, so only the
# 1 + sum_j ceil(P / 2^j) coefficients that reach [0, P) are drawn and inverted (about P, not m); the noise std is
# constant on each level (sigma S / 2^j), so it is applied inside the inverse (per_level_scales), not in a pass.
# Past level J (sound calibration, large layers): with the layer's rows in groups of G = 2^t (G | out), a group holds
# exactly `in / 2^J` blocks of level J + t, so Q_J+t(d a^T) = <sum_g d_g d_g^T, C_t^T C_t> with C_t a fixed 0/1
# product of S_J(a): [B, G, G] Gram matrices instead of the [B, out in / 2^J] outer product (_grouped_levels).
_FACTORED_MIN = 4096  # Linear layers at least this large keep their outer-product form


def _trailing_zeros(v: int) -> int:
    return (v & -v).bit_length() - 1 if v else 62


def _sq(v: torch.Tensor) -> torch.Tensor:
    """Per-row squared L2 norm [B] float64. Accumulated in v's float32 (torch's cascade sum, relative error ~1e-7 on
    these positive sums, well inside clip_factors' 2^-16 shrink): a float64 accumulation first copies v to float64,
    which cost the mlp's DP-SGD-WAV step a tenth of a plain step."""
    return torch.linalg.vector_norm(v, dim=1).to(torch.float64).square_()


_TAIL = 64  # rows this short finish their levels in one product with a cached matrix (dispatch, not flops, costs)


@functools.lru_cache(maxsize=256)
def _tail_matrix(length: int, first: int, count: int, n: int, weighted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels first..first+count-1 of rows of `length` block sums as one product: M [length, K] (rows zero padded
    to whole blocks of the last level) and weights w [K], so that (s M)^2 w is what _haar_levels adds and the last columns are
    the block sums after the levels."""
    c = min(count, max(0, (length - 1).bit_length()))  # the levels that still pair values (then one sum is left)
    lp = -(-length // (1 << c)) << c  # padded to whole blocks of the last of them
    cols, weights = [], []
    for t in range(1, c + 1):
        j, size = first + t - 1, 1 << t
        for k in range(lp // size):
            col = np.zeros(lp)
            if weighted:
                col[k * size:(k + 1) * size] = 1.0
                weights.append(1.0 if j < n else 0.0)
            else:
                col[k * size:k * size + size // 2] = 1.0
                col[k * size + size // 2:(k + 1) * size] = -1.0
                weights.append(4.0 ** -j)
            cols.append(col)
    size = 1 << c
    extra = range(first + c, first + count)  # levels past a single block sum S: (S - 0)^2 each
    for k in range(lp // size):
        col = np.zeros(lp)
        col[k * size:(k + 1) * size] = 1.0
        cols.append(col)
        weights.append(sum(1.0 for j in extra if j < n) if weighted else sum(4.0 ** -j for j in extra))
    m = torch.from_numpy(np.stack(cols, 1)[:length].astype(np.float32))
    return m, torch.tensor(weights, dtype=torch.float64)


_BLOCK = 4  # arrays of at most _BLOCK_MAX values go through blocks of 2^_BLOCK values, _BLOCK levels in one product
_BLOCK_MAX = 1 << 17


@functools.lru_cache(maxsize=256)
def _tail_weights(length: int, first: int, count: int, n: int, weighted: bool) -> torch.Tensor:
    """The weights of _tail_matrix(length, first, count, n, weighted) as float32 (its products are float32)."""
    return _tail_matrix(length, first, count, n, weighted)[1].to(torch.float32)


def _haar_levels(s: torch.Tensor, first: int, last: int, n: int, acc: torch.Tensor, weighted: bool) -> torch.Tensor:
    """Levels first..last of an n-level HWT on block sums s [B, L] (blocks of 2^(first-1), zero padded on the
    right). Adds to acc [B] (float64) Q_j for each j < n (weighted) or 4^-j E_j (not); returns the block sums at
    level `last`. Large arrays go level by level (strided pair sums: about one add per value, memory bound);
    smaller ones _BLOCK levels at a time, viewed as [B L / 2^_BLOCK, 2^_BLOCK] in one product with the cached
    matrix of a block's pair sums (or differences) at those levels, whose last column is the block's sum (2^_BLOCK
    multiply-adds per value, but a handful of calls where per-call dispatch is what costs); short rows finish in
    one product (_tail_matrix)."""
    b = s.shape[0]
    j, norms, weights = first, [], []
    while j <= last and s.shape[1] > _TAIL and s.numel() > _BLOCK_MAX:
        if s.shape[1] % 2:
            s = F.pad(s, (0, 1))
        left, right = s[:, 0::2], s[:, 1::2]
        if not weighted:
            norms.append(torch.linalg.vector_norm(left - right, dim=1))
            weights.append(4.0 ** -j)
        s = left + right
        if weighted and j < n:
            norms.append(torch.linalg.vector_norm(s, dim=1))
            weights.append(1.0)
        j += 1
    if norms:
        acc.add_(torch.stack(norms, 1).square() @ torch.tensor(weights))
    while j <= last and s.shape[1] > _TAIL:
        c = min(_BLOCK, last - j + 1)
        size = 1 << c
        if s.shape[1] % size:
            s = F.pad(s, (0, -s.shape[1] % size))
        m, _ = _tail_matrix(size, j, c, n, weighted)
        out = s.reshape(-1, size) @ m  # [B L / size, K]: every level's values of each block, its sum last
        s = out[:, -1].view(b, -1).contiguous()  # a strided view would take the product's slow path
        acc.add_(out.square_().view(b, -1, m.shape[1]).sum(1) @ _tail_weights(size, j, c, n, weighted))
        j += c
    if j <= last:
        m, _ = _tail_matrix(s.shape[1], j, last - j + 1, n, weighted)
        out = s @ m
        acc.add_(out.square() @ _tail_weights(s.shape[1], j, last - j + 1, n, weighted))
        s = out[:, m.shape[1] - _tail_width(s.shape[1], last - j + 1):]
    return s


def _tail_width(length: int, count: int) -> int:
    """How many block sums rows of `length` have after `count` more levels (as _tail_matrix pads them)."""
    c = min(count, max(0, (length - 1).bit_length()))
    return -(-length // (1 << c))


_GROUP_LEVELS = 3  # at most this many levels past J0 in row groups of up to 2^_GROUP_LEVELS rows


@functools.lru_cache(maxsize=64)
def _group_matrix(cols: int, k: int) -> torch.Tensor:
    """[cols, cols (2 + 4 + ... + 2^k)] 0/1: S @ it gives, for t = 1..k in turn, C_t [cols, 2^t] (row-major) of a row S
    of `cols` block sums: rows r of a group of G = 2^t laid out row-major and cut into blocks of G values, C_t[c, r]
    the sum of the part of block c that lies in row r."""
    parts = []
    for t in range(1, k + 1):
        g = 1 << t
        m = np.zeros((cols, cols, g), dtype=np.float32)
        col, r = np.meshgrid(np.arange(cols), np.arange(g), indexing="ij")  # the value S[col] in row r of the group
        m[col, (r * cols + col) // g, r] = 1.0
        parts.append(m.reshape(cols, -1))
    return torch.from_numpy(np.concatenate(parts, 1))


def _grouped_levels(d: torch.Tensor, sx: torch.Tensor, j0: int, k: int, n: int, acc: torch.Tensor,
                    out: torch.Tensor) -> None:
    """Levels j0+1..j0+k of a factored Linear layer d (x) S (S = sx, its input's level-j0 block sums [B, c]) without
    the [B, out c] outer product: with rows in groups of G = 2^t (G | out), a group's G c values are exactly c blocks
    of level j0+t, and block b of group g sums to sum_r d[g G + r] C_t[b, r], C_t[b, r] the part of S (in row r of
    the group) inside block b (one product with a cached 0/1 matrix for every t). So Q_j0+t = sum_g ||C_t^T d_g||^2
    = <sum_g d_g d_g^T, C_t^T C_t>, two [B, G, G] Gram matrices per level below j0+k, and the level-(j0+k)
    block sums are one batched product [B, out / G, G] @ [B, G, c], written to `out` [B, out / G, c]. Adds Q_j
    (j < n) to acc."""
    b, cols = sx.shape
    every = sx @ _group_matrix(cols, k)  # C_1, ..., C_k side by side
    at = 0
    for t in range(1, k + 1):
        g = 1 << t
        part = every[:, at:at + cols * g].view(b, cols, g)
        at += cols * g
        if t < k:
            if j0 + t < n:
                # float32 Grams: float64 ones (a copy of both operands and a batched double product) cost twice as much
                # and the sum hardly cancels (only blocks that straddle two rows give C_t^T C_t off-diagonal terms)
                dg = d.view(b, -1, g)
                gram = torch.bmm(dg.transpose(1, 2), dg).mul_(torch.bmm(part.transpose(1, 2), part))
                acc.add_(gram.view(b, -1).sum(1, dtype=torch.float64))
        else:
            # into a fresh array, then copied: bmm into a view of the coarse array (row stride != its width) takes a
            # per-example loop, twice the time of the product and the copy
            out.copy_(torch.bmm(d.view(b, -1, g), part.transpose(1, 2)))
            if j0 + t < n:
                acc.add_(_sq(out.reshape(b, -1)))


@functools.lru_cache(maxsize=256)
def _norm_plan(shapes: tuple, m: int, weighted: bool, b: int) -> tuple:
    """What _segment_norm_sq does for pieces of these shapes (("linear", out, in) or ("rows", width)), computed once:
    (n, J0, k, J, factored, sizes, width). Python bookkeeping per step is as costly as the small layers' arithmetic."""
    n = m.bit_length() - 1
    sizes = [s[1] * s[2] if s[0] == "linear" else s[1] for s in shapes]
    offsets = np.cumsum([0] + sizes[:-1]).tolist()
    aligned = [min(_trailing_zeros(s[2]), _trailing_zeros(off)) if s[0] == "linear" and size >= _FACTORED_MIN else 0
               for s, size, off in zip(shapes, sizes, offsets)]
    # the common coarse level J: the alignment of the least aligned large Linear layer (those below J materialise)
    big = [a for a in aligned if a > 0]
    J = min(min(big), n) if big else 0
    factored = [J > 0 and a >= J for a in aligned]
    # sound calibration: the factored layers go on k more levels in row groups (Gram products, see the comment above)
    k = 0
    if weighted and any(factored):
        k = max(0, min([_GROUP_LEVELS, n - J] + [min(_trailing_zeros(shapes[i][1]), _trailing_zeros(offsets[i]) - J)
                                                 for i, f in enumerate(factored) if f]))
        if b * sum(sizes[i] >> J for i, f in enumerate(factored) if f) <= _BLOCK_MAX:
            k = 0  # a small outer product costs less than the Gram products that replace it
    J0, J = J, J + k  # the coarse array holds the level-J block sums; a's own levels stop at J0
    # the level-J block sums of the whole vector: factored layers as d (x) S_J(a), runs of dense rows (each starts
    # on a 2^J boundary and ends on one or, zero padded, at the data's end) after their levels 1..J
    width = sum(size >> J if f else 0 for size, f in zip(sizes, factored))
    runs, run = [], []
    for i, f in enumerate(factored):
        if f:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(i)
    if run:
        runs.append(run)
    width += sum(-(-sum(sizes[i] for i in r) // (1 << J)) for r in runs)
    width += -width % (1 << min(n - J, 6))  # whole pairs for the next six levels (fewer pads)
    return n, J0, k, J, tuple(factored), tuple(sizes), width


def _segment_norm_sq(pieces: list, m: int, weighted: bool) -> torch.Tensor:
    """||W (.) HWT(g)||^2 (weighted) or ||HWT(g)||^2 [B] float64 of the per-example vectors g made of `pieces`
    (book-keeping parts, contiguous from offset 0), padded to m: see the comment above."""
    b = pieces[0][1].shape[0]
    dtype = pieces[0][1].dtype
    n, J0, k, J, factored, sizes, width = _norm_plan(
        tuple((p[0], p[1].shape[1], p[2].shape[1]) if p[0] == "linear" else (p[0], p[1].shape[1]) for p in pieces),
        m, weighted, b)
    acc = torch.zeros(b, dtype=torch.float64)
    coarse = _scratch("coarse", b, width, dtype)
    at, i = 0, 0
    while i < len(pieces):
        if factored[i]:
            d, x = pieces[i][1], pieces[i][2]
            qa = _sq(x).mul_(2.0) if weighted else torch.zeros(b, dtype=torch.float64)
            sx = _haar_levels(x, 1, J0, n, qa, weighted)  # the levels 1..J0 of a; d's norm factors out
            acc.add_(qa * _sq(d))
            w = sizes[i] >> J
            out = coarse[:, at:at + w].view(b, d.shape[1] >> k, sx.shape[1])
            if k:
                _grouped_levels(d, sx, J0, k, n, acc, out)
            else:
                torch.mul(d[:, :, None], sx[:, None, :], out=out)
            at += w
            i += 1
            continue
        run = [pieces[i]]
        i += 1
        while i < len(pieces) and not factored[i]:
            run.append(pieces[i])
            i += 1
        width_run = sum(_dense_width(p) for p in run)
        tail = -width_run % (1 << J)
        r = _scratch("run", b, width_run + tail, dtype)  # the run and its zero padding, written in place
        col = 0
        for p in run:
            col = _dense_into(p, r, col)
        r[:, col:].zero_()
        if weighted:
            acc.add_(_sq(r), alpha=2.0)
        r = _haar_levels(r, 1, J, n, acc, weighted)
        coarse[:, at:at + r.shape[1]] = r
        at += r.shape[1]
    coarse[:, at:].zero_()
    s = _haar_levels(coarse, J + 1, n, n, acc, weighted)
    if n == 0:  # m = 1: the one coefficient is the value
        return acc.add_(_sq(s), alpha=-1.0 if weighted else 1.0)
    return acc if weighted else acc.add_(_sq(s) / float(m) ** 2)


_SCRATCH = threading.local()


def _scratch(name: str, b: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's reused buffer `name` ([b, width]): a fresh array of a few hundred KB per step is mapped anew by
    the allocator and costs its page faults (zero-padding the mlp's 2,210-value dense run took a third of a plain
    step)."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (b, width, dtype)
    if name not in bufs or bufs[name][0] != key:
        bufs[name] = (key, torch.empty(b, width, dtype=dtype))
    return bufs[name][1]


def _dense_width(part) -> int:
    return part[1].shape[1] * part[2].shape[1] if part[0] == "linear" else part[1].shape[1]


def _dense_into(part, out: torch.Tensor, col: int) -> int:
    """Write a book-keeping part's per-example rows (d a^T flattened, or the rows themselves) into out[:, col:];
    returns the next column."""
    w = _dense_width(part)
    if part[0] == "linear":
        d, a = part[1], part[2]
        torch.mul(d[:, :, None], a[:, None, :], out=out[:, col:col + w].view(d.shape[0], d.shape[1], a.shape[1]))
    else:
        out[:, col:col + w] = part[1]
    return col + w


def wavelet_part_norms(parts: Sequence, layout: WaveletLayout, calibration: str) -> torch.Tensor:
    """[B, layout segments] norms ||W (.) H_i|| (sound) or ||H_i|| (paper) of each example's Haar coefficients,
    from book-keeping parts (one per parameter tensor, in order: ("linear", d, a) or ("rows", g)), without
    forming [B, P]. Equals layout.row_norms of the materialised per-example gradients (up to float32 rounding)."""
    _check("calibration", calibration in CALIBRATIONS, f"one of {', '.join(CALIBRATIONS)}", calibration)
    weighted = calibration == "sound"
    if layout.scope == "flat":
        groups = [list(parts)]
    else:
        groups = [[p] for p in parts]
    if len(groups) != len(layout.padded):
        raise ValueError(f"{len(groups)} parameter groups for a layout of {len(layout.padded)} segments")
    return torch.stack([_segment_norm_sq(g, m, weighted) for g, m in zip(groups, layout.padded)], 1).sqrt()


def needed_coefficients(size: int, m: int) -> list[tuple[int, int]]:
    """(start, count) of the Haar coefficients of a length-m transform that reach the first `size` coordinates, in
    coefficient order [H_0, d(1), ..., d(n)]: H_0 and the first ceil(size / 2^j) details of each level j."""
    n = m.bit_length() - 1
    return [(0, 1)] + [(m + 1 - (m >> (j - 1)), -(-size // (1 << j))) for j in range(1, n + 1)]


def haar_inverse_prefix(h: torch.Tensor, size: int, m: int, level_scales: Sequence[float] | None = None
                        ) -> torch.Tensor:
    """IHWT(c)[:, :size] from the needed coefficients only: h [B, K] holds, in needed_coefficients order, the
    coefficients that reach [0, size); every other coefficient of c is irrelevant to the result. O(size) work.
    With `level_scales` (H_0's factor, then one per level 1..n) the coefficients are scaled on the way, as if h had
    been multiplied by them first (the same float32 products), without that pass over h."""
    b, n = h.shape[0], m.bit_length() - 1
    j0, top = _inverse_top(size, m)
    ends = _needed_ends(size, m)
    # the coarse levels n..j0+1 (short rows) in one product with a cached matrix, then level by level
    if j0 < n:
        coarse = torch.cat([h[:, :1], h[:, ends[j0]:]], 1)
        if level_scales is not None:
            coarse.mul_(_top_scales(size, m, tuple(level_scales), h.dtype))
        a = coarse @ _inverse_top_as(size, m, h.dtype)
    else:
        a = h[:, :1] if level_scales is None else h[:, :1] * level_scales[0]
    for j in range(j0, 0, -1):  # coarse to fine: a_2i = a_i + d_i, a_2i+1 = a_i - d_i
        cnt = ends[j] - ends[j - 1]
        d = h[:, ends[j - 1]:ends[j]]
        scale = 1.0 if level_scales is None else level_scales[j]
        out = torch.empty(b, cnt, 2, dtype=h.dtype)
        torch.add(a, d, alpha=scale, out=out[..., 0])
        torch.sub(a, d, alpha=scale, out=out[..., 1])
        a = out.reshape(b, 2 * cnt)[:, :-(-size // (1 << (j - 1)))]
    return a


_FINE = 4  # blocked_inverse_noise: the finest levels, drawn in block order and inverted in one product


def blocked_inverse_noise(draws, batch: int, size: int, m: int, level_scales: Sequence[float]) -> torch.Tensor:
    """IHWT(z)[:, :size] [batch, size] for independent z_c ~ N(0, s_j^2) on every coefficient c of level j
    (level_scales: s for H_0, then s_1..s_n), the finest L = min(4, n) levels drawn in BLOCK order.

    The coefficients are i.i.d. up to their level's scale, so which draw lands on which coefficient does not change
    the distribution; a fixed order that suits the inverse is taken (fine_coefficient_index says which). First H_0 and
    the levels L+1..n: an IHWT of length m / 2^L on its own (this function again while it holds more than 256 values,
    else haar_inverse_prefix) gives the level-L averages a_L, one per block of 2^L outputs. Then, per block, its 2^L - 1
    details of levels L..1 (level L's one, level L-1's two, ..., level 1's 2^(L-1)), so the block's outputs are
    a_L + z_block F, F the fixed [2^L - 1, 2^L] matrix of the recursion a_2i = a_i + d_i, a_2i+1 = a_i - d_i over L
    levels with the scales folded in: one product instead of four strided passes."""
    n = m.bit_length() - 1
    fine = min(_FINE, n)
    blocks = -(-size // (1 << fine))
    if fine == 0 or size <= 256:
        return haar_inverse_prefix(draws.randn(batch, _needed_ends(size, m)[-1]), size, m, level_scales)
    a = blocked_inverse_noise(draws, batch, blocks, m >> fine, (level_scales[0],) + tuple(level_scales[fine + 1:]))
    out = draws.randn(batch * blocks, (1 << fine) - 1) @ _fine_matrix(
        fine, tuple(float(v) for v in level_scales[1:fine + 1]), a.dtype)
    out += a.reshape(-1, 1)
    return out.view(batch, blocks << fine)[:, :size]


@functools.lru_cache(maxsize=64)
def _fine_matrix(levels: int, scales: tuple, dtype: torch.dtype) -> torch.Tensor:
    """[2^L - 1, 2^L]: row r the effect on a block's 2^L outputs of the block's r-th detail in block order (level L
    first, then L-1, ..., 1; a detail of level j spans 2^j outputs, + s_j on its first half and - s_j on its second)."""
    width = 1 << levels
    rows = []
    for j in range(levels, 0, -1):
        span = 1 << j
        for k in range(width // span):
            row = np.zeros(width)
            row[k * span:k * span + span // 2] = scales[j - 1]
            row[k * span + span // 2:(k + 1) * span] = -scales[j - 1]
            rows.append(row)
    return torch.tensor(np.stack(rows), dtype=dtype)


def fine_coefficient_index(size: int, m: int) -> np.ndarray:
    """Where blocked_inverse_noise's draws of one row land, in the order drawn: the index in the full coefficient
    vector [H_0, d(1), ..., d(n)] of each: the coarse draws first (in this order again, for the transform of length
    m / 2^L), then each block's details (those of the last block that reach only the padding included)."""
    n = m.bit_length() - 1
    fine = min(_FINE, n)
    if fine == 0 or size <= 256:
        return np.concatenate([np.arange(a, a + c) for a, c in needed_coefficients(size, m)])
    blocks, mc = -(-size // (1 << fine)), m >> fine
    start = lambda j: m + 1 - (m >> (j - 1))  # where d(j) starts in the full vector (wavelet.haar_inverse's layout)
    # the coarse transform's H_0 is H_0 and its level j is level j + L, at the same offset within the level
    coarse = fine_coefficient_index(blocks, mc)
    level = np.concatenate([[0]] + [np.full(mc >> j, j) for j in range(1, mc.bit_length())])[coarse]
    offset = coarse - np.where(level > 0, mc + 1 - (mc >> np.maximum(level - 1, 0)), 0)
    placed = np.where(level > 0, m + 1 - (m >> (level + fine - 1)) + offset, 0)
    per_block = [start(j) + np.arange(blocks)[:, None] * (1 << (fine - j)) + np.arange(1 << (fine - j))[None, :]
                 for j in range(fine, 0, -1)]
    return np.concatenate([placed, np.concatenate(per_block, 1).reshape(-1)])


@functools.lru_cache(maxsize=64)
def _needed_ends(size: int, m: int) -> list[int]:
    return np.cumsum([c for _, c in needed_coefficients(size, m)]).tolist()


@functools.lru_cache(maxsize=64)
def _top_scales(size: int, m: int, level_scales: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The factors of the coefficients haar_inverse_prefix takes to its top product: H_0, then levels j0+1..n."""
    j0 = _inverse_top(size, m)[0]
    spans = needed_coefficients(size, m)
    return torch.tensor([level_scales[0]] + [level_scales[j] for j in range(j0 + 1, len(spans))
                                             for _ in range(spans[j][1])], dtype=dtype)


def per_level_scales(layout: WaveletLayout, compact: Sequence[torch.Tensor]) -> list:
    """Per layout segment, compact noise scales (compact_scales) as one float per level (H_0, d(1), ..., d(n)) where
    they are constant on each level, as noise_scales' sigma S / W_c are; else the tensor unchanged. wavelet_noise
    draws them in block order and scales them inside the inverse (blocked_inverse_noise), not in a pass of their own."""
    out = []
    for size, m, sc in zip(layout.segments, layout.padded, compact):
        ends = [0] + _needed_ends(size, m)
        firsts = [float(sc[a]) for a in ends[:-1]]
        levels = torch.repeat_interleave(torch.tensor(firsts, dtype=sc.dtype), torch.tensor(np.diff(ends)))
        out.append(tuple(firsts) if torch.equal(levels, sc) else sc)
    return out


@functools.lru_cache(maxsize=64)
def _inverse_top(size: int, m: int) -> tuple[int, torch.Tensor]:
    """(j0, T): the level j0 whose rows hold at most 256 values, and the float64 matrix taking [H_0, d(j0+1), ...,
    d(n)] (needed ones) to the level-j0 averages a_j0."""
    n = m.bit_length() - 1
    spans = needed_coefficients(size, m)
    j0 = next((j for j in range(n + 1) if -(-size // (1 << j)) <= 256), n)
    k = 1 + sum(c for _, c in spans[j0 + 1:])
    eye = torch.eye(k, dtype=torch.float64)  # columns: H_0, then the needed d(j0+1), ..., d(n) in order
    ends = np.cumsum([0] + [c for _, c in spans[j0 + 1:]]).tolist()
    a = eye[:, :1]
    for idx, j in reversed(list(enumerate(range(j0 + 1, n + 1)))):
        d = eye[:, 1 + ends[idx]:1 + ends[idx + 1]]
        a = torch.stack((a + d, a - d), -1).reshape(k, -1)[:, :-(-size // (1 << (j - 1)))]
    return j0, a


@functools.lru_cache(maxsize=64)
def _inverse_top_as(size: int, m: int, dtype: torch.dtype) -> torch.Tensor:
    return _inverse_top(size, m)[1].to(dtype)


@functools.lru_cache(maxsize=64)
def _needed_index(size: int, m: int, start: int) -> torch.Tensor:
    return torch.cat([torch.arange(start + a, start + a + c) for a, c in needed_coefficients(size, m)])


def compact_scales(layout: WaveletLayout, scales: torch.Tensor) -> list[torch.Tensor]:
    """Per layout segment, the noise scales of the coefficients that reach the data (needed_coefficients order)."""
    out, start = [], 0
    for size, m in zip(layout.segments, layout.padded):
        out.append(scales[_needed_index(size, m, start)])
        start += m
    return out


def wavelet_noise(layout: WaveletLayout, scales, generator, batch: int) -> list[torch.Tensor]:
    """IHWT(z)[:P] per layout segment for z_c ~ N(0, scales_c^2) on every coefficient (scales [coeff_length], as
    noise_scales gives, or compact_scales or per_level_scales of them): the coefficients that only reach the padding are
    not drawn (see the comment above)."""
    if isinstance(scales, torch.Tensor):
        scales = compact_scales(layout, scales)
    draws = as_draws(generator)
    out = []
    for size, m, sc in zip(layout.segments, layout.padded, scales):
        if isinstance(sc, tuple):  # one factor per level (per_level_scales): applied inside the inverse
            out.append(blocked_inverse_noise(draws, batch, size, m, sc))
        else:
            out.append(haar_inverse_prefix(draws.randn(batch, len(sc)).mul_(sc), size, m))
    return out


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


def noise_scales(noise_multiplier: float, sensitivity: float, layout: WaveletLayout | None) -> torch.Tensor:
    """Noise std per coordinate: sigma S, or sigma S / W_c on wavelet coefficient c (paper 002 Alg. 1 step 5)."""
    if layout is None:
        return torch.full((1,), noise_multiplier * sensitivity)
    return noise_multiplier * sensitivity / torch.from_numpy(layout.weights).to(torch.float32)


def noise_rows(rows: int, width: int, scales, layout: WaveletLayout | None, generator) -> torch.Tensor:
    """`rows` independent noise draws [rows, width] of one release each: N(0, scales^2) on each coordinate or, with a
    wavelet layout, IHWT(z)[:P] of N(0, scales_c^2) on each Haar coefficient (scales as in noisy_sum)."""
    draws = as_draws(generator)
    if layout is None:
        return draws.randn(rows, width, scale=float(scales))
    parts = wavelet_noise(layout, scales, draws, rows)
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def noisy_sum(total: torch.Tensor, scales, layout: WaveletLayout | None, generator,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """The lot's release: the clipped sum plus one noise draw, N(0, scales^2) on each coordinate or, with a wavelet
    layout, on each Haar coefficient (IHWT(HWT(total) + noise), computed as total + IHWT(noise)). `scales` as
    noise_scales gives them (or, with a layout, their compact_scales). `total` is [P] or [B, P] (B releases); it is
    updated in place where that saves a copy."""
    if layout is None and out is not None and out.shape == total.shape:  # the caller's buffer for the draw
        return total.add_(as_draws(generator).randn(out=out, scale=float(scales)))
    # IHWT(HWT(total) + z) = total + IHWT(z): only the noise is transformed, and only where it reaches [0, P)
    rows = total.reshape(-1, total.shape[-1])
    rows += noise_rows(rows.shape[0], rows.shape[1], scales, layout, generator)
    return total


@functools.lru_cache(maxsize=16)
def _wavelet_plan(sizes: tuple, scope: str, std: float) -> tuple[WaveletLayout, list[torch.Tensor]]:
    """A dp_sgd call's wavelet layout and the noise scales (sigma S / W_c of the coefficients that are drawn, per level),
    built once per (sizes, scope, sigma S): building them for the mlp's m = 2^18 costs a fifth of a step. Read only."""
    layout = WaveletLayout(list(sizes), scope)
    return layout, per_level_scales(layout, compact_scales(layout, noise_scales(std, 1.0, layout)))


def draw_lot(n: int, q: float, lot: str, generator) -> torch.Tensor:
    """Indices of one lot: each of the n examples independently with probability q ("poisson", Abadi et
    al.'s lot and the sampling the RDP accountant assumes) or a uniform subset of round(q n) ("fixed")."""
    _check("q (lot sampling rate)", 0 < q <= 1, "in (0, 1]", q)
    _check("lot", lot in LOTS, f"one of {', '.join(LOTS)}", lot)
    if lot == "poisson":
        return torch.nonzero(as_draws(generator).rand(n) < q).reshape(-1)
    return as_draws(generator).sample(n, fixed_lot_size(n, q))


def fixed_lot_size(n: int, q: float) -> int:
    return max(1, int(round(q * n)))


def accounting(*, mechanism: str, calibration: str, noise_multiplier: float, q: float, steps: int, lot: str,
               n: int, sensitivity: float, layout: WaveletLayout | None = None) -> dict:
    """What the ledger must compose for one dp_sgd call, as a plain dict.

    Poisson lots under add/remove-one adjacency: PoissonSampled(Gaussian(sigma)) x steps. Fixed lots are
    sampling without replacement, which dp_accounting accounts under replace-one adjacency, where the sum
    of clipped vectors moves by up to 2C: the accounted multiplier is then sigma / 2."""
    fixed = lot == "fixed" and q < 1.0  # a lot of the whole dataset is no sampling at all
    out = {
        "mechanism": mechanism,
        "calibration": calibration,
        "noise_multiplier": float(noise_multiplier),
        "accounting_noise_multiplier": float(noise_multiplier) / (2.0 if fixed else 1.0),
        "sampling_rate": float(q),
        "steps": int(steps),
        "lot": lot,
        "dataset_size": int(n),
        "lot_size": float(fixed_lot_size(n, q) if fixed else q * n),
        "neighbouring": "replace_one" if fixed else "add_or_remove_one",
        "sensitivity": float(sensitivity),
        # paper-mode wavelet: the accountant's epsilon for sigma is only the paper's claim (digest P1)
        "epsilon_label": "epsilon_claimed" if calibration == "paper" else "epsilon",
    }
    if mechanism == "wavelet" and layout is not None:
        out["effective_noise_multiplier"] = effective_multiplier(noise_multiplier, layout, calibration) / (
            2.0 if fixed else 1.0)
        out["wavelet_length"] = int(layout.coeff_length)
    return out


def dp_event(info: dict):
    """The dp_accounting event of an `accounting` dict (the multiplier the calibration claims)."""
    import dp_accounting

    base = dp_accounting.GaussianDpEvent(info["accounting_noise_multiplier"])
    if info["lot"] == "fixed":
        sampled = dp_accounting.SampledWithoutReplacementDpEvent(info["dataset_size"], int(info["lot_size"]), base)
    else:
        sampled = dp_accounting.PoissonSampledDpEvent(info["sampling_rate"], base)
    return dp_accounting.SelfComposedDpEvent(sampled, info["steps"])


# Values of noise drawn at once for the coming steps of a dp_sgd call (256 KB: in cache): rows of independent draws,
# as one draw per step gives; for a small model (the linear model's 7,850 values: 8 steps) one draw and one inverse
# transform of 8 rows cost a fraction of 8 single ones. A model over it draws each step's alone (the mlp's 159,010
# in blocks of 6 cost more: 3.8 MB leave the caches).
NOISE_BLOCK = 1 << 16


def dp_sgd(model: nn.Module, w: np.ndarray, shard, lr: float, steps: int, q: float, clip: float,
           noise_multiplier: float, mechanism: str, generator, *, lot: str = "poisson",
           calibration: str = "sound", layer_bounds: Sequence[float] | None = None, wavelet_scope: str = "flat",
           physical_batch: int = 256, grad_method: str = "auto", optimizer: str = "sgd"
           ) -> tuple[np.ndarray, float, dict]:
    """`steps` DP-SGD steps from flat weights `w` on `shard` (a device_client.training.Shard).

    Each step draws a lot, computes per-example gradients g_i, clips them (flat to `clip`, or per layer to
    `layer_bounds`), sums, adds noise ONCE (digest P5), divides by the expected lot size and steps by lr:
      gaussian: g^ = (sum_i clip(g_i) + N(0, sigma^2 S^2 I)) / L        (Abadi et al. Alg. 1; S = C or
                sqrt(sum_j C_j^2))
      wavelet:  g^ = IHWT(sum_i clip(HWT(g_i)) + N(0, sigma^2 S^2 / W^2)) / L   (paper 002 Alg. 1; per-layer
                bounds need wavelet_scope "per_layer", so each layer's coefficients are clipped to its C_j)
    with the wavelet clip on ||W (.) H|| (calibration "sound") or ||H|| (calibration "paper"; see wavelet.py).
    L = q n for Poisson lots, round(q n) for fixed ones. An empty Poisson lot still gets its noise. `optimizer` (a
    name in optimizers.OPTIMIZERS) is the rule g^ is fed to: sgd (theta -= lr g^), adam (DP-Adam), adagrad
    (DP-AdaGrad); post-processing of the same release, so the accounting dict does not depend on it.

    grad_method "bookkeeping" (the default "auto" where every layer is Linear or Conv2d, either mechanism) gets the
    clipped sum without per-example gradient rows (the wavelet norms level by level, wavelet_part_norms); "vmap"
    forms them with torch.func. The wavelet noise is IHWT(z) added to the sum (noisy_sum).

    Returns (new flat float32 weights, mean per-example loss over the lots, accounting dict)."""
    _check("grad_method", grad_method in GRAD_METHODS, f"one of {', '.join(GRAD_METHODS)}", grad_method)
    _check("mechanism", mechanism in MECHANISMS, f"one of {', '.join(MECHANISMS)}", mechanism)
    _check("calibration", calibration in CALIBRATIONS, f"one of {', '.join(CALIBRATIONS)}", calibration)
    _check("wavelet_scope", wavelet_scope in SCOPES, f"one of {', '.join(SCOPES)}", wavelet_scope)
    _check("lot", lot in LOTS, f"one of {', '.join(LOTS)}", lot)
    _check("q (lot sampling rate)", 0 < q <= 1, "in (0, 1]", q)
    _check("steps", isinstance(steps, (int, np.integer)) and steps >= 0, "an integer >= 0", steps)
    _check("lr", math.isfinite(lr) and lr >= 0, "a finite number >= 0", lr)
    _check("noise_multiplier", math.isfinite(noise_multiplier) and noise_multiplier >= 0, "a finite number >= 0",
           noise_multiplier)
    _check("physical_batch", physical_batch >= 1, "an integer >= 1", physical_batch)
    generator = as_draws(generator)  # lots and noise: dp_draws' keystream on a device, a torch.Generator in tests
    sizes = layer_sizes(model)
    if layer_bounds is None:
        _check("clip", math.isfinite(clip) and clip > 0, "a finite number > 0", clip)
        bounds = torch.tensor([float(clip)], dtype=torch.float64)
    else:
        _check("layer_bounds", len(layer_bounds) == len(sizes) and all(b > 0 for b in layer_bounds),
               f"{len(sizes)} numbers > 0 (one per parameter tensor)", layer_bounds)
        bounds = torch.tensor([float(b) for b in layer_bounds], dtype=torch.float64)
        if mechanism == "wavelet":
            _check("wavelet_scope", wavelet_scope == "per_layer", "per_layer when layer_bounds are given", wavelet_scope)
    sensitivity = float(bounds.square().sum().sqrt())
    n = len(shard)
    _check("shard", n >= 1, "non-empty", n)

    theta = torch.from_numpy(np.asarray(w, dtype=np.float32)).clone()
    rule = OPTIMIZERS.get(optimizer)(theta)
    _check("w", theta.numel() == num_parameters(model), f"a vector of {num_parameters(model)} values", theta.numel())
    set_flat(model, theta.numpy())
    model.train()
    params, offset = {}, 0
    for (name, p), size in zip(model.named_parameters(), sizes):
        params[name] = theta[offset:offset + size].view_as(p)  # views: updating theta updates params
        offset += size

    layout, wavelet_scales = _wavelet_plan(tuple(sizes), wavelet_scope, noise_multiplier * sensitivity) \
        if mechanism == "wavelet" else (None, None)
    per_layer = layer_bounds is not None
    layers = _bookkeeping_layers(model)
    if grad_method == "bookkeeping":
        _check("grad_method", layers is not None, "vmap for this model (bookkeeping needs only Linear / Conv2d "
               "layers)", grad_method)
    use_bookkeeping = layers is not None and grad_method != "vmap"
    if use_bookkeeping:  # the module's parameters become the views of theta: a plain forward, no functional_call
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.data = params[name]
        params = dict(model.named_parameters())
    segments = sizes if per_layer else None
    noise_scale = noise_scales(noise_multiplier, sensitivity, None) if layout is None else wavelet_scales
    width = theta.numel()
    expected_lot = float(fixed_lot_size(n, q) if lot == "fixed" else q * n)

    loss_sum, loss_count = 0.0, 0
    noise, used = torch.empty(0, width), 0
    for step in range(steps):
        if used == len(noise):  # the noise of the next steps in one draw and one inverse transform
            noise, used = noise_rows(min(steps - step, max(1, NOISE_BLOCK // width)), width, noise_scale, layout,
                                     generator), 0
        idx = draw_lot(n, q, lot, generator)
        total = noise[used]  # the step's own noise row: the lot's clipped sums are added to it
        for chunk in idx.split(physical_batch):
            if len(chunk) == 0:  # an empty Poisson lot: the step is noise only
                continue
            x, y = shard.batch(chunk)
            if use_bookkeeping:
                _, losses, _ = bookkeeping_clipped_sum(model, params, x, y, bounds, per_layer, layers, layout,
                                                       calibration, out=total)
            else:
                g, losses = per_example_gradients(model, params, x, y)
                # the HWT is linear: sum_i s_i HWT(g_i) = HWT(sum_i s_i g_i), so the clipped sum is formed
                # in the gradient domain and transformed once per lot
                total += clipped_sum(g, clip_factors(example_norms(g, layout, calibration, segments), bounds), segments)
            loss_sum += float(losses.sum())
            loss_count += len(chunk)
        rule.step(theta, total, lr, expected_lot)
        used += 1

    info = accounting(mechanism=mechanism, calibration=calibration if mechanism == "wavelet" else "sound",
                      noise_multiplier=noise_multiplier, q=q, steps=steps, lot=lot, n=n, sensitivity=sensitivity,
                      layout=layout)
    mean_loss = loss_sum / loss_count if loss_count else float("nan")
    return theta.numpy().copy(), mean_loss, info
