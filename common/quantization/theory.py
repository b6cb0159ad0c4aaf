"""Closed-form quantities of papers 001 (QHetFed) and 004 (DP-SQ): quantizer distortions, the QSGD variance
bound, the optimality-gap terms. Pure numpy, vectorised; used by fusion, cluster sizing and tests.

Grid conventions follow paper 004 Sec. 3: a coordinate a lies in cell [q_i, q_{i+1}] of width `step`
(Delta_b) at fraction `frac` = (a - q_i) / Delta_b in [0, 1].
"""
from __future__ import annotations

import numpy as np


def expit(epsilon1) -> np.ndarray:
    """1 / (1 + e^-eps1) for eps1 >= 0 (checked by every caller): finite up to inf, without scipy.special, whose
    import costs a second of the cloud's launch (the cloud imports this module through quantization.schedule)."""
    return 1.0 / (1.0 + np.exp(-np.asarray(epsilon1, float)))


def _check_eps(epsilon1) -> None:
    if not np.all(np.asarray(epsilon1, float) >= 0):
        raise ValueError(f"epsilon1 must be >= 0, got {epsilon1!r}")


def _check_frac(frac: np.ndarray) -> None:
    if not np.all((frac >= 0) & (frac <= 1)):
        raise ValueError("frac must lie in [0, 1] (position of a inside its cell)")


def grid_step(lo: float, hi: float, bits: int) -> float:
    """Delta_b = (hi - lo) / (2^b - 1) (paper 004 Sec. 3)."""
    if not 1 <= int(bits) <= 16 or int(bits) != bits:
        raise ValueError(f"bits must be an integer in 1..16, got {bits!r}")
    if not hi >= lo:
        raise ValueError(f"hi must be >= lo, got lo={lo!r}, hi={hi!r}")
    return (float(hi) - float(lo)) / ((1 << int(bits)) - 1)


def dpsq_distortion(frac, step: float, epsilon1):
    """E|Q_{b,eps1}(a) - a|^2 = (e^eps1 min{d_l, d_u} + max{d_l, d_u}) / (e^eps1 + 1), paper 004 eq. (7), with
    d_l = (frac step)^2, d_u = ((1 - frac) step)^2; written with expit so it stays finite for large eps1."""
    frac = np.asarray(frac, float)
    _check_frac(frac)
    _check_eps(epsilon1)
    d_l, d_u = (frac * step) ** 2, ((1 - frac) * step) ** 2
    p = expit(np.asarray(epsilon1, float))
    return p * np.minimum(d_l, d_u) + (1 - p) * np.maximum(d_l, d_u)


def dpsq_uniform_cell_distortion(step: float, epsilon1):
    """Mean of eq. (7) over a uniform in a cell: Delta^2 (e^eps1/12 + 7/12) / (e^eps1 + 1) (digest 004, 3.3)."""
    _check_eps(epsilon1)
    p = expit(np.asarray(epsilon1, float))
    return float(step) ** 2 * (p / 12 + (1 - p) * 7 / 12)


def sq_distortion(frac, step: float):
    """Variance of the unbiased b-bit stochastic quantizer Q_b: frac (1 - frac) Delta^2 (digest 004, 3.4)."""
    frac = np.asarray(frac, float)
    _check_frac(frac)
    return frac * (1 - frac) * float(step) ** 2


def sq_uniform_cell_distortion(step: float) -> float:
    """Mean of frac (1 - frac) Delta^2 over a uniform frac: Delta^2 / 6 (digest 004, 3.4)."""
    return float(step) ** 2 / 6


def laplace_sq_distortion(frac, step: float, scale):
    """E|L(a) - a|^2 = E|Q_b(a) - a|^2 + 2 (rho / eps1)^2 with Laplace `scale` = rho / eps1 (paper 004 eq. 3 and
    Remark 1); unbounded as eps1 -> 0. The choice of rho is the caller's (digest 004 P4)."""
    scale = np.asarray(scale, float)
    if not np.all(scale >= 0):
        raise ValueError(f"scale must be >= 0, got {scale!r}")
    return sq_distortion(frac, step) + 2 * scale ** 2


def dpsq_vector_bound(dim: int, clip: float, bits: int) -> float:
    """E||Q_{b,eps1}(x) - x||^2 <= 4 d C^2 / (2^b - 1)^2 for ||x||_1 <= C (paper 004, Appendix B)."""
    return 4 * int(dim) * float(clip) ** 2 / ((1 << int(bits)) - 1) ** 2


def dpsq_upload_epsilon(dim: int, epsilon1: float) -> float:
    """epsilon = d eps1 per device per round (paper 004, Lemma 1 sequential composition over coordinates)."""
    _check_eps(epsilon1)
    return int(dim) * float(epsilon1)


def qsgd_variance_bound(dim: int, levels: int) -> float:
    """q <= min(d / s^2, sqrt(d) / s), QSGD (Alistarh et al., Lemma 3.1) as quoted by paper 001 Sec. II."""
    if int(levels) < 1 or int(dim) < 1:
        raise ValueError(f"levels and dim must be integers >= 1, got levels={levels!r}, dim={dim!r}")
    return min(dim / levels ** 2, np.sqrt(dim) / levels)


def qsgd_relative_error(x, levels: int, bucket_size: int = 0) -> float:
    """Exact E||Q^s(x) - x||^2 / ||x||^2 = sum_i p_i (1 - p_i) ||x_b||^2 / (s^2 ||x||^2) with p_i = s |x_i| / ||x_b|| -
    floor(...) per bucket x_b (digest 001 section 3, the digest's derivation; one bucket = the whole vector)."""
    x = np.asarray(x, float).ravel()
    if int(levels) < 1:
        raise ValueError(f"levels must be an integer >= 1, got {levels!r}")
    size = x.size if bucket_size in (0, None) else int(bucket_size)
    rows = np.pad(x, (0, -x.size % size)).reshape(-1, size)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    scaled = np.divide(np.abs(rows) * levels, norms, out=np.zeros_like(rows), where=norms > 0)
    p = scaled - np.floor(scaled)
    total = float((x * x).sum())
    return float((p * (1 - p) * norms ** 2).sum() / levels ** 2 / total) if total > 0 else 0.0


# ---- paper 001: optimality-gap terms (Theorem 1, Lemma 1 and the gap difference) --------------------------

def qhetfed_error_floor(tau, gamma, *, lr, smooth, sigma2_over_b, num_devices, num_edges, q1, q2, het):
    """e of paper 001 Theorem 1: (L mu^2/2)(sigma^2/B)((L mu/N) C (1+q1) tau[(tau-1)/2 + gamma] + L mu gamma(gamma-1)/2
    + (1/N)(tau+gamma)(1+q2)(1+q1)) + mu (tau+gamma) G^2 / 2."""
    t, g, mu, lip, n = np.asarray(tau, float), np.asarray(gamma, float), lr, smooth, num_devices
    inner = (lip * mu / n * num_edges * (1 + q1) * t * ((t - 1) / 2 + g) + lip * mu * g * (g - 1) / 2
             + (t + g) * (1 + q2) * (1 + q1) / n)
    return lip * mu ** 2 / 2 * sigma2_over_b * inner + mu * (t + g) / 2 * het


def hier_local_qsgd_error_floor(tau, gamma, *, lr, smooth, sigma2_over_b, num_devices, num_edges, q1, q2, het):
    """e-bar of paper 001 Lemma 1 (Hier-Local-QSGD)."""
    t, g, mu, lip, n = np.asarray(tau, float), np.asarray(gamma, float), lr, smooth, num_devices
    inner = (lip * mu / n * num_edges * (1 + q1) * g ** 2 * t * (t - 1) / 2 + lip * mu * t * g * (g - 1) / 2
             + t * g * (1 + q2) * (1 + q1) / n)
    return lip * mu ** 2 / 2 * sigma2_over_b * inner + mu * t * g / 2 * het


def gap_difference_factors(tau, gamma) -> dict:
    """The (tau, gamma) factors of Delta = e-bar - e (paper 001, after Lemma 1): tau gamma - tau - gamma (in Delta^Q2
    and Delta^het), (gamma^2 - 1) tau (tau - 1)/2 - tau gamma (Delta^Q1), (tau - 1) gamma (gamma - 1)/2 (local comp)."""
    t, g = np.asarray(tau, float), np.asarray(gamma, float)
    return {"q2_het": t * g - t - g, "q1": (g ** 2 - 1) * t * (t - 1) / 2 - t * g, "local": (t - 1) * g * (g - 1) / 2}


def gap_difference(tau, gamma, *, lr, smooth, sigma2_over_b, num_devices, num_edges, q1, q2, het) -> dict:
    """Delta^Q1, Delta^Q2, Delta^local-comp, Delta^het and their sum Delta (paper 001, after Lemma 1)."""
    f, mu, lip, n = gap_difference_factors(tau, gamma), lr, smooth, num_devices
    parts = {
        "q1": lip ** 2 * mu ** 3 / (2 * n) * sigma2_over_b * num_edges * (1 + q1) * f["q1"],
        "q2": lip * mu ** 2 / (2 * n) * sigma2_over_b * (1 + q2) * (1 + q1) * f["q2_het"],
        "local": lip ** 2 * mu ** 3 / 2 * sigma2_over_b * f["local"],
        "het": mu / 2 * het * f["q2_het"],
    }
    parts["total"] = parts["q1"] + parts["q2"] + parts["local"] + parts["het"]
    return parts


def split_threshold(num_devices: int, num_edges: int) -> float:
    """Corollary 1 of paper 001: with tau + gamma fixed, more tau helps iff q1 < N/C - 1."""
    return num_devices / num_edges - 1
