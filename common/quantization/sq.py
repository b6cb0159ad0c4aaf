"""Plain b-bit stochastic quantizer Q_b of paper 004 ("SQ-FL", its ref. [31]) and the uniform grid it shares
with DP-SQ and LaplaceSQ.

Grid (paper 004, Sec. 3): q_j = lo + j * Delta_b, j = 0 .. 2^b - 1, Delta_b = (hi - lo) / (2^b - 1).
Q_b rounds a in [q_i, q_{i+1}] up with probability (a - q_i) / Delta_b, so E[Q_b(a)] = a (digest 004, 3.4;
the paper never writes Q_b out, this is the unbiased reading the digest recommends).

Range (digest 004 P1, ambiguous in the paper): `range_mode="minmax"` (default) sends the vector's own
[min, max] as side information; `range_mode="fixed"` uses [-clip, clip] (the l1 clipping constant C) and
clamps anything outside it. Both ends are rounded outwards to float32 so the grid the sender used is
exactly the grid the receiver rebuilds from the header. A constant vector (hi == lo) dequantizes to the
constant (digest P10).
"""
from __future__ import annotations

import numpy as np

from .packing import MAX_WIDTH

RANGE_MODES = ("minmax", "fixed")


def check_bits(bits) -> int:
    if isinstance(bits, bool) or not float(bits).is_integer() or not 1 <= bits <= MAX_WIDTH:
        raise ValueError(f"bits must be an integer in 1..{MAX_WIDTH}, got {bits!r}")
    return int(bits)


def check_vector(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"vec must be one-dimensional, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("vec must be finite (no NaN or inf)")
    return x


def finite_vector(x) -> np.ndarray:
    """check_vector without its float64 copy, for the grid quantizers (grid_indices widens a block at a time): a float32
    vector stays as it is, and a NaN or an infinity shows in its min or max."""
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim != 1:
        raise ValueError(f"vec must be one-dimensional, got shape {x.shape}")
    if x.size and not (np.isfinite(x.min()) and np.isfinite(x.max())):
        raise ValueError("vec must be finite (no NaN or inf)")
    return x


def _outward_float32(lo: float, hi: float) -> tuple[np.float32, np.float32]:
    lo32, hi32 = np.float32(lo), np.float32(hi)
    if float(lo32) > lo:
        lo32 = np.nextafter(lo32, np.float32(-np.inf))
    if float(hi32) < hi:
        hi32 = np.nextafter(hi32, np.float32(np.inf))
    return lo32, hi32


def vector_range(x: np.ndarray, range_mode: str = "minmax", clip: float | None = None) -> tuple[np.float32, np.float32]:
    """[lo, hi] of the grid, float32-representable (digest 004 P1)."""
    if range_mode == "minmax":
        if clip is not None:
            raise ValueError("clip is only used with range_mode='fixed'")
        return _outward_float32(float(x.min()), float(x.max())) if x.size else (np.float32(0), np.float32(0))
    if range_mode == "fixed":
        if clip is None or not np.isfinite(clip) or clip <= 0:
            raise ValueError(f"clip must be a finite number > 0 with range_mode='fixed', got {clip!r}")
        return _outward_float32(-float(clip), float(clip))
    raise ValueError(f"range_mode must be one of {RANGE_MODES}, got {range_mode!r}")


def step(lo: float, hi: float, levels: int) -> float:
    return (float(hi) - float(lo)) / (levels - 1)


def cell_position(x: np.ndarray, lo: float, hi: float, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(i, t): x lies in cell [q_i, q_{i+1}] at fraction t in [0, 1]; x == hi falls in the top cell with t = 1
    (digest P10); values outside [lo, hi] are clamped to it."""
    lower, frac = cell_floor(x, lo, hi, levels)
    return lower.astype(np.int64), frac


def cell_floor(x: np.ndarray, lo: float, hi: float, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """cell_position with i as float64 (whole numbers): two arrays allocated, every other step in place, the same
    floats as the step-by-step arithmetic."""
    delta = step(lo, hi, levels)
    if delta == 0:
        return np.zeros(x.size), np.zeros(x.size)
    pos = np.clip(x, lo, hi)
    pos -= float(lo)
    pos /= delta
    lower = np.floor(pos)
    np.minimum(lower, levels - 2, out=lower)
    pos -= lower
    np.clip(pos, 0.0, 1.0, out=pos)
    return lower, pos


def dequantize_grid(indices: np.ndarray, lo: float, hi: float, levels: int) -> np.ndarray:
    return (float(lo) + np.asarray(indices, np.float64) * step(lo, hi, levels)).astype(np.float32)


def coins(rng, n: int, p: float) -> np.ndarray:
    """rng.random(n) < p: n coins of probability p, in one comparison of the keystream where rng has one (a DP
    release's CipherGenerator.below, the same booleans)."""
    below = getattr(rng, "below", None)
    return below(n, p) if below is not None else rng.random(n) < p


BLOCK = 8192  # values a block of grid_indices: 64 KiB float64 temporaries, below malloc's mmap threshold (128 KiB)


def grid_indices(x: np.ndarray, lo: float, hi: float, levels: int, up) -> np.ndarray:
    """Every value's grid index: its cell's lower level, plus one where `up(frac)` says (frac: its place in the cell,
    cell_floor's float64 arithmetic). Block by block: a model-sized temporary is mapped afresh by malloc on every call,
    and its page faults cost more than the arithmetic, where a block's stay in the heap; `up` draws its randomness a
    block after another, the same stream as one call's."""
    out = np.empty(x.size, np.uint32)
    for start in range(0, x.size, BLOCK):
        lower, frac = cell_floor(np.asarray(x[start:start + BLOCK], np.float64), lo, hi, levels)
        block = out[start:start + BLOCK]
        block[...] = lower
        block += up(frac)
    return out


def sq_indices(x: np.ndarray, lo: float, hi: float, levels: int, rng: np.random.Generator) -> np.ndarray:
    """Unbiased stochastic rounding on the grid: up with probability t."""
    return grid_indices(x, lo, hi, levels, lambda frac: rng.random(frac.size) < frac)


def sq_quantize(x, rng: np.random.Generator, bits: int, range_mode: str = "minmax", clip: float | None = None
                ) -> tuple[np.float32, np.float32, np.ndarray]:
    """Paper 004's Q_b (SQ-FL): returns (lo, hi, uint32 indices in 0..2^b-1)."""
    x, levels = finite_vector(x), 1 << check_bits(bits)
    lo, hi = vector_range(x, range_mode, clip)
    return lo, hi, sq_indices(x, lo, hi, levels, rng)


def sq(x, rng: np.random.Generator, bits: int, range_mode: str = "minmax", clip: float | None = None) -> np.ndarray:
    """Q_b(x) as the receiver sees it."""
    lo, hi, idx = sq_quantize(x, rng, bits, range_mode, clip)
    return dequantize_grid(idx, lo, hi, 1 << int(bits))
