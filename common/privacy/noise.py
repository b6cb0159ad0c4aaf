"""Additive noise mechanisms, drawn only from the caller's generator."""
from __future__ import annotations

import numpy as np


def _float_vector(vec: np.ndarray) -> np.ndarray:
    arr = np.asarray(vec)
    if arr.ndim != 1:
        raise ValueError(f"vec must be a 1-D vector, got shape {arr.shape}")
    return arr


def _out_dtype(arr: np.ndarray):
    return arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64


def add_gaussian(vec: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """vec + N(0, std^2 I): the Gaussian mechanism (paper 000 Eqs. 10-12; paper 002 Eq. 2 in its standard
    form sigma^2 S_f^2, digest P3). `std` is the per-coordinate standard deviation (noise multiplier x sensitivity)."""
    if not (std >= 0 and np.isfinite(std)):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    arr = _float_vector(vec)
    if std == 0:
        return arr.copy()
    return (arr.astype(np.float64) + rng.normal(0.0, std, size=arr.shape)).astype(_out_dtype(arr))


def add_laplace(vec: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """vec + Lap(0, scale) per coordinate (density exp(-|x|/b)/2b, std = sqrt(2) b): the Laplace mechanism,
    scale = L1 sensitivity / epsilon (Dwork & Roth Def. 3.3; the baseline of paper 004)."""
    if not (scale >= 0 and np.isfinite(scale)):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    arr = _float_vector(vec)
    if scale == 0:
        return arr.copy()
    return (arr.astype(np.float64) + rng.laplace(0.0, scale, size=arr.shape)).astype(_out_dtype(arr))
