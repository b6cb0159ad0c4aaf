"""Payload normalisation, the activity test and truncated channel inversion (paper 003, sec. III-A).

E_1 is `scipy.special.exp1` (the paper writes "Ei"; `expi` is a different function, digest notation).
"""
from __future__ import annotations

import numpy as np
from scipy.special import exp1

SIGMA_FLOOR = 1e-12  # digest 10.7: a constant payload has sigma 0; divide by this instead


def ring_moment(alpha: float, r0: float, R: float) -> float:
    """E||y||^alpha for y uniform in the ring [r0, R] (digest 3.1): 2/(2+alpha) (R^{a+2}-r0^{a+2})/(R^2-r0^2)."""
    if not 0 <= r0 < R:
        raise ValueError(f"need 0 <= r0 < R, got r0={r0}, R={R}")
    return 2.0 / (2.0 + alpha) * (R ** (alpha + 2) - r0 ** (alpha + 2)) / (R ** 2 - r0 ** 2)


def inversion_rho(P_u: float, th1: float, alpha: float, r0: float, R: float) -> float:
    """rho of truncated channel inversion from the average power P_u (paper 003, eqs. 16-17):
    E|p|^2 = rho E_1(th1) E||y||^alpha = P_u."""
    if P_u <= 0:
        raise ValueError(f"P_u must be > 0, got {P_u}")
    if th1 <= 0:
        raise ValueError(f"th1 must be > 0 (E_1 diverges at 0), got {th1}")
    return P_u / (exp1(th1) * ring_moment(alpha, r0, R))


def normalise(payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise s_bar = (s - mu) / sigma over all d entries (paper 003, eqs. 12-13).

    Returns (s_bar [n, d], mu [n], sigma [n]); s_bar is float32 for float32 payloads (what a device sends; mu
    and sigma accumulate in float64), float64 otherwise. sigma is the population standard deviation, floored at
    SIGMA_FLOOR so a constant vector does not divide by zero.
    """
    s = np.atleast_2d(np.asarray(payloads))
    if s.dtype != np.float32:
        s = s.astype(np.float64)
    if s.shape[1] == 0:
        raise ValueError("payloads must have at least one entry per row")
    mu = s.mean(axis=1, dtype=np.float64)
    hi = mu.astype(s.dtype)
    bar = s - hi[:, None]  # exact for entries near mu (Sterbenz); mu's float32 rounding taken off next
    bar -= (mu - hi).astype(s.dtype)[:, None]
    sigma = np.maximum(np.sqrt(np.einsum("ij,ij->i", bar, bar, dtype=np.float64) / s.shape[1]), SIGMA_FLOOR)
    bar /= sigma.astype(s.dtype)[:, None]
    return bar, mu, sigma


def denormalise(s_bar: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    return np.atleast_2d(s_bar) * np.asarray(sigma)[:, None] + np.asarray(mu)[:, None]


def active_mask(own_fading: np.ndarray, cluster: np.ndarray, th1: float, eligible=None) -> np.ndarray:
    """Activity indicator |f_{y->x}|^2 >= th1 (paper 003, eq. 15), with the empty-cluster fallback of
    digest 2.3 / 10.11: if no device of a cluster passes, its device with the largest |f| transmits.

    eligible: devices still alive in the round (a failed th0 test drops a device, digest 2.3 step 7);
    only they can be active or be the fallback. A cluster with no eligible device stays empty."""
    if th1 < 0:
        raise ValueError(f"th1 must be >= 0, got {th1}")
    gain = np.abs(np.asarray(own_fading)) ** 2
    cluster = np.asarray(cluster, dtype=np.int64)
    eligible = np.ones(gain.shape, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    active = (gain >= th1) & eligible
    n_clusters = int(cluster.max()) + 1 if cluster.size else 0
    any_active = np.bincount(cluster, weights=active, minlength=n_clusters) > 0
    empty = np.flatnonzero(~any_active & (np.bincount(cluster, weights=eligible, minlength=n_clusters) > 0))
    if len(empty):
        order = np.lexsort((-np.where(eligible, gain, -1.0), cluster))  # by cluster, best eligible gain first
        first = np.searchsorted(cluster[order], empty)
        active[order[first]] = True
    return active


def inversion_coefficient(own_fading: np.ndarray, own_distance: np.ndarray, rho: float, alpha: float,
                          active: np.ndarray) -> np.ndarray:
    """p_y = sqrt(rho) / (||y||^{-alpha/2} f_{y->x}) for active devices, 0 otherwise (paper 003, eq. 15).
    Path loss is inverted but not part of the activity test; the instantaneous power is not capped."""
    f = np.asarray(own_fading)
    d = np.asarray(own_distance, dtype=np.float64)
    safe = np.where(active, f, 1.0)
    return np.where(active, np.sqrt(rho) * d ** (alpha / 2) / safe, 0.0)
