"""One time base (issue 19): paper 001's T_di model timed with the model the run trains (latency.time_base =
"model", the default), the configured figures with "config", and summary.json says which."""
import pytest

from hfl.common import config as config_mod
from hfl.common.models import build, num_parameters
from hfl.common.quantization import latency_opt as lo
from hfl.common.quantization import schedule


def test_table_iii_with_the_papers_cnn_gives_the_config_defaults():
    s = config_mod.Config().latency
    d = num_parameters(build("cifar-cnn", (3, 32, 32), 10))
    assert d == lo.PAPER_001_D
    assert lo.model_link_times(d, 100, 3 * 32 * 32) == pytest.approx((s.t_cp_s, s.t_de_s, s.t_ec_s), rel=1e-4)


def test_times_scale_with_d_and_data():
    t_cp, t_de, t_ec = lo.model_link_times(7_850, 32, 784)
    _, t_de_paper, _ = lo.model_link_times(lo.PAPER_001_D, 100, 3072)
    assert t_de == pytest.approx(t_de_paper * 7_850 / lo.PAPER_001_D) and t_ec == pytest.approx(10 * t_de)
    assert t_cp == pytest.approx(20 * 32 * 784 * 8 / 1e9)
    with pytest.raises(ValueError, match="integers"):
        lo.model_link_times(0, 32, 784)


def test_schedule_uses_the_trained_model_and_records_it():
    cfg = config_mod.load(None, ["run.algorithm=qhetfed", "latency.time_base=model", "train.tau=3", "train.gamma=4",
                                 "train.batch_size=32"])
    sched = schedule.RoundSchedule(cfg, 28_938, input_size=784)
    t_cp, t_de, t_ec = lo.model_link_times(28_938, 32, 784)
    assert sched.record({})["virtual_seconds"] == pytest.approx(lo.round_latency(3, 4, t_cp, t_de, t_ec))
    base = sched.describe()["time_base"]
    assert base["source"] == "model" and base["d"] == 28_938 and base["t_de_s"] == pytest.approx(t_de)
    default = schedule.RoundSchedule(config_mod.load(None, ["run.algorithm=qhetfed", "train.batch_size=32"]), 28_938)
    assert default.describe()["time_base"] == base  # the default is the model's time base
    configured = schedule.RoundSchedule(config_mod.load(None, ["run.algorithm=qhetfed", "latency.time_base=config"]),
                                        28_938).describe()["time_base"]
    assert configured["source"] == "config" and configured["d_model"] == 28_938
    assert configured["t_de_s"] == config_mod.Config().latency.t_de_s


def test_model_time_base_reads_the_input_size_from_the_dataset():
    cfg = config_mod.load(None, ["run.algorithm=qhetfed", "latency.time_base=model"])
    base = schedule.RoundSchedule(cfg, 7_850).describe()["time_base"]
    assert base["data_bits"] == cfg.train.batch_size * 784 * 8  # mnist-embedded: 1 x 28 x 28


def test_a_deadline_too_short_for_the_models_times_fails_before_launch():
    from hfl.preflight import preflight

    auto = ["run.algorithm=qhetfed", "latency.auto_tau_gamma=true", "pipeline.uplink_encoding=qsgd",
            "model.name=linear", "train.batch_size=32"]
    t_cp, t_de, t_ec = lo.model_link_times(7_850, 32, 784)
    least = float(lo.round_latency(1, 1, t_cp, t_de, t_ec))
    preflight(config_mod.load(None, auto + [f"latency.deadline_s={least * 1.01}"]))  # config time cannot know d
    with pytest.raises(config_mod.ConfigError, match=r"latency\.deadline_s = .* leaves no \(tau >= 1"):
        preflight(config_mod.load(None, auto + [f"latency.deadline_s={least * 0.99}"]))


def test_the_papers_cnn_on_28x28x1_is_timed_with_its_own_d():
    """Paper 001's CNN adapted to F-MNIST (cifar-cnn on 1 x 28 x 28, d = 467,818) is timed with that d and D = 100 x
    784 x 8 bits, not with the CIFAR model's 591,274 and 100 x 3,072 x 8 (issue 21)."""
    d = num_parameters(build("cifar-cnn", (1, 28, 28), 10))
    assert d == 467_818
    cfg = config_mod.load(None, ["run.algorithm=qhetfed", "model.name=cifar-cnn", "train.batch_size=100",
                                 "train.tau=12", "train.gamma=3"])
    sched = schedule.RoundSchedule(cfg, d, input_size=784)
    base = sched.describe()["time_base"]
    assert base["d"] == d and base["d_b_bits"] == 32 * d and base["data_bits"] == 100 * 784 * 8
    t_cp, t_de, t_ec = lo.model_link_times(d, 100, 784)
    assert (base["t_cp_s"], base["t_de_s"], base["t_ec_s"]) == pytest.approx((t_cp, t_de, t_ec))
    assert base["t_de_s"] == pytest.approx(config_mod.Config().latency.t_de_s * d / lo.PAPER_001_D, rel=1e-4)
    assert sched.record({})["virtual_seconds"] == pytest.approx(15 * t_cp + 12 * t_de + t_ec)


def test_paper_001_specs_time_every_run_with_the_model_it_trains():
    """Every run of the issue 21 paper-001 specs uses the trained model's time base; the Hier-Local-QSGD and QHetFed
    cells of 9.1 get equal virtual time (their rounds are chosen for it) within 3%."""
    import math
    import pathlib

    from hfl import sweep

    root = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "experiments"
    specs = sorted(root.glob("qhetfed-*-fmnist.toml"))
    assert len(specs) >= 5
    virtual = {}
    for path in specs:
        for run in sweep.expand(sweep.load_spec(path), pathlib.Path("/nonexistent/out")):
            cfg = run.config
            assert cfg.latency.time_base == "model", (path.name, run.cell)
            shape = (1, 28, 28)
            d = num_parameters(build(cfg.model.name, shape, 10))
            sched = schedule.RoundSchedule(cfg, d, input_size=math.prod(shape))
            assert sched.describe()["time_base"]["d"] == d
            if path.name == "qhetfed-hetero-fmnist.toml" and run.seed == 0:
                per_round = sched.model.seconds(cfg.train.tau, cfg.train.gamma, sched.cfg.latency)
                virtual[run.cell] = per_round * cfg.run.rounds
    for level in ("iid", "mixed", "non-iid1", "non-iid2"):
        q, h = virtual[f"qhetfed,data.partition={level}"], virtual[f"hier-local-qsgd,data.partition={level}"]
        assert abs(q - h) / q < 0.03, (level, q, h)
