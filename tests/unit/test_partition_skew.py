"""Label skew at device and cluster level (issue 19): random k-class draws, cluster-level skew, paper 001's mixed
and non-i.i.d. sets, paper 003's power-law sizes, hierarchical Dirichlet, and the run directory's data report."""
import json

import numpy as np
import pytest

from hfl.common import config as c
from hfl.common.partition import PARTITIONERS, data_report, partition, power_law_counts
from hfl.common.rundir import plot_data_report, write_data_report

LABELS = np.repeat(np.arange(10), 300)


def cfg(*overrides):
    return c.load(None, list(overrides)).data


def rng(seed=0):
    return np.random.default_rng(seed)


def label_sets(parts):
    return [frozenset(np.unique(LABELS[p]).tolist()) for p in parts]


def edge_sets(parts, edges):
    m = len(parts) // edges
    return [frozenset(np.unique(LABELS[np.concatenate(parts[e * m:(e + 1) * m])]).tolist()) for e in range(edges)]


def assert_disjoint(parts, every_sample=True):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)
    if every_sample:
        assert len(allidx) == len(LABELS)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_random_classes_exactly_k_disjoint_balanced(k):
    parts = partition(LABELS, 20, rng(), cfg("data.partition=classes", f"data.classes_per_device={k}"), edges=4)
    assert all(len(s) == k for s in label_sets(parts))
    assert_disjoint(parts)
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() - sizes.min() <= 2  # equal shards
    holders = np.bincount([lab for s in label_sets(parts) for lab in s], minlength=10)
    assert holders.max() - holders.min() <= 1  # every label dealt about equally often


def test_random_classes_are_drawn_not_round_robin():
    """Round robin with 5 devices per edge and k = 2 makes every cluster hold all 10 labels; the random draw
    gives clusters that differ."""
    rr = partition(LABELS, 10, rng(), cfg("data.partition=classes-rr"), edges=2)
    assert edge_sets(rr, 2) == [frozenset(range(10))] * 2
    draws = [label_sets(partition(LABELS, 10, rng(s), cfg("data.partition=classes"), edges=2)) for s in range(6)]
    assert len({tuple(d) for d in draws}) > 1  # the seed changes the draw
    assert any(edge_sets(partition(LABELS, 10, rng(s), cfg("data.partition=classes"), edges=2), 2)
               != [frozenset(range(10))] * 2 for s in range(6))
    a = partition(LABELS, 10, rng(7), cfg("data.partition=classes"))
    b = partition(LABELS, 10, rng(7), cfg("data.partition=classes"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_edge_classes_gives_clusters_different_label_sets():
    parts = partition(LABELS, 15, rng(), cfg("data.partition=edge-classes", "data.classes_per_edge=3",
                                             "data.classes_per_device=2"), edges=3)
    report = data_report(LABELS, parts, 3)
    held = [frozenset(np.flatnonzero(e["labels"]).tolist()) for e in report["edges"]]
    assert all(len(s) == 3 for s in held) and len(set(held)) == 3
    assert all(s.isdisjoint(t) for i, s in enumerate(held) for t in held[i + 1:])  # 3 x 3 of 10: no overlap
    for g, s in enumerate(label_sets(parts)):
        assert len(s) == 2 and s <= held[g // 5]
    assert_disjoint(parts, every_sample=False)
    with pytest.raises(ValueError, match="classes_per_edge=1"):
        partition(LABELS, 15, rng(), cfg("data.partition=edge-classes", "data.classes_per_edge=1"), edges=3)


def test_mixed_matches_paper_001_per_set():
    parts = partition(LABELS, 60, rng(), cfg("data.partition=mixed"), edges=3)
    sets = label_sets(parts)
    assert all(len(s) == 10 for s in sets[:20])  # set 1: i.i.d.
    assert all(len(s) == 2 for s in sets[20:40])  # set 2: two classes per device
    assert all(len(s) == 10 for s in sets[40:50]) and all(len(s) == 2 for s in sets[50:60])  # set 3: 10 + 10
    assert_disjoint(parts)
    iid_hist = np.bincount(LABELS[parts[0]], minlength=10)
    assert iid_hist.min() >= 0.5 * iid_hist.max()  # an i.i.d. device is close to uniform
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() <= 1.1 * sizes.min()  # every device about the same size
    custom = partition(LABELS, 6, rng(), cfg("data.partition=mixed", 'data.edge_partitions=["classes", "iid"]',
                                             "data.classes_per_device=1"), edges=2)
    assert [len(s) for s in label_sets(custom)] == [1, 1, 1, 10, 10, 10]
    with pytest.raises(ValueError, match="edge_partitions"):
        partition(LABELS, 6, rng(), cfg("data.partition=mixed", 'data.edge_partitions=["iid"]'), edges=2)


@pytest.mark.parametrize("name,k", [("non-iid1", 2), ("non-iid2", 1)])
def test_paper_001_non_iid_sets(name, k):
    parts = partition(LABELS, 20, rng(), cfg(f"data.partition={name}", "data.classes_per_device=5"), edges=2)
    assert all(len(s) == k for s in label_sets(parts))
    assert_disjoint(parts)


def test_power_law_exponent_and_moments():
    """p(n) ~ n^-2 on [100, 1000] (paper 003): the maximum-likelihood exponent is 2 within 0.05, mean ~257,
    median ~182 (digest 003 section 6)."""
    n = power_law_counts(40000, 100, 1000, rng(1)).astype(float) + 0.5  # floor -> centre of the unit bin
    assert n.min() >= 100 and n.max() <= 1001
    grid = np.linspace(1.5, 2.5, 201)
    loglik = [len(n) * np.log((1 - e) / (1000.5 ** (1 - e) - 100 ** (1 - e))) - e * np.log(n).sum() for e in grid]
    assert abs(grid[int(np.argmax(loglik))] - 2.0) <= 0.05
    assert abs(n.mean() - 257) / 257 < 0.03 and abs(np.median(n) - 182) / 182 < 0.03


def test_power_law_sizes_in_partitions():
    labels = np.repeat(np.arange(10), 3000)
    parts = partition(labels, 40, rng(), cfg("data.sample_sizes=power-law", "data.partition=classes"), edges=4)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 100 and sizes.max() <= 1000 and np.median(sizes) < sizes.mean()
    assert len(np.unique(np.concatenate(parts))) == sizes.sum()  # room enough: still disjoint
    iid = partition(labels, 40, rng(), cfg("data.sample_sizes=power-law", "data.samples_per_device=[200, 400]"))
    assert all(200 <= len(p) <= 400 for p in iid)


def test_hier_dirichlet_edge_alpha_sets_cluster_skew():
    def cluster_skew(edge_alpha):
        parts = partition(LABELS, 20, rng(2), cfg("data.partition=hier-dirichlet", f"data.edge_alpha={edge_alpha}",
                                                  "data.dirichlet_alpha=10"), edges=4)
        assert_disjoint(parts) and all(len(p) for p in parts)
        hist = np.array([e["labels"] for e in data_report(LABELS, parts, 4)["edges"]], float)
        return np.mean(hist.max(axis=1) / hist.sum(axis=1))

    assert cluster_skew(0.05) > cluster_skew(100.0) + 0.2


def test_registered_names():
    assert {"iid", "classes", "classes-rr", "edge-classes", "mixed", "non-iid1", "non-iid2", "dirichlet",
            "hier-dirichlet"} <= set(PARTITIONERS.names())


def test_data_report_and_files(tmp_path):
    parts = partition(LABELS, 6, rng(), cfg("data.partition=classes"), edges=2)
    report = data_report(LABELS, parts, 2, 10)
    assert [d["samples"] for d in report["devices"]] == [len(p) for p in parts]
    assert [d["edge"] for d in report["devices"]] == [0, 0, 0, 1, 1, 1]
    assert sum(e["samples"] for e in report["edges"]) == 3000
    assert np.array_equal(np.sum([e["labels"] for e in report["edges"]], axis=0), np.bincount(LABELS))
    write_data_report(tmp_path, report)
    assert json.loads((tmp_path / "data.json").read_text()) == report
    assert not (tmp_path / "data.png").exists()  # drawn at the end of the run, not at launch
    plot_data_report(tmp_path, report, "test")
    assert (tmp_path / "data.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
