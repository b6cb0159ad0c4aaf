"""Noise calibration: paper 000's formula, the accountant-backed sound mode, DP-FedAvg."""
import math

import numpy as np
import pytest

from hfl.common.privacy.accountant import epsilon_of_releases
from hfl.common.privacy.calibration import (aggregate_noise_variance, calibrate_dp_fedavg, calibrate_h2fdp,
                                            calibrate_multiplier, dp_fedavg_weights, h2fdp_sensitivity,
                                            local_aggregations_per_round, paper_sigma)
from hfl.common.privacy.noise import add_gaussian

BASE = dict(epsilon=1.0, delta=1e-5, eta=0.01, tau=20, clip=1.0, rounds=200, local_per_round=3, participants=5, q=0.027)


@pytest.mark.parametrize("mode", ["paper", "sound", "noise_multiplier"])
@pytest.mark.parametrize("s_c", [1, 5, 12])
def test_trusted_cluster_aggregate_variance_is_one_over_sc_of_untrusted(mode, s_c):
    # digest 000, 9.1: trusted = one edge draw on the mean; untrusted = mean of s_c device draws.
    kw = {**BASE, "participants": s_c, "mode": mode, "c2": 0.7, "v2": 0.7, "noise_multiplier": 3.0}
    for stream in ("local", "global"):
        edge = calibrate_h2fdp(trusted=True, **kw)[stream]
        dev = calibrate_h2fdp(trusted=False, **kw)[stream]
        trusted_var = aggregate_noise_variance([edge.std], [1.0])
        untrusted_var = aggregate_noise_variance([dev.std] * s_c, [1.0 / s_c] * s_c)
        assert trusted_var / untrusted_var == pytest.approx(1.0 / s_c, rel=1e-12)
        assert (edge.tier, dev.tier) == ("edge", "device")


def test_aggregate_variance_formula_against_real_draws():
    # Monte Carlo of the untrusted mean of s_c = 5 draws of std 2: variance 4/5. Relative SE of a
    # sample variance over 200k coordinates is sqrt(2/200k) = 0.3%; 2% is ~6 SE.
    s_c, std, n = 5, 2.0, 200_000
    draws = [add_gaussian(np.zeros(n), std, np.random.default_rng(i)) for i in range(s_c)]
    assert np.mean(draws, axis=0).var() == pytest.approx(aggregate_noise_variance([std] * s_c, [1 / s_c] * s_c), rel=0.02)
    assert aggregate_noise_variance([std] * s_c, [1 / s_c] * s_c) == pytest.approx(std ** 2 / s_c)


def test_paper_sigma_matches_formula_and_scales():
    sens = h2fdp_sensitivity(0.01, 20, 1.0)
    assert sens == pytest.approx(0.4)
    assert h2fdp_sensitivity(0.01, 20, 1.0, participants=5) == pytest.approx(0.08)
    s = paper_sigma(sens, 0.027, 200, 1.0, 1e-5, c2=1.0)
    assert s == pytest.approx(0.027 * 0.4 * math.sqrt(200 * math.log(1e5)))  # digest 000 Sec. 10: about 0.5
    # linear in eta * tau * q / epsilon ...
    for factor in (0.5, 2.0, 3.0):
        assert paper_sigma(h2fdp_sensitivity(0.01 * factor, 20, 1.0), 0.027, 200, 1.0, 1e-5) == pytest.approx(factor * s)
        assert paper_sigma(h2fdp_sensitivity(0.01, int(20 * factor), 1.0), 0.027, 200, 1.0, 1e-5) == pytest.approx(factor * s)
        assert paper_sigma(sens, 0.027 * factor / 3, 200, 1.0, 1e-5) == pytest.approx(factor / 3 * s)
        assert paper_sigma(sens, 0.027, 200, 1.0 / factor, 1e-5) == pytest.approx(factor * s)
    # ... and with sqrt(L ln(1/delta))
    assert paper_sigma(sens, 0.027, 800, 1.0, 1e-5) == pytest.approx(2 * s)
    assert paper_sigma(sens, 0.027, 200, 1.0, 1e-10) == pytest.approx(math.sqrt(2) * s)


def test_paper_mode_labels_claim_and_reports_the_accountant():
    out = calibrate_h2fdp(trusted=False, mode="paper", **BASE)
    loc, glob = out["local"], out["global"]
    assert loc.std == pytest.approx(paper_sigma(0.4, 0.027, 600, 1.0, 1e-5))  # l_c = K_g K_l = 600
    assert glob.std == pytest.approx(paper_sigma(0.4, 0.027, 200, 1.0, 1e-5))
    assert loc.epsilon_claimed == glob.epsilon_claimed == 1.0
    assert loc.mode == "paper"
    direct = epsilon_of_releases([("gaussian", loc.noise_multiplier, 1.0, 600), ("gaussian", glob.noise_multiplier, 1.0, 200)], 1e-5)
    assert loc.epsilon == pytest.approx(direct)
    assert loc.epsilon > 10  # the paper's noise does not deliver its claim under sound accounting


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_sound_mode_meets_target_and_is_tight(accountant):
    out = calibrate_h2fdp(trusted=True, mode="sound", accountant=accountant, **BASE)
    z = out["local"].noise_multiplier
    assert out["global"].noise_multiplier == z and out["local"].epsilon_claimed is None
    n = 200 * (3 + 1)  # both streams count for every party: rounds x (K_l + 1) releases per device
    spent = epsilon_of_releases([("gaussian", z, 1.0, n)], 1e-5, accountant)
    assert spent == pytest.approx(out["local"].epsilon)
    assert 0.95 <= spent <= 1.0
    assert epsilon_of_releases([("gaussian", 0.97 * z, 1.0, n)], 1e-5, accountant) > 1.0  # no slack left
    assert out["local"].std == pytest.approx(z * 0.4 / 5)


def test_sound_mode_charges_only_rounds_a_device_may_join():
    full = calibrate_h2fdp(trusted=False, mode="sound", **BASE)["global"]
    half = calibrate_h2fdp(trusted=False, mode="sound", rounds_participating=100, **BASE)["global"]
    assert half.releases == 100 and half.noise_multiplier < full.noise_multiplier
    assert half.epsilon <= 1.0


@pytest.mark.parametrize("rate", [1.0, 0.1])
def test_calibrate_multiplier_subsampled(rate):
    z = calibrate_multiplier(2.0, 1e-5, 50, sampling_rate=rate)
    spent = epsilon_of_releases([("gaussian", z, rate, 50)], 1e-5)
    assert 0.95 * 2.0 <= spent <= 2.0


def test_noise_multiplier_mode_reports_spend():
    out = calibrate_h2fdp(trusted=False, mode="noise_multiplier", noise_multiplier=50.0, **BASE)["global"]
    assert out.noise_multiplier == 50.0 and out.std == pytest.approx(50.0 * 0.4)
    assert out.epsilon == pytest.approx(epsilon_of_releases([("gaussian", 50.0, 1.0, 800)], 1e-5))
    with pytest.raises(ValueError, match="noise_multiplier"):
        calibrate_h2fdp(trusted=False, mode="noise_multiplier", **BASE)


def test_local_aggregations_per_round():
    assert local_aggregations_per_round(20, 5) == 3
    assert local_aggregations_per_round(21, 5) == 4
    assert local_aggregations_per_round(5, 5) == 0
    out = calibrate_h2fdp(trusted=True, **{**BASE, "local_per_round": 0})
    assert set(out) == {"global"}


def test_dp_fedavg_sound_std_uses_max_weight():
    sizes = [100, 300, 600]
    p = dp_fedavg_weights(sizes, 0.5)
    assert p == pytest.approx(np.array(sizes) / (0.5 * 1000))
    s = calibrate_dp_fedavg(epsilon=2.0, delta=1e-5, rounds=50, client_rate=0.1, clip=0.8, sizes=sizes)
    assert s.std == pytest.approx(s.noise_multiplier * 0.8 * 6.0)  # z S max_k p_k, max p = 600 / (0.1 * 1000)
    # the edge's report shows the draw to the cloud: every round charged unsampled (issue 18, item 3)
    assert 1.9 <= s.epsilon <= 2.0 and s.sampling_rate == 1.0 and s.tier == "edge"
    assert s.epsilon == pytest.approx(epsilon_of_releases([("gaussian", s.noise_multiplier, 1.0, 50)], 1e-5))
    amplified = calibrate_dp_fedavg(epsilon=2.0, delta=1e-5, rounds=50, client_rate=0.1, clip=0.8, sizes=sizes,
                                    amplified=True)
    assert amplified.sampling_rate == 0.1 and amplified.noise_multiplier < s.noise_multiplier / 3


def test_dp_fedavg_paper_mode_is_labelled_and_under_noised():
    kw = dict(epsilon=2.0, delta=1e-5, rounds=50, client_rate=0.5, clip=0.8, sizes=[100, 300, 600])
    paper = calibrate_dp_fedavg(mode="paper", noise_multiplier=1.5, **kw)
    assert paper.std == pytest.approx(1.5 * 0.8 / (0.5 * 1000))  # paper 002 Eq. 5, drops d_k
    assert paper.epsilon_claimed == pytest.approx(epsilon_of_releases([("gaussian", 1.5, 0.5, 50)], 1e-5))
    assert paper.epsilon > paper.epsilon_claimed


@pytest.mark.parametrize("call, message", [
    (lambda: calibrate_h2fdp(trusted=True, **{**BASE, "epsilon": 0}), "epsilon"),
    (lambda: calibrate_h2fdp(trusted=True, **{**BASE, "delta": 1.0}), "delta"),
    (lambda: calibrate_h2fdp(trusted=True, mode="magic", **BASE), "calibration"),
    (lambda: calibrate_h2fdp(trusted=True, **{**BASE, "clip": -1}), "clip"),
    (lambda: calibrate_h2fdp(trusted=True, rounds_participating=500, **BASE), "rounds_participating"),
    (lambda: dp_fedavg_weights([1, 2], 0.0), "client_rate"),
    (lambda: paper_sigma(1.0, 1.5, 10, 1.0, 1e-5), "q"),
])
def test_bad_input_names_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_round_records_put_noise_at_the_policy_tier_and_sum_to_the_plan():
    from hfl.common.privacy.calibration import h2fdp_round_records
    from hfl.common.privacy.ledger import PrivacyLedger

    levels = {"edge-000": "trusted", "edge-001": "untrusted"}
    members = {"edge-000": ["dev-00001", "dev-00000"], "edge-001": ["dev-00002", "dev-00003"]}
    kw = {**BASE, "participants": 2, "rounds": 4}
    settings = {e: calibrate_h2fdp(trusted=lvl == "trusted", **kw) for e, lvl in levels.items()}
    recs = h2fdp_round_records(0, levels, members, settings, 3)
    assert {(r.tier, r.node, r.covers) for r in recs} == {
        ("edge", "edge-000", ("dev-00000", "dev-00001")), ("device", "dev-00002", ("dev-00002",)),
        ("device", "dev-00003", ("dev-00003",))}
    ledger = PrivacyLedger(1e-5)
    for k in range(4):
        assert not ledger.would_exceed(h2fdp_round_records(k, levels, members, settings, 3), 1.0)
        ledger.record_round(k, h2fdp_round_records(k, levels, members, settings, 3))
    assert ledger.summary()["epsilon_max"] == pytest.approx(settings["edge-000"]["global"].epsilon)
    assert 0.95 <= ledger.summary()["epsilon_max"] <= 1.0
    assert ledger.would_exceed(h2fdp_round_records(4, levels, members, settings, 3), 1.0)  # a 5th round is refused
