"""Sample-level DP (DP-SGD / DP-SGD-WAV) units: calibrate_dp_sgd, DpRecord.population, the REPLACE_ONE accounting
of fixed-size lots, the wavelet noise shape on the wire, and the device's local_dp_sgd phase."""
import json

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import rdp

from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy import accountant as acct
from hfl.common.privacy import instructions, on_wire, shapes
from hfl.common.privacy.calibration import calibrate_dp_sgd
from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.wavelet import (WaveletLayout, coefficient_norms, effective_multiplier,
                                        element_noise_variance, padded_length)
from hfl.device_client.training import local_dp_sgd, make_shard

DELTA = 1e-5
EPS = 1.0
STEPS = 60
Q = 0.05
CLIP = 1.0
# fixed lots: dp_accounting's without-replacement RDP costs ~0.5 s per evaluation, so one small calibration only
N_FIXED, Q_FIXED, STEPS_FIXED = 100, 0.1, 10


# ----------------------------------------------------------------------------------------------------
# direct dp_accounting references

def poisson_eps(z, q=Q, steps=STEPS, delta=DELTA):
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


def fixed_eps(z, n, k, steps, delta=DELTA):
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, k, dp_accounting.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


@pytest.fixture(scope="module")
def vanilla():
    return calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=STEPS, lot_rate=Q, clip=CLIP)


@pytest.fixture(scope="module")
def fixed_setting():
    return calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=STEPS_FIXED, lot_rate=Q_FIXED, clip=CLIP, lot="fixed",
                            dataset_size=N_FIXED)


# ----------------------------------------------------------------------------------------------------
# 1. calibrate_dp_sgd

def test_poisson_sound_matches_dp_accounting_and_is_tight(vanilla):
    s = vanilla
    assert (s.mode, s.tier, s.stream, s.mechanism) == ("sound", "device-sample", "sample", "gaussian")
    assert s.releases == STEPS and s.sampling_rate == Q and s.sensitivity == CLIP
    assert s.epsilon_claimed is None
    assert s.std == pytest.approx(s.noise_multiplier * CLIP, rel=1e-12)
    direct = poisson_eps(s.noise_multiplier)
    assert s.epsilon == pytest.approx(direct, rel=1e-9)
    assert s.epsilon <= EPS
    assert poisson_eps(0.97 * s.noise_multiplier) > EPS  # tight: 3% less noise breaks the target


def test_fixed_lots_record_half_the_multiplier_under_replace_one(fixed_setting):
    s = fixed_setting
    k = round(Q_FIXED * N_FIXED)
    assert s.sampling_rate == pytest.approx(k / N_FIXED, rel=1e-12)
    # replace-one adjacency: the clipped sum moves by up to 2C, so the recorded multiplier is std / (2C)
    assert s.noise_multiplier == pytest.approx(s.std / (2 * CLIP), rel=1e-12)
    direct = fixed_eps(s.noise_multiplier, N_FIXED, k, STEPS_FIXED)
    assert s.epsilon == pytest.approx(direct, rel=1e-9)
    assert s.epsilon <= EPS


def test_wavelet_paper_divides_by_max_weight_and_labels_the_claim(vanilla):
    m = 16.0
    p = calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=STEPS, lot_rate=Q, clip=CLIP, wavelet="paper", max_weight=m)
    assert p.noise_multiplier == pytest.approx(vanilla.noise_multiplier / m, rel=1e-12)
    assert p.std == pytest.approx(vanilla.std, rel=1e-12)  # same noise as the vanilla accountant's sigma
    assert p.epsilon_claimed == pytest.approx(vanilla.epsilon, rel=1e-12)
    assert p.epsilon == pytest.approx(poisson_eps(p.noise_multiplier), rel=1e-9)
    assert p.epsilon > 50 * p.epsilon_claimed


def test_wavelet_sound_is_the_vanilla_setting(vanilla):
    s = calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=STEPS, lot_rate=Q, clip=CLIP, wavelet="sound",
                         max_weight=16.0)
    assert s.noise_multiplier == vanilla.noise_multiplier
    assert s.epsilon == vanilla.epsilon
    assert s.std == vanilla.std
    assert s.epsilon_claimed is None


def test_noise_multiplier_mode_uses_z_as_given():
    z = 1.7
    s = calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=STEPS, lot_rate=Q, clip=2.0, mode="noise_multiplier",
                         noise_multiplier=z)
    assert s.mode == "noise_multiplier"
    assert s.noise_multiplier == z and s.std == pytest.approx(z * 2.0, rel=1e-12)
    assert s.epsilon == pytest.approx(poisson_eps(z), rel=1e-9)
    with pytest.raises(ValueError, match="noise_multiplier"):
        calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=STEPS, lot_rate=Q, clip=2.0, mode="noise_multiplier")


@pytest.mark.parametrize("changes, message", [
    ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"), ({"lot_rate": 0.0}, "lot_rate"), ({"lot_rate": 1.5}, "lot_rate"),
    ({"lot": "x"}, "lot"), ({"wavelet": "x"}, "wavelet"), ({"lot": "fixed"}, "dataset_size"),
    ({"lot": "fixed", "dataset_size": 0}, "dataset_size"), ({"clip": 0.0}, "clip"), ({"mode": "x"}, "calibration"),
    ({"epsilon": 0.0}, "epsilon"), ({"delta": 1.0}, "delta"),
])
def test_bad_input_names_the_argument(changes, message):
    kwargs = dict(epsilon=EPS, delta=DELTA, steps=STEPS, lot_rate=Q, clip=CLIP)
    with pytest.raises(ValueError, match=message):
        calibrate_dp_sgd(**{**kwargs, **changes})


# ----------------------------------------------------------------------------------------------------
# 2. DpRecord.population

def sample_record(**changes):
    base = dict(tier="device-sample", node="dev-00003", covers=("dev-00003",), mechanism="gaussian",
                noise_multiplier=1.5, sensitivity=1.0, sampling_rate=0.1, count=7, round=2, stream="sample",
                population=100)
    return DpRecord(**{**base, **changes})


def test_population_round_trips_through_params_and_json():
    r = sample_record()
    params = r.to_transform_params()
    assert params["dp.population"] == 100.0
    back = DpRecord.from_transform_params(params)
    assert back == r and back.population == 100 and isinstance(back.population, int)
    js = DpRecord.from_json(json.loads(json.dumps(r.to_json())))
    assert js == r and js.population == 100
    assert DpRecord.from_transform_params(sample_record(population=0).to_transform_params()).population == 0


@pytest.mark.parametrize("changes", [
    {"population": -1}, {"population": 2.5},
    {"population": 10, "sampling_rate": 0.01},  # round(0.1) = 0 records per lot
])
def test_invalid_population_raises(changes):
    with pytest.raises(ValueError, match="population"):
        sample_record(**changes)


def test_population_record_is_sampled_without_replacement():
    one = sample_record(count=1)
    assert one.to_dp_event() == dp_accounting.SampledWithoutReplacementDpEvent(
        100, 10, dp_accounting.GaussianDpEvent(1.5))
    assert sample_record().to_dp_event() == dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(100, 10, dp_accounting.GaussianDpEvent(1.5)), 7)
    # population without subsampling (rate 1) is a plain Gaussian; population 0 is Poisson
    assert sample_record(count=1, sampling_rate=1.0).to_dp_event() == dp_accounting.GaussianDpEvent(1.5)
    assert sample_record(count=1, population=0).to_dp_event() == dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.GaussianDpEvent(1.5))


# ----------------------------------------------------------------------------------------------------
# 3. accountant.epsilon with population > 0

def test_population_records_use_the_replace_one_accountant():
    # two records with one key (grouped into one SelfComposed event by the accountant), composed one by one here
    recs = [sample_record(noise_multiplier=2.0, count=4, round=0), sample_record(noise_multiplier=2.0, count=3, round=1)]
    direct = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for r in recs:
        direct.compose(r.to_dp_event())
    assert acct.epsilon(recs, DELTA) == pytest.approx(direct.get_epsilon(DELTA), rel=1e-9)


def test_mixing_fixed_and_poisson_records_for_one_device_raises():
    recs = [sample_record(), sample_record(population=0, round=3)]
    with pytest.raises(ValueError, match="fixed-lot"):
        acct.epsilon(recs, DELTA)
    with pytest.raises(ValueError):
        acct.device_epsilons(recs, DELTA)


def test_pld_refuses_population_records():
    with pytest.raises(ValueError, match="rdp"):
        acct.epsilon([sample_record()], DELTA, "pld")


# ----------------------------------------------------------------------------------------------------
# 4. on_wire: the wavelet noise shape

def wavelet_plan(paper, z=1.3, sens=0.2, delta_clip=0.0):
    return instructions.parse(instructions.build("device", "local", "wavelet_gaussian", z, sens, delta_clip,
                                                 calibration="paper" if paper else "sound"))


def test_every_noise_shape_is_a_registered_noise_stage_and_mechanisms_select_them():
    from hfl.common.pipeline import VECTOR_STAGES
    from hfl.common.privacy.stages import NOISE_STAGES

    assert shapes.NOISE_SHAPES.names() == ["gaussian", "laplace", "wavelet_gaussian"]
    for name in shapes.NOISE_SHAPES:
        assert name in VECTOR_STAGES and name in NOISE_STAGES
    assert {m: shapes.for_mechanism(m).stage for m in ("gaussian", "laplace", "wavelet")} == {
        "gaussian": "gaussian", "laplace": "laplace", "wavelet": "wavelet_gaussian"}
    assert shapes.for_mechanism("wavelet").mechanism == "gaussian"  # what its DP event records
    with pytest.raises(ValueError, match="uniform"):
        shapes.for_mechanism("uniform")


@pytest.mark.parametrize("shape", ["gaussian", "laplace"])
def test_a_shape_adds_exactly_its_registered_stage(shape):
    from hfl.common.pipeline import VECTOR_STAGES

    vec = np.ones(64, np.float32)
    scale = {"gaussian": "std", "laplace": "scale"}[shape]
    via_shape = shapes.NOISE_SHAPES.get(shape).add(vec, 0.7, np.random.default_rng(3))
    via_stage = VECTOR_STAGES.get(shape)(vec, np.random.default_rng(3), **{scale: 0.7})
    np.testing.assert_array_equal(via_shape, via_stage)
    assert not np.array_equal(via_shape, vec)


@pytest.mark.parametrize("length", [1000, 1024, 7])
def test_apply_noise_wavelet_multiplier(length):
    vec = np.zeros(length, dtype=np.float32)
    m = padded_length(length)
    out_s, z_s, sens_s = on_wire.apply_noise(vec, wavelet_plan(False), np.random.default_rng(5))
    out_p, z_p, sens_p = on_wire.apply_noise(vec, wavelet_plan(True), np.random.default_rng(5))
    assert z_s == pytest.approx(1.3, rel=1e-12)
    assert z_p == pytest.approx(1.3 / m, rel=1e-12)
    assert z_p == pytest.approx(effective_multiplier(1.3, WaveletLayout([length]), "paper"), rel=1e-12)
    assert sens_s == sens_p == pytest.approx(0.2)
    assert out_s.dtype == np.float32 and out_s.shape == (length,)
    np.testing.assert_array_equal(out_s, out_p)  # same noise; only the claimed multiplier differs
    assert np.any(out_s != 0)


def test_apply_noise_gaussian_and_absent():
    plan = instructions.NoisePlan([instructions.parse(instructions.build("edge", "global", "gaussian", 2.0, 0.5))])
    vec = np.ones(16, dtype=np.float32)
    out, z, sens = on_wire.apply_noise(vec, plan.get("edge", "global"), np.random.default_rng(0))
    assert (z, sens) == (2.0, 0.5) and not np.array_equal(out, vec)
    np.testing.assert_array_equal(out, (vec + np.random.default_rng(0).normal(0.0, 1.0, 16)).astype(np.float32))
    out, z, sens = on_wire.apply_noise(vec, plan.get("edge", "local"), np.random.default_rng(0))
    assert (z, sens) == (0.0, 0.0) and out is vec


def test_wavelet_noise_per_element_variance_monte_carlo():
    m, z, sens, draws = 1024, 1.3, 0.2, 200
    s = z * sens
    rng = np.random.default_rng(1234)
    vec = np.zeros(m, dtype=np.float32)
    noise = np.stack([on_wire.apply_noise(vec, wavelet_plan(False, z, sens), rng)[0] for _ in range(draws)])
    expected = element_noise_variance(m, s)
    assert expected == pytest.approx(s * s * (1 / m ** 2 + sum(4.0 ** -j for j in range(1, 11))), rel=1e-12)
    # 204,800 values, at least ~1e5 effectively independent (the finest detail is shared by pairs): the relative
    # standard error of the variance estimate is ~sqrt(2 / 1e5) = 0.45%, so 3% is a > 6-sigma tolerance
    assert float(np.mean(noise.astype(np.float64) ** 2)) == pytest.approx(expected, rel=0.03)
    assert abs(float(noise.mean())) < 0.01 * s
    # the per-element variance is the same for every position: check the first and last quarter separately
    for part in (noise[:, : m // 4], noise[:, -m // 4:]):
        assert float(np.mean(part.astype(np.float64) ** 2)) == pytest.approx(expected, rel=0.06)


@pytest.mark.parametrize("paper", [False, True])
def test_enforce_clip_wavelet_norm(paper):
    rng = np.random.default_rng(7)
    v = rng.normal(size=100).astype(np.float32)
    layout = WaveletLayout([len(v)])
    calibration = "paper" if paper else "sound"
    norm = float(coefficient_norms(layout.forward(v.astype(np.float64)), layout.weights, calibration))
    bound = norm / 3
    out, clipped = on_wire.enforce_clip(v, wavelet_plan(paper, delta_clip=bound))
    assert clipped and out.dtype == np.float32
    after = float(coefficient_norms(layout.forward(out.astype(np.float64)), layout.weights, calibration))
    assert after <= bound and after == pytest.approx(bound, rel=1e-5)
    np.testing.assert_allclose(out, v / 3, rtol=1e-5, atol=1e-7)  # a pure rescaling
    # the other calibration's norm is not what was clipped
    other = "sound" if paper else "paper"
    ratio = float(coefficient_norms(layout.forward(out.astype(np.float64)), layout.weights, other)) / float(
        coefficient_norms(layout.forward(v.astype(np.float64)), layout.weights, other))
    assert ratio == pytest.approx(1 / 3, rel=1e-5)
    # under the bound: unchanged
    same, clipped = on_wire.enforce_clip(v, wavelet_plan(paper, delta_clip=2 * norm))
    assert not clipped and np.array_equal(same, v)


def test_wavelet_sound_clip_is_tighter_than_paper():
    v = np.random.default_rng(8).normal(size=64).astype(np.float32)
    layout = WaveletLayout([64])
    h = layout.forward(v.astype(np.float64))
    bound = 0.5 * float(coefficient_norms(h, layout.weights, "paper"))
    out_p, _ = on_wire.enforce_clip(v, wavelet_plan(True, delta_clip=bound))
    out_s, _ = on_wire.enforce_clip(v, wavelet_plan(False, delta_clip=bound))
    assert np.linalg.norm(out_s) < np.linalg.norm(out_p)  # weights >= 1: ||W (.) H|| >= ||H||


def test_enforce_clip_gaussian_is_l2_and_absent_bound_is_a_no_op():
    v = np.random.default_rng(9).normal(size=50).astype(np.float32)
    norm = float(np.linalg.norm(v.astype(np.float64)))
    plan = instructions.parse(instructions.build("edge", "global", "gaussian", 1.0, 1.0, norm / 2, ("edge",)))
    out, clipped = on_wire.enforce_clip(v, plan)
    assert clipped and float(np.linalg.norm(out.astype(np.float64))) == pytest.approx(norm / 2, rel=1e-5)
    assert float(np.linalg.norm(out.astype(np.float64))) <= norm / 2
    for plan in (instructions.parse(instructions.build("edge", "global", "gaussian", 1.0, 1.0)), wavelet_plan(False),
                 wavelet_plan(True)):
        out, clipped = on_wire.enforce_clip(v, plan)
        assert not clipped and out is v


# ----------------------------------------------------------------------------------------------------
# 5. device_client.training.local_dp_sgd

N_SHARD = 20
PHASE = {"lr": 0.1, "steps": 3, "q": 0.2, "clip": 1.0, "fixed": 0, "per_layer": 0}


def sample_noise(z=1.3, shape="gaussian", calibration=""):
    return instructions.parse(instructions.build("device-sample", "sample", shape, z, 1.0, calibration=calibration))


PLAN = sample_noise()


@pytest.fixture(scope="module")
def mlp():
    model = build("mlp", (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    return model, get_flat(model)


@pytest.fixture(scope="module")
def shard():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(N_SHARD, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=N_SHARD)
    return make_shard(x, y, mean=(0.5,), std=(0.25,))


def run_phase(mlp, shard, seed, phase=None, plan=None):
    model, w0 = mlp
    return local_dp_sgd(model, w0, shard, phase or PHASE, PLAN if plan is None else plan,
                        torch.Generator().manual_seed(seed), "dev-00004", 5)


@pytest.fixture(scope="module")
def run_11(mlp, shard):
    return run_phase(mlp, shard, 11)


def test_local_dp_sgd_gaussian_record(mlp, run_11):
    w, loss, rec = run_11
    assert w.dtype == np.float32 and w.shape == mlp[1].shape and np.isfinite(loss)
    assert not np.array_equal(w, mlp[1])
    assert rec.tier == "device-sample" and rec.stream == "sample" and rec.mechanism == "gaussian"
    assert rec.node == "dev-00004" and rec.covers == ("dev-00004",) and rec.round == 5
    assert rec.count == PHASE["steps"] and rec.sampling_rate == PHASE["q"] and rec.population == 0
    assert rec.noise_multiplier == pytest.approx(1.3, rel=1e-12)
    assert rec.sensitivity == pytest.approx(PHASE["clip"])


def test_local_dp_sgd_is_reproducible_per_seed(mlp, shard, run_11):
    w_a, loss_a, rec_a = run_11
    w_b, loss_b, rec_b = run_phase(mlp, shard, 11)
    w_c, _, _ = run_phase(mlp, shard, 12)
    np.testing.assert_array_equal(w_a, w_b)
    assert loss_a == loss_b and rec_a == rec_b
    assert not np.array_equal(w_a, w_c)


def test_local_dp_sgd_fixed_lots_record_population(mlp, shard):
    _, _, rec = run_phase(mlp, shard, 3, phase={**PHASE, "fixed": 1})
    assert rec.population == N_SHARD
    assert rec.sampling_rate == pytest.approx(round(PHASE["q"] * N_SHARD) / N_SHARD, rel=1e-12)
    assert rec.noise_multiplier == pytest.approx(1.3 / 2, rel=1e-12)  # replace-one: sigma / 2
    assert rec.to_dp_event() == dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        N_SHARD, round(PHASE["q"] * N_SHARD), dp_accounting.GaussianDpEvent(1.3 / 2)), PHASE["steps"])


@pytest.mark.parametrize("paper", [0, 1])
def test_local_dp_sgd_wavelet_record(mlp, shard, paper):
    model, w0 = mlp
    _, _, rec = run_phase(mlp, shard, 4, phase={**PHASE, "steps": 2},
                          plan=sample_noise(shape="wavelet_gaussian", calibration="paper" if paper else "sound"))
    max_weight = padded_length(len(w0))  # the flat scope's largest Haar weight, W(H_0) = m
    assert max_weight == float(WaveletLayout([len(w0)]).weights.max())
    assert rec.tier == "device-sample" and rec.covers == ("dev-00004",) and rec.count == 2
    assert rec.sampling_rate == PHASE["q"]
    assert rec.noise_multiplier == pytest.approx(1.3 / max_weight if paper else 1.3, rel=1e-12)


def test_local_dp_sgd_needs_a_noise_instruction(mlp, shard):
    for plan in (None, sample_noise(0.0)):
        with pytest.raises(ValueError, match="device-sample noise instruction"):
            local_dp_sgd(mlp[0], mlp[1], shard, PHASE, plan, torch.Generator().manual_seed(1), "dev-00004", 5)


def test_local_dp_sgd_fixed_full_lot_matches_calibration(mlp, shard):
    s = calibrate_dp_sgd(epsilon=EPS, delta=DELTA, steps=3, lot_rate=1.0, clip=1.0, lot="fixed",
                         dataset_size=N_SHARD, mode="noise_multiplier", noise_multiplier=5.0)
    _, _, rec = run_phase(mlp, shard, 2, phase={**PHASE, "fixed": 1, "q": 1.0},
                          plan=sample_noise(s.std / s.sensitivity))
    assert rec.population == 0 and rec.sampling_rate == 1.0
    # the device's record must account what the cloud planned for the same noise
    assert rec.noise_multiplier == pytest.approx(s.noise_multiplier, rel=1e-12)


def test_events_written_before_population_existed_still_parse():
    rec = DpRecord(tier="device", node="dev-00001", covers=("dev-00001",), mechanism="gaussian",
                   noise_multiplier=2.0, sensitivity=1.0)
    params = {k: v for k, v in rec.to_transform_params().items() if k != "dp.population"}
    assert DpRecord.from_transform_params(params) == rec


def test_wavelet_stages_are_registered_as_the_pure_functions():
    from hfl.common.pipeline import VECTOR_STAGES
    from hfl.common.privacy.wavelet import WaveletLayout, wavelet_clip, wavelet_gaussian

    vec = np.linspace(-2.0, 3.0, 100).astype(np.float32)
    layout = WaveletLayout([100])
    got = VECTOR_STAGES.get("wavelet_gaussian")(vec, np.random.default_rng(7), noise_multiplier=2.0, sensitivity=0.5)
    np.testing.assert_array_equal(got, wavelet_gaussian(vec, 1.0, layout, np.random.default_rng(7)))
    for weighted, mode in ((1.0, "sound"), (0.0, "paper")):
        got = VECTOR_STAGES.get("wavelet_clip")(vec, np.random.default_rng(0), clip=0.5, weighted=weighted)
        np.testing.assert_array_equal(got, wavelet_clip(vec, 0.5, layout, mode)[0])


@pytest.mark.parametrize("overrides, key", [
    (["run.algorithm=dp-sgd", "privacy.lot=fixed", "privacy.accountant=pld"], "privacy.accountant"),
    (["run.algorithm=dp-fedavg-wav", "privacy.trust=trusted", "privacy.wavelet_scope=per_layer"], "privacy.wavelet_scope"),
    (["run.algorithm=dp-fedavg", "privacy.trust=trusted", "privacy.mechanism=laplace"], "privacy.mechanism"),
    (["run.algorithm=dp-sgd", "privacy.mechanism=laplace"], "privacy.mechanism"),
    (["run.algorithm=dp-sgd", "train.gamma=0"], "train.gamma"),
    (["run.algorithm=dp-sgd", "privacy.lot_rate=0"], "privacy.lot_rate"),
    (["run.algorithm=dp-sgd", "privacy.layer_clips=[1.0, 1.0]"], "privacy.layer_clips"),
    (["run.algorithm=dp-sgd-wav", "privacy.layer_clips=[1,1,1,1,1,1]"], "privacy.wavelet_scope"),
    (["run.algorithm=hierfavg", "privacy.level=sample"], "privacy.level"),
    (["run.algorithm=dp-sgd-wav", "privacy.mechanism=laplace"], "privacy.mechanism"),
])
def test_bad_sample_level_configs_name_the_key(overrides, key):
    from hfl.common.config import ConfigError, load

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(overrides=overrides)


def test_dp_sgd_steps_for_epochs_round_up_exactly():
    from types import SimpleNamespace

    from hfl.common.plans import dp_sgd_steps

    assert dp_sgd_steps(SimpleNamespace(gamma=3, local_unit="epochs"), 0.3) == 10
    assert dp_sgd_steps(SimpleNamespace(gamma=3, local_unit="epochs"), 0.6) == 5
    assert dp_sgd_steps(SimpleNamespace(gamma=1, local_unit="epochs"), 0.07) == 15
    assert dp_sgd_steps(SimpleNamespace(gamma=7, local_unit="steps"), 0.07) == 7
