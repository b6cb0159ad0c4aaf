"""DP stochastic quantizer Q_{b, eps1} of paper 004 (Lemma 3, eq. 6; distortion eq. 7).

Each coordinate a in cell [q_i, q_{i+1}] goes to its NEAREST neighbour level with probability
e^eps1 / (e^eps1 + 1) and to the other one otherwise; a tie (a at the cell midpoint) counts q_i as nearest,
per the <= in eq. (6a). Biased by design (digest P11): do NOT de-bias. The range and cell index are
deterministic functions of the data and fall outside the DP claim (digest P1, P2).
"""
from __future__ import annotations

import math

import numpy as np

from .sq import (cell_position, check_bits, check_vector, coins, dequantize_grid, finite_vector, grid_indices, step,
                 vector_range)


def check_epsilon1(epsilon1) -> float:
    eps = float(epsilon1)
    if not eps >= 0:  # also refuses NaN
        raise ValueError(f"epsilon1 must be a number >= 0 (inf = nearest rounding), got {epsilon1!r}")
    return eps


def nearest_probability(epsilon1: float) -> float:
    """p* = e^eps1 / (e^eps1 + 1) = 1 / (1 + e^-eps1) (Lemma 3): finite for every eps1 >= 0, inf included, and
    equal to scipy.special.expit bit for bit (not imported: every edge imports this module, scipy.special costs
    about half of an edge's start-up imports)."""
    return 1.0 / (1.0 + math.exp(-check_epsilon1(epsilon1)))


def dpsq_indices(x: np.ndarray, lo: float, hi: float, levels: int, epsilon1: float, rng: np.random.Generator
                 ) -> np.ndarray:
    p = nearest_probability(epsilon1)
    # the upper level when the nearest is the upper one (frac > 1/2) and the coin says nearest, or the other way round
    return grid_indices(x, lo, hi, levels, lambda frac: np.equal(frac > 0.5, coins(rng, frac.size, p)))


def dpsq_quantize(x, rng: np.random.Generator, bits: int, epsilon1: float, range_mode: str = "minmax",
                  clip: float | None = None) -> tuple[np.float32, np.float32, np.ndarray]:
    """Paper 004, Lemma 3 / eq. (6): returns (lo, hi, uint32 indices in 0..2^b-1)."""
    x, levels = finite_vector(x), 1 << check_bits(bits)
    lo, hi = vector_range(x, range_mode, clip)
    return lo, hi, dpsq_indices(x, lo, hi, levels, check_epsilon1(epsilon1), rng)


def dpsq(x, rng: np.random.Generator, bits: int, epsilon1: float, range_mode: str = "minmax",
         clip: float | None = None) -> np.ndarray:
    """Q_{b,eps1}(x) as the receiver sees it (no de-biasing)."""
    lo, hi, idx = dpsq_quantize(x, rng, bits, epsilon1, range_mode, clip)
    return dequantize_grid(idx, lo, hi, 1 << int(bits))


def dpsq_expected_distortion(x, bits: int, epsilon1: float, range_mode: str = "minmax",
                             clip: float | None = None) -> np.ndarray:
    """Per-coordinate E|Q(a) - a|^2 = (e^eps1 min{d_l, d_u} + max{d_l, d_u}) / (e^eps1 + 1), paper 004 eq. (7),
    with d_l = (q_i - a)^2, d_u = (q_{i+1} - a)^2 on the grid the quantizer would use for this vector.
    Summed over coordinates it is the device-reported distortion of FWO option (a) (digest P3)."""
    x, levels = check_vector(x), 1 << check_bits(bits)
    lo, hi = vector_range(x, range_mode, clip)
    delta = step(lo, hi, levels)
    _, frac = cell_position(x, lo, hi, levels)
    d_lower, d_upper = (frac * delta) ** 2, ((1 - frac) * delta) ** 2
    p = nearest_probability(epsilon1)
    return p * np.minimum(d_lower, d_upper) + (1 - p) * np.maximum(d_lower, d_upper)


def dpsq_uniform_cell_distortion(delta: float, epsilon1: float) -> float:
    """E|Q(a) - a|^2 for a uniform within a cell: Delta^2 (e^eps1/12 + 7/12) / (e^eps1 + 1) (digest 004, 3.3),
    written with p* so it stays finite for large eps1."""
    p = nearest_probability(epsilon1)
    return float(delta) ** 2 * (p / 12 + (1 - p) * 7 / 12)
