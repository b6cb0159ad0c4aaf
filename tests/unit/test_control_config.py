"""[control] checks name their key; the controller plug point builds the configured controller."""
import pytest

from hfl.cloud_server import controller
from hfl.common import config

H2FDP = ["run.algorithm=h2fdp", "train.tau=10", "train.gamma=5", "control.controller=h2fdp"]


@pytest.mark.parametrize("overrides, key", [
    (["run.algorithm=hierfavg"], "control.controller"),
    (["control.tau_max=1"], "control.tau_max"),
    (["control.eta=0"], "control.eta"),
    (["control.beta=-2"], "control.beta"),
    (["control.s_max=99"], "control.s_max"),
    (["control.controller=pid"], "control.controller"),
    (["control.alpha1=-1"], "control.alpha1"),
    (["control.delay_reading=serial"], "control.delay_reading"),
])
def test_bad_control_settings_name_their_key(overrides, key):
    with pytest.raises(config.ConfigError, match=key.replace(".", r"\.")):
        config.load(None, H2FDP + overrides)


def test_no_controller_by_default_and_h2fdp_registered():
    assert controller.build(config.load(None, []), None, 10, [1]) is None
    assert "h2fdp" in controller.CONTROLLERS
    assert config.load(None, H2FDP).control.controller == "h2fdp"


def test_plan_means_average_the_planned_rounds_only():
    rows = [{"round": 0, "ctrl": "configured", "tau": 20, "s_mean": 5.0, "s_trusted": 5, "s_untrusted": 5},
            {"round": 1, "ctrl": "nested_line_search", "tau": 40, "s_mean": 4.5, "s_trusted": 4, "s_untrusted": 5},
            {"round": 2, "ctrl": "exhaustive", "tau": 24, "s_mean": 3.0, "s_trusted": 3, "s_untrusted": 3},
            {"round": 3, "accuracy": 0.5}]  # a row without a controller's columns (another mode) counts nowhere
    assert controller.plan_means(rows) == {"planned_rounds": 2, "tau_mean": 32.0, "s_mean": 3.75,
                                           "s_trusted_mean": 3.5, "s_untrusted_mean": 4.0}
    assert controller.plan_means(rows[:1]) == {"planned_rounds": 0, "tau_mean": None, "s_mean": None,
                                               "s_trusted_mean": None, "s_untrusted_mean": None}


def test_h2fdp_controller_summary_holds_the_means_of_its_own_plans(tmp_path):
    """A real controller on a real privacy policy (2 clusters of 3, one trusted): the rows its decisions write
    are what describe(rows) averages, so summary.json's control.tau_mean / s_mean are the plans' means."""
    from types import SimpleNamespace

    from hfl.cloud_server.privacy_policy import PrivacyPolicy
    from hfl.common.channel.round_clock import CLUSTER_SECONDS, DEVICE_JOULES, EDGE_JOULES

    cfg = config.load(None, H2FDP + ["topology.edges=2", "topology.devices_per_edge=3", "privacy.trusted_fraction=0.5",
                                     "privacy.calibration=paper", "run.rounds=4", "control.eta=0.05",
                                     "control.beta=10", "control.phi=1e9"])
    policy = PrivacyPolicy(cfg, ["edge-000", "edge-001"], [100] * 6, tmp_path, {}, layer_sizes=[50])
    ctrl = controller.build(cfg, policy, 50, [100] * 6)
    rows = []
    for r in range(3):
        d = ctrl.decide(r)
        row = {"round": r, **d.columns}
        assert row["s_mean"] == sum(d.participants.values()) / 2
        ctrl.observe(r, {e: SimpleNamespace(scalars={CLUSTER_SECONDS: 0.2, DEVICE_JOULES: 0.05, EDGE_JOULES: 0.3})
                         for e in policy.edges}, row)
        rows.append(row)
    assert rows[0]["ctrl"] == "configured" and rows[1]["ctrl"] != "configured"
    out = ctrl.describe(rows)
    assert out["planned_rounds"] == 2
    assert out["tau_mean"] == (rows[1]["tau"] + rows[2]["tau"]) / 2
    assert out["s_mean"] == (rows[1]["s_mean"] + rows[2]["s_mean"]) / 2
    assert out["s_mean"] < 3  # nu / phi negligible: energy alone, fewer than all 3 devices take part


@pytest.mark.parametrize("reading, method", [("parallel", "nested_line_search"),
                                             ("sequential", "exhaustive (delay couples s_T, s_U)")])
def test_h2fdp_controller_names_its_delay_reading(tmp_path, reading, method):
    """The reading reaches the plan (the sequential one is searched exhaustively), the measured upload time is
    logged (ctrl_t_up, from the edges' t_upload_seconds), and summary.json's control entry names the reading."""
    from types import SimpleNamespace

    from hfl.cloud_server.privacy_policy import PrivacyPolicy
    from hfl.common.channel.round_clock import CLUSTER_SECONDS, DEVICE_JOULES, EDGE_JOULES, UPLOAD_SECONDS

    cfg = config.load(None, H2FDP + ["topology.edges=2", "topology.devices_per_edge=3", "privacy.trusted_fraction=0.5",
                                     "privacy.calibration=paper", "run.rounds=3", "control.eta=0.05",
                                     "control.beta=10", f"control.delay_reading={reading}"])
    policy = PrivacyPolicy(cfg, ["edge-000", "edge-001"], [100] * 6, tmp_path, {}, layer_sizes=[50])
    ctrl = controller.build(cfg, policy, 50, [100] * 6)
    rows = []
    for r in range(2):
        row = {"round": r, **ctrl.decide(r).columns}
        ctrl.observe(r, {e: SimpleNamespace(scalars={CLUSTER_SECONDS: 0.2, DEVICE_JOULES: 0.05, EDGE_JOULES: 0.3,
                                                     UPLOAD_SECONDS: 0.01 * (i + 1)})
                         for i, e in enumerate(policy.edges)}, row)
        rows.append(row)
    assert rows[0]["ctrl_t_up"] == pytest.approx(0.015) and rows[1]["ctrl"] == method
    described = ctrl.describe(rows)
    assert described["delay_reading"] == reading
    assert described["search"] == ("line" if reading == "parallel" else method)
