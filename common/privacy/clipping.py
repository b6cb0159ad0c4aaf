"""L2 clipping of an update: flat, or per layer.

Flat clipping g <- g / max(1, ||g||_2 / C) has L2 sensitivity C; per-layer clipping with bounds C_j has
sensitivity sqrt(sum_j C_j^2) (paper 002, Sec. 3.1; the paper prints sqrt(sum_j C_j), a typo, digest P3).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# float32 rounding can leave a clipped vector a few ulps over the bound; shrinking by this factor when that
# happens keeps ||out|| <= C exactly (the bias, 2.4e-7 relative, is far below float32 training noise).
_SHRINK = 1.0 - 2.0 ** -22


def _check_vector(vec: np.ndarray) -> np.ndarray:
    arr = np.asarray(vec)
    if arr.ndim != 1:
        raise ValueError(f"vec must be a 1-D vector, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("vec must hold finite values only (NaN or inf found)")
    return arr


def _scaled(arr: np.ndarray, scale) -> np.ndarray:
    """arr * scale computed in float64 and rounded to arr's float dtype (float64 for integers), without a float64
    copy of the model-sized vector (numpy widens it a buffer at a time)."""
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64
    return np.multiply(arr, scale, dtype=np.float64, out=np.empty(arr.shape, dtype), casting="unsafe")


def _l1(arr: np.ndarray) -> float:
    return float(np.abs(arr).sum(dtype=np.float64))


def _l2(arr: np.ndarray) -> float:
    return float(np.sqrt(np.einsum("i,i->", arr, arr, dtype=np.float64)))


def _scale_into_bound(arr: np.ndarray, scale: np.ndarray, bound: np.ndarray, seg_ids: np.ndarray | None) -> np.ndarray:
    """arr * scale (per element), cast back to arr's float dtype, shrunk by an ulp where rounding overshoots."""
    out = _scaled(arr, scale)
    if seg_ids is None:
        norms = np.array([_l2(out)])
    else:
        norms = np.sqrt(np.bincount(seg_ids, weights=out.astype(np.float64) ** 2, minlength=len(bound)))
    over = norms > bound
    if np.any(over):
        fix = np.where(over, _SHRINK, 1.0)
        out = _scaled(out, fix[0] if seg_ids is None else fix[seg_ids])
    return out


def clip_l2(vec: np.ndarray, bound: float) -> tuple[np.ndarray, bool]:
    """Flat L2 clipping to norm `bound` (paper 002 Sec. 3.1; paper 000 Assumption 2 enforced by clipping).

    Returns the clipped vector (same float dtype) and whether it was over the bound.
    """
    if not bound > 0 or not np.isfinite(bound):
        raise ValueError(f"bound (clip norm C) must be a finite number > 0, got {bound!r}")
    arr = _check_vector(vec)
    norm = _l2(arr)
    if norm <= bound:
        return arr.copy(), False
    scale = np.float64(bound / norm)
    return _scale_into_bound(arr, scale, np.array([bound]), None), True


def clip_l1(vec: np.ndarray, bound: float) -> tuple[np.ndarray, bool]:
    """l1 clipping v <- min(1, C / ||v||_1) v (paper 004, Step 9 of Algorithm 1; digest 004 section 3.1).
    Returns the clipped vector (same float dtype, ||out||_1 <= C) and whether it was over the bound."""
    if not bound > 0 or not np.isfinite(bound):
        raise ValueError(f"bound (l1 clipping constant C) must be a finite number > 0, got {bound!r}")
    arr = _check_vector(vec)
    norm = _l1(arr)
    if norm <= bound:
        return arr.copy(), False
    out = _scaled(arr, bound / norm)
    if _l1(out) > bound:
        out = _scaled(out, _SHRINK)
    return out, True


def per_layer_sensitivity(bounds: Sequence[float]) -> float:
    """L2 sensitivity of per-layer clipping: sqrt(sum_j C_j^2) (paper 002 Sec. 3.1, corrected per digest P3)."""
    b = np.asarray(bounds, dtype=np.float64)
    if b.ndim != 1 or b.size == 0 or not np.all(b > 0):
        raise ValueError(f"bounds must be a non-empty list of numbers > 0, got {list(bounds)!r}")
    return float(np.sqrt(np.sum(b ** 2)))


def equal_layer_bounds(total: float, layers: int) -> np.ndarray:
    """Split an overall bound C into `layers` equal bounds C/sqrt(p), so per_layer_sensitivity == C."""
    if not total > 0:
        raise ValueError(f"total (clip norm C) must be > 0, got {total!r}")
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers!r}")
    return np.full(layers, total / np.sqrt(layers))


def clip_per_layer(vec: np.ndarray, bounds: Sequence[float], sizes: Sequence[int]) -> tuple[np.ndarray, bool]:
    """Per-layer L2 clipping g(j) <- g(j) / max(1, ||g(j)||_2 / C_j) (paper 002 Sec. 3.1).

    `sizes` are the layer lengths in the flat vector, in order; they must sum to len(vec). Returns the
    clipped vector and whether any layer was over its bound.
    """
    arr = _check_vector(vec)
    b = np.asarray(bounds, dtype=np.float64)
    s = np.asarray(sizes)
    per_layer_sensitivity(b)  # validates the bounds
    if s.ndim != 1 or s.shape != b.shape:
        raise ValueError(f"sizes must be a list with one length per bound ({b.size}), got {list(sizes)!r}")
    if not np.issubdtype(s.dtype, np.integer) or np.any(s < 1):
        raise ValueError(f"sizes must be integers >= 1, got {list(sizes)!r}")
    if int(s.sum()) != arr.size:
        raise ValueError(f"sizes must sum to len(vec) = {arr.size}, got {int(s.sum())}")
    seg_ids = np.repeat(np.arange(b.size), s)
    norms = np.sqrt(np.bincount(seg_ids, weights=arr.astype(np.float64) ** 2, minlength=b.size))
    over = norms > b
    if not np.any(over):
        return arr.copy(), False
    scale = np.where(over, b / np.where(over, norms, 1.0), 1.0)
    return _scale_into_bound(arr, scale[seg_ids], b, seg_ids), True
