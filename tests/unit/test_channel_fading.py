"""Counter-based Rayleigh fading (paper 003, digest 3.2): reproducible per (seed, slot, link, tx, rx), CN(0, 1)."""
import numpy as np
import pytest
from scipy import stats

from hfl.common.channel.fading import path_gain, rayleigh


def test_draws_do_not_depend_on_which_pairs_are_requested_together():
    tx, rx = np.meshgrid(np.arange(60), np.arange(60), indexing="ij")
    full = rayleigh(7, 12, tx, rx)
    rng = np.random.default_rng(0)
    pick = rng.choice(3600, size=500, replace=False)
    subset = rayleigh(7, 12, tx.ravel()[pick], rx.ravel()[pick])
    assert np.array_equal(subset, full.ravel()[pick])  # bit-identical, not merely close
    one = np.array([rayleigh(7, 12, int(t), int(r)) for t, r in zip(tx.ravel()[pick[:20]], rx.ravel()[pick[:20]])])
    assert np.array_equal(one, full.ravel()[pick[:20]])
    assert np.array_equal(rayleigh(7, 12, tx.T, rx.T), full.T)


def test_slot_link_seed_and_direction_give_fresh_draws():
    tx, rx = np.arange(1, 101), np.zeros(100, dtype=int)  # tx != rx, so swapping them is a different pair
    base = rayleigh(1, 3, tx, rx)
    for other in (rayleigh(1, 4, tx, rx), rayleigh(2, 3, tx, rx), rayleigh(1, 3, tx, rx, link="down"),
                  rayleigh(1, 3, rx, tx)):
        assert not np.any(base == other)
        assert abs(np.corrcoef(np.abs(base) ** 2, np.abs(other) ** 2)[0, 1]) < 0.4  # 100 pairs: |r| ~ 0.1


def test_gain_is_exponential_with_the_requested_mean_and_phase_is_uniform():
    tx, rx = np.meshgrid(np.arange(200), np.arange(50), indexing="ij")
    f = np.concatenate([rayleigh(5, s, tx, rx).ravel() for s in range(20)])  # 200k draws
    g = np.abs(f) ** 2
    se = 1 / np.sqrt(g.size)  # Exp(1) has unit standard deviation
    assert abs(g.mean() - 1) < 5 * se
    # KS on a 20k slice: a wrong law (e.g. |f| instead of |f|^2 exponential) gives p ~ 0
    assert stats.kstest(g[:20000], "expon").pvalue > 1e-3
    assert stats.kstest(np.angle(f[:20000]), "uniform", args=(-np.pi, 2 * np.pi)).pvalue > 1e-3
    assert abs(np.mean(f.real * f.imag)) < 5 * 0.5 / np.sqrt(f.size)  # independent quadratures, var 1/2 each
    down = np.abs(rayleigh(5, 0, tx, rx, link="down", mean_gain=10.0)) ** 2
    assert abs(down.mean() - 10) < 5 * 10 / np.sqrt(down.size)


def test_real_kind_keeps_the_amplitude_and_draws_a_sign():
    tx = np.arange(10000)
    c = rayleigh(3, 1, tx, 0)
    r = rayleigh(3, 1, tx, 0, kind="real")
    assert np.isrealobj(r) and np.allclose(np.abs(r), np.abs(c))
    assert abs(np.mean(r > 0) - 0.5) < 5 * 0.5 / np.sqrt(tx.size)


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="link"):
        rayleigh(0, 0, 0, 0, link="sideways")
    with pytest.raises(ValueError, match="slot"):
        rayleigh(0, -1, 0, 0)
    with pytest.raises(ValueError, match="mean_gain"):
        rayleigh(0, 0, 0, 0, mean_gain=0)
    with pytest.raises(ValueError, match="indices"):
        rayleigh(0, 0, -1, 0)
    with pytest.raises(ValueError, match="distance"):
        path_gain([1.0, 0.0], 4)
    assert path_gain(2.0, 4) == 1 / 16
