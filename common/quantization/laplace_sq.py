"""LaplaceSQ baseline of paper 004, eq. (3): L(a) = Q_b(a) + z, z ~ Laplace(0, rho / eps), Var z = 2 rho^2 / eps^2.

Its absolute numbers are NOT reproducible: the paper never states rho for FL update vectors nor whether
eps1 is per coordinate, and its Fig. 2a gap contradicts its own rho = 20 (digest 004 section 7 and P4).
The knobs:
  rho        "range" (default; rho = hi - lo, the l1 sensitivity of a scalar Q_b on the grid: the paper's
             rho = 20 for a ~ U[-10, 10]), "step" (rho = Delta_b, the digest's guess that matches Fig. 2a's
             "2.5 decades"), or a positive number;
  eps_scope  "per_coord" (default; scale rho / eps1, eq. 3 read literally) or "per_vector" (scale
             rho / (d eps1): eps = d eps1 given to each coordinate, the digest's undocumented trainable guess).

On the wire (`laplace_sq_quantize`) the real-valued L(x) is re-quantized by unbiased stochastic rounding
onto a b-bit grid over its own [min, max], so it travels as packed b-bit indices like every other codec;
that is post-processing of L(x), so the Laplace mechanism's guarantee is untouched (our choice: the paper
does not say how LaplaceSQ outputs are transmitted).
"""
from __future__ import annotations

import numpy as np

from .dpsq import check_epsilon1
from .sq import cell_position, check_bits, check_vector, dequantize_grid, sq_indices, step, vector_range

RHO_MODES = ("range", "step")
EPS_SCOPES = ("per_coord", "per_vector")


def laplace_scale(lo: float, hi: float, bits: int, epsilon1: float, length: int, rho="range",
                  eps_scope: str = "per_coord") -> float:
    """Laplace scale rho / eps for the chosen knobs (digest 004 P4)."""
    eps = check_epsilon1(epsilon1)
    if eps == 0:
        raise ValueError("epsilon1 must be > 0 for laplace-sq (the Laplace scale rho / eps1 is infinite at 0)")
    if rho == "range":
        sensitivity = float(hi) - float(lo)
    elif rho == "step":
        sensitivity = step(lo, hi, 1 << check_bits(bits))
    elif isinstance(rho, (int, float)) and not isinstance(rho, bool) and np.isfinite(rho) and rho > 0:
        sensitivity = float(rho)
    else:
        raise ValueError(f"rho must be one of {RHO_MODES} or a finite number > 0, got {rho!r}")
    if eps_scope == "per_coord":
        return sensitivity / eps
    if eps_scope == "per_vector":
        return sensitivity / (eps * max(length, 1))
    raise ValueError(f"eps_scope must be one of {EPS_SCOPES}, got {eps_scope!r}")


def laplace_sq(x, rng: np.random.Generator, bits: int, epsilon1: float, rho="range", eps_scope: str = "per_coord",
               range_mode: str = "minmax", clip: float | None = None) -> np.ndarray:
    """L(x) = Q_b(x) + z exactly as eq. (3) (float64, not re-quantized)."""
    x, levels = check_vector(x), 1 << check_bits(bits)
    lo, hi = vector_range(x, range_mode, clip)
    scale = laplace_scale(lo, hi, bits, epsilon1, x.size, rho, eps_scope)
    quantized = dequantize_grid(sq_indices(x, lo, hi, levels, rng), lo, hi, levels).astype(np.float64)
    return quantized + rng.laplace(0.0, scale, size=x.size)


def laplace_sq_expected_distortion(x, bits: int, epsilon1: float, rho="range", eps_scope: str = "per_coord",
                                   range_mode: str = "minmax", clip: float | None = None) -> np.ndarray:
    """Per-coordinate E|L(a) - a|^2 = t (1 - t) Delta_b^2 + 2 (rho / eps)^2 (paper 004, Remark 1)."""
    x, levels = check_vector(x), 1 << check_bits(bits)
    lo, hi = vector_range(x, range_mode, clip)
    _, frac = cell_position(x, lo, hi, levels)
    scale = laplace_scale(lo, hi, bits, epsilon1, x.size, rho, eps_scope)
    return frac * (1 - frac) * step(lo, hi, levels) ** 2 + 2 * scale ** 2


def laplace_sq_quantize(x, rng: np.random.Generator, bits: int, epsilon1: float, rho="range",
                        eps_scope: str = "per_coord", range_mode: str = "minmax", clip: float | None = None
                        ) -> tuple[np.float32, np.float32, np.ndarray]:
    """L(x) re-quantized for the wire: (lo', hi', uint32 indices) on a b-bit grid over L(x)'s own range."""
    noisy = laplace_sq(x, rng, bits, epsilon1, rho, eps_scope, range_mode, clip)
    if not np.isfinite(noisy).all():
        raise ValueError(f"epsilon1 = {epsilon1!r} is too small: the Laplace noise overflowed")
    levels = 1 << int(bits)
    lo, hi = vector_range(noisy)
    return lo, hi, sq_indices(noisy, lo, hi, levels, rng)
