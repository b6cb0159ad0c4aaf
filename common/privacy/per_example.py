"""Sample-level DP-SGD on a device: per-example gradients, per-example clipping, lots, noise once per lot.

Vanilla DP-SGD is Abadi et al. 2016 Algorithm 1 (paper 002 Sec. II-B, Eq. 3, digest Sec. 2.4); DP-SGD-WAV is
paper 002 Algorithm 1 (digest Sec. 2.2), with the noise added once per lot on the sum of the clipped
per-example vectors and the noisy sum divided by the EXPECTED lot size q n (digest P5: the pseudo-code nests
the noise in the per-sample loop; the text's "same methodology as standard DP-SGD" reading is taken).

Per-example gradients come from torch.func (vmap of grad over functional_call). Measured against Opacus'
GradSampleModule on the project's three models (benchmarks/bench_dpsgd.py) torch.func was kept; see the
benchmark output for the figures. A "layer" for per-layer clipping is one parameter tensor (weight and
bias separately, Opacus' convention), in model.parameters() order.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from hfl.common.models import num_parameters, set_flat

from .wavelet import CALIBRATIONS, SCOPES, WaveletLayout, effective_multiplier

MECHANISMS = ("gaussian", "wavelet")
LOTS = ("poisson", "fixed")
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


def clip_rows(v: torch.Tensor, bounds: torch.Tensor, segment_ids: torch.Tensor | None = None,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each row of v [B, D] so that ||weights (.) v_segment||_2 <= bound for every segment.

    One segment (segment_ids None, bounds of shape [1]) is flat clipping g / max(1, ||g|| / C); one segment
    per layer is per-layer clipping with sensitivity sqrt(sum_j C_j^2) (paper 002 Sec. III-A, corrected per
    digest P3). Norms are taken in float64. Returns (clipped v, norms before clipping [B, segments])."""
    w = v if weights is None else v * weights
    sq = w.to(torch.float64).square()
    if segment_ids is None:
        norms = sq.sum(dim=1, keepdim=True).sqrt()
    else:
        norms = torch.zeros(v.shape[0], len(bounds), dtype=torch.float64).index_add_(1, segment_ids, sq).sqrt()
    b = bounds.to(torch.float64)
    scale = torch.where(norms > b, b / norms * _SHRINK, torch.ones_like(norms)).to(v.dtype)
    return v * (scale if segment_ids is None else scale[:, segment_ids]), norms


def draw_lot(n: int, q: float, lot: str, generator: torch.Generator) -> torch.Tensor:
    """Indices of one lot: each of the n examples independently with probability q ("poisson", Abadi et
    al.'s lot and the sampling the RDP accountant assumes) or a uniform subset of round(q n) ("fixed")."""
    _check("q (lot sampling rate)", 0 < q <= 1, "in (0, 1]", q)
    _check("lot", lot in LOTS, f"one of {', '.join(LOTS)}", lot)
    if lot == "poisson":
        return torch.nonzero(torch.rand(n, generator=generator) < q).reshape(-1)
    return torch.randperm(n, generator=generator)[:fixed_lot_size(n, q)]


def fixed_lot_size(n: int, q: float) -> int:
    return max(1, int(round(q * n)))


def accounting(*, mechanism: str, calibration: str, noise_multiplier: float, q: float, steps: int, lot: str,
               n: int, sensitivity: float, layout: WaveletLayout | None = None) -> dict:
    """What the ledger must compose for one dp_sgd call, as a plain dict.

    Poisson lots under add/remove-one adjacency: PoissonSampled(Gaussian(sigma)) x steps. Fixed lots are
    sampling without replacement, which dp_accounting accounts under replace-one adjacency, where the sum
    of clipped vectors moves by up to 2C: the accounted multiplier is then sigma / 2."""
    fixed = lot == "fixed"
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


def dp_sgd(model: nn.Module, w: np.ndarray, shard, lr: float, steps: int, q: float, clip: float,
           noise_multiplier: float, mechanism: str, generator: torch.Generator, *, lot: str = "poisson",
           calibration: str = "sound", layer_bounds: Sequence[float] | None = None, wavelet_scope: str = "flat",
           physical_batch: int = 256) -> tuple[np.ndarray, float, dict]:
    """`steps` DP-SGD steps from flat weights `w` on `shard` (a device_client.training.Shard).

    Each step draws a lot, computes per-example gradients g_i, clips them (flat to `clip`, or per layer to
    `layer_bounds`), sums, adds noise ONCE (digest P5), divides by the expected lot size and steps by lr:
      gaussian: g^ = (sum_i clip(g_i) + N(0, sigma^2 S^2 I)) / L        (Abadi et al. Alg. 1; S = C or
                sqrt(sum_j C_j^2))
      wavelet:  g^ = IHWT(sum_i clip(HWT(g_i)) + N(0, sigma^2 S^2 / W^2)) / L   (paper 002 Alg. 1)
    with the wavelet clip on ||W (.) H|| (calibration "sound") or ||H|| (calibration "paper"; see wavelet.py).
    L = q n for Poisson lots, round(q n) for fixed ones. An empty Poisson lot still gets its noise.

    Returns (new flat float32 weights, mean per-example loss over the lots, accounting dict)."""
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
    _check("w", theta.numel() == num_parameters(model), f"a vector of {num_parameters(model)} values", theta.numel())
    set_flat(model, theta.numpy())
    model.train()
    params, offset = {}, 0
    for (name, p), size in zip(model.named_parameters(), sizes):
        params[name] = theta[offset:offset + size].view_as(p)  # views: updating theta updates params
        offset += size

    layout = WaveletLayout(sizes, wavelet_scope) if mechanism == "wavelet" else None
    if layout is None:
        segment_ids = None if layer_bounds is None else torch.repeat_interleave(
            torch.arange(len(sizes)), torch.tensor(sizes))
        noise_scale = torch.full((1,), noise_multiplier * sensitivity)
        weights = None
    else:
        segment_ids = None if layer_bounds is None else torch.from_numpy(layout.segment_ids)
        wt = torch.from_numpy(layout.weights).to(torch.float32)
        noise_scale = noise_multiplier * sensitivity / wt
        weights = wt if calibration == "sound" else None
    width = theta.numel() if layout is None else layout.coeff_length
    expected_lot = float(fixed_lot_size(n, q) if lot == "fixed" else q * n)

    loss_sum, loss_count = 0.0, 0
    for _ in range(steps):
        idx = draw_lot(n, q, lot, generator)
        total = torch.zeros(width)
        for chunk in idx.split(physical_batch):
            x, y = shard.batch(chunk)
            g, losses = per_example_gradients(model, params, x, y)
            if layout is not None:
                g = layout.forward(g)
            clipped, _ = clip_rows(g, bounds, segment_ids, weights)
            total += clipped.sum(dim=0)
            loss_sum += float(losses.sum())
            loss_count += len(chunk)
        total += torch.randn(width, generator=generator) * noise_scale
        step = total if layout is None else layout.inverse(total)
        theta.sub_(step, alpha=lr / expected_lot)

    info = accounting(mechanism=mechanism, calibration=calibration if mechanism == "wavelet" else "sound",
                      noise_multiplier=noise_multiplier, q=q, steps=steps, lot=lot, n=n, sensitivity=sensitivity,
                      layout=layout)
    mean_loss = loss_sum / loss_count if loss_count else float("nan")
    return theta.numpy().copy(), mean_loss, info
