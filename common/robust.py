"""Robust aggregation rules, registered beside `weighted_mean` (config `pipeline.aggregate`).

They bound what one finite but absurd update can do to an aggregate. Parameters come from
`[pipeline.params.NAME]`; every run records the rule it used in `summary.json`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .pipeline import AGGREGATORS


def _stack(vectors: Sequence[np.ndarray]) -> np.ndarray:
    if len(vectors) == 0:
        raise ValueError("aggregation needs at least one vector")
    return np.stack([np.asarray(v, dtype=np.float64) for v in vectors])


@AGGREGATORS.register("norm_bound")
def norm_bound(vectors: Sequence[np.ndarray], weights: Sequence[float], bound: float = 0.0,
               multiple: float = 3.0) -> np.ndarray:
    """Weighted mean after scaling every update to L2 norm <= bound (TFF's norm bounding); with
    bound = 0 the bound is `multiple` x the median norm of the cohort, so no fixed scale is needed."""
    x = _stack(vectors)
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError("norm_bound needs positive weights")
    norms = np.linalg.norm(x, axis=1)
    limit = bound if bound > 0 else multiple * float(np.median(norms))
    scale = np.minimum(1.0, limit / np.maximum(norms, 1e-30)) if limit > 0 else np.zeros_like(norms)
    return ((w * scale) @ x / w.sum()).astype(np.float32)


@AGGREGATORS.register("coordinate_median")
def coordinate_median(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Coordinate-wise median (Yin et al. 2018; Flower's FedMedian); weights are ignored."""
    return np.median(_stack(vectors), axis=0).astype(np.float32)


@AGGREGATORS.register("trimmed_mean")
def trimmed_mean(vectors: Sequence[np.ndarray], weights: Sequence[float], beta: float = 0.1) -> np.ndarray:
    """Coordinate-wise mean after dropping the floor(beta * n) largest and smallest values of every
    coordinate (Yin et al. 2018; Flower's FedTrimmedAvg); weights are ignored."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed_mean: beta must be in [0, 0.5), got {beta}")
    x = np.sort(_stack(vectors), axis=0)
    k = int(np.floor(beta * len(x)))
    return x[k:len(x) - k].mean(axis=0).astype(np.float32)


def aggregate(name: str, params: Mapping[str, Mapping[str, float]], vectors: Sequence[np.ndarray],
              weights: Sequence[float]) -> np.ndarray:
    """Apply the rule `name` with its `[pipeline.params.NAME]` parameters."""
    return AGGREGATORS.get(name)(vectors, weights, **dict(params.get(name, {})))


def outliers(vectors: Sequence[np.ndarray], max_ratio: float) -> dict[int, str]:
    """The uploads of a phase to leave out, by index, with the reason: a norm over max_ratio x the median norm of the
    others (or not finite). With fewer than two uploads, or max_ratio = 0, none; nor where the others' median is 0
    (devices that sent zero updates give no scale to judge by)."""
    if max_ratio <= 0 or len(vectors) < 2:
        return {}
    norms = np.array([float(np.linalg.norm(np.asarray(v, dtype=np.float64))) for v in vectors])
    out = {}
    for i, norm in enumerate(norms):
        others = float(np.median(np.delete(norms, i)))
        if not np.isfinite(norm) or (np.isfinite(others) and others > 0 and norm > max_ratio * others):
            out[i] = f"its norm {norm:.3g} is over {max_ratio:g} x the median {others:.3g} of the others " \
                     f"(aggregation.max_member_ratio)"
    return out


def refuse_install(new: np.ndarray, old: np.ndarray, max_ratio: float) -> str:
    """Why the cloud must not install `new` as the global model ("" if it may): a non-finite model, or one that moved
    by more than max_ratio * max(1, ||old||) (the last line of defence against an exploding aggregate)."""
    if not np.isfinite(new).all():
        return f"{int((~np.isfinite(new)).sum())} non-finite values"
    if max_ratio > 0:
        moved = float(np.linalg.norm(new.astype(np.float64) - old))
        limit = max_ratio * max(1.0, float(np.linalg.norm(old.astype(np.float64))))
        if not moved <= limit:
            return f"the model moved by {moved:.3g}, over {limit:.3g} (aggregation.max_update_ratio)"
    return ""
