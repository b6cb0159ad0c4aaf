"""Truncated channel inversion and activity (paper 003, eqs. 12-17, 43; digest 3.2-3.3, 5)."""
import numpy as np
import pytest
from scipy.special import comb, exp1, expi

from hfl.common.channel.fading import rayleigh
from hfl.common.channel.geometry import ring_offsets
from hfl.common.channel.power import (active_mask, denormalise, inversion_coefficient, inversion_rho, normalise,
                                      ring_moment)

ALPHA, R0, R, TH1 = 4.0, 4.0, 30.0, 0.5


def test_rho_on_the_defaults():
    assert ring_moment(ALPHA, R0, R) == pytest.approx(274885.33, rel=1e-6)  # digest 3.1
    assert inversion_rho(1.0, TH1, ALPHA, R0, R) == pytest.approx(6.50e-6, rel=2e-3)  # digest 3.3
    # control: with `expi` (the trap of the digest's notation block) rho would be off by ~23%
    wrong = 1.0 / (expi(TH1) * ring_moment(ALPHA, R0, R))
    assert abs(wrong / inversion_rho(1.0, TH1, ALPHA, R0, R) - 1) > 0.1


def test_mean_power_meets_P_u_and_activity_rate_is_exp_minus_th1():
    n = 400_000
    dist = np.linalg.norm(ring_offsets(n, R0, R, np.random.default_rng(0)), axis=1)
    f = rayleigh(11, 0, np.arange(n), 0)
    active = np.abs(f) ** 2 >= TH1  # the plain eq. 15 test; the empty-cluster fallback is tested below
    rho = inversion_rho(1.0, TH1, ALPHA, R0, R)
    power = np.abs(inversion_coefficient(f, dist, rho, ALPHA, active)) ** 2
    # |p|^2 = rho ||y||^4 / |f|^2 on the active set: finite variance (|f|^2 >= th1), so 5 standard errors
    # of the sample mean (~0.5% here) bound a correct implementation; a 23% expi slip or a missing
    # truncation would be far outside.
    assert abs(power.mean() - 1.0) < 5 * power.std() / np.sqrt(n)
    assert abs(active.mean() - np.exp(-TH1)) < 5 * np.sqrt(0.607 * 0.393 / n)
    assert np.exp(-TH1) == pytest.approx(0.607, abs=5e-4)
    # after inversion, every active device reaches its edge with amplitude exactly sqrt(rho)
    amp = inversion_coefficient(f, dist, rho, ALPHA, active)[active] * dist[active] ** (-ALPHA / 2) * f[active]
    assert np.allclose(amp, np.sqrt(rho))


def test_mean_inverse_active_count_matches_eq_43():
    m, slots = 15, 20000
    q = np.exp(-TH1)
    r, p0 = q / (1 - q), (1 - q) ** m
    ks = np.arange(1, m + 1)
    formula = p0 / (1 - p0) * np.sum(comb(m, ks) * r ** ks / ks)
    assert formula == pytest.approx(0.1156, abs=2e-4)  # digest 5
    cluster = np.zeros(m, dtype=int)
    inv = np.array([1.0 / active_mask(rayleigh(2, s, np.arange(m), 0), cluster, TH1).sum() for s in range(slots)])
    # 5 standard errors of the sample mean (about 3e-4 each); a Bin(M, 0.5) activity would give ~0.14
    assert abs(inv.mean() - formula) < 5 * inv.std() / np.sqrt(slots)
    assert abs(inv.mean() - 0.116) < 2e-3


def test_empty_cluster_falls_back_to_the_best_channel():
    f = np.array([0.1, 0.5, 0.2, 2.0, 0.3, 0.05, 0.6])
    cluster = np.array([0, 0, 0, 1, 1, 2, 2])
    mask = active_mask(f, cluster, th1=0.5)  # |f|^2: cluster 0 all < 0.5, cluster 2 all < 0.5
    assert mask.tolist() == [False, True, False, True, False, False, True]


def test_normalisation_round_trip_and_constant_guard():
    x = np.random.default_rng(3).normal(2.0, 3.0, size=(4, 1000))
    bar, mu, sigma = normalise(x)
    assert np.allclose(bar.mean(axis=1), 0) and np.allclose(bar.std(axis=1), 1)
    assert np.allclose(mu, x.mean(axis=1)) and np.allclose(sigma, x.std(axis=1))
    assert np.allclose(denormalise(bar, mu, sigma), x)
    bar, mu, sigma = normalise(np.full((1, 5), 7.0))
    assert np.all(np.isfinite(bar)) and np.allclose(denormalise(bar, mu, sigma), 7.0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="P_u"):
        inversion_rho(-1.0, TH1, ALPHA, R0, R)
    with pytest.raises(ValueError, match="th1"):
        inversion_rho(1.0, 0.0, ALPHA, R0, R)
    with pytest.raises(ValueError, match="r0"):
        ring_moment(ALPHA, 30.0, 4.0)
    assert exp1(TH1) == pytest.approx(0.5598, abs=1e-4)


def test_dropped_devices_are_never_active_nor_the_fallback():
    f = np.array([0.1, 2.0, 0.2, 0.3, 0.05])
    cluster = np.array([0, 0, 0, 1, 1])
    alive = np.array([True, False, True, False, False])  # device 1 has the best channel but dropped out
    assert active_mask(f, cluster, 0.5, alive).tolist() == [False, False, True, False, False]


def test_normalise_float32_equals_float64():
    # devices normalise float32 payloads without a float64 copy: same s_bar to float32 round-off, same mu, sigma
    x = (np.random.default_rng(3).normal(size=(4, 5000)) * [[1.0], [1e-3], [50.0], [2.0]] + 3.0).astype(np.float32)
    bar32, mu32, sigma32 = normalise(x)
    bar64, mu64, sigma64 = normalise(x.astype(np.float64))
    assert bar32.dtype == np.float32 and bar64.dtype == np.float64
    assert np.allclose(bar32, bar64, rtol=0, atol=1e-5)
    assert np.allclose(mu32, mu64, rtol=1e-7) and np.allclose(sigma32, sigma64, rtol=1e-6)
    assert np.allclose(np.mean(bar64, axis=1), 0, atol=1e-9) and np.allclose(np.std(bar64, axis=1), 1)
