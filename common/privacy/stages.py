"""Pipeline stages `fn(vec, rng, **params) -> vec` for clipping and noise (L2, L1, per layer, Gaussian, Laplace,
and paper 002's wavelet clip and noise), and the DP-FedAvg update sum.

Plan parameters travel as map<string, double>, so list-valued parameters of `clip_per_layer` may come
either as lists (`bounds`, `sizes`) or flattened as `bound_0, bound_1, ...` and `size_0, size_1, ...`;
with only `clip` and sizes, each of the p layers gets clip / sqrt(p) (total sensitivity = clip).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from hfl.common.pipeline import AGGREGATORS, VECTOR_STAGES

from .clipping import clip_l1, clip_l2, clip_per_layer, equal_layer_bounds
from .noise import add_gaussian, add_laplace
from .wavelet import wavelet_clip_stage, wavelet_gaussian_stage

# Noise stages: in a pipeline slot they would add noise that no DP event records, so the run's config refuses them
# there (privacy.* places and records DP noise, by the round plan's instructions); they stay registered as pure
# functions for tests and tools. Registering a noise shape (shapes.py) adds its stage here.
NOISE_STAGES = {"gaussian", "laplace", "wavelet_gaussian"}
VECTOR_STAGES.register("wavelet_gaussian")(wavelet_gaussian_stage)  # paper 002's noise on Haar coefficients
VECTOR_STAGES.register("wavelet_clip")(wavelet_clip_stage)  # ||W (.) H|| <= clip (weighted = 1) or ||H|| (0)


def _indexed(params: Mapping[str, float], prefix: str) -> list[float]:
    keys = sorted((int(k[len(prefix):]), v) for k, v in params.items()
                  if k.startswith(prefix) and k[len(prefix):].isdigit())
    if [i for i, _ in keys] != list(range(len(keys))):
        raise ValueError(f"{prefix}N parameters must be numbered 0..n-1 without gaps, got {[i for i, _ in keys]}")
    return [v for _, v in keys]


def _std(params: Mapping[str, float], direct: str) -> float:
    if direct in params:
        return float(params[direct])
    if "noise_multiplier" in params and "sensitivity" in params:
        return float(params["noise_multiplier"]) * float(params["sensitivity"])
    raise ValueError(f"noise stage needs `{direct}` or both `noise_multiplier` and `sensitivity`, got {sorted(params)}")


@VECTOR_STAGES.register("clip_l2")
def clip_l2_stage(vec: np.ndarray, rng: np.random.Generator, clip: float, **_: float) -> np.ndarray:
    return clip_l2(vec, clip)[0]


@VECTOR_STAGES.register("clip_l1")
def clip_l1_stage(vec: np.ndarray, rng: np.random.Generator, clip: float, **_: float) -> np.ndarray:
    return clip_l1(vec, clip)[0]


@VECTOR_STAGES.register("clip_per_layer")
def clip_per_layer_stage(vec: np.ndarray, rng: np.random.Generator, bounds: Sequence[float] | None = None,
                         sizes: Sequence[int] | None = None, **params: float) -> np.ndarray:
    sizes = list(sizes) if sizes is not None else [int(round(s)) for s in _indexed(params, "size_")]
    if bounds is None:
        bounds = _indexed(params, "bound_")
        if not bounds and "clip" in params:
            bounds = equal_layer_bounds(float(params["clip"]), len(sizes))
    return clip_per_layer(vec, bounds, sizes)[0]


@VECTOR_STAGES.register("gaussian")
def gaussian_stage(vec: np.ndarray, rng: np.random.Generator, **params: float) -> np.ndarray:
    return add_gaussian(vec, _std(params, "std"), rng)


@VECTOR_STAGES.register("laplace")
def laplace_stage(vec: np.ndarray, rng: np.random.Generator, **params: float) -> np.ndarray:
    return add_laplace(vec, _std(params, "scale"), rng)


@AGGREGATORS.register("fixed_denominator_sum")
def fixed_denominator_sum(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum_k p_k Delta_k, NOT normalised by sum p_k: DP-FedAvg's unbiased fixed-denominator estimator with
    p_k = d_k / (q_c d) (McMahan et al. 2018; paper 002 Eq. 4). Apply it to updates, never to models:
    sum_{k in S_t} p_k != 1 would rescale a model (digest 002 P9)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(vectors) == 0 or w.shape != (len(vectors),) or np.any(w < 0):
        raise ValueError("fixed_denominator_sum needs one weight >= 0 per vector and at least one vector")
    return np.einsum("k,kd->d", w, np.stack([np.asarray(v, dtype=np.float64) for v in vectors])).astype(np.float32)
