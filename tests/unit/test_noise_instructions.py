"""The round plan states the noise (issue 17 item 3): each placement's typed NoiseInstructions, the receiver's
validation of them, the releases a device and an edge make from them, and the pipeline's noise slots refusing
noise that no instruction states."""
import asyncio
import types

import numpy as np
import pytest

from hfl.cloud_server.privacy_policy import PrivacyPolicy
from hfl.common import config
from hfl.common.config import ConfigError
from hfl.common.privacy import instructions, on_wire, shapes
from hfl.common.privacy.instructions import NoisePlanError
from hfl.proto import hfl_v1_pb2 as pb

H2 = ["train.tau=10", "train.gamma=5"]
EDGES = ["edge-000", "edge-001"]


def _policy(tmp_path, overrides):
    cfg = config.load(None, ["topology.edges=2", "topology.devices_per_edge=3", *H2] + overrides)
    return PrivacyPolicy(cfg, EDGES, [100, 200, 300, 400, 500, 600], tmp_path, {}, layer_sizes=[50]), cfg


def _plans(policy, r=0):
    plans = policy.cluster_plans(r, policy.participants(r))
    # what travels: the receiver reads the plan the wire gives it
    return {e: pb.ClusterPlan.FromString(p.SerializeToString()) for e, p in plans.items()}


def _fields(ins: pb.NoiseInstruction) -> tuple:
    return ins.tier, ins.stream, ins.shape, tuple(ins.clip_at), ins.calibration


# ---- placements -> instructions ---------------------------------------------------------------------------

def test_by_trust_a_trusted_edge_noises_and_clips_its_streams_an_untrusted_ones_devices_noise(tmp_path):
    policy, cfg = _policy(tmp_path, ["run.algorithm=h2fdp", 'privacy.trust_table={"edge-000" = "trusted"}',
                                     "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=2.0"])
    plans = _plans(policy)
    bound = cfg.train.lr * cfg.train.gamma * cfg.privacy.clip  # eta m G
    for edge, tier, clip_at in (("edge-000", "edge", ("edge",)), ("edge-001", "device", ())):
        plan = plans[edge]
        assert dict(plan.params) == {}  # no trusted flag, no noise floats: the instructions say it all
        assert [_fields(i) for i in plan.noise] == [(tier, s, "gaussian", clip_at, "") for s in ("local", "global")]
        for ins in plan.noise:
            setting = policy.settings[edge][ins.stream]
            assert setting.tier == tier
            assert ins.multiplier == pytest.approx(2.0, rel=1e-12) and ins.sensitivity == setting.sensitivity
            assert ins.clip == pytest.approx(bound)
        noise = instructions.read_cluster(plan)
        assert noise.clip_for("edge", "global") is (noise.get("edge", "global") if tier == "edge" else None)
        assert noise.clip_for("device", "global") is None  # by trust, a device never clips to eta m G itself


def test_by_trust_a_controllers_round_restates_the_sensitivity_not_the_multiplier(tmp_path):
    policy, cfg = _policy(tmp_path, ["run.algorithm=h2fdp", 'privacy.trust_table={"edge-000" = "trusted"}',
                                     "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=2.0"])
    half = config.load(None, ["topology.edges=2", "topology.devices_per_edge=3", *H2, "train.lr=0.005",
                              "run.algorithm=h2fdp", 'privacy.trust_table={"edge-000" = "trusted"}'])
    plans = policy.cluster_plans(0, policy.participants(0), round_cfg=half)
    for edge in EDGES:
        for ins in plans[edge].noise:
            planned = policy.settings[edge][ins.stream]
            assert ins.multiplier == pytest.approx(2.0, rel=1e-12)
            assert ins.sensitivity == pytest.approx(planned.sensitivity * 0.005 / cfg.train.lr, rel=1e-12)
            assert ins.clip == pytest.approx(0.005 * cfg.train.gamma * cfg.privacy.clip)


@pytest.mark.parametrize("algorithm, shape, calibration", [("dp-fedavg", "gaussian", ""),
                                                           ("dp-fedavg-wav", "wavelet_gaussian", "sound")])
def test_aggregator_the_edge_noises_the_sum_and_device_and_edge_both_clip(tmp_path, algorithm, shape, calibration):
    policy, cfg = _policy(tmp_path, [f"run.algorithm={algorithm}", "privacy.trust=trusted", "privacy.client_rate=0.5",
                                     "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.5"])
    for edge, plan in _plans(policy).items():
        assert [_fields(i) for i in plan.noise] == [("edge", "global", shape, ("device", "edge"), calibration)]
        ins = plan.noise[0]
        setting = policy.settings[edge]["global"]
        assert ins.multiplier == pytest.approx(setting.std / setting.sensitivity, rel=1e-12)
        assert ins.sensitivity == setting.sensitivity and ins.clip == cfg.privacy.clip
        # what is not noise stays a param: the edge's client draw and its fixed-denominator sum
        assert set(plan.params) == {"client_rate", "fixed_denominator"}
        noise = instructions.read_device(plan, policy.members[edge][0])
        assert noise.clip_for("device", "global").clip == cfg.privacy.clip and noise.get("device", "global") is None


def test_aggregator_paper_wavelet_states_the_paper_calibration(tmp_path):
    policy, _ = _policy(tmp_path, ["run.algorithm=dp-fedavg-wav", "privacy.trust=trusted",
                                   "privacy.wavelet_mode=paper", "privacy.calibration=noise_multiplier",
                                   "privacy.noise_multiplier=1.5"])
    ins = _plans(policy)["edge-000"].noise[0]
    assert (ins.shape, ins.calibration) == ("wavelet_gaussian", "paper")
    assert ins.multiplier == pytest.approx(1.5, rel=1e-12)  # the multiplier that scales the noise, as before


@pytest.mark.parametrize("lot", ["poisson", "fixed"])
def test_sample_each_device_gets_its_device_sample_instruction(tmp_path, lot):
    policy, _ = _policy(tmp_path, ["run.algorithm=dp-sgd", f"privacy.lot={lot}", "privacy.lot_rate=0.1",
                                   "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=1.1"])
    plans = _plans(policy)
    assert policy.planned_noise[0] == {}  # sample-level events are the devices' own (not checked by the cloud)
    for edge, plan in plans.items():
        assert dict(plan.params) == {}
        assert bool(plan.noise) == (lot == "poisson") and bool(plan.devices) == (lot == "fixed")
        for device in policy.members[edge]:
            ins = instructions.read_device(plan, device).get("device-sample", "sample")
            setting = policy.settings[edge].get("sample") or policy.settings[edge][f"sample/{device}"]
            assert (ins.tier, ins.stream, ins.shape.stage, ins.clip_at) == ("device-sample", "sample", "gaussian", ())
            assert ins.multiplier == pytest.approx(setting.std / setting.sensitivity, rel=1e-12)
            assert ins.sensitivity == setting.sensitivity


# ---- the receiver's validation ----------------------------------------------------------------------------

def _good(**kw) -> pb.NoiseInstruction:
    base = dict(tier="edge", stream="global", shape="gaussian", multiplier=2.0, sensitivity=0.5, clip=1.0,
                clip_at=["edge"])
    return pb.NoiseInstruction(**{**base, **kw})


@pytest.mark.parametrize("change, words", [
    (dict(shape="uniform"), "unknown noise shape 'uniform'; registered: gaussian, laplace, wavelet_gaussian"),
    (dict(shape="2"), "unknown noise shape '2'"),  # the old float index is not a shape
    (dict(shape="wavelet"), "unknown noise shape 'wavelet'"),  # a config value, not a stage
    (dict(tier="cloud"), "tier must be one of"),
    (dict(stream=""), "no stream"),
    (dict(multiplier=-1.0), "multiplier must be"),
    (dict(sensitivity=float("nan")), "sensitivity must be"),
    (dict(clip=float("inf")), "clip must be"),
    (dict(clip=0.0), "needs clip > 0"),
    (dict(clip_at=["cloud"]), "clip_at must name"),
    (dict(calibration="loose"), "calibration must be one of"),
])
def test_an_instruction_the_receiver_cannot_execute_is_refused_with_its_reason(change, words):
    instructions.parse(_good())
    plan = pb.ClusterPlan(noise=[_good(stream="local"), _good(**change)])
    with pytest.raises(NoisePlanError, match="noise instruction") as err:
        instructions.read_cluster(plan)
    assert words in str(err.value)
    with pytest.raises(NoisePlanError):
        instructions.build(**{**dict(tier="edge", stream="global", shape="gaussian", multiplier=2.0, sensitivity=0.5,
                                     clip=1.0, clip_at=["edge"]), **change})


def test_a_devices_own_bad_instruction_is_refused_by_its_edge_and_by_the_device():
    plan = pb.ClusterPlan(noise=[_good()], devices={"dev-00001": pb.DevicePlan(noise=[_good(shape="uniform")])})
    with pytest.raises(NoisePlanError, match="of dev-00001.*'uniform'"):
        instructions.read_cluster(plan)
    with pytest.raises(NoisePlanError, match="'uniform'"):
        instructions.read_device(plan, "dev-00001")
    assert instructions.read_device(plan, "dev-00002").get("edge", "global").multiplier == 2.0


def test_two_instructions_for_one_release_are_refused_and_a_devices_own_overrides_the_clusters():
    with pytest.raises(NoisePlanError, match="two noise instructions"):
        instructions.read_cluster(pb.ClusterPlan(noise=[_good(), _good(multiplier=3.0)]))
    plan = pb.ClusterPlan(noise=[_good(tier="device-sample", stream="sample", clip=0, clip_at=[])],
                          devices={"dev-00001": pb.DevicePlan(noise=[_good(tier="device-sample", stream="sample",
                                                                           multiplier=7.0, clip=0, clip_at=[])])})
    assert instructions.read_device(plan, "dev-00001").get("device-sample", "sample").multiplier == 7.0
    assert instructions.read_device(plan, "dev-00002").get("device-sample", "sample").multiplier == 2.0
    assert not instructions.read_cluster(pb.ClusterPlan())  # no instruction: nothing to add


def _task(ins: pb.NoiseInstruction, edge="edge-000") -> pb.RoundTask:
    return pb.RoundTask(round=0, clusters={edge: pb.ClusterPlan(noise=[ins])})


def test_the_edge_and_the_device_refuse_a_bad_plan_before_touching_anything():
    """The receivers read the instructions first: a stand-in holding only the ids they need raises the plan's error,
    not an AttributeError of the state (model, links, context) they would have touched next."""
    from hfl.device_client.host import Device
    from hfl.edge_server.service import EdgeServer

    edge = types.SimpleNamespace(id="edge-000")
    device = types.SimpleNamespace(id="dev-00001", edge_id="edge-000", dim=10)
    for run in (lambda t: EdgeServer._round(edge, t, pb.Envelope()), lambda t: Device._round(device, t, [pb.Envelope()])):
        with pytest.raises(NoisePlanError, match="unknown noise shape 'uniform'"):
            asyncio.run(run(_task(_good(shape="uniform"))))
        with pytest.raises(AttributeError):  # a good plan goes on to the state: the check above can tell them apart
            asyncio.run(run(_task(_good())))
    assert vars(edge) == {"id": "edge-000"} and vars(device) == {"id": "dev-00001", "edge_id": "edge-000", "dim": 10}


# ---- releases made from instructions ------------------------------------------------------------------------

def _ins(**kw) -> instructions.Instruction:
    return instructions.parse(_good(**kw))


def test_a_device_adds_exactly_its_instructed_noise_and_records_it():
    delta = np.full(100, 0.3, np.float32)  # norm 3, over the stated clip 1: a device-tier release does not clip
    noise = instructions.NoisePlan([_ins(tier="device", stream="local", clip_at=[])])
    out, recs = on_wire.device_release(delta, noise, "local", np.random.default_rng(4), "dev-00001", 7)
    want = (delta.astype(np.float64) + np.random.default_rng(4).normal(0.0, 2.0 * 0.5, 100)).astype(np.float32)
    np.testing.assert_array_equal(out, want)
    assert [(r.tier, r.stream, r.noise_multiplier, r.sensitivity, r.covers, r.round) for r in recs] == [
        ("device", "local", 2.0, 0.5, ("dev-00001",), 7)]
    same, none = on_wire.device_release(delta, noise, "global", np.random.default_rng(4), "dev-00001", 7)
    assert none == [] and same is delta  # no instruction for the stream: nothing added, nothing recorded


def test_a_device_clips_where_the_instruction_says_and_adds_nothing_of_the_edges():
    delta = np.full(100, 0.3, np.float32)
    noise = instructions.NoisePlan([_ins(clip_at=["device", "edge"])])  # DP-FedAvg: the edge noises the sum
    out, recs = on_wire.device_release(delta, noise, "global", np.random.default_rng(4), "dev-00001", 7)
    assert recs == [] and float(np.linalg.norm(out)) == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(out, delta / 3, rtol=1e-5)  # a pure rescaling, no noise


def test_an_edge_release_records_the_instruction_at_the_sensitivity_it_really_had():
    agg = np.zeros(50, np.float32)
    out, recs = on_wire.edge_release(agg, _ins(), np.random.default_rng(1), [1.0, 3.0], 4, "edge-000",
                                     ["dev-00001", "dev-00002"], 2)
    true = 0.5 * 4 * 0.75  # planned 4 equal contributors, really two weighted 1:3
    np.testing.assert_array_equal(out, np.random.default_rng(1).normal(0.0, 2.0 * true, 50).astype(np.float32))
    assert [(r.tier, r.node, r.covers, r.noise_multiplier, r.sensitivity) for r in recs] == [
        ("edge", "edge-000", ("dev-00001", "dev-00002"), 2.0, pytest.approx(true))]
    _, fixed = on_wire.edge_release(agg, _ins(), np.random.default_rng(1), [1.0, 3.0], 4, "edge-000", ["d"], 2,
                                    mean=False)
    assert fixed[0].sensitivity == 0.5  # a fixed-denominator sum keeps its planned sensitivity


# ---- the pipeline's noise slots -------------------------------------------------------------------------------

@pytest.mark.parametrize("slot", ["device_noise", "edge_noise"])
@pytest.mark.parametrize("shape", shapes.NOISE_SHAPES.names())
def test_noise_slots_refuse_every_registered_noise_shape(slot, shape):
    """pipeline.device_noise / edge_noise emit no DP event, so every stage a plan's instruction can name is refused
    there: noise is added only where an instruction states it and its event is recorded."""
    with pytest.raises(ConfigError, match=rf"pipeline\.{slot} = {shape}: .*DP event"):
        config.load(None, [f"pipeline.{slot}={shape}"])
    config.load(None, [f"pipeline.{slot}=identity"])
