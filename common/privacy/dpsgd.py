"""Sample-level DP-SGD on a device: lots, per-example clipping (per_example.py), noise once per lot, accounting.

Vanilla DP-SGD is Abadi et al. 2016 Algorithm 1 (paper 002 Sec. II-B, Eq. 3, digest Sec. 2.4); DP-SGD-WAV is
paper 002 Algorithm 1 (digest Sec. 2.2), with the noise added once per lot on the sum of the clipped
per-example vectors and the noisy sum divided by the EXPECTED lot size q n (digest P5: the pseudo-code nests
the noise in the per-sample loop; the text's "same methodology as standard DP-SGD" reading is taken).
The clipped sums come from per_example.py (book-keeping or torch.func), DP-SGD-WAV's norms and noise without
[B, P] from wavelet_norms.py and wavelet_noise.py.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch
from torch import nn

from hfl.common.models import num_parameters, set_flat
from hfl.common.secret_random import as_draws

from .optimizers import OPTIMIZERS
from .per_example import (_bookkeeping_layers, bookkeeping_clipped_sum, clip_factors, clipped_sum, example_norms,
                          layer_sizes, per_example_gradients)
from .wavelet import CALIBRATIONS, SCOPES, WaveletLayout, effective_multiplier
from .wavelet_noise import compact_scales, per_level_scales, wavelet_noise

MECHANISMS = ("gaussian", "wavelet")
LOTS = ("poisson", "fixed")
GRAD_METHODS = ("auto", "vmap", "bookkeeping")


def _check(name: str, ok: bool, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


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
