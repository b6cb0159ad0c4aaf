"""Partitioners: pure functions (labels, devices, rng, data config) -> one index array per device.

Devices are numbered edge by edge (device g belongs to edge g // devices_per_edge). Partitioners that need
the clusters (cluster-level skew, paper 001's mixed sets, hierarchical Dirichlet) are marked `by_edge` and
get `edges=`. Label-skew partitioners state what each device wants as a weight matrix W[device, label] and
every label's samples are dealt out, without replacement, in proportion to its column, so shards are disjoint; a
shard shorter than its drawn sample count (data.samples_per_device) is topped up from other devices' samples of its
own labels, so shards then overlap across devices but never repeat a sample within one (digest 001 section 10).
`data_report` summarises a partition per device and per edge (the run directory's data.json).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .registry import Registry

PARTITIONERS: Registry = Registry("partition")
SIZE_LAWS = ("uniform", "power-law")
POWER_LAW_RANGE = (100, 1000)  # paper 003: p(n) ~ n^-2 on [100, 1000]
MIXED_KINDS = ("iid", "classes", "half")
PAPER_MIXED = ("iid", "classes", "half")  # paper 001: set 1 i.i.d., set 2 two classes, set 3 half and half


def by_edge(fn):
    fn.by_edge = True
    return fn


def power_law_counts(n: int, lo: int, hi: int, rng: np.random.Generator, exponent: float = 2.0) -> np.ndarray:
    """n sizes with p(s) ~ s^-exponent on [lo, hi] by inverse transform (paper 003: exponent 2, [100, 1000],
    s = 1 / (1/lo - u (1/lo - 1/hi)))."""
    u = rng.random(n)
    if exponent == 1.0:
        s = lo * (hi / lo) ** u
    else:
        a = 1.0 - exponent
        s = (lo ** a + u * (hi ** a - lo ** a)) ** (1.0 / a)
    return np.clip(np.floor(s).astype(np.int64), lo, hi)


def sample_counts(n_devices: int, lo: int, hi: int, rng: np.random.Generator, law: str = "uniform") -> np.ndarray | None:
    """Per-device sample counts on [lo, hi]: uniform (paper 001: [500, 1500]) or power law (paper 003, [100, 1000]
    when the range is unset); None = split all."""
    if law not in SIZE_LAWS:
        raise ValueError(f"data.sample_sizes must be one of {SIZE_LAWS}, got {law!r}")
    if lo <= 0 and hi <= 0:
        if law == "uniform":
            return None
        lo, hi = POWER_LAW_RANGE
    if lo < 1 or hi < lo:
        raise ValueError(f"data.samples_per_device must satisfy 1 <= lo <= hi, got [{lo}, {hi}]")
    if law == "power-law":
        return power_law_counts(n_devices, lo, hi, rng)
    return rng.integers(lo, hi + 1, size=n_devices)


def _counts(n_devices: int, rng: np.random.Generator, cfg) -> np.ndarray | None:
    return sample_counts(n_devices, *cfg.samples_per_device, rng, getattr(cfg, "sample_sizes", "uniform"))


def _top_up(pool: np.ndarray, count: int, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`pool` plus count - len(pool) samples of the pool's own labels, in the pool's label shares, drawn without
    replacement from the samples outside it (other devices' shards): overlap across devices, never a sample twice
    on one device (digest 001 section 10, "Data budget"). Capped at the samples those labels have."""
    classes, held = np.unique(labels[pool], return_counts=True)
    outside = np.ones(len(labels), dtype=bool)
    outside[pool] = False
    cand = np.flatnonzero(outside & np.isin(labels, classes))
    which = np.searchsorted(classes, labels[cand])
    weight = (held / held.sum() / np.maximum(np.bincount(which, minlength=len(classes)), 1))[which]
    need = min(int(count) - len(pool), len(cand))
    extra = rng.choice(cand, size=need, replace=False, p=weight / weight.sum()) if need > 0 else cand[:0]
    return np.sort(np.concatenate([pool, extra]))


def _take(pools: list[np.ndarray], counts: np.ndarray | None, rng: np.random.Generator,
          labels: np.ndarray) -> list[np.ndarray]:
    """Each pool cut to its drawn count (without replacement), or topped up from outside it when short (_top_up)."""
    if counts is None:
        return [np.sort(p) for p in pools]
    out = []
    for pool, count in zip(pools, counts):
        if len(pool) == 0:
            out.append(pool)
        elif count > len(pool):
            out.append(_top_up(pool, int(count), labels, rng))
        else:
            out.append(np.sort(rng.choice(pool, size=int(count), replace=False)))
    return out


def balanced_draw(rows: int, k: int, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[rows, k]: each row k distinct members of `pool` drawn at random among the least used so far, so every
    member is used about rows k / len(pool) times (each label gets holders, shards stay about equal)."""
    pool = np.asarray(pool)
    if k > len(pool):
        raise ValueError(f"cannot draw {k} distinct labels out of {len(pool)}")
    used = np.zeros(len(pool))
    out = np.empty((rows, k), dtype=pool.dtype)
    for r in range(rows):
        pick = np.lexsort((rng.random(len(pool)), used))[:k]
        used[pick] += 1
        out[r] = pool[pick]
    return out


def random_draw(rows: int, k: int, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[rows, k]: each row k distinct members of `pool` at random, every member dealt equally often (+-1), as a
    shuffled deck of rows x k label shards (McMahan et al.'s sorted shards) dealt without repeats in a row: row by
    row, the members whose copies left equal the rows left are taken (else the deal could not finish), the rest
    drawn without replacement in proportion to their copies left. Equal holders per label give equal shards."""
    pool = np.asarray(pool)
    n = len(pool)
    if k > n:
        raise ValueError(f"cannot draw {k} distinct labels out of {n}")
    full, extra = divmod(rows * k, n)
    left = np.full(n, full)
    left[rng.permutation(n)[:extra]] += 1
    picks = np.empty((rows, k), dtype=np.int64)
    for r in range(rows):
        must = np.flatnonzero(left == rows - r)
        free = np.flatnonzero((left > 0) & (left < rows - r))
        drawn = rng.choice(free, size=k - len(must), replace=False, p=left[free] / left[free].sum()) \
            if k > len(must) else np.zeros(0, dtype=np.int64)
        row = np.concatenate([must, drawn])
        left[row] -= 1
        picks[r] = row
    return pool[np.sort(picks, axis=1)]


def independent_draw(rows: int, k: int, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[rows, k]: each row k distinct members of `pool` drawn uniformly and independently of the other rows (paper
    001's literal reading, digest 001 section 10: a label may have many holders or none; nothing is balanced)."""
    pool = np.asarray(pool)
    if k > len(pool):
        raise ValueError(f"cannot draw {k} distinct labels out of {len(pool)}")
    return np.sort(pool[np.argsort(rng.random((rows, len(pool))), axis=1)[:, :k]], axis=1)


LABEL_DRAWS = {"deck": random_draw, "independent": independent_draw}


def _draw(cfg):
    return LABEL_DRAWS[getattr(cfg, "class_draw", "deck")]


def allocate(labels: np.ndarray, shares: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Deal each label's samples (shuffled) to the devices in proportion to shares[:, label] (columns in the order
    of np.unique(labels)); disjoint; a column of zeros leaves that label unused."""
    classes = np.unique(labels)
    n_devices = shares.shape[0]
    pieces: list[list[np.ndarray]] = [[] for _ in range(n_devices)]
    for j, c in enumerate(classes):
        col = shares[:, j]
        if col.sum() <= 0:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = np.floor(np.cumsum(col)[:-1] / col.sum() * len(idx) + 1e-9).astype(int)
        for dev, part in enumerate(np.split(idx, cuts)):
            if len(part):
                pieces[dev].append(part)
    return [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in pieces]


def _deal(labels: np.ndarray, wants: np.ndarray, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    """Shards for label-preference rows `wants` [devices, classes] (each row sums to 1): each label dealt in
    proportion to the rows' weights on it (times the drawn sample counts, if any), then subsampled to those counts.
    With labels dealt equally often (random_draw) the devices' shards come out about equal."""
    counts = _counts(len(wants), rng, cfg)
    shares = wants if counts is None else wants * counts[:, None]
    return _take(allocate(labels, shares, rng), counts, rng, labels)


def _onehot_rows(picks: np.ndarray, classes: np.ndarray) -> np.ndarray:
    rows = np.zeros((len(picks), len(classes)))
    np.put_along_axis(rows, np.searchsorted(classes, picks), 1.0, axis=1)
    return rows


def _k(cfg, classes: np.ndarray) -> int:
    k = cfg.classes_per_device
    if k > len(classes):
        raise ValueError(f"data.classes_per_device={k} but the dataset has {len(classes)} classes")
    return k


def _per_edge(n_devices: int, edges: int) -> int:
    if edges < 1 or n_devices % edges:
        raise ValueError(f"{n_devices} devices do not split into {edges} equal clusters")
    return n_devices // edges


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    order = rng.permutation(len(labels))
    counts = _counts(n_devices, rng, cfg)
    if counts is None:
        return [np.sort(part) for part in np.array_split(order, n_devices)]
    if counts.sum() <= len(labels):
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return [np.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return [np.sort(rng.choice(len(labels), size=int(c), replace=False)) if c <= len(labels)
            else np.sort(rng.choice(len(labels), size=int(c), replace=True)) for c in counts]


@PARTITIONERS.register("classes")
def k_classes(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    """Each device holds exactly k distinct labels drawn at random, every label by about as many devices, with
    equal disjoint shards (digest 000 section 10; paper 001's non-i.i.d.); data.class_draw = "independent": each
    device draws its k labels on its own (paper 001's literal reading; shards may then overlap across devices)."""
    classes = np.unique(labels)
    picks = _draw(cfg)(n_devices, _k(cfg, classes), classes, rng)
    return _deal(labels, _onehot_rows(picks, classes), rng, cfg)


@PARTITIONERS.register("non-iid1")
def non_iid1(labels, n_devices, rng, cfg):
    """Paper 001's non-i.i.d.1: two random classes per device."""
    return k_classes(labels, n_devices, rng, dataclasses.replace(cfg, classes_per_device=2))


@PARTITIONERS.register("non-iid2")
def non_iid2(labels, n_devices, rng, cfg):
    """Paper 001's non-i.i.d.2: one random class per device."""
    return k_classes(labels, n_devices, rng, dataclasses.replace(cfg, classes_per_device=1))


@PARTITIONERS.register("classes-rr")
def k_classes_round_robin(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg) -> list[np.ndarray]:
    """Deterministic round robin: device i holds perm[(i k + j) mod C], j < k; a label's samples are split evenly
    among its holders. With 5 devices per edge and k = 2 every cluster holds all labels."""
    classes = np.unique(labels)
    k = _k(cfg, classes)
    perm = rng.permutation(classes)
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for dev in range(n_devices):
        for j in range(k):
            holders[int(perm[(dev * k + j) % len(classes)])].append(dev)
    pools: list[list[np.ndarray]] = [[] for _ in range(n_devices)]
    for c, devs in holders.items():
        if not devs:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for dev, part in zip(devs, np.array_split(idx, len(devs))):
            pools[dev].append(part)
    merged = [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in pools]
    return _take(merged, _counts(n_devices, rng, cfg), rng, labels)


@PARTITIONERS.register("edge-classes")
@by_edge
def edge_classes(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg, edges: int = 1) -> list[np.ndarray]:
    """Cluster-level label skew: each edge holds data.classes_per_edge labels (random, balanced over the edges:
    disjoint while edges x classes_per_edge <= classes),
    and each of its devices draws its classes_per_device labels from the edge's."""
    classes = np.unique(labels)
    m, k, per_edge = _per_edge(n_devices, edges), _k(cfg, classes), cfg.classes_per_edge
    if not k <= per_edge <= len(classes):
        raise ValueError(f"data.classes_per_edge={per_edge} must be within [classes_per_device={k}, {len(classes)}]")
    edge_labels = balanced_draw(edges, per_edge, classes, rng)
    picks = np.concatenate([_draw(cfg)(m, k, edge_labels[e], rng) for e in range(edges)])
    return _deal(labels, _onehot_rows(picks, classes), rng, cfg)


def mixed_kinds(cfg, edges: int) -> tuple[str, ...]:
    spec = tuple(getattr(cfg, "edge_partitions", ()) or ())
    if not spec:
        return tuple(PAPER_MIXED[e % len(PAPER_MIXED)] for e in range(edges))
    bad = [s for s in spec if s not in MIXED_KINDS]
    if bad or len(spec) != edges:
        raise ValueError(f"data.edge_partitions must name one of {MIXED_KINDS} per edge ({edges}), got {list(spec)}")
    return spec


@PARTITIONERS.register("mixed")
@by_edge
def mixed(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg, edges: int = 1) -> list[np.ndarray]:
    """Paper 001's mixed sets, one kind per edge (data.edge_partitions; default iid, classes, half, repeated):
    iid = every device i.i.d.; classes = every device classes_per_device random labels; half = the edge's first
    half of devices i.i.d., the rest k-class."""
    classes = np.unique(labels)
    m, k = _per_edge(n_devices, edges), _k(cfg, classes)
    skewed = np.zeros(n_devices, dtype=bool)
    for e, kind in enumerate(mixed_kinds(cfg, edges)):
        if kind == "classes":
            skewed[e * m:(e + 1) * m] = True
        elif kind == "half":
            skewed[e * m + m // 2:(e + 1) * m] = True
    wants = np.ones((n_devices, len(classes))) / len(classes)
    if skewed.any():
        wants[skewed] = _onehot_rows(_draw(cfg)(int(skewed.sum()), k, classes, rng), classes) / k
    return _deal(labels, wants, rng, cfg)


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
    return _take(_no_empty([np.concatenate(p) for p in pools]), _counts(n_devices, rng, cfg), rng, labels)


def _no_empty(merged: list[np.ndarray]) -> list[np.ndarray]:
    for dev in np.flatnonzero(np.array([len(m) for m in merged]) == 0):
        donor = int(np.argmax([len(m) for m in merged]))
        merged[dev], merged[donor] = merged[donor][:1], merged[donor][1:]
    return merged


@PARTITIONERS.register("hier-dirichlet")
@by_edge
def hier_dirichlet(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg, edges: int = 1) -> list[np.ndarray]:
    """Hierarchical Dirichlet: per label, edge shares ~ Dir(data.edge_alpha) and, within each edge, device shares
    ~ Dir(data.dirichlet_alpha); every device keeps at least one sample."""
    classes = np.unique(labels)
    m = _per_edge(n_devices, edges)
    edge_share = rng.dirichlet(np.full(edges, cfg.edge_alpha), size=len(classes))  # [C, E]
    within = rng.dirichlet(np.full(m, cfg.dirichlet_alpha), size=(len(classes), edges))  # [C, E, m]
    shares = (edge_share[:, :, None] * within).reshape(len(classes), n_devices).T
    return _take(_no_empty(allocate(labels, shares, rng)), _counts(n_devices, rng, cfg), rng, labels)


def partition(labels: np.ndarray, n_devices: int, rng: np.random.Generator, cfg, edges: int = 1) -> list[np.ndarray]:
    fn = PARTITIONERS.get(cfg.partition)
    parts = fn(labels, n_devices, rng, cfg, edges=edges) if getattr(fn, "by_edge", False) else fn(labels, n_devices, rng, cfg)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(f"partition {cfg.partition!r} left devices {empty[:5]} without data; use fewer devices")
    return parts


def data_report(labels: np.ndarray, parts: list[np.ndarray], edges: int, num_classes: int | None = None) -> dict:
    """Per device and per edge: sample count and label histogram (data.json)."""
    c = int(num_classes or int(labels.max()) + 1)
    hist = np.stack([np.bincount(labels[p], minlength=c)[:c] for p in parts])  # [devices, classes]
    m = _per_edge(len(parts), edges)
    edge_hist = hist.reshape(edges, m, c).sum(axis=1)
    return {"num_classes": c, "devices_per_edge": m,
            "devices": [{"device": g, "edge": g // m, "samples": int(h.sum()), "labels": h.tolist()}
                        for g, h in enumerate(hist)],
            "edges": [{"edge": e, "samples": int(h.sum()), "labels": h.tolist(),
                       "classes_held": int((h > 0).sum())} for e, h in enumerate(edge_hist)]}
