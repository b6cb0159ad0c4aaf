"""Fusion weights (paper 004 eq. 14 and baselines) and the paper-004 distortion formulas of theory.py."""
import numpy as np
import pytest

from hfl.common.quantization import fusion, theory


def test_fwo_weights_proportional_to_theta_and_sum_to_one():
    # Digest 004 9.6.
    dist = np.array([0.5, 2.0, 8.0, 0.1])
    stds = np.array([0.01, 0.125, 6.25e-4, 0.3])
    d = 1000
    theta = 1 / (dist + d * stds ** 2)
    w = fusion.fusion_weights("fwo", bits=[2, 4, 2, 4], distortions=dist, link_stds=stds, dim=d)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(w / theta, (w / theta)[0], rtol=1e-12)
    np.testing.assert_allclose(w, theta / theta.sum(), rtol=1e-12)


def test_fwo_minimises_the_fusion_error_bound():
    # eq. (12)-(14): omega = theta / sum theta minimises sum omega^2 / theta on the simplex; any seeded
    # perturbation along the simplex must not lower it.
    rng = np.random.default_rng(0)
    dist, stds, d = rng.uniform(0.1, 5, 6), rng.uniform(0, 0.2, 6), 500
    w = fusion.fwo_weights(distortions=dist, link_stds=stds, dim=d)
    inv_theta = dist + d * stds ** 2
    best = (w ** 2 * inv_theta).sum()
    for _ in range(200):
        step = rng.normal(size=6)
        step -= step.mean()
        other = w + 0.01 * step
        if (other >= 0).all():
            assert (other ** 2 * inv_theta).sum() >= best - 1e-15


def test_fwo_perfect_devices_share_everything():
    w = fusion.fwo_weights(distortions=[0.0, 1.0, 0.0], link_stds=[0.0, 0.0, 0.0], dim=10)
    np.testing.assert_allclose(w, [0.5, 0, 0.5])


def test_uniform_and_fedhq_weights():
    np.testing.assert_allclose(fusion.fusion_weights("uniform", bits=[2, 4, 4, 2]), 0.25)
    w = fusion.fusion_weights("fedhq", bits=[2, 4, 4])
    np.testing.assert_allclose(w, np.array([9, 225, 225]) / 459)
    assert w[1] > w[0]  # the paper's one requirement: higher resolution, larger weight (digest 004 P5)


def test_fusion_rule_errors():
    with pytest.raises(KeyError, match="allowed"):
        fusion.fusion_weights("nope", bits=[2])
    with pytest.raises(ValueError, match="link_stds"):
        fusion.fwo_weights(distortions=[1.0, 2.0], link_stds=[0.1], dim=3)
    with pytest.raises(ValueError, match="distortions"):
        fusion.fwo_weights(distortions=[-1.0], link_stds=[0.1], dim=3)
    with pytest.raises(ValueError, match="dim"):
        fusion.fwo_weights(distortions=[1.0], link_stds=[0.1], dim=0)
    with pytest.raises(ValueError, match="bits"):
        fusion.fedhq_weights(bits=[0, 4])
    with pytest.raises(ValueError, match="estimate"):
        fusion.expected_distortion(np.ones(3), 4, 0.1, estimate="guess")


def test_dpsq_distortion_eq7_against_monte_carlo():
    # eq. (7) per coordinate vs a seeded simulation of Lemma 3's rule (nearest w.p. e^eps/(e^eps+1)). 200k draws
    # per point: the MC mean of a variable bounded by step^2 has std <= step^2/sqrt(4*200k) ~ 1e-3 step^2.
    rng = np.random.default_rng(0)
    step, n = 0.5, 200_000
    for frac in (0.0, 0.2, 0.5, 0.9):
        for eps in (0.0, 0.1, 1.5):
            near_is_low = frac <= 0.5
            take_near = rng.random(n) < np.exp(eps) / (np.exp(eps) + 1)
            up = take_near != near_is_low
            err = ((up * step) - frac * step) ** 2
            assert err.mean() == pytest.approx(float(theory.dpsq_distortion(frac, step, eps)), abs=4e-3 * step ** 2)


def test_distortion_reference_values():
    # Digest 004 9.1: a ~ U[-10, 10], b = 6, eps1 = 0.1 -> Delta^2 (e^eps/12 + 7/12)/(e^eps + 1) = 0.0323.
    step = theory.grid_step(-10, 10, 6)
    assert theory.dpsq_uniform_cell_distortion(step, 0.1) == pytest.approx(0.0323, abs=5e-5)
    # Limits: Delta^2/3 as eps -> 0, Delta^2/12 as eps -> inf; SQ's Delta^2/6 lies between.
    assert theory.dpsq_uniform_cell_distortion(1.0, 0.0) == pytest.approx(1 / 3)
    assert theory.dpsq_uniform_cell_distortion(1.0, 50.0) == pytest.approx(1 / 12)
    assert theory.sq_uniform_cell_distortion(1.0) == pytest.approx(1 / 6)
    # Mean of eq. (7) over frac equals the uniform-cell formula (midpoint rule, 1e5 points: error ~1e-10).
    frac = (np.arange(100_000) + 0.5) / 100_000
    assert theory.dpsq_distortion(frac, 1.0, 0.7).mean() == pytest.approx(theory.dpsq_uniform_cell_distortion(1.0, 0.7))


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_dpsq_below_laplace_sq(bits):
    # Digest 004 9.2 with rho = 20 (a ~ U[-10, 10]) and with the step-sized rho: DP-SQ below LaplaceSQ everywhere.
    step = theory.grid_step(-10, 10, bits)
    frac = np.linspace(0, 1, 101)
    for eps in np.linspace(1.5, 0.1, 8):
        dp = theory.dpsq_distortion(frac, step, eps)
        for rho in (20.0, step):
            assert np.all(dp < theory.laplace_sq_distortion(frac, step, rho / eps))
    # Bounded as eps1 -> 0: the cell average (midpoint rule) stays at Delta^2/3, every point below Delta^2/2.
    mid = (np.arange(1000) + 0.5) / 1000
    assert theory.dpsq_distortion(mid, step, 1e-9).mean() == pytest.approx(step ** 2 / 3, rel=1e-5)
    assert theory.dpsq_distortion(frac, step, 1e-9).max() <= step ** 2 / 2 + 1e-15


def test_expected_distortion_estimates():
    rng = np.random.default_rng(3)
    v = rng.laplace(size=2000) * 1e-3
    v *= min(1, 10 / np.abs(v).sum())
    device = fusion.expected_distortion(v, 4, 0.1)
    uniform = fusion.expected_distortion(v, 4, 0.1, estimate="uniform_cell")
    bound = fusion.expected_distortion(v, 4, 0.1, estimate="bound", clip=10)
    assert 0 < device <= bound and 0 < uniform <= bound
    assert bound == pytest.approx(4 * 2000 * 100 / 225)
    try:
        from hfl.common.quantization import dpsq
    except ImportError:
        return
    # Option (a) agrees with the codec's own eq. (7) implementation and with a seeded Monte Carlo of the codec:
    # 400 draws of a 2000-coordinate sum, relative MC error ~ 1/sqrt(400 * 2000) per coordinate-level noise; 3%.
    assert device == pytest.approx(float(dpsq.dpsq_expected_distortion(v, 4, 0.1).sum()), rel=1e-9)
    rng = np.random.default_rng(4)
    mc = np.mean([((dpsq.dpsq(v, rng, 4, 0.1) - v) ** 2).sum() for _ in range(400)])
    assert mc == pytest.approx(device, rel=0.03)


def test_upload_epsilon():
    # Digest 004 3.5: d = 159,010 gives 0.159 at eps1 = 1e-6.
    assert theory.dpsq_upload_epsilon(159_010, 1e-6) == pytest.approx(0.15901)
