"""OTA medium and MultiAirFed receive maths (paper 003, eqs. 14, 18-30, 35; digest 3.3-3.6, 10)."""
import dataclasses

import numpy as np
import pytest

from hfl.common.channel import lanes, ota
from hfl.common.channel.fading import rayleigh
from hfl.common.channel.geometry import matern_cluster
from hfl.common.channel.ota import OtaParams
from hfl.common.channel.power import inversion_rho, normalise

SEED, SLOT = 17, 5
QUIET = OtaParams(interference=False, noise=False)


def _topology(seed=0, interferer_devices=15, C=3):
    return matern_cluster(20e-6, 15, 4.0, 30.0, 1000.0, C, np.random.default_rng(seed), interferer_devices)


def _active_tx(top, slot, params=OtaParams()):
    active = ota.slot_activity(top, slot, SEED, params)
    return np.flatnonzero(active & (top.device_edge < top.collaborating))


def test_uplink_superposition_equals_a_direct_sum_over_transmitters():
    top = _topology(interferer_devices=0)  # other edges exist but have no devices: nothing random is added
    params = OtaParams(noise=False)
    tx = _active_tx(top, SLOT, params)
    payloads = np.random.default_rng(1).normal(size=(tx.size, 64))
    rec = ota.medium_slot(payloads, tx, top, SLOT, SEED, params, np.random.default_rng(2))
    rho = inversion_rho(1.0, 0.5, 4.0, 4.0, 30.0)
    for z_i, z in enumerate(rec.receivers):
        direct = np.zeros(64, dtype=complex)
        for t_i, t in enumerate(tx):  # eq. 14 term by term
            own = top.device_edge[t]
            f_own = rayleigh(SEED, SLOT, t, own)
            p = np.sqrt(rho) / (np.linalg.norm(top.devices[t] - top.edges[own]) ** -2.0 * f_own)
            dist = np.linalg.norm(top.devices[t] - top.edges[z])
            direct += p * dist ** -2.0 * rayleigh(SEED, SLOT, t, z) * payloads[t_i]
        assert np.allclose(rec.received[z_i], direct, rtol=1e-9, atol=1e-12 * np.abs(direct).max())
        own_sum = np.sqrt(rho) * payloads[top.device_edge[tx] == z].sum(axis=0)
        quiet = ota.medium_slot(payloads, tx, top, SLOT, SEED, QUIET, np.random.default_rng(2))
        assert np.allclose(quiet.received[z_i], own_sum, rtol=1e-12)  # inversion: own cluster arrives real
        assert not np.allclose(rec.received[z_i], own_sum)  # control: the other clusters do interfere
    assert np.array_equal(rec.n_active, np.bincount(top.device_edge[tx], minlength=3)[:3])


def test_downlink_superposition_equals_a_direct_sum_over_edges():
    top = _topology()
    params = OtaParams(noise=False)
    every_edge = np.arange(top.n_edges)  # all edges scheduled: no simulated other-task edges
    signals = np.random.default_rng(3).normal(size=(top.n_edges, 16)) * (1 + 0.5j)
    devices = np.array([0, 7, 20, 44])
    rec = ota.medium_broadcast(signals, every_edge, devices, top, SLOT, SEED, params, np.random.default_rng(4))
    for k, dev in enumerate(devices):
        dist = np.linalg.norm(top.edges - top.devices[dev], axis=1)
        f = rayleigh(SEED, SLOT, every_edge, dev, "down", 10.0)
        direct = np.sum((dist ** -2.0 * f)[:, None] * signals, axis=0)
        assert np.allclose(rec.received[k], direct, rtol=1e-9)


@pytest.mark.parametrize("equal_sigma", [True, False])
def test_eq_21_reproduces_eq_6_without_interference_and_noise(equal_sigma):
    top = _topology()
    tx = _active_tx(top, SLOT)
    rng = np.random.default_rng(5)
    d = 200
    z = normalise(rng.normal(size=(tx.size, d)))[0]
    sigma_true = np.full(tx.size, 0.3) if equal_sigma else rng.uniform(0.1, 2.0, tx.size)
    g = z * sigma_true[:, None] + rng.normal(size=tx.size)[:, None]  # eq. 6 inputs, per-device mu and sigma
    bar, mu, sigma = normalise(g)
    rec = ota.medium_slot(bar, tx, top, SLOT, SEED, QUIET, rng)
    rho = inversion_rho(1.0, 0.5, 4.0, 4.0, 30.0)
    psi = ota.psi_corrected(20e-6, 15, 1.0, 4.0, 4.0)
    E = ota.edge_power(rho, rec.n_active, psi)
    down = ota.medium_broadcast(ota.edge_transmit(rec.received, 1.0, E), rec.receivers, top.collaborating_devices,
                                top, SLOT, SEED, QUIET, rng)
    devs = top.collaborating_devices
    own = top.device_edge[devs]
    cluster_of_tx = top.device_edge[tx]
    mean_g = np.stack([g[cluster_of_tx == x].mean(axis=0) for x in range(3)])  # eq. 6 per edge
    mu_mean = np.array([mu[cluster_of_tx == x].mean() for x in range(3)])
    theta = (np.array([sigma[cluster_of_tx == x].mean() for x in range(3)]) if not equal_sigma
             else np.full(3, 0.3))  # equal sigma: theta is the true per-device sigma
    g_hat = ota.estimate(down.received, theta[own], rho, 1.0, E[own], rec.n_active[own],
                         ota.own_downlink_fading(top, SLOT, SEED, devs, QUIET),
                         np.linalg.norm(top.offsets[devs], axis=1), 4.0, mu_mean[own])
    if equal_sigma:
        assert np.allclose(g_hat, mean_g[own], rtol=1e-9, atol=1e-9)
    else:  # the eq. 22 decomposition: g_hat - eq. 6 = sum_y (theta - sigma_y) g_bar_y / |A_o|
        err = np.stack([((theta[x] - sigma[cluster_of_tx == x])[:, None] * bar[cluster_of_tx == x]).sum(axis=0)
                        / rec.n_active[x] for x in range(3)])
        assert np.allclose(g_hat - mean_g[own], err[own], atol=1e-9)
        assert not np.allclose(g_hat, mean_g[own], atol=1e-3)  # control: unequal sigma does leave an error


def test_interference_switch_matters_and_noise_has_its_power():
    top = _topology()
    tx = _active_tx(top, SLOT)
    bar = normalise(np.random.default_rng(6).normal(size=(tx.size, 4000)))[0]
    quiet = ota.medium_slot(bar, tx, top, SLOT, SEED, QUIET, np.random.default_rng(7))
    loud = ota.medium_slot(bar, tx, top, SLOT, SEED, OtaParams(sigma_en2=1e-4), np.random.default_rng(7))
    assert np.all(quiet.interference_power < 1e-20) and np.all(loud.interference_power > 0)
    assert loud.interferers_active > 0
    noise = loud.received - quiet.received
    noise_only = ota.medium_slot(bar, tx, top, SLOT, SEED, dataclasses.replace(QUIET, noise=True, sigma_en2=1e-4),
                                 np.random.default_rng(7)).received - quiet.received
    # CN(0, 1e-4) per entry over 4000 entries: sample power within 5 SE (SE = 1e-4 / sqrt(4000))
    assert np.all(np.abs(np.mean(np.abs(noise_only) ** 2, axis=1) - 1e-4) < 5 * 1e-4 / np.sqrt(4000))
    assert np.all(np.mean(np.abs(noise) ** 2, axis=1) > np.mean(np.abs(noise_only) ** 2, axis=1) * 0.5)


@pytest.mark.parametrize("mode", ["explicit", "aggregate"])
def test_interferer_payload_modes_have_the_gaussian_law_of_the_gains(mode):
    top = _topology()
    params = OtaParams(noise=False, interferers=mode)
    rho = inversion_rho(1.0, 0.5, 4.0, 4.0, 30.0)
    active = ota.slot_activity(top, SLOT, SEED, params)
    interferers = np.flatnonzero(active & (top.device_edge >= 3))
    gains = ota.uplink_gains(top, SLOT, SEED, interferers, np.arange(3), params, rho)
    d = 20000
    v = ota.gaussian_superposition(gains, d, np.random.default_rng(8), mode)
    stacked_v = np.vstack([v.real, v.imag])
    k = np.vstack([gains.real, gains.imag])
    expected, measured = k @ k.T, stacked_v @ stacked_v.T / d
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
    # each normalised second moment of d iid Gaussian columns has SE <= sqrt(2/d) = 0.01; 5 SE
    assert np.all(np.abs(measured - expected) / scale < 5 * np.sqrt(2 / d))


def test_independent_mode_keeps_each_receivers_law_and_drops_the_cross_terms():
    rng = np.random.default_rng(10)
    gains = rng.normal(size=(3, 40)) + 1j * rng.normal(size=(3, 40))
    gains[1] = gains[0] * 0.5  # receivers 0 and 1 share their interferers: truly correlated
    d = 20000
    v = ota.gaussian_superposition(gains, d, np.random.default_rng(11), "independent")
    for r in range(3):
        k = np.vstack([gains[r].real, gains[r].imag])
        expected = k @ k.T
        measured = np.cov(np.vstack([v[r].real, v[r].imag]), bias=True)
        scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
        assert np.all(np.abs(measured - expected) / scale < 5 * np.sqrt(2 / d))  # same SE argument as above
    corr = np.corrcoef(v[0].real, v[1].real)[0, 1]
    assert abs(corr) < 5 / np.sqrt(d)  # independent by construction, though the exact law has corr ~ 1
    exact = ota.gaussian_superposition(gains, d, np.random.default_rng(11), "explicit")
    assert np.corrcoef(exact[0].real, exact[1].real)[0, 1] > 0.99


def test_psi_closed_forms_on_the_defaults():
    rho = inversion_rho(1.0, 0.5, 4.0, 4.0, 30.0)
    assert ota.psi_corrected(20e-6, 15, 1.0, 4.0, 4.0) / rho == pytest.approx(9.06, abs=0.01)  # digest 3.4
    paper = ota.psi_paper(20e-6, 15, rho, 0.5, 4.0, 4.0, 30.0)
    assert paper / rho == pytest.approx(5.5, abs=0.1)  # digest 3.4: "about 5.5 rho"
    finer = ota.psi_paper(20e-6, 15, rho, 0.5, 4.0, 4.0, 30.0, n_y=128, n_phi=32768)
    assert finer == pytest.approx(paper, rel=1e-3)  # the quadrature has converged
    p = OtaParams()
    assert ota.psi("corrected", 20e-6, 15, p, 4.0, 30.0) == ota.psi("empirical", 20e-6, 15, p, 4.0, 30.0)
    assert ota.psi("empirical", 20e-6, 15, p, 4.0, 30.0, empirical=3e-5) == 3e-5
    with pytest.raises(ValueError, match="psi_mode"):
        ota.psi("guess", 20e-6, 15, p, 4.0, 30.0)


def test_excluded_plane_integral_against_monte_carlo():
    # I(y) = E[1(|v + u e^{i phi}| >= 2 r0)] * 2 pi r0^(2-a)/(a-2) with u Pareto(a-2) from r0, phi uniform
    rng = np.random.default_rng(9)
    n, r0, a = 400_000, 4.0, 4.0
    u = r0 * rng.random(n) ** (-1 / (a - 2))
    phi = 2 * np.pi * rng.random(n)
    for y in (4.0, 10.0, 30.0):
        keep = np.abs(y + u * np.exp(1j * phi)) >= 2 * r0
        mc = keep.mean() * 2 * np.pi * r0 ** (2 - a) / (a - 2)
        se = np.sqrt(keep.mean() * (1 - keep.mean()) / n) * 2 * np.pi * r0 ** (2 - a) / (a - 2)
        quad = ota._excluded_plane_integral(np.array([y]), a, r0, 8192)[0]
        assert abs(quad - mc) < 5 * se + 1e-6 * mc


def test_beta_and_theta_on_the_digest_example():
    beta = ota.downlink_beta(20e-6, 10.0, 4.0, 4.0, 0.0, 1.0)
    assert beta == pytest.approx(3.93e-5, rel=2e-3)  # digest 3.5
    G0 = ota.downlink_gain(np.sqrt(10.0), 20.0, 4.0)
    assert beta / G0 == pytest.approx(0.63, abs=0.01)
    psi_over_rho = 9.06
    theta = ota.receive_factor(9.1 * 1.0, 9.1, beta, G0, psi_over_rho)  # sigma_bar = 1, |A_o| = 9.1
    assert theta == pytest.approx(9.1 / (1.628 * 18.16), rel=2e-3)  # ~ sigma_bar / 3.2
    inter = ota.receive_factor(27.3, 27.3, beta, G0, psi_over_rho, groups=3)  # eq. 35: |A| + C Psi/rho
    assert inter == pytest.approx(27.3 / ((1 + beta / G0) * (27.3 + 3 * 9.06)))
    assert ota.edge_power(2.0, 3, 5.0, groups=2) == 16.0
    assert list(ota.downlink_passes(np.sqrt([0.005, 0.02]), 0.01)) == [False, True]


def test_empirical_psi_sample_and_running_mean():
    v = np.array([[np.sqrt(5.0)] * 10, [1j] * 10])
    assert np.allclose(ota.psi_sample(v, [2, 1], 1.0), [3.0, 0.0])
    mean, count = ota.running_mean(0.0, 0, [1.0, 3.0])
    assert (mean, count) == (2.0, 2)
    assert ota.running_mean(mean, count, 5.0) == (3.0, 3)


def test_medium_refuses_bad_emissions():
    top = _topology()
    tx = _active_tx(top, SLOT)
    inactive = np.setdiff1d(top.collaborating_devices, tx)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not active"):
        ota.medium_slot(np.zeros((1, 4)), inactive[:1], top, SLOT, SEED, QUIET, rng)
    with pytest.raises(ValueError, match="rows"):
        ota.medium_slot(np.zeros((2, 4)), tx[:1], top, SLOT, SEED, QUIET, rng)
    with pytest.raises(ValueError, match="collaborating"):
        ota.medium_slot(np.zeros((1, 4)), top.interferer_devices[:1], top, SLOT, SEED, QUIET, rng)
    with pytest.raises(ValueError, match="alpha"):
        OtaParams(alpha=2.0)
    with pytest.raises(ValueError, match="P_u"):
        OtaParams(P_u=-1.0)


def test_alive_mask_and_missing_transmitters():
    top = _topology()
    tx = _active_tx(top, SLOT)
    alive = np.ones(top.n_devices, dtype=bool)
    alive[tx[0]] = False  # dropped after a failed th0 test earlier in the round
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not active"):
        ota.medium_slot(np.zeros((tx.size, 8)), tx, top, SLOT, SEED, QUIET, rng, alive=alive)
    rec = ota.medium_slot(np.zeros((tx.size - 2, 8)), tx[1:-1], top, SLOT, SEED, QUIET, rng, alive=alive)
    assert rec.missing.tolist() == [tx[-1]]  # active, alive, but no payload arrived
    assert rec.n_active.sum() == tx.size - 2  # |A| counts what was actually superposed


def test_folded_interference_and_noise_have_the_joint_law_of_separate_draws():
    """aggregate mode draws interference and noise jointly (one Cholesky factor): the stacked [Re; Im] of the
    receivers must have covariance S S^T + sigma^2 / 2 I; seeded, d = 200,000 samples, 5% tolerance on the
    diagonal and 0.05 on correlations."""
    rng = np.random.default_rng(3)
    gains = (rng.normal(size=(3, 40)) + 1j * rng.normal(size=(3, 40))) * 1e-2
    noise = 2e-3
    drawn, folded = ota.interference_and_noise(gains, 200_000, np.random.default_rng(4), "aggregate", 4096, noise)
    assert folded
    stacked = np.vstack([gains.real, gains.imag])
    want = stacked @ stacked.T + noise / 2 * np.eye(6)
    got = np.cov(np.vstack([drawn.real, drawn.imag]))
    np.testing.assert_allclose(np.diag(got), np.diag(want), rtol=0.05)
    corr = lambda c: c / np.sqrt(np.outer(np.diag(c), np.diag(c)))  # noqa: E731
    np.testing.assert_allclose(corr(got), corr(want), atol=0.05)
    _, folded = ota.interference_and_noise(gains, 10, np.random.default_rng(4), "explicit", 4096, noise)
    assert not folded  # explicit mode draws every payload, and the noise apart


# the settings each fast path (broadcast_rows, uplink_rows) is checked against its reference in
FAST_PATH_CASES = [OtaParams(), OtaParams(interferers="explicit", chunk=7), OtaParams(interferers="independent"),
                   OtaParams(noise=False), OtaParams(interference=False), QUIET, OtaParams(fading="real")]
FAST_PATH_IDS = ["aggregate", "explicit", "independent", "no-noise", "no-interference", "quiet", "real"]


@pytest.mark.parametrize("params", FAST_PATH_CASES, ids=FAST_PATH_IDS)
def test_broadcast_rows_equal_the_reference_broadcast(params):
    # the fast downlink (float32, interference and noise in the signals' product, own part added last) against
    # medium_broadcast (complex128) on fixed inputs: same rows to float32 round-off, same powers, same draws
    top = _topology()
    d = 3001
    rng = np.random.default_rng(8)
    signals = rng.normal(size=(top.collaborating, d)) + 1j * rng.normal(size=(top.collaborating, d))
    tx = np.arange(top.collaborating)
    devices = np.concatenate([top.collaborating_devices, [top.n_devices - 1]])  # one listener of an interferer edge
    ref = ota.medium_broadcast(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(9))
    fast = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(9))
    assert fast.received.shape == (devices.size, 2, d) and fast.received.dtype == np.float32
    want = np.stack([ref.received.real, ref.received.imag], axis=1)
    scale = np.abs(want).max(axis=(1, 2), keepdims=True)
    assert np.abs(fast.received - want).max(axis=(1, 2)).max() > 0 or params == QUIET  # float32, not a copy
    assert np.all(np.abs(fast.received - want) <= 1e-5 * scale)
    assert np.allclose(fast.signal_power, ref.signal_power, rtol=1e-9, atol=0)
    assert np.allclose(fast.interference_power, ref.interference_power, rtol=1e-4,
                       atol=1e-6 * ref.signal_power.max())
    assert fast.interferers_active == ref.interferers_active
    assert np.array_equal(fast.receivers, ref.receivers)
    control = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(10))
    if params.interference:  # another draw changes the rows: the draws are compared, not skipped
        assert np.abs(control.received - want).max() > 1e-3 * np.abs(want).max()
    elif params.noise:  # the noise (variance 4e-15) is all that another draw changes
        assert np.abs(control.received - fast.received).max() > 2 * np.sqrt(params.sigma_dn2)


@pytest.mark.parametrize("params", FAST_PATH_CASES, ids=FAST_PATH_IDS)
def test_uplink_rows_equal_the_reference_uplink(params):
    # the fast uplink (float32 rows, interferers and folded noise in the payloads' product, own part measured and
    # added in one pass) against medium_slot (complex128) on fixed inputs: same rows to float32 round-off (1e-5 of
    # the row's largest entry), same powers to 1e-4, same draws, same counts
    top = _topology()
    d = 3001
    tx = _active_tx(top, SLOT, params)
    payloads = np.random.default_rng(12).normal(size=(tx.size, d)).astype(np.float32)
    ref = ota.medium_slot(payloads[1:], tx[1:], top, SLOT, SEED, params, np.random.default_rng(13))  # one missing
    fast = ota.uplink_rows(payloads[1:], tx[1:], top, SLOT, SEED, params, np.random.default_rng(13))
    assert fast.received.shape == (top.collaborating, 2, d) and fast.received.dtype == np.float32
    want = np.stack([ref.received.real, ref.received.imag], axis=1)
    scale = np.abs(want).max(axis=(1, 2), keepdims=True)
    assert np.all(np.abs(fast.received - want) <= 1e-5 * scale)
    assert np.allclose(fast.signal_power, ref.signal_power, rtol=1e-5, atol=0)
    assert np.allclose(fast.interference_power, ref.interference_power, rtol=1e-4,
                       atol=1e-6 * ref.signal_power.max())
    assert np.array_equal(fast.n_active, ref.n_active) and np.array_equal(fast.missing, ref.missing)
    assert fast.missing.size >= 1 and fast.interferers_active == ref.interferers_active
    control = ota.uplink_rows(payloads[1:], tx[1:], top, SLOT, SEED, params, np.random.default_rng(14))
    if params.interference:  # another draw changes the rows: the draws are compared, not skipped
        assert np.abs(control.received - want).max() > 1e-4 * np.abs(want).max()


def test_broadcast_rows_take_the_uplinks_rows_as_signals():
    # air_slot hands uplink_rows' [m, 2, d] float32 rows to the downlink: the same rows as from complex signals
    top = _topology()
    rng = np.random.default_rng(15)
    signals = (rng.normal(size=(top.collaborating, 2, 500))).astype(np.float32)
    complex_form = signals[:, 0].astype(np.float64) + 1j * signals[:, 1]
    tx, devices = np.arange(top.collaborating), top.collaborating_devices
    a = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, OtaParams(), np.random.default_rng(16))
    b = ota.broadcast_rows(complex_form, tx, devices, top, SLOT, SEED, OtaParams(), np.random.default_rng(16))
    assert np.array_equal(a.received, b.received)
    assert np.allclose(a.signal_power, b.signal_power, rtol=1e-12) and np.array_equal(a.interference_power,
                                                                                       b.interference_power)


@pytest.mark.parametrize("block", [1, 7, 48, 1000])
def test_the_triangular_product_by_blocks_equals_the_full_product(monkeypatch, block):
    # _into_rows skips the Cholesky factor's zero upper triangle by blocks of rows: the same rows as one full
    # product of [left | L] @ [head; W] with the same W, to float32 round-off (1e-5 of the largest entry)
    rng = np.random.default_rng(18)
    gains = (rng.normal(size=(9, 40)) + 1j * rng.normal(size=(9, 40))) * 1e-2
    head = rng.normal(size=(6, 777)).astype(np.float32)
    left = np.zeros((18, 6 + 18), dtype=np.float32)
    left[:, :6] = rng.normal(size=(18, 6))
    monkeypatch.setattr(lanes, "TRIANGLE_BLOCK", block)
    rows = ota._into_rows(left.copy(), head, gains, 1e-3, np.random.default_rng(19))
    factor = ota.folded_factor(gains, 1e-3)
    assert np.array_equal(factor, np.tril(factor))
    w = lanes.standard_normals(np.random.default_rng(19), np.empty((18, 777), dtype=np.float32))
    want = left[:, :6] @ head + factor @ w
    assert np.abs(rows.reshape(18, 777) - want).max() <= 1e-5 * np.abs(want).max()


def _downlink_covariance(top, devices, params):
    """S S^T + sigma_dn^2 / 2 I of the listeners' interleaved (Re, Im) rows, S the real and imaginary parts of
    sqrt(P_d) ||x - pos||^-alpha/2 f_x over every edge that does not collaborate (eq. 18, from fading and geometry)."""
    others = np.arange(top.collaborating, top.n_edges)
    dist = np.linalg.norm(top.edges[others][None, :, :] - top.devices[devices][:, None, :], axis=2)
    g = np.sqrt(params.P_d) * dist ** (-params.alpha / 2) * rayleigh(SEED, SLOT, others[None, :], devices[:, None],
                                                                     "down", params.sigma_d2)
    s = np.empty((2 * devices.size, others.size))
    s[0::2], s[1::2] = g.real, g.imag
    return s @ s.T + params.sigma_dn2 / 2 * np.eye(2 * devices.size)


def test_broadcast_rows_have_the_exact_joint_law_of_interference_and_noise():
    """What the devices receive from silent edges (zero signals): the interleaved (Re, Im) rows of every listener are
    jointly Gaussian with covariance S S^T + sigma_dn^2 / 2 I, S the real and imaginary parts of sqrt(P_d) ||x -
    pos||^-alpha/2 f_x over every other edge of the plane (eq. 18, written out here from fading and geometry).
    Seeded, d = 100,000 columns: 5% on the diagonal, 0.03 on the correlations (sampling error ~0.003-0.01)."""
    top = _topology(C=3)
    params = OtaParams(interferers="aggregate", sigma_dn2=2e-8)  # folded; noise near the listeners' interference
    devices = top.collaborating_devices[:12]
    tx = np.arange(top.collaborating)
    d = 100_000
    assert ota.folds(params.interferers, params.sigma_dn2, devices.size)
    got = ota.broadcast_rows(np.zeros((tx.size, d)), tx, devices, top, SLOT, SEED, params, np.random.default_rng(20))
    want = _downlink_covariance(top, devices, params)
    cov = np.cov(got.received.reshape(2 * devices.size, d).astype(np.float64))
    np.testing.assert_allclose(np.diag(cov), np.diag(want), rtol=0.05)
    corr = lambda c: c / np.sqrt(np.outer(np.diag(c), np.diag(c)))  # noqa: E731
    np.testing.assert_allclose(corr(cov), corr(want), atol=0.03)
    noise_share = params.sigma_dn2 / 2 / np.diag(want)
    assert 0.1 < noise_share.min() and noise_share.max() < 0.9  # both parts of the law are checked


def test_estimate_rows_equal_the_complex_estimate():
    # the devices' float32 estimate from [n, 2, d] rows against eq. 21/30 on complex vectors (ota.estimate)
    rng = np.random.default_rng(11)
    n, d = 5, 2000
    v = rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))
    rows = np.stack([v.real, v.imag], axis=1).astype(np.float32)
    args = (rng.uniform(0.1, 2, n), 0.7, 1.0, rng.uniform(1, 5, n), rng.integers(1, 15, n).astype(float),
            rng.normal(size=n) + 1j * rng.normal(size=n), rng.uniform(1, 30, n), 4.0, rng.normal(size=n))
    want = ota.estimate(rows[:, 0].astype(np.float64) + 1j * rows[:, 1].astype(np.float64), *args)
    got = ota.estimate_rows(rows, *args)
    assert got.dtype == np.float32 and got.shape == (n, d)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    one = ota.estimate_rows(rows[:1], *(a[:1] if np.ndim(a) else a for a in args))  # one device, as each computes
    assert np.allclose(one[0], want[0], rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_in_phase_rows_are_the_projection_of_the_complex_rows_where_the_law_is_not_folded():
    # noise off: nothing is folded, so broadcast_rows draws the complex rows and projects them: with the same rng,
    # row i is cos(phi_i) Re v_i + sin(phi_i) Im v_i of the complex rows, to float32 round-off
    top = _topology()
    params = OtaParams(noise=False)
    rng = np.random.default_rng(21)
    signals = rng.normal(size=(top.collaborating, 2, 700)).astype(np.float32)
    tx, devices = np.arange(top.collaborating), top.collaborating_devices[:10]
    phase = rng.uniform(-np.pi, np.pi, devices.size)
    full = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(22))
    got = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(22), phase)
    want = np.cos(phase)[:, None] * full.received[:, 0] + np.sin(phase)[:, None] * full.received[:, 1]
    assert got.received.shape == (devices.size, 700) and got.received.dtype == np.float32
    assert np.abs(got.received - want).max() <= 1e-5 * np.abs(want).max()
    assert np.array_equal(got.signal_power, full.signal_power)


def test_in_phase_rows_have_the_law_of_the_projected_complex_rows():
    """The folded in-phase path draws its own [n, n] law, not the complex rows' draws: the difference D between its
    rows and the projection of the complex rows (independent draws, same signals) is N(0, 2 P C P^T) per column (C
    the complex rows' covariance S S^T + sigma_dn^2 / 2 I, P the projection), with no signal left in it. Seeded,
    d = 60,000: 5% on the diagonal, 0.03 on the correlations, |corr(D, signal)| < 0.03 (sampling error ~0.004-0.01)."""
    top = _topology(C=3)
    params = OtaParams(interferers="aggregate", sigma_dn2=2e-8)
    rng = np.random.default_rng(23)
    d = 60_000
    signals = (10 * rng.normal(size=(top.collaborating, 2, d))).astype(np.float32)
    tx, devices = np.arange(top.collaborating), top.collaborating_devices[:10]
    phase = rng.uniform(-np.pi, np.pi, devices.size)
    full = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(24))
    got = ota.broadcast_rows(signals, tx, devices, top, SLOT, SEED, params, np.random.default_rng(25), phase)
    p = ota.in_phase_projection(phase)
    diff = got.received.astype(np.float64) - p @ full.received.reshape(2 * devices.size, d)
    want = 2 * p @ _downlink_covariance(top, devices, params) @ p.T
    cov = np.cov(diff)
    np.testing.assert_allclose(np.diag(cov), np.diag(want), rtol=0.05)
    corr = lambda c: c / np.sqrt(np.outer(np.diag(c), np.diag(c)))  # noqa: E731
    np.testing.assert_allclose(corr(cov), corr(want), atol=0.03)
    sig = signals.reshape(2 * top.collaborating, d).astype(np.float64)
    cross = (diff - diff.mean(1, keepdims=True)) @ (sig - sig.mean(1, keepdims=True)).T / d
    assert np.abs(cross / np.outer(diff.std(1), sig.std(1))).max() < 0.03
    # the signal part is not small beside the noise (else the check above would be empty)
    assert (np.var(p @ full.received.reshape(2 * devices.size, d), axis=1) > 10 * np.diag(want) / 2).all()
    # the reported interference power: the complex rows' measured one, to 1%
    np.testing.assert_allclose(got.interference_power, full.interference_power, rtol=0.01)


def test_estimate_from_in_phase_rows_equals_the_complex_estimate():
    # a device that gets Re(e^{-i arg f_o} v) computes the same estimate as from the whole v (theta real)
    rng = np.random.default_rng(26)
    n, d = 5, 2000
    v = rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))
    f_o = rng.normal(size=n) + 1j * rng.normal(size=n)
    args = (rng.uniform(0.1, 2, n), 0.7, 1.0, rng.uniform(1, 5, n), rng.integers(1, 15, n).astype(float),
            f_o, rng.uniform(1, 30, n), 4.0, rng.normal(size=n))
    want = ota.estimate(v, *args)
    y = np.real(np.exp(-1j * np.angle(f_o))[:, None] * v).astype(np.float32)
    got = ota.estimate_rows(y, *args)
    assert got.dtype == np.float32 and got.shape == (n, d)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("phase", [False, True], ids=["complex", "in-phase"])
def test_the_rows_do_not_depend_on_the_medium_threads(phase):
    # the column blocks draw from their own seeds and sum their powers in the blocks' order: one thread and three give
    # the same rows and powers bit for bit, on the uplink and the downlink (d spans several blocks and a partial one)
    top = _topology()
    params = OtaParams(interferers="aggregate", sigma_dn2=2e-8, sigma_en2=2e-8)
    d = 3 * lanes.COLUMN_BLOCK + 777
    tx = _active_tx(top, SLOT, params)
    payloads = np.random.default_rng(27).normal(size=(tx.size, d)).astype(np.float32)
    devices = top.collaborating_devices[:12]
    angles = np.random.default_rng(28).uniform(-np.pi, np.pi, devices.size) if phase else None
    runs = []
    try:
        for threads in (1, 3):
            lanes.medium_threads(threads)
            up = ota.uplink_rows(payloads, tx, top, SLOT, SEED, params, np.random.default_rng(29))
            down = ota.broadcast_rows(up.received, np.arange(top.collaborating), devices, top, SLOT, SEED, params,
                                      np.random.default_rng(30), angles)
            runs.append((up, down))
    finally:
        lanes.medium_threads(0)
    (u1, d1), (u3, d3) = runs
    assert np.array_equal(u1.received, u3.received) and np.array_equal(d1.received, d3.received)
    assert np.array_equal(u1.interference_power, u3.interference_power)
    assert np.array_equal(d1.interference_power, d3.interference_power)
    assert d1.received.shape == ((devices.size, d) if phase else (devices.size, 2, d))


def test_a_forked_child_gets_its_own_medium_threads():
    # nodes are forked from a preloaded forkserver: a pool made before the fork has no threads in the child, which
    # must make its own rather than wait on the parent's
    import multiprocessing as mp

    top = _topology()
    params = OtaParams(interferers="aggregate", sigma_dn2=2e-8)
    signals = np.random.default_rng(31).normal(size=(top.collaborating, 2, 2 * lanes.COLUMN_BLOCK)).astype(np.float32)
    devices = top.collaborating_devices[:6]
    args = (signals, np.arange(top.collaborating), devices, top, SLOT, SEED, params)
    try:
        lanes.medium_threads(2)
        want = ota.broadcast_rows(*args, np.random.default_rng(32)).received  # the parent's pool exists now
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(_rows_in_child, (args,)).get(timeout=30)
    finally:
        lanes.medium_threads(0)
    assert np.array_equal(got, want)


def _rows_in_child(args):
    return ota.broadcast_rows(*args, np.random.default_rng(32)).received


def test_lane_normals_are_standard_normal_and_repeat_from_their_seed():
    # lanes._LaneNormals (SFC64 words through Box-Muller): for 400,000 draws the mean is within 5 standard errors of 0
    # (5 / sqrt(n) = 0.008), the variance within 5 of 1 (sqrt(2 / n) x 5 = 0.011), the kurtosis within 0.05 of 3 and
    # the tails as N(0, 1)'s: P(|z| > 3) = 0.0027 within 15% (n p = 1,080 expected); the same seed gives the same
    # values, another seed others; an odd length and a non-contiguous array
    seed = np.array([3, 5], dtype=np.uint64)
    out = np.empty((400, 1000), dtype=np.float32)
    lanes._LaneNormals(seed).fill(out)
    z = out.astype(np.float64).reshape(-1)
    assert abs(z.mean()) < 5 / np.sqrt(z.size)
    assert abs(z.var() - 1.0) < 5 * np.sqrt(2 / z.size)
    assert abs(np.mean(z ** 4) / z.var() ** 2 - 3.0) < 0.05
    assert abs(np.mean(np.abs(z) > 3) / 0.0026998 - 1) < 0.15
    again = np.empty_like(out)
    lanes._LaneNormals(seed).fill(again)
    assert np.array_equal(out, again)
    other = np.empty_like(out)
    lanes._LaneNormals(np.array([3, 6], dtype=np.uint64)).fill(other)
    assert not np.array_equal(out, other)
    odd = np.empty(7, dtype=np.float32)
    lanes._LaneNormals(seed).fill(odd)
    assert np.isfinite(odd).all()
    with pytest.raises(ValueError, match="C-contiguous float32"):
        lanes._LaneNormals(seed).fill(np.empty((4, 6), dtype=np.float32)[:, ::2])


@pytest.mark.parametrize("threads", [1, 3])
def test_row_combination_is_the_weighted_sum_on_any_threads(threads):
    rng = np.random.default_rng(41)
    rows = rng.normal(size=(45, 2 * lanes.MEASURE_COLUMNS + 123)).astype(np.float32)
    weights = rng.uniform(0.5, 2.0, 45)
    try:
        lanes.medium_threads(1)
        one = lanes.row_combination(weights, rows)
        lanes.medium_threads(threads)
        got = lanes.row_combination(weights, rows)
    finally:
        lanes.medium_threads(0)
    assert got.dtype == np.float32 and np.array_equal(got, one)
    assert np.allclose(got, weights @ rows.astype(np.float64), rtol=1e-5, atol=1e-4)
