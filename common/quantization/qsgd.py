"""QSGD stochastic quantizer with s levels (Alistarh et al. 2017), as used by QHetFed (paper 001, Assumption 1
and the example after it; digest 001 section 3).

    Q_s(x)_i = sign(x_i) * ||x||_2 * zeta_i,   zeta_i = (l_i + 1)/s w.p. p_i, else l_i/s,
    a_i = |x_i| / ||x||,  l_i = floor(a_i s),  p_i = a_i s - l_i.

The wire code of a coordinate is (level << 1) | sign_bit with level in 0..s, so it takes
1 + ceil(log2(s + 1)) bits. The norm is one float32 per bucket (the whole vector by default: the paper
quantizes the whole d-vector, digest 001 section 10; `bucket_size` is the offered variant).
"""
from __future__ import annotations

import numpy as np

from .packing import MAX_WIDTH, width_for
from .sq import check_vector

MAX_LEVELS = (1 << (MAX_WIDTH - 1)) - 1


def check_levels(levels) -> int:
    if isinstance(levels, bool) or not float(levels).is_integer() or not 1 <= levels <= MAX_LEVELS:
        raise ValueError(f"levels (s) must be an integer in 1..{MAX_LEVELS}, got {levels!r}")
    return int(levels)


def check_bucket_size(bucket_size) -> int:
    if isinstance(bucket_size, bool) or not float(bucket_size).is_integer() or bucket_size < 0:
        raise ValueError(f"bucket_size must be an integer >= 0 (0 = whole vector), got {bucket_size!r}")
    return int(bucket_size)


def levels_for_bits(bits) -> int:
    """s such that a code (sign + level) takes exactly `bits` bits: s = 2**(bits-1) - 1 (digest 001 P: s_is_bits)."""
    if isinstance(bits, bool) or not float(bits).is_integer() or not 2 <= bits <= MAX_WIDTH:
        raise ValueError(f"bits must be an integer in 2..{MAX_WIDTH} for qsgd (one sign bit plus level bits), got {bits!r}")
    return (1 << (int(bits) - 1)) - 1


def code_width(levels: int) -> int:
    return 1 + width_for(check_levels(levels) + 1)


def bucket_count(length: int, bucket_size: int) -> int:
    return 1 if bucket_size == 0 or length == 0 else -(-length // bucket_size)


def _buckets(x: np.ndarray, bucket_size: int) -> np.ndarray:
    """x as rows of bucket_size (zero-padded), or one row for the whole vector."""
    size = x.size if bucket_size == 0 else bucket_size
    rows = bucket_count(x.size, bucket_size)
    padded = np.zeros(rows * max(size, 1), dtype=np.float64)
    padded[:x.size] = x
    return padded.reshape(rows, max(size, 1))


def _float32_norms(rows: np.ndarray) -> np.ndarray:
    """Per-row l2 norms rounded UP to float32, so |x_i| / norm <= 1 holds for the norm that travels."""
    exact = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    rounded = exact.astype(np.float32)
    low = rounded.astype(np.float64) < exact
    rounded[low] = np.nextafter(rounded[low], np.float32(np.inf))
    return rounded


def _scaled(x: np.ndarray, levels: int, bucket_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 norms per bucket, a_i s as float64): in place on one buffer (each fresh array of this size costs its
    page faults as much as the arithmetic)."""
    rows = _buckets(x, bucket_size)  # a fresh padded copy: ours to overwrite
    norms = _float32_norms(rows)
    safe = np.where(norms > 0, norms, 1.0).astype(np.float64)
    a = np.abs(rows, out=rows)
    a /= safe[:, None]
    np.minimum(a, 1.0, out=a)
    a *= levels
    return norms, a.ravel()[:x.size]


def qsgd_quantize(x, levels: int, rng: np.random.Generator, bucket_size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Paper 001, QSGD example after Assumption 1: returns (float32 norms per bucket, uint32 codes)."""
    x = check_vector(x)
    levels, bucket_size = check_levels(levels), check_bucket_size(bucket_size)
    norms, scaled = _scaled(x, levels, bucket_size)
    lower = np.floor(scaled)
    frac = np.subtract(scaled, lower, out=scaled)
    up = np.less(rng.random(x.size), frac)  # the level rounds up with probability a_i s - l_i
    codes = lower.astype(np.uint32)
    codes += up
    codes <<= 1
    codes |= x < 0
    return norms, codes


def qsgd_dequantize(norms: np.ndarray, codes: np.ndarray, levels: int, bucket_size: int = 0) -> np.ndarray:
    """Inverse map of `qsgd_quantize`: sign * norm_of_bucket * level / s, as float32."""
    codes = np.asarray(codes, dtype=np.uint32)
    size = codes.size if bucket_size == 0 else bucket_size
    out = (codes >> 1).astype(np.float64)  # level * norm / s, then the sign bit where the code has it: the same
    if bucket_size == 0:                    # bits as (sign * norm) * level / s, -0.0 included (a sign flip is exact)
        out *= float(np.asarray(norms, np.float64).reshape(-1)[0]) if codes.size else 1.0
    else:
        out *= np.repeat(np.asarray(norms, np.float64), max(size, 1))[:codes.size]
    out /= levels
    out.view(np.uint64)[...] |= (codes & 1).astype(np.uint64) << np.uint64(63)
    return out.astype(np.float32)


def qsgd(x, rng: np.random.Generator, levels: int, bucket_size: int = 0) -> np.ndarray:
    """Q_s(x) as the receiver sees it (quantize then dequantize)."""
    return qsgd_dequantize(*qsgd_quantize(x, levels, rng, bucket_size), levels=levels, bucket_size=bucket_size)


def relative_error(x, quantized) -> float:
    """Measured q = ||Q(x) - x||^2 / ||x||^2 (0 for a zero vector)."""
    x = np.asarray(x, dtype=np.float64)
    energy = float(x @ x)
    diff = np.asarray(quantized, dtype=np.float64) - x
    return float(diff @ diff) / energy if energy > 0 else 0.0


def qsgd_expected_relative_error(x, levels: int, bucket_size: int = 0) -> float:
    """E||Q_s(x) - x||^2 / ||x||^2 = sum_b ||x_b||^2 / s^2 * sum_i p_i (1 - p_i) / ||x||^2 (digest 001, 9.6)."""
    x = check_vector(x)
    levels, bucket_size = check_levels(levels), check_bucket_size(bucket_size)
    energy = float(x @ x)
    if energy == 0:
        return 0.0
    norms, scaled = _scaled(x, levels, bucket_size)
    p = scaled - np.floor(scaled)
    size = x.size if bucket_size == 0 else bucket_size
    norm_sq = np.repeat(norms.astype(np.float64) ** 2, max(size, 1))[:x.size]
    return float(np.sum(norm_sq * p * (1 - p)) / levels ** 2 / energy)
