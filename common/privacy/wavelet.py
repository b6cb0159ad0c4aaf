"""Haar wavelet transform in the Privelet convention and the wavelet-domain Gaussian noise of paper 002.

Transform (paper 002 Sec. III-C, Privelet [Xiao et al. 2010]; digest Sec. 3.3): unnormalised, the input
zero-padded to m = 2^n. Level j = 1..n halves the row: a <- (a_2i + a_2i+1)/2, d(j) <- (a_2i - a_2i+1)/2.
Coefficients in the paper's order H = [H_0, d(1) (m/2 values), d(2), ..., d(n) (1 value)], with weights
W(H_0) = m and W(d(j)) = 2^j (the number of leaves under the node).

The functions take a numpy array or a torch tensor of shape [m] or [B, m] and return the same kind, so an
edge (which never imports torch) and a training device share one implementation. Each level is one
reshape to [B, m/2^j, 2]: O(m) per row, a Python loop over the n = log2 m levels only.

Noise calibrations (digest P1):
- `paper`: noise N(0, (sigma C / W_c)^2) on coefficient c after clipping ||H||_2 <= C (Algorithm 1). Adding
  that noise to H equals releasing W (.) H + N(0, sigma^2 C^2 I), whose sensitivity is C max_c W_c = m C, so
  the true noise multiplier is sigma / m. The accountant's epsilon for sigma is only what the paper claims:
  label it epsilon_claimed.
- `sound` (default): clip the WEIGHTED coefficients ||W (.) H||_2 <= C, then the same noise. Argument: the
  map H -> W (.) H is a fixed bijection (W_c > 0), so releasing S~ = sum_i H_i + N(0, diag(sigma C / W)^2)
  is a post-processing of W (.) S~ = sum_i (W (.) H_i) + N(0, sigma^2 C^2 I). Each summand W (.) H_i has L2
  norm <= C, so adding or removing one example moves the mean by at most C: the standard Gaussian mechanism
  with multiplier sigma (and, Poisson-subsampled, the usual DP-SGD accounting). The inverse transform and
  the division by the lot size are post-processing too.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

CALIBRATIONS = ("sound", "paper")
SCOPES = ("flat", "per_layer")


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _cat(parts: list, like):
    if _is_torch(like):
        import torch
        return torch.cat(parts, dim=-1)
    return np.concatenate(parts, axis=-1)


def _stack_last(a, b, like):
    if _is_torch(like):
        import torch
        return torch.stack((a, b), dim=-1)
    return np.stack((a, b), axis=-1)


def padded_length(length: int) -> int:
    """m = 2^ceil(log2 length): the padded length of a vector of `length` values (1 for length 1)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length!r}")
    return 1 << (int(length) - 1).bit_length()


def _as_rows(x):
    if x.ndim not in (1, 2):
        raise ValueError(f"x must be a vector [m] or a batch [B, m], got shape {tuple(x.shape)}")
    return x.reshape(1, -1) if x.ndim == 1 else x, x.ndim == 1


def pad(x, m: int | None = None):
    """Zero-pad the last axis of `x` ([P] or [B, P]) to m (default: the next power of two)."""
    rows, single = _as_rows(x)
    p = rows.shape[-1]
    m = padded_length(p) if m is None else m
    if m < p or m & (m - 1):
        raise ValueError(f"m must be a power of two >= {p}, got {m!r}")
    if m > p:
        if _is_torch(rows):
            import torch
            rows = torch.nn.functional.pad(rows, (0, m - p))
        else:
            rows = np.pad(rows, ((0, 0), (0, m - p)))
    return rows[0] if single else rows


def _check_power_of_two(m: int) -> int:
    if m < 1 or m & (m - 1):
        raise ValueError(f"the last axis must have a power-of-two length (pad first), got {m!r}")
    return m.bit_length() - 1


def haar_forward(x):
    """HWT of each row of `x` ([m] or [B, m], m a power of two; paper 002 Sec. III-C, digest Sec. 3.3)."""
    rows, single = _as_rows(x)
    b, m = rows.shape
    n = _check_power_of_two(m)
    a, details = rows, []
    for _ in range(n):
        pairs = a.reshape(b, -1, 2)
        details.append((pairs[..., 0] - pairs[..., 1]) / 2)
        a = (pairs[..., 0] + pairs[..., 1]) / 2
    out = _cat([a] + details, rows)
    return out[0] if single else out


def haar_inverse(h):
    """IHWT (paper 002 Eq. 6) as the coarse-to-fine recursion a_2i = a_i + d_i, a_2i+1 = a_i - d_i."""
    rows, single = _as_rows(h)
    b, m = rows.shape
    n = _check_power_of_two(m)
    a = rows[:, :1]
    # d(j) starts at 1 + m/2 + ... + m/2^(j-1) = m + 1 - m/2^(j-1)
    for j in range(n, 0, -1):
        start = m + 1 - (m >> (j - 1))
        d = rows[:, start:start + (m >> j)]
        a = _stack_last(a + d, a - d, rows).reshape(b, -1)
    return a[0] if single else a


def haar_norms(x, weighted: bool):
    """Per-row ||HWT(x)||_2, or ||W (.) HWT(x)||_2 when `weighted`, accumulated level by level without
    forming the coefficient vector (x: [B, m], m a power of two)."""
    b, m = x.shape
    n = _check_power_of_two(m)
    a, total = x, 0.0
    for j in range(1, n + 1):
        pairs = a.reshape(b, -1, 2)
        d = (pairs[..., 0] - pairs[..., 1]) / 2
        total = total + (d * d).sum(-1) * (float(4 ** j) if weighted else 1.0)
        a = (pairs[..., 0] + pairs[..., 1]) / 2
    total = total + a[:, 0] * a[:, 0] * (float(m * m) if weighted else 1.0)
    return total ** 0.5


def haar_weights(m: int) -> np.ndarray:
    """Privelet weights W (float64, length m): W(H_0) = m, W(d(j)) = 2^j, in the coefficient order."""
    n = _check_power_of_two(int(m))
    parts = [np.array([float(m)])] + [np.full(m >> j, float(1 << j)) for j in range(1, n + 1)]
    return np.concatenate(parts)


def element_noise_variance(m: int, s: float = 1.0) -> float:
    """Exact per-element variance of IHWT(noise) with coefficient std s / W_c: s^2 (1/m^2 + sum_j 4^-j).

    Each element is H_0 plus one signed detail per level (Eq. 6). Paper 002's Lemma 1 bound
    (2 + log2 m)/2 s^2 is Privelet's range-sum bound, not this (digest P2)."""
    n = _check_power_of_two(int(m))
    return s * s * (1.0 / m ** 2 + sum(4.0 ** -j for j in range(1, n + 1)))


def lemma2_multiplier(sigma: float, m: int) -> float:
    """Paper 002 Lemma 2 in its corrected form (digest Sec. 3.4): sigma_Haar = sigma sqrt(2 / (2 + log2 m)).

    Only the paper's claim of an equivalent multiplier; not a privacy guarantee (digest P1, P2)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    n = _check_power_of_two(int(m))
    return float(sigma * np.sqrt(2.0 / (2.0 + n)))


class WaveletLayout:
    """Where each segment's coefficients lie: one segment for the whole vector (scope "flat") or one per
    layer (scope "per_layer", each layer padded to its own power of two; digest P6)."""

    def __init__(self, sizes: Sequence[int], scope: str = "flat"):
        sizes = [int(s) for s in sizes]
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError(f"sizes must be a non-empty list of layer lengths >= 1, got {sizes!r}")
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        self.scope = scope
        self.length = sum(sizes)
        self.segments = [self.length] if scope == "flat" else sizes
        self.padded = [padded_length(s) for s in self.segments]
        self.coeff_length = sum(self.padded)
        self.weights = np.concatenate([haar_weights(m) for m in self.padded])
        self.segment_ids = np.repeat(np.arange(len(self.segments)), self.padded)

    def forward(self, x):
        """[P] or [B, P] -> coefficients [m_total] or [B, m_total]."""
        rows, single = _as_rows(x)
        if rows.shape[-1] != self.length:
            raise ValueError(f"x must have {self.length} values per row, got {rows.shape[-1]}")
        parts, start = [], 0
        for size, m in zip(self.segments, self.padded):
            parts.append(haar_forward(pad(rows[:, start:start + size], m)))
            start += size
        out = parts[0] if len(parts) == 1 else _cat(parts, rows)
        return out[0] if single else out

    def inverse(self, h):
        """Coefficients -> [P] or [B, P], the padded tails dropped."""
        rows, single = _as_rows(h)
        if rows.shape[-1] != self.coeff_length:
            raise ValueError(f"h must have {self.coeff_length} coefficients per row, got {rows.shape[-1]}")
        parts, start = [], 0
        for size, m in zip(self.segments, self.padded):
            parts.append(haar_inverse(rows[:, start:start + m])[:, :size])
            start += m
        out = parts[0] if len(parts) == 1 else _cat(parts, rows)
        return out[0] if single else out

    def row_norms(self, x, calibration: str = "sound"):
        """[B, P] gradients -> [B, segments] norms of the coefficients the calibration clips: ||W (.) H||
        (sound) or ||H|| (paper), per transformed segment, without forming H."""
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")
        rows, _ = _as_rows(x)
        if rows.shape[-1] != self.length:
            raise ValueError(f"x must have {self.length} values per row, got {rows.shape[-1]}")
        parts, start = [], 0
        for size, m in zip(self.segments, self.padded):
            parts.append(haar_norms(pad(rows[:, start:start + size], m), calibration == "sound"))
            start += size
        if _is_torch(rows):
            import torch
            return torch.stack(parts, dim=1)
        return np.stack(parts, axis=1)


def coefficient_norms(h, weights, calibration: str = "sound"):
    """Per-row L2 norm of the coefficients the calibration clips: ||W (.) H|| (sound) or ||H|| (paper)."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")
    v = h * weights if calibration == "sound" else h
    if _is_torch(v):
        import torch
        return torch.linalg.vector_norm(v, dim=-1, dtype=torch.float64)
    return np.sqrt(np.sum(np.asarray(v, dtype=np.float64) ** 2, axis=-1))


def wavelet_clip(vec: np.ndarray, clip: float, layout: WaveletLayout, calibration: str = "sound") -> tuple[np.ndarray, bool]:
    """Clip a flat vector in the coefficient domain: scale it so ||W (.) HWT(vec)|| <= C (sound) or
    ||HWT(vec)|| <= C (paper, Algorithm 1 step 4). The HWT is linear, so scaling the vector scales H.

    Returns (clipped vector, whether it was over the bound)."""
    if not clip > 0 or not np.isfinite(clip):
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    arr = np.asarray(vec)
    if arr.ndim != 1 or not np.all(np.isfinite(arr)):
        raise ValueError(f"vec must be a finite 1-D vector, got shape {arr.shape}")
    h = layout.forward(arr.astype(np.float64))
    norm = float(coefficient_norms(h, layout.weights, calibration))
    if norm <= clip:
        return arr.copy(), False
    # the 2^-22 shrink keeps the float32 result inside the bound after rounding
    scale = clip / norm * (1.0 - 2.0 ** -22)
    return (arr.astype(np.float64) * scale).astype(arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64), True


def wavelet_gaussian(vec: np.ndarray, std: float, layout: WaveletLayout, rng: np.random.Generator) -> np.ndarray:
    """WaveletNoise (paper 002 Algorithm 2 step 5 / Algorithm 1 step 5, digest Sec. 3.4): HWT, add
    N(0, std^2 / W_c^2) to coefficient c, IHWT, drop the padding. `std` is sigma x sensitivity.

    Sound only when the input's sensitivity is measured in the weighted coefficient domain
    (wavelet_clip with calibration "sound"); see the module docstring."""
    if not (std >= 0 and np.isfinite(std)):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    arr = np.asarray(vec)
    if arr.ndim != 1:
        raise ValueError(f"vec must be a 1-D vector, got shape {arr.shape}")
    h = layout.forward(arr.astype(np.float64))
    h = h + rng.normal(0.0, 1.0, size=h.shape) * (std / layout.weights)
    out = layout.inverse(h)
    return out.astype(arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64)


def effective_multiplier(sigma: float, layout: WaveletLayout, calibration: str) -> float:
    """The multiplier the noise really gives against the clipping bound (digest P1): sigma for sound,
    sigma / max_c W_c (= sigma / m for the flat scope) for paper."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")
    return float(sigma) if calibration == "sound" else float(sigma / layout.weights.max())


def _stage_layout(vec: np.ndarray, params) -> WaveletLayout:
    """Plan parameters are floats: `size_0, size_1, ...` select the per-layer scope, none the flat one."""
    keys = sorted((int(k[5:]), v) for k, v in params.items() if k.startswith("size_") and k[5:].isdigit())
    if [i for i, _ in keys] != list(range(len(keys))):
        raise ValueError(f"size_N parameters must be numbered 0..n-1 without gaps, got {[i for i, _ in keys]}")
    if not keys:
        return WaveletLayout([len(vec)])
    return WaveletLayout([int(round(v)) for _, v in keys], "per_layer")


def wavelet_gaussian_stage(vec: np.ndarray, rng: np.random.Generator, **params: float) -> np.ndarray:
    """Pipeline-stage form `fn(vec, rng, **params)` of wavelet_gaussian (DP-FedAvg-WAV noise at a trusted
    aggregator, paper 002 Alg. 2 step 5): std from `std`, or `noise_multiplier` x `sensitivity`."""
    if "std" in params:
        std = float(params["std"])
    elif "noise_multiplier" in params and "sensitivity" in params:
        std = float(params["noise_multiplier"]) * float(params["sensitivity"])
    else:
        raise ValueError(f"wavelet noise needs `std` or both `noise_multiplier` and `sensitivity`, got {sorted(params)}")
    return wavelet_gaussian(vec, std, _stage_layout(np.asarray(vec), params), rng)


def wavelet_clip_stage(vec: np.ndarray, rng: np.random.Generator, clip: float, weighted: float = 1.0,
                       **params: float) -> np.ndarray:
    """Pipeline-stage form of wavelet_clip for user-level updates: weighted = 1 clips ||W (.) H|| <= clip
    (sound, the default), weighted = 0 clips ||H|| (paper)."""
    if weighted not in (0, 1, 0.0, 1.0):
        raise ValueError(f"weighted must be 0 (paper) or 1 (sound), got {weighted!r}")
    calibration = "sound" if weighted else "paper"
    return wavelet_clip(vec, clip, _stage_layout(np.asarray(vec), params), calibration)[0]
