"""DP-SGD-WAV's noise without [B, P] (paper 002's unnormalised Haar transform, wavelet.py; P values zero-padded to
m = 2^n).

The noise is transformed, not the sum:
    IHWT(HWT(t) + z)[:P] = t + IHWT(z)[:P]     (linear; HWT(pad(t)) inverts exactly),
and a coefficient whose block lies in the zero padding reaches only dropped coordinates, so only the
1 + sum_j ceil(P / 2^j) coefficients that reach [0, P) are drawn and inverted (about P, not m); the noise std is
constant on each level (sigma S / 2^j), so it is applied inside the inverse (per_level_scales), not in a pass.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import torch

from hfl.common.secret_random import as_draws

from .wavelet import WaveletLayout


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
