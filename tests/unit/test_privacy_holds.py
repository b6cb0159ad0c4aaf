"""Privacy that holds (issue 18): secret DP randomness, honest sensitivities, every release charged, and nothing
un-noised in a private device's upload. Each test fails on the code before the fix."""
import json

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from hfl.common import config
from hfl.common.config import ConfigError
from hfl.common.privacy import calibration, instructions, on_wire
from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.ledger import lines_to_keep
from hfl.common.secret_random import dp_draws, dp_numpy_rng
from hfl.common.wire import WireError
from hfl.cloud_server.privacy_policy import PrivacyPolicy


H2 = ["train.tau=10", "train.gamma=5"]  # an H2FDP schedule: tau a multiple of the window m


# ---- secret randomness -------------------------------------------------------------------------------

def test_secret_draws_differ_and_do_not_follow_the_run_seed():
    a = dp_numpy_rng("secret", 7, "device", 3, 0, "dp_noise").standard_normal(1000)
    b = dp_numpy_rng("secret", 7, "device", 3, 0, "dp_noise").standard_normal(1000)
    seeded = dp_numpy_rng("seeded", 7, "device", 3, 0, "dp_noise").standard_normal(1000)
    again = dp_numpy_rng("seeded", 7, "device", 3, 0, "dp_noise").standard_normal(1000)
    assert not np.array_equal(a, b) and not np.array_equal(a, seeded)
    np.testing.assert_array_equal(seeded, again)  # the explicit replay option stays bit-identical
    # still a standard normal: mean and std of 1000 draws within 5 standard errors
    assert abs(a.mean()) < 5 / np.sqrt(1000) and abs(a.std() - 1) < 5 / np.sqrt(2 * 1000)
    import torch
    t1 = dp_draws("secret", 7, "device", 3, 0, "dp_sgd").randn(100)
    t2 = dp_draws("secret", 7, "device", 3, 0, "dp_sgd").randn(100)
    assert not torch.equal(t1, t2)
    s1 = dp_draws("seeded", 7, "device", 3, 0, "dp_sgd").randn(100)
    assert torch.equal(s1, dp_draws("seeded", 7, "device", 3, 0, "dp_sgd").randn(100))
    assert not torch.equal(s1, dp_draws("seeded", 7, "device", 3, 1, "dp_sgd").randn(100))
    with pytest.raises(ValueError, match="noise source"):
        dp_numpy_rng("public", 7, "device", 3)


# ---- honest sensitivities -------------------------------------------------------------------------------

def test_laplace_under_by_trust_is_refused_naming_the_key():
    for algorithm, edges in (("h2fdp", 2), ("hfl-dp", 2), ("pedpfl-style", 1)):
        with pytest.raises(ConfigError, match=r"privacy\.mechanism.*L1"):
            config.load(None, [f"run.algorithm={algorithm}", "privacy.mechanism=laplace", f"topology.edges={edges}", *H2])


def test_robust_aggregator_behind_a_trusted_dp_edge_is_refused():
    with pytest.raises(ConfigError, match="pipeline.aggregate"):
        config.load(None, ["run.algorithm=h2fdp", "pipeline.aggregate=coordinate_median", *H2])
    config.load(None, ["run.algorithm=hfl-dp", "pipeline.aggregate=coordinate_median", *H2])  # no trusted edge: fine


def test_noise_in_a_pipeline_slot_is_refused():
    with pytest.raises(ConfigError, match=r"pipeline\.device_noise.*DP event"):
        config.load(None, ["pipeline.device_noise=gaussian"])


def test_window_sensitivity_is_the_default_and_tau_the_papers_reading():
    base = dict(trusted=False, epsilon=1.0, delta=1e-5, eta=0.1, tau=20, clip=1.0, rounds=10, local_per_round=3,
                participants=5)
    window = calibration.calibrate_h2fdp(**base, window=5)["global"]
    literal = calibration.calibrate_h2fdp(**base)["global"]
    assert window.sensitivity == pytest.approx(2 * 0.1 * 5 * 1.0) and literal.sensitivity == pytest.approx(4.0)
    assert window.std == pytest.approx(literal.std / 4)  # same multiplier, a quarter of the noise
    cfg = config.load(None, ["run.algorithm=h2fdp", "train.tau=20", "train.gamma=5"])
    from hfl.common.privacy.config import effective, sensitivity_window
    from hfl.common import plans
    p = effective(cfg.privacy, plans.ALGORITHMS.get("h2fdp"))
    assert sensitivity_window(p, cfg.train) == 5
    paper = config.load(None, ["run.algorithm=h2fdp", "train.tau=20", "train.gamma=5", "privacy.calibration=paper"])
    assert sensitivity_window(effective(paper.privacy, plans.ALGORITHMS.get("h2fdp")), paper.train) == 20


def test_trusted_edge_scales_its_noise_to_the_contributors_it_really_has():
    """1 of 5 planned contributors: the mean moves by 2 eta m G / 1, five times the planned 2 eta m G / 5; the edge
    keeps the planned multiplier by scaling the std (the true multiplier equals the planned one)."""
    plan = instructions.parse(instructions.build("edge", "global", "gaussian", 2.0, 2 * 0.1 * 5 / 5))
    one = on_wire.mean_sensitivity(plan, [1.0], planned=5)
    assert one.sensitivity == pytest.approx(2 * 0.1 * 5) and one.multiplier == 2.0
    vec = np.zeros(200_000, np.float32)
    out, z, sens = on_wire.apply_noise(vec, one, np.random.default_rng(0))
    true_sensitivity = 2 * 0.1 * 5 / 1
    assert z == 2.0 and sens == pytest.approx(true_sensitivity)
    assert np.std(out) / true_sensitivity == pytest.approx(2.0, rel=0.01)  # the true multiplier: std / true sens
    full = on_wire.mean_sensitivity(plan, [1.0] * 5, planned=5)
    assert full.sensitivity == pytest.approx(plan.sensitivity)  # as planned: unchanged
    weighted = on_wire.mean_sensitivity(plan, [1.0, 3.0], planned=5)  # max w / sum w = 3/4
    assert weighted.sensitivity == pytest.approx(plan.sensitivity * 5 * 0.75)


# ---- the edge checks device events against the plan ----------------------------------------------------

PLAN = instructions.parse(instructions.build("device", "local", "gaussian", 1.5, 0.4))


def _event(**kw):
    base = dict(tier="device", node="dev-00001", covers=("dev-00001",), mechanism="gaussian", noise_multiplier=1.5,
                sensitivity=0.4, stream="local")
    return DpRecord(**{**base, **kw})


def test_device_events_must_state_the_planned_noise():
    on_wire.check_device_records([_event()], PLAN, "dev-00001", "local")
    for bad in ([_event(noise_multiplier=1e-3)], [_event(sensitivity=1e-9)], [_event(stream="global")], [],
                [_event(), _event()]):
        with pytest.raises(WireError) as err:
            on_wire.check_device_records(bad, PLAN, "dev-00001", "local")
        assert err.value.reason == "bad_dp_event"
    with pytest.raises(WireError):
        on_wire.check_device_records([_event()], None, "dev-00001", "local")


def test_degenerate_multipliers_are_refused_not_divided_by():
    for z in (1e-300, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise_multiplier"):
            _event(noise_multiplier=z)


# ---- every release charged ----------------------------------------------------------------------------

def test_resume_keeps_redone_rounds_charged_unless_the_noise_is_a_replay():
    lines = [{"round": r} for r in (0, 1, 2, 3)]
    assert lines_to_keep(lines, 1, "secret") == lines
    assert lines_to_keep(lines, 1, "seeded") == lines[:2]


def _policy(tmp_path, overrides):
    cfg = config.load(None, ["topology.edges=2", "topology.devices_per_edge=3", *H2] + overrides)
    return PrivacyPolicy(cfg, ["edge-000", "edge-001"], [100] * 6, tmp_path, {}, layer_sizes=[50]), cfg


def test_an_edge_that_never_reports_is_charged_its_planned_releases(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=hfl-dp", "privacy.calibration=noise_multiplier",
                                   "privacy.noise_multiplier=2.0", "train.tau=2", "train.gamma=1"])
    participants = policy.participants(0)
    policy.cluster_plans(0, participants)
    planned = policy.planned_records(0, participants)
    reported = [on_wire.to_transform(r) for r in planned if set(r.covers) <= set(participants["edge-000"])]
    row = policy.record(0, {"edge-000": reported})  # edge-001 lost mid-round: nothing reported
    line = json.loads((tmp_path / "privacy_ledger.jsonl").read_text().splitlines()[-1])
    assert row["dp_events"] == len(planned) and policy.charged_missing > 0
    z = planned[0].noise_multiplier
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), 2)  # K_l = 1 local + 1 global release
    assert line["epsilon"]["dev-00004"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)


def test_dp_fedavg_is_charged_unsampled_what_the_cloud_can_see(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=dp-fedavg", "privacy.trust=trusted", "privacy.client_rate=0.5",
                                   "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.0"])
    setting = policy.settings["edge-000"]["global"]
    assert setting.sampling_rate == 1.0
    plan = policy.cluster_plans(0, policy.participants(0))["edge-000"]
    assert plan.params["client_rate"] == 0.5  # the edge still draws; the ledger claims no amplification from it


def test_paper_modes_say_when_they_pass_the_budget(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=hfl-dp", "privacy.calibration=paper", "privacy.epsilon=0.01",
                                   "train.tau=2", "train.gamma=1"])
    participants = policy.participants(0)
    policy.cluster_plans(0, participants)
    assert policy.refuse_round(0, participants) is None  # paper mode runs on...
    row = policy.record(0, {"edge-000": [on_wire.to_transform(r) for r in policy.planned_records(0, participants)]})
    out = policy.describe()
    assert row["budget_exceeded"] and out["budget_exceeded"]  # ...and says so
    assert out["epsilon_over_budget"] == pytest.approx(out["epsilon_max"] - 0.01)


def test_seeded_noise_and_clear_beta_are_labelled(tmp_path):
    seeded, _ = _policy(tmp_path / "a", ["run.algorithm=hfl-dp", "privacy.noise_source=seeded"])
    assert any("run.seed" in g and "inf" in g for g in seeded.guarantee())
    secret, _ = _policy(tmp_path / "b", ["run.algorithm=hfl-dp"])
    assert secret.guarantee() == []
    ctrl, _ = _policy(tmp_path / "c", ["run.algorithm=h2fdp", "control.controller=h2fdp",
                                       'privacy.trust_table={"edge-000" = "trusted"}'])
    assert any("beta_estimate" in g and "not DP" in g for g in ctrl.guarantee())


def test_the_cloud_refuses_edge_events_that_do_not_match_the_plan(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=h2fdp", 'privacy.trust_table={"edge-000" = "trusted"}',
                                   "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=2.0"])
    participants = policy.participants(0)
    policy.cluster_plans(0, participants)
    honest = [r for r in policy.planned_records(0, participants) if r.node == "edge-000"]
    policy.check_events(0, "edge-000", honest)
    for forged in (honest[0].replace(noise_multiplier=1e-3), honest[0].replace(sensitivity=honest[0].sensitivity / 10),
                   honest[0].replace(sampling_rate=0.01),
                   honest[0].replace(tier="device")):   # a tier the plan did not instruct for this cluster
        with pytest.raises(WireError) as err:
            policy.check_events(0, "edge-000", [forged])
        assert err.value.reason == "bad_dp_event"
    # a trusted edge with fewer contributors records a larger sensitivity: accepted
    policy.check_events(0, "edge-000", [honest[0].replace(sensitivity=honest[0].sensitivity * 3)])
