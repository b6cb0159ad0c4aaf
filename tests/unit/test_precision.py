"""Paper 004 wiring: l1 clipping, the AWGN link, per-device precision and cluster draws, the [precision] checks,
and the cloud's fusion over relayed uploads (per-edge partial sums equal the paper's fusion over all devices)."""
import json

import grpc
import numpy as np
import pytest

from hfl.cloud_server.fusion_center import FUSION_WEIGHT, FusionCenter
from hfl.common import config, topology, wire
from hfl.common.pipeline import CHANNELS, Link, StageRef, weighted_mean
from hfl.common.privacy.clipping import clip_l1
from hfl.common.quantization import fusion, precision
from hfl.common.seeding import numpy_rng
from hfl.device_client.host import encode_overrides
from hfl.proto import hfl_v1_pb2 as pb

PAPER = ["run.algorithm=dpsq-fl-fwo-cso", "topology.edges=2", "topology.devices_per_edge=50", "pipeline.clip=clip_l1",
         "pipeline.params.clip_l1.clip=10.0", "pipeline.uplink_encoding=dpsq", "pipeline.params.dpsq.epsilon1=1e-6",
         "precision.group_sizes=[50, 50]", "precision.bits=[2, 4]", "precision.link_std=[6.25e-4, 0.125]",
         "precision.participants=10", "precision.bit_budget=30"]


def cfg(overrides=(), base=PAPER):
    return config.load(None, list(base) + list(overrides))


def test_clip_l1_scales_to_the_bound_and_keeps_small_vectors():
    v = np.array([3.0, -4.0, 1.0], np.float32)
    out, over = clip_l1(v, 4.0)
    assert over and np.abs(out).sum() <= 4.0 and out == pytest.approx(v * 4.0 / 8.0)
    same, over = clip_l1(v, 8.0)
    assert not over and np.array_equal(same, v)
    big = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    assert np.abs(clip_l1(big, 10.0)[0].astype(np.float64)).sum() <= 10.0
    with pytest.raises(ValueError, match="l1 clipping constant"):
        clip_l1(v, 0.0)


def test_awgn_adds_noise_of_the_given_std():
    x = np.zeros(200_000, np.float32)
    y = CHANNELS.get("awgn")(x, np.random.default_rng(1), std=0.125)
    # the sample std of 2e5 normals is within 1% of sigma with overwhelming probability (its sd is sigma/sqrt(2n))
    assert abs(y.mean()) < 0.125 * 5 / np.sqrt(x.size) and y.std() == pytest.approx(0.125, rel=0.01)
    assert CHANNELS.get("awgn")(x, np.random.default_rng(1), std=0.0) is x
    with pytest.raises(ValueError, match="std"):
        CHANNELS.get("awgn")(x, np.random.default_rng(1), std=-1.0)


def test_groups_cluster_sizes_and_draws_follow_the_config():
    c = cfg()
    groups = precision.resolve(c)
    assert groups.sizes == (50, 50) and groups.bits == (2, 4) and groups.clip == 10.0 and groups.epsilon1 is None
    assert [groups.group_of(i) for i in (0, 49, 50, 99)] == [0, 0, 1, 1]
    assert groups.device_plan(60) == {"bits": 4.0, "group": 1.0, "link_std": 0.125}
    sizes = precision.cluster_sizes(groups, "cso", 10, 30, np.random.default_rng(0))
    assert sizes.sizes == (5, 5)  # digest 004 section 5.3, acceptance check 6
    for seed in range(20):  # random: always feasible (sum c = N, sum b c <= B, 1 <= c_m)
        s = precision.cluster_sizes(groups, "random", 10, 30, np.random.default_rng(seed)).sizes
        assert sum(s) == 10 and 2 * s[0] + 4 * s[1] <= 30 and min(s) >= 1
    drawn = precision.draw_devices(groups, (3, 7), np.random.default_rng(2))
    assert len(set(drawn)) == 10 and sum(i < 50 for i in drawn) == 3 and drawn == sorted(drawn)
    assert drawn == precision.draw_devices(groups, (3, 7), np.random.default_rng(2))
    assert precision.cluster_sizes(groups, "all", 10, 30, np.random.default_rng(0)).sizes == (50, 50)
    one = precision.resolve(cfg(base=PAPER[:7]))  # no groups: every device at the codec's bits (4 by default)
    assert one.sizes == (100,) and one.bits == (4,)
    assert encode_overrides({"bits": 2.0, "epsilon1": 1e-6, "link_std": 0.1}) == {"bits": 2, "epsilon1": 1e-6}


def test_uniform_draws_are_uniform_within_a_group():
    groups = precision.resolve(cfg())
    counts = np.zeros(100)
    for r in range(4000):
        counts[precision.draw_devices(groups, (5, 5), numpy_rng(0, "cloud", 0, r, "clusters"))] += 1
    # each device is drawn with probability 5/50 = 0.1 per round: 400 expected, sd 19; 6 sd bounds every one
    assert np.all(np.abs(counts - 400) < 6 * 19)


@pytest.mark.parametrize("overrides, key", [
    (["precision.bits=[0, 4]"], "precision.bits"),
    (["precision.bits=[2, 17]"], "precision.bits"),
    (["precision.bits=[2]"], "precision.bits"),
    (["precision.group_sizes=[50, 40]"], "precision.group_sizes"),
    (["precision.bit_budget=19"], "precision.bit_budget"),  # the cheapest 10 devices need 9 * 2 + 4 = 22
    (["precision.participants=101"], "precision.participants"),
    (["precision.link_std=[0.1, -1.0]"], "precision.link_std"),
    (["pipeline.uplink_encoding=qsgd"], "pipeline.uplink_encoding"),
    (["run.algorithm=dpsq-fl-fwo-cso", "pipeline.clip=identity"], "cso"),
    (["run.algorithm=sq-fl", "pipeline.uplink_encoding=sq", "precision.epsilon1=[1e-6, 1e-6]"], "precision.epsilon1"),
    (["run.algorithm=hierfavg", "pipeline.uplink_encoding=float32"], "precision.group_sizes"),
    (["aggregation.cloud_weights=samples"], "aggregation"),
])
def test_bad_precision_settings_name_their_key(overrides, key):
    with pytest.raises(config.ConfigError, match=key.replace(".", r"\.")):
        cfg(overrides)


def _uploads(c, dim, nodes, r, drawn):
    """What each drawn device sends: its own clipped, DP-SQ-quantized delta at its own bits and epsilon1."""
    link = Link.device_uplink(c)
    rng = np.random.default_rng(5)
    out = {}
    for node in nodes:
        vec = rng.standard_normal(dim).astype(np.float32) * 0.01
        tensor, transforms = link.send(vec, "delta", c.run.seed, topology.device_index(node), r, 1,
                                       {"encode": encode_overrides(drawn[node])})
        meta = pb.Meta(run_id="run-x", round=r, phase="edge_model_sync", step=1, sender_id=node, num_devices=1,
                       transforms=transforms)
        out[node] = pb.Envelope(meta=meta, tensors=[tensor])
    return out


def _relay(edge, uploads):
    env = pb.Envelope(meta=pb.Meta(run_id="run-x", round=0, phase="cloud_sync", sender_id=edge,
                                   num_devices=len(uploads)))
    env.relay.uploads.extend(u.SerializeToString() for u in uploads)
    return env


@pytest.mark.parametrize("rule", ["fwo", "uniform", "fedhq"])
def test_per_edge_partial_fusion_equals_the_papers_fusion_over_all_devices(tmp_path, rule):
    c = cfg([f"precision.fusion={rule}", "precision.distortion_estimate=device"])  # the paper's option (a)
    dim = 300
    center = FusionCenter(c, dim, tmp_path)
    drawn, sizes = center.draw(0)
    assert sizes == (5, 5) and len(drawn) == 10
    uploads = _uploads(c, dim, sorted(drawn), 0, drawn)
    by_edge = {e: [uploads[n] for n in sorted(drawn) if n in topology.edge_members(c, topology.edge_index(e))]
               for e in center.edges}
    results = {e: center.fuse(e, _relay(e, ups), 0, 3) for e, ups in by_edge.items() if ups}
    fused = weighted_mean([d for d, _, _ in results.values()], [w for _, w, _ in results.values()])
    # the paper's fusion, directly: omega over all drawn devices, y_i = dequantized upload + AWGN(sigma_m)
    link = Link.from_config(c.pipeline, "uplink")
    ys, bits, dists, stds = [], [], [], []
    for node in sorted(drawn):
        std = drawn[node]["link_std"]
        y, _ = link.receive(uploads[node].tensors[0], dim, c.run.seed, topology.device_index(node), 0, 1,
                            StageRef("channel", "awgn", {"std": std}))
        ys.append(y.astype(np.float64))
        bits.append(drawn[node]["bits"])
        dists.append(next(t.params["expected_distortion"] for t in uploads[node].meta.transforms if t.stage == "encode"))
        stds.append(std)
    omega = fusion.fusion_weights(rule, bits=bits, distortions=dists, link_stds=stds, dim=dim)
    assert fused == pytest.approx(np.asarray(omega) @ np.asarray(ys), rel=1e-5, abs=1e-7)
    rows = [row for _, _, rs in results.values() for row in rs]
    center.log(rows)
    logged = [json.loads(line) for line in (tmp_path / "fusion.jsonl").read_text().splitlines()]
    assert [row["weight"] for row in logged] == pytest.approx(list(omega))
    assert FUSION_WEIGHT == "fusion_weight"


def test_bad_relays_are_refused(tmp_path):
    c = cfg()
    dim = 300
    center = FusionCenter(c, dim, tmp_path)
    drawn, _ = center.draw(0)
    edge = "edge-000"
    mine = [n for n in sorted(drawn) if n in topology.edge_members(c, 0)]
    uploads = _uploads(c, dim, mine, 0, drawn)
    undrawn = next(n for n in topology.edge_members(c, 0) if n not in drawn)
    other = _uploads(c, dim, [undrawn], 0, {undrawn: drawn[mine[0]]})[undrawn]
    wrong_bits = _uploads(c, dim, [mine[0]], 0, {mine[0]: {**drawn[mine[0]], "bits": 3.0}})[mine[0]]
    # a bad upload beside a good one is refused alone (the good one is fused) and counted with its reason
    from hfl.common.service_base import Refusals

    center.refusals = Refusals()
    for reason, env in {"bad_relay": _relay(edge, [uploads[mine[0]], other]),      # a device not drawn this round
                        "replay": _relay(edge, [uploads[mine[0]], uploads[mine[0]]])}.items():  # the same device twice
        _, _, rows = center.fuse(edge, env, 0, 3)
        assert [row["device"] for row in rows] == [mine[0]], reason
    assert dict(center.refusals.total) == {"bad_relay": 1, "replay": 1}
    assert center.round_stats(0)["relay_refused"] == 2
    cases = {
        "bad_relay": _relay(edge, [other]),
        "bad_header": _relay(edge, [wrong_bits]),                                   # not the bits of its plan
    }
    bad = _relay(edge, [])
    bad.relay.uploads.append(b"\x0a\xff\xff")
    bad.meta.num_devices = 1
    cases["malformed"] = bad
    count = _relay(edge, [uploads[mine[0]]])
    count.meta.num_devices = 2
    cases["bad_relay_count"] = count
    for reason, env in cases.items():
        with pytest.raises(wire.WireError) as err:
            center.fuse(edge, env, 0, 3)
        assert err.value.reason == reason.replace("_count", ""), (reason, err.value)
    with pytest.raises(wire.WireError) as err:
        center.fuse("edge-001", _relay("edge-001", [uploads[mine[0]]]), 0, 3)  # another edge's device
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_group_epsilon1_stands_in_for_the_codecs_and_a_missing_one_names_the_key():
    base = [o for o in PAPER if not o.startswith("pipeline.params.dpsq")]
    link = Link.device_uplink(cfg(["precision.epsilon1=[1e-6, 2e-6]"], base=base))
    assert link.encode_params["epsilon1"] == 1e-6 and link.encode_params["bits"] == 2
    with pytest.raises(config.ConfigError, match=r"pipeline\.params\.dpsq: .*epsilon1 is required"):
        cfg(base=base)


@pytest.mark.parametrize("rule", ["uniform", "fwo", "fedhq"])
def test_fusion_scores_normalise_to_the_rules_weights(rule):
    kw = dict(bits=[2, 4, 4], distortions=[0.5, 0.01, 0.02], link_stds=[1e-3, 0.1, 0.1], dim=100)
    s = fusion.fusion_scores(rule, **kw)
    assert s / s.sum() == pytest.approx(fusion.fusion_weights(rule, **kw))
    with pytest.raises(ValueError, match="fusion rule"):
        fusion.fusion_scores("median", **kw)


def test_a_range_wider_than_the_groups_clip_is_refused(tmp_path):
    """Issue 24, finding 3: honest indices under the announced range (-1e30, 1e30) would make the fused model NaN;
    an l1-clipped update has every coordinate within [-C, C], which the fusion center knows."""
    import dataclasses as dc

    from hfl.common.quantization.codecs import read_payload, write_payload

    c = cfg()
    dim = 300
    center = FusionCenter(c, dim, tmp_path)
    drawn, _ = center.draw(0)
    node = next(n for n in sorted(drawn) if n in topology.edge_members(c, 0))
    upload = _uploads(c, dim, [node], 0, drawn)[node]
    center.fuse("edge-000", _relay("edge-000", [upload]), 0, 3)  # the honest upload passes
    tensor = upload.tensors[0]
    forged = dc.replace(read_payload(tensor), side=np.array([-1e30, 1e30], np.float32))
    tensor.data = write_payload(forged)
    with pytest.raises(wire.WireError) as err:
        center.fuse("edge-000", _relay("edge-000", [upload]), 0, 3)
    assert err.value.reason == "bad_header" and "clip" in str(err.value)


def test_relayed_uploads_carry_a_device_tag_the_edge_cannot_forge(tmp_path, monkeypatch):
    """Issue 24, finding 4: a mirrored (forged), replayed or untagged upload is refused; a dropped one is counted."""
    from hfl.common import relay_tag

    monkeypatch.setenv(relay_tag.ENV, "run-secret")
    c = cfg()
    dim = 300
    center = FusionCenter(c, dim, tmp_path)
    drawn, _ = center.draw(0)
    mine = [n for n in sorted(drawn) if n in topology.edge_members(c, 0)]
    uploads = _uploads(c, dim, mine, 0, drawn)
    key = lambda n: relay_tag.device_key(b"run-secret", n)  # noqa: E731

    def tagged(node, upload, round_=0, attempt=0, who=None):
        out = pb.Envelope()
        out.CopyFrom(upload)
        out.meta.round = round_
        out.meta.transforms.append(pb.Transform(stage=relay_tag.STAGE, tier="device", name=relay_tag.tag(
            key(who or node), "run-x", round_, attempt, node, out.meta.step, out.tensors[0], out.meta.transforms)))
        return out

    honest = {n: tagged(n, uploads[n]) for n in mine}
    center.fuse("edge-000", _relay("edge-000", [honest[n] for n in mine]), 0, 3)
    assert center.round_stats(0)["relay_missing"] == 0
    forged = pb.Envelope()
    forged.CopyFrom(honest[mine[0]])
    forged.tensors[0].data = uploads[mine[1]].tensors[0].data  # another device's payload, the first one's tag
    cases = {"untagged": uploads[mine[0]], "forged": forged,
             "other key": tagged(mine[0], uploads[mine[0]], who=mine[1])}
    recorded = pb.Envelope()
    recorded.CopyFrom(honest[mine[0]])
    recorded.meta.transforms[0].params["expected_distortion"] = 0.0  # a record the fusion may read, altered
    cases["altered record"] = recorded
    for name, upload in cases.items():
        with pytest.raises(wire.WireError) as err:
            center.fuse("edge-000", _relay("edge-000", [upload]), 0, 3)
        assert err.value.reason == "bad_relay_tag", name
    # one forged upload among honest ones is refused alone: the others are fused, the refusal counted
    delta, _, rows = center.fuse("edge-000", _relay("edge-000", [forged] + [honest[n] for n in mine[1:]]), 0, 3)
    assert [row["device"] for row in rows] == mine[1:] and np.isfinite(delta).all()
    assert center.round_stats(0)["relay_refused"] == 1
    # round 0's upload relayed as round 1: the tag binds the round
    replayed = tagged(mine[0], uploads[mine[0]])
    replayed.meta.round = 1
    drawn1, _ = center.draw(1)
    if mine[0] in drawn1:
        with pytest.raises(wire.WireError) as err:
            center.fuse("edge-000", _relay("edge-000", [replayed]), 1, 3)
        assert err.value.reason == "bad_relay_tag"
    # an edge that drops one of its drawn devices' uploads is counted
    center.fuse("edge-000", _relay("edge-000", [honest[n] for n in mine[1:]]), 0, 3)
    assert center.round_stats(0)["relay_missing"] == 1
