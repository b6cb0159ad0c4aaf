"""Partitioners: pure functions (labels, devices, rng, data config) -> one index array per device."""
from __future__ import annotations

import numpy as np

from .registry import Registry

PARTITIONERS: Registry = Registry("partition")


def sample_counts(n_devices: int, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray | None:
    """Per-device sample counts drawn uniformly from [lo, hi] (paper 001: [500, 1500]); None = split all."""
    if lo <= 0 and hi <= 0:
        return None
    if lo < 1 or hi < lo:
        raise ValueError(f"data.samples_per_device must satisfy 1 <= lo <= hi, got [{lo}, {hi}]")
    return rng.integers(lo, hi + 1, size=n_devices)


def _take(pools: list[np.ndarray], counts: np.ndarray | None, rng: np.random.Generator) -> list[np.ndarray]:
    if counts is None:
        return [np.sort(p) for p in pools]
    out = []
    for pool, count in zip(pools, counts):
        if len(pool) == 0:
            out.append(pool)
            continue
        replace = count > len(pool)
        out.append(np.sort(rng.choice(pool, size=int(count), replace=replace)))
    return out


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    order = rng.permutation(len(labels))
    counts = sample_counts(n_devices, *cfg.samples_per_device, rng)
    if counts is None:
        return [np.sort(part) for part in np.array_split(order, n_devices)]
    if counts.sum() <= len(labels):
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return [np.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return [np.sort(rng.choice(len(labels), size=int(c), replace=False)) if c <= len(labels)
            else np.sort(rng.choice(len(labels), size=int(c), replace=True)) for c in counts]


@PARTITIONERS.register("classes")
def k_classes(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    """Each device holds exactly k distinct labels; a label's samples are split evenly among its holders."""
    classes = np.unique(labels)
    k = cfg.classes_per_device
    if k > len(classes):
        raise ValueError(f"data.classes_per_device={k} but the dataset has {len(classes)} classes")
    perm = rng.permutation(classes)
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    device_classes = []
    for dev in range(n_devices):
        mine = [int(perm[(dev * k + j) % len(classes)]) for j in range(k)]
        device_classes.append(mine)
        for c in mine:
            holders[c].append(dev)
    pools: list[list[np.ndarray]] = [[] for _ in range(n_devices)]
    for c, devs in holders.items():
        if not devs:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for dev, part in zip(devs, np.array_split(idx, len(devs))):
            pools[dev].append(part)
    merged = [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in pools]
    return _take(merged, sample_counts(n_devices, *cfg.samples_per_device, rng), rng)


@PARTITIONERS.register("dirichlet")
def dirichlet(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    """Per label, device shares ~ Dirichlet(alpha); every device keeps at least one sample."""
    pools: list[list[np.ndarray]] = [[] for _ in range(n_devices)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(n_devices, cfg.dirichlet_alpha))
        cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
        for dev, part in enumerate(np.split(idx, cuts)):
            pools[dev].append(part)
    merged = [np.concatenate(p) for p in pools]
    sizes = np.array([len(m) for m in merged])
    for dev in np.flatnonzero(sizes == 0):
        donor = int(np.argmax([len(m) for m in merged]))
        merged[dev], merged[donor] = merged[donor][:1], merged[donor][1:]
    return _take(merged, sample_counts(n_devices, *cfg.samples_per_device, rng), rng)


def partition(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    parts = PARTITIONERS.get(cfg.partition)(labels, n_devices, rng, cfg)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(f"partition {cfg.partition!r} left devices {empty[:5]} without data; use fewer devices")
    return parts
