import numpy as np
import pytest

from hfl.common import config as c
from hfl.common.partition import partition

LABELS = np.repeat(np.arange(10), 100)


def cfg(*overrides):
    return c.load(None, list(overrides)).data


def rng(seed=0):
    return np.random.default_rng(seed)


def test_iid_is_a_disjoint_cover():
    parts = partition(LABELS, 7, rng(), cfg())
    allidx = np.concatenate(parts)
    assert len(allidx) == 1000 and len(np.unique(allidx)) == 1000
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_k_classes_gives_exactly_k_labels():
    parts = partition(LABELS, 20, rng(), cfg("data.partition=classes", "data.classes_per_device=2"))
    assert all(len(np.unique(LABELS[p])) == 2 for p in parts)
    assert len(np.unique(np.concatenate(parts))) == 1000  # every sample used exactly once
    assert sum(map(len, parts)) == 1000


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def skew(alpha):
        parts = partition(LABELS, 10, rng(1), cfg("data.partition=dirichlet", f"data.dirichlet_alpha={alpha}"))
        assert all(len(p) > 0 for p in parts) and sum(map(len, parts)) == 1000
        return np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])

    assert skew(0.05) > skew(100.0) + 0.3


def test_sample_counts_drawn_from_range():
    parts = partition(LABELS, 8, rng(), cfg("data.samples_per_device=[50, 120]"))
    sizes = [len(p) for p in parts]
    assert all(50 <= s <= 120 for s in sizes) and len(set(sizes)) > 1
    big = partition(LABELS, 20, rng(), cfg("data.samples_per_device=[500, 1500]"))  # more than exists: overlap
    assert all(500 <= len(p) <= 1500 for p in big)


def test_partitions_are_seeded():
    a = partition(LABELS, 5, rng(3), cfg("data.partition=dirichlet"))
    b = partition(LABELS, 5, rng(3), cfg("data.partition=dirichlet"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_errors():
    with pytest.raises(ValueError, match="classes_per_device=11"):
        partition(LABELS, 5, rng(), cfg("data.partition=classes", "data.classes_per_device=11"))
    with pytest.raises(ValueError, match="without data"):
        partition(LABELS[:3], 5, rng(), cfg())
