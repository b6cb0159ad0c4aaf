"""[latency]: virtual runtime per round, the cloud's per-round (tau, gamma) choice (paper 001 Sec. IV), `hfl plan`."""
import json

import pytest

from hfl.common import config as config_mod
from hfl.common import plans
from hfl.common.quantization import latency_opt as lo
from hfl.common.quantization import schedule
from hfl.cli import main as plan_main

DIM = 28938  # mnist-cnn on the embedded MNIST
QSGD = ["pipeline.uplink_encoding=qsgd", "pipeline.params.uplink_encoding.levels=4"]
SMALL_LATENCY = ["latency.time_base=config", "latency.t_cp_s=1", "latency.t_de_s=1", "latency.t_ec_s=2",
                 "latency.deadline_s=8"]
TABLE_III = ["latency.time_base=config"]  # the [latency] defaults: paper 001's CIFAR CNN, not the model trained


def cfg(*overrides):
    return config_mod.load(None, ["run.algorithm=qhetfed", "topology.edges=2", "topology.devices_per_edge=3",
                                  *overrides])


def counts(plan):
    kinds = [p.kind for p in plan]
    local = [p for p in plan if p.kind == plans.LOCAL_SGD]
    return kinds.count(plans.EDGE_GRADIENT_STEP), int(local[0].params["steps"]) if local else 0


def test_latency_defaults_are_digest_001_worked_example():
    s = config_mod.Config().latency
    t_cp, t_de, t_ec = lo.link_times(cycles_per_bit=20, data_bits=100 * 3072 * 8, cpu_hz=1e9, model_bits=32 * 591_274,
                                     bandwidth_hz=1e6, gain=1e-8, power_w=0.5, noise_w=1e-10)
    assert (s.t_cp_s, s.t_de_s, s.t_ec_s) == pytest.approx((t_cp, t_de, t_ec), rel=1e-4)
    assert s.deadline_s == 156.0 and s.uploads == "paper" and s.auto_tau_gamma is False
    # digest 001 section 5: at 156 s the optimum is the largest feasible tau, 36
    choice, _, _ = schedule.choose(cfg(*QSGD, *TABLE_III), DIM)
    assert choice.tau == 36


def test_theoretical_q1():
    q, text = schedule.theoretical_q(cfg(*QSGD), DIM)
    assert q == pytest.approx(min(DIM / 16, DIM ** 0.5 / 4)) and "s1 = 4" in text
    q, _ = schedule.theoretical_q(cfg(*QSGD, "pipeline.params.uplink_encoding.bucket_size=512"), DIM)
    assert q == pytest.approx(min(512 / 16, 512 ** 0.5 / 4))
    assert schedule.theoretical_q(cfg(), DIM)[0] == 0.0  # float32 uplink is exact


def test_auto_schedule_builds_each_round_from_its_choice():
    c = cfg(*QSGD, *SMALL_LATENCY, "latency.auto_tau_gamma=true", "train.tau=50", "train.gamma=50")
    sched = schedule.RoundSchedule(c, DIM)
    # round 0: theoretical q1 ~ 42.5 -> k = 2 (1 + q1) / 6 ~ 14.5 -> tau = 1, gamma = 4 (train.tau/gamma unused)
    assert counts(sched.plan(0)) == (1, 4)
    row = sched.record({"q_uplink": 1.0})
    assert row == {"virtual_seconds": 8.0, "tau": 1, "gamma": 4, "q1_used": pytest.approx(42.528, abs=1e-3),
                   "q1_source": "theory", "latency_source": "config", "t_cp_s_used": 1.0, "t_de_s_used": 1.0,
                   "t_ec_s_used": 2.0}
    # round 1: the measured q1 = 1 (k = 2/3) favours more tau: (2, 2); the clock adds T_di(2, 2) = 8 s
    assert counts(sched.plan(1)) == (2, 2)
    row = sched.record({"q_uplink": 30.0})
    assert row["q1_source"] == "measured" and row["q1_used"] == 1.0 and row["virtual_seconds"] == 16.0
    assert counts(sched.plan(2)) == (1, 4)
    summary = sched.describe()
    assert summary["mode"] == "auto" and [c["tau"] for c in summary["choices"]] == [1, 2, 1]
    assert summary["q1_sources"] == ["measured", "theory"] and summary["first"]["q1_source"] == "theory"
    assert summary["choices"][1]["q1_detail"] == "q_uplink of round 0"
    json.dumps(summary)


def test_resumed_schedule_continues_clock_and_measured_q():
    c = cfg(*QSGD, *SMALL_LATENCY, "latency.auto_tau_gamma=true")
    sched = schedule.RoundSchedule(c, DIM, rows=[{"round": 0, "virtual_seconds": 8.0, "q_uplink": 1.0},
                                                 {"round": 1, "virtual_seconds": 16.0, "q_uplink": None}])
    assert counts(sched.plan(2)) == (2, 2)
    assert sched.record({})["virtual_seconds"] == 24.0


@pytest.mark.parametrize("algorithm, formula", [
    ("qhetfed", lambda t, g: lo.round_latency(t, g, 1, 1, 2)),
    ("hier-local-qsgd", lambda t, g: lo.hier_local_qsgd_latency(t, g, 1, 1, 2)),
    ("qhetfed-gamma1", lambda t, g: lo.round_latency(t, 1, 1, 1, 2)),
])
def test_fixed_schedule_virtual_seconds(algorithm, formula):
    c = cfg(*SMALL_LATENCY, f"run.algorithm={algorithm}", "train.tau=3", "train.gamma=4")
    sched = schedule.RoundSchedule(c, DIM)
    assert [p.kind for p in sched.plan(0)] == [p.kind for p in plans.build_plan(c)]
    assert [sched.record({})["virtual_seconds"] for _ in range(3)] == pytest.approx([formula(3, 4) * i for i in (1, 2, 3)])
    assert sched.describe()["mode"] == "fixed" and "latency_model" in sched.describe()


def test_no_virtual_clock_without_a_latency_model():
    assert schedule.RoundSchedule(cfg("run.algorithm=hierfavg"), DIM).record({}) == {}
    assert schedule.RoundSchedule(cfg("train.local_unit=epochs"), DIM).record({}) == {}  # T_di counts steps


def test_exact_uploads_charge_one_more_upload():
    c = cfg(*SMALL_LATENCY, "latency.uploads=exact", "train.tau=2", "train.gamma=2")
    assert schedule.RoundSchedule(c, DIM).record({})["virtual_seconds"] == (2 + 2) + (2 + 1) + 2  # (tau + gamma) t_CP + (tau + 1) t_DE + t_EC


@pytest.mark.parametrize("overrides, key", [
    (["latency.auto_tau_gamma=true", "run.algorithm=hier-local-qsgd"], "latency.auto_tau_gamma"),
    (["latency.auto_tau_gamma=true", "pipeline.uplink_encoding=sq"], "latency.auto_tau_gamma"),
    (["latency.auto_tau_gamma=true", "train.local_unit=epochs"], "train.local_unit"),
    (["latency.auto_tau_gamma=true", "latency.deadline_s=10", *TABLE_III], "latency.deadline_s"),
    (["latency.t_de_s=1"], "latency.t_de_s = 1.0 would be unused: latency.time_base = \"model\""),
    (["latency.deadline_s=0"], "latency.deadline_s"),
    (["latency.deadline_s=nan"], "latency.deadline_s"),
    (["latency.t_cp_s=0"], "latency.t_cp_s"),
    (["latency.t_de_s=-1"], "latency.t_de_s"),
    (["latency.t_ec_s=inf"], "latency.t_ec_s"),
    (["latency.uploads=some"], "latency.uploads"),
    (["latency.auto_tau_gamma=1"], "latency.auto_tau_gamma"),
    (["latency.deadline=1"], "latency.deadline"),
])
def test_bad_latency_config_names_the_key(overrides, key):
    with pytest.raises(config_mod.ConfigError, match=key.replace(".", r"\.")):
        cfg(*overrides)


def test_latency_section_round_trips_through_toml():
    c = cfg(*SMALL_LATENCY, "latency.auto_tau_gamma=true")
    import tomllib

    again = config_mod.from_dict(tomllib.loads(config_mod.to_toml(c)))
    assert again.latency == c.latency


def test_hfl_plan_prints_choice_and_curve(tmp_path, capsys):
    assert plan_main(["plan", "--set", "run.algorithm=qhetfed", *sum((["--set", o] for o in QSGD + TABLE_III), []),
                      "--dim", str(DIM), "--rows", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "chosen tau=36 gamma=16" in out and "QSGD bound" in out
    table = [line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert len(table) == 36  # every feasible tau with --rows 0
    report = json.loads((tmp_path / "plan.json").read_text())
    assert report["tau"] == 36 and report["model_parameters"] == DIM and len(report["curve"]) == 36
    assert report["q1"] == pytest.approx(DIM ** 0.5 / 4) and report["latency"]["deadline_s"] == 156.0
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_hfl_plan_measured_q1_and_model_from_config(capsys):
    assert plan_main(["plan", *sum((["--set", o] for o in SMALL_LATENCY), []), "--q1", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "d = 28938" in out and "q1 = 1 from measured" in out and "chosen tau=2 gamma=2" in out


@pytest.mark.parametrize("args, message", [
    (["--set", "latency.deadline_s=-1"], "latency.deadline_s"),
    (["--q1", "-2", "--dim", "10"], "--q1"),
    (["--dim", "0"], "--dim"),
    (["--set", "latency.time_base=config", "--set", "latency.t_cp_s=1", "--set", "latency.deadline_s=1", "--dim", "10"],
     "latency.deadline_s = 1.0 leaves no"),
    (["--set", "latency.deadline_s=0.001", "--dim", "10"], "latency.deadline_s = 0.001 leaves no"),  # the model's times
])
def test_hfl_plan_bad_inputs(args, message, capsys):
    assert plan_main(["plan", *args]) == 2
    assert message in capsys.readouterr().err


def test_emulated_latency_source_chooses_from_the_previous_rounds_clock():
    c = cfg(*QSGD, "latency.auto_tau_gamma=true", "latency.source=emulated", "latency.deadline_s=8",
            "train.tau=3", "train.gamma=2")
    sched = schedule.RoundSchedule(c, DIM)
    assert counts(sched.plan(0)) == (3, 2)  # nothing emulated yet: the configured plan
    row = sched.record({"q_uplink": 1.0, "t_cp_emulated": 1.0, "t_de_emulated": 1.0, "t_ec_emulated": 2.0})
    assert row["latency_source"].startswith("configured") and row["tau"] == 3
    # the emulated times equal SMALL_LATENCY's, so the choice is the config-driven one at q1 = 1: (2, 2)
    assert counts(sched.plan(1)) == (2, 2)
    row = sched.record({"q_uplink": 1.0, "t_cp_emulated": 0.001, "t_de_emulated": 0.001, "t_ec_emulated": 0.001})
    assert row["latency_source"] == "emulated" and (row["t_cp_s_used"], row["t_ec_s_used"]) == (1.0, 2.0)
    # a deadline of 8 s is 2,000 x the new T_di(1, 1) = 4 ms: out of range, the previous (tau, gamma) is kept
    assert counts(sched.plan(2)) == (2, 2)
    assert sched.record({})["latency_source"].startswith("kept")
    with pytest.raises(config_mod.ConfigError, match="latency.source"):
        cfg("latency.source=measured")


def test_random_pick_draws_a_feasible_pair_per_round_from_the_seed():
    c = cfg(*QSGD, *TABLE_III, "latency.auto_tau_gamma=true", "latency.pick=random")  # Table III, 156 s deadline
    best, _, _ = schedule.choose(cfg(*QSGD, *TABLE_III, "latency.auto_tau_gamma=true"), DIM)
    picks = [schedule.choose(c, DIM, round_=r)[0] for r in range(12)]
    feasible = set(zip(best.curve_tau.tolist(), best.curve_gamma.tolist()))
    assert all((p.tau, p.gamma) in feasible and p.method == "random_feasible" for p in picks)
    assert len({(p.tau, p.gamma) for p in picks}) > 1 and all(p.phi >= best.phi for p in picks)
    assert [(p.tau, p.gamma) for p in picks] == [(q.tau, q.gamma) for q in (schedule.choose(c, DIM, round_=r)[0]
                                                                             for r in range(12))]
