"""An example plugin: a model, a dataset and a pipeline stage of your own, registered by name.

Run it from the repository root (a plugin only has to be importable: beside your experiment, or installed):

    hfl run examples/tiny_plugin.toml

`run.plugins = ["examples/tiny_plugin.py"]` in that config (a file, or an importable module name) makes every process (the launcher, the cloud, the edges,
the device hosts, a sweep, a container given HFL_PLUGINS) import this module before the config is checked, so
"tiny-mlp", "blobs" and "clip_linf" are valid names everywhere. The registration API is in docs/plugins.md.
"""
from __future__ import annotations

import logging
import math

import numpy as np
from torch import nn

from hfl.common.data import DATASETS, Dataset
from hfl.common.models import MODELS
from hfl.common.pipeline import VECTOR_STAGES
from hfl.common.seeding import numpy_rng


@MODELS.register("tiny-mlp")
def tiny_mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """fn(input_shape (C, H, W), num_classes) -> torch module; the cloud initialises it from the run seed."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 32), nn.ReLU(), nn.Linear(32, num_classes))


@DATASETS.register("blobs")
def blobs(cfg) -> Dataset:
    """fn(DataSection) -> Dataset of uint8 images (N, C, H, W) and int64 labels: four Gaussian blobs drawn as 8x8
    images, seeded so that every process builds the same arrays (`data.synthetic_samples` of them)."""
    rng = numpy_rng(0, "data", "blobs")
    classes, n = 4, cfg.synthetic_samples
    centres = rng.uniform(40, 215, size=(classes, 64))
    y = rng.integers(0, classes, size=n)
    x = np.clip(centres[y] + rng.normal(0, 30, size=(n, 64)), 0, 255).astype(np.uint8).reshape(n, 1, 8, 8)
    n_test = max(1, int(round(n * cfg.test_fraction)))
    return Dataset("blobs", x[n_test:], y[n_test:].astype(np.int64), x[:n_test], y[:n_test].astype(np.int64), classes,
                   mean=(0.5,), std=(0.25,))


_said: list = []


@VECTOR_STAGES.register("clip_linf")
def clip_linf(vec: np.ndarray, rng: np.random.Generator, bound: float = 1.0) -> np.ndarray:
    """A pipeline stage is a pure fn(vec, rng, **params) -> vec; its parameters come from
    [pipeline.params.clip_linf] and are checked against this signature before any process starts."""
    if not bound > 0:
        raise ValueError(f"clip_linf: bound must be > 0, got {bound!r}")
    if not _said:
        _said.append(True)
        logging.getLogger("hfl.tiny_plugin").info("clip_linf: clipping uploads to [-%g, %g]", bound, bound)
    return np.clip(vec, -bound, bound).astype(np.float32)
