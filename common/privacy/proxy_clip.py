"""The clip norm from a public proxy set (privacy.clip_rule = "median_proxy"; paper 002 Sec. III-A, digest P13).

Paper 002 takes C as the median per-example gradient norm (after Abadi et al.), computed "during the initial rounds
of training using a public proxy dataset" and then frozen; it names no proxy set. Reading chosen here: the proxy is
privacy.clip_proxy images of the TEST split (public at the cloud, never trained on by a device), drawn without
replacement by a generator seeded from (run seed, "cloud", 0, 0, "clip_proxy"); the norms are taken at the initial
model (the cloud's seeded initialisation, before round 0), once, and C replaces privacy.clip for the whole run. The
norm is the one the clip bounds (P13): ||g|| for DP-SGD, ||H|| (paper clip) or ||W (.) H|| (sound clip) of the Haar
coefficients for DP-SGD-WAV. The evaluation still uses the whole test split: only the clip is chosen on the proxy.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hfl.common.seeding import numpy_rng

PURPOSE = "clip_proxy"


def proxy_indices(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """min(size, n) distinct indices of n, sorted."""
    if n < 1 or size < 1:
        raise ValueError(f"need n >= 1 and size >= 1, got n={n!r}, size={size!r}")
    return np.sort(rng.choice(n, size=min(size, n), replace=False))


def example_gradient_norms(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, layout=None,
                           calibration: str = "sound", chunk: int = 64) -> np.ndarray:
    """The per-example norm the clip bounds, for each (x_i, y_i), at the model's current parameters: ||g_i||, or with
    a wavelet layout the Haar coefficient norm of the calibration (per_example.example_norms)."""
    from .per_example import example_norms, per_example_gradients

    params = {k: v.detach() for k, v in model.named_parameters()}
    out = []
    for start in range(0, len(y), chunk):
        g, _ = per_example_gradients(model, params, x[start:start + chunk], y[start:start + chunk])
        norms = example_norms(g, layout, calibration, None)
        out.append(norms.reshape(-1).to(torch.float64).numpy())
    return np.concatenate(out)


def median_clip(norms: np.ndarray) -> float:
    """The median of per-example norms (Abadi et al. 2016's suggestion, paper 002's choice of C)."""
    norms = np.asarray(norms, dtype=np.float64)
    if norms.size == 0 or not np.all(np.isfinite(norms)):
        raise ValueError("median_clip needs finite norms")
    c = float(np.median(norms))
    if not c > 0:
        raise ValueError(f"the median per-example norm is {c!r}: no usable clip")
    return c


def resolve_clip(cfg, model: torch.nn.Module, data):
    """The config with privacy.clip set by its clip_rule: unchanged for "fixed"; for "median_proxy" the median norm
    over the proxy set at the model's (initial) parameters. `data` is the loaded dataset (common.data)."""
    if cfg.privacy.clip_rule != "median_proxy":
        return cfg
    from hfl.common import plans
    from hfl.common.shard import make_shard

    from .config import effective, wavelet_calibration
    from .wavelet import WaveletLayout

    p = effective(cfg.privacy, plans.ALGORITHMS.get(cfg.run.algorithm))
    idx = proxy_indices(len(data.y_test), p.clip_proxy, numpy_rng(cfg.run.seed, "cloud", 0, 0, PURPOSE))
    shard = make_shard(data.x_test[idx], data.y_test[idx], data.mean, data.std)
    x, y = shard.batch(torch.arange(len(shard)))
    layout = WaveletLayout([q.numel() for q in model.parameters()], p.wavelet_scope) \
        if p.mechanism == "wavelet" else None
    norms = example_gradient_norms(model, x, y, layout, wavelet_calibration(p))
    return cfg.replace(privacy=dataclasses.replace(cfg.privacy, clip=median_clip(norms)))
