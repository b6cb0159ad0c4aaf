"""Issue 24's six findings, replayed on real processes: one compromised device or edge (a Tamper proxy in front of an
honest node's upstream, holding the node's valid session; or a raw outsider) does what the finding describes, and
the run ends as a clean run of the same seed did, no node dies, and the hostile message is counted in `refused` with
its reason (in the refusing node's log, and at the cloud in summary.json's refused_by_reason_at_cloud).

The clean reference of each mode is one run shared by the tests of this module. On the air a forged transmission
cannot be followed by an honest one (one per slot): there the reference is the same attack made by the other party.
(The proxy: tests/integration/mitm.py.)"""
import dataclasses
import json
import threading
import time

import numpy as np
import pytest

from hfl.proto import hfl_v1_pb2 as pb

from .conftest import SMALL
from .mitm import Act, Tamper, until
from .test_faults import key

BASE = SMALL + ["topology.host_layout=per_edge", "topology.hosts_per_edge=1", "run.rounds=2",
                "net.phase_timeout_s=30", "net.rejoin_grace_s=5"]
DP = BASE + ["topology.devices_per_edge=2", "model.name=mlp", "run.algorithm=hfl-dp", "train.tau=5", "privacy.clip=1.0",
             "privacy.calibration=noise_multiplier", "privacy.noise_multiplier=2", "privacy.epsilon=1e6",
             "privacy.noise_source=seeded"]  # seeded: a clean run of the same seed releases the same noise
RELAY = BASE + ["topology.devices_per_edge=2", "run.rounds=3", "run.algorithm=dpsq-fl-fwo-cso", "train.gamma=10",
                 "train.batch_size=10", "pipeline.clip=clip_l1", "pipeline.params.clip_l1.clip=10.0",
                 "pipeline.uplink_encoding=dpsq", "pipeline.params.dpsq.epsilon1=1e-6", "precision.group_sizes=[2, 2]",
                 "precision.bits=[2, 4]", "precision.participants=4", "privacy.noise_source=seeded"]

AIR = BASE + ["topology.edges=3", "channel.model=ota", "run.algorithm=multiairfed", "train.tau=3", "train.gamma=1",
              "train.lr=0.01", "data.max_test_samples=500", "net.phase_timeout_s=20"]
SLOT_WAIT = 20 + 5 + 10  # how long an air slot waits for a missing edge: phase timeout + rejoin grace + 10 s


def copy(envelope: pb.Envelope) -> pb.Envelope:
    out = pb.Envelope()
    out.CopyFrom(envelope)
    return out


def refusals_logged(tb, node: str, reason: str) -> int:
    return (tb.logs / f"{node}.log").read_text().count(f"refused {reason} from ")


def started(hfl_testbed, overrides, proxies: dict[str, Tamper], **kwargs):
    """A testbed whose nodes named in `proxies` dial their upstream through that proxy."""
    tb = hfl_testbed(overrides=overrides, via={name: p.address for name, p in proxies.items()}, **kwargs)
    for name, proxy in proxies.items():
        proxy.upstream = tb.cloud_address if name.startswith("edge-") else tb.edge_addresses[int(name.split("-")[1])]
    return tb


def clean_run(tmp_path_factory, overrides, name):
    from hfl.testbed import Testbed

    with Testbed(overrides=overrides, run_dir=tmp_path_factory.mktemp(name)) as tb:
        tb.wait(timeout=600)
    return tb  # its metrics(), summary() and run_dir stay readable


@pytest.fixture(scope="module")
def clean_dp(tmp_path_factory):
    return clean_run(tmp_path_factory, DP, "clean-dp")


def with_z(envelope: pb.Envelope, z: float) -> pb.Envelope:
    out = copy(envelope)
    for t in out.meta.transforms:
        if t.stage == "dp_event":
            t.params["dp.noise_multiplier"] = z
    return out


def test_finding1_a_forged_dp_event_is_refused_at_the_edge_and_the_cloud(hfl_testbed, clean_dp):
    """Finding 1: a device declaring z = 1e-300 (ZeroDivisionError in the accountant, cloud dead) or z = 1e-3 (a
    ledger charge of ~1e6 that stopped the run), and an edge rewriting its cluster's DP events the same way."""
    def device(method, envelope):
        m = envelope.meta
        if method == "Exchange" and m.sender_id == "dev-00000" and m.round == 0 and m.phase == "edge_model_sync":
            return Act(envelope, [("device z=1e-300", with_z(envelope, 1e-300)), ("device z=1e-3", with_z(envelope, 1e-3))])
        return Act(envelope)

    def edge(method, envelope):
        if method == "Submit" and envelope.meta.round == 0:
            return Act(envelope, [("edge z=1e-300", with_z(envelope, 1e-300)), ("edge z=1e-3", with_z(envelope, 1e-3))])
        return Act(envelope)

    with Tamper(device) as dev, Tamper(edge) as edg:
        tb = started(hfl_testbed, DP, {"devices-000-0": dev, "edge-001": edg})
        summary = tb.wait(timeout=600)
    clean_rows, clean_summary = clean_dp.metrics(), clean_dp.summary()
    assert dev.sent_labels() == {"device z=1e-300": "INVALID_ARGUMENT", "device z=1e-3": "INVALID_ARGUMENT"}, dev.sent
    assert edg.sent_labels() == {"edge z=1e-300": "INVALID_ARGUMENT", "edge z=1e-3": "INVALID_ARGUMENT"}, edg.sent
    assert key(tb.metrics()) == key(clean_rows)
    assert summary["epsilon"] == pytest.approx(clean_summary["epsilon"], rel=1e-9)  # nothing forged was charged
    assert clean_summary["refused"] == 0 and summary["refused"] == 4 and tb.metrics()[0]["refused"] == 4
    assert summary["refused_by_reason_at_cloud"] == {"bad_dp_event": 2}
    assert refusals_logged(tb, "edge-000", "bad_dp_event") == 2
    assert not (tb.run_dir / "pending").exists() or not list((tb.run_dir / "pending").rglob("*.npz"))


def test_finding1_a_resume_discards_a_poisoned_pending_result(hfl_testbed, clean_dp):
    """Finding 1, resume: a result with a degenerate DP event saved in pending/ crashed every `--resume` the same way.
    Here the cloud is killed while edge-000's round-1 result is held on the way, a result of edge-000 with z = 1e-300
    is planted in pending/, and the resumed cloud discards it with a log line; edge-000's real result then counts and
    the run ends as the clean one."""
    held, release = {}, threading.Event()

    def edge(method, envelope):
        if method == "Submit" and envelope.meta.round == 1 and not held:
            held["envelope"] = envelope
            return Act(envelope, hold=until(release.is_set, 300))
        return Act(envelope)

    with Tamper(edge) as proxy:
        tb = started(hfl_testbed, DP + ["net.rejoin_grace_s=40"], {"edge-000": proxy})
        deadline = time.monotonic() + 300
        while "envelope" not in held:
            assert time.monotonic() < deadline, "edge-000 never submitted round 1"
            tb.check()
            time.sleep(0.05)
        tb.kill("cloud")
        with np.load(tb.run_dir / "checkpoint.npz") as ckpt:
            run_id, dim, last = str(ckpt["run_id"]), ckpt["weights"].size, int(ckpt["round"])
        assert last == 0
        poisoned = with_z(held["envelope"], 1e-300)
        folder = tb.run_dir / "pending" / "round-000001"
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "edge-000.npz", delta=np.zeros(dim, np.float32), devices=2, samples=1, scalars="{}",
                 run_id=run_id, fused="[]",
                 transforms=np.frombuffer(pb.Meta(transforms=poisoned.meta.transforms).SerializeToString(), np.uint8))
        tb.restart("cloud", resume=True)
        release.set()
        summary = tb.wait(timeout=600)
    assert summary["resumed"] is True and key(tb.metrics()) == key(clean_dp.metrics())
    log = (tb.logs / "cloud.log").read_text()
    assert "--resume: discarding" in log and "edge-000.npz" in log and "ZeroDivisionError" not in log


@pytest.fixture(scope="module")
def clean_relay(tmp_path_factory):
    return clean_run(tmp_path_factory, RELAY, "clean-relay")


def widened(envelope: pb.Envelope) -> pb.Envelope:
    """The upload with its DP-SQ range announced as (-1e30, 1e30), the indices honest."""
    from hfl.common.quantization import codecs

    out = copy(envelope)
    tensor = out.tensors[0]
    payload = codecs.read_payload(tensor)
    tensor.data = codecs.write_payload(dataclasses.replace(payload, side=np.array([-1e30, 1e30], np.float32)))
    return out


def test_finding3_a_relay_device_cannot_announce_a_range_beyond_its_clip(hfl_testbed, clean_relay):
    """Finding 3: a DP-SQ upload announcing the range (-1e30, 1e30) made the loss NaN; it is refused by the edge
    (which knows the group's l1 clip C), so the device's honest upload still counts."""
    def device(method, envelope):
        m = envelope.meta
        if method == "Exchange" and m.sender_id == "dev-00000" and m.round == 0 and envelope.tensors:
            return Act(envelope, [("range 1e30", widened(envelope))])
        return Act(envelope)

    with Tamper(device) as dev:
        tb = started(hfl_testbed, RELAY, {"devices-000-0": dev})
        summary = tb.wait(timeout=600)
    clean_rows = clean_relay.metrics()
    assert dev.sent_labels() == {"range 1e30": "INVALID_ARGUMENT"}, dev.sent
    assert key(tb.metrics()) == key(clean_rows)
    assert summary["refused"] == 1 and tb.metrics()[0]["refused"] == 1
    assert refusals_logged(tb, "edge-000", "bad_header") == 1


def relayed(envelope: pb.Envelope, keep=lambda i, upload: upload) -> pb.Envelope:
    """The edge's Submit with its relayed uploads rewritten by keep(i, upload) (None: left out)."""
    out = copy(envelope)
    uploads = [keep(i, pb.Envelope.FromString(raw)) for i, raw in enumerate(envelope.relay.uploads)]
    uploads = [u for u in uploads if u is not None]
    del out.relay.uploads[:]
    out.relay.uploads.extend(u.SerializeToString() for u in uploads)
    out.meta.num_devices = len(uploads)
    return out


def test_finding4_a_relaying_edge_cannot_forge_replay_or_inflate_and_its_drop_is_counted(hfl_testbed, clean_relay):
    """Finding 4: a relaying edge altered an upload, passed one device's upload off as another's, replayed round 0's
    uploads into round 1 (all fused), and a device's reported distortion 0 took 78% of the FWO weight. Each upload now
    carries its device's tag and the cloud computes the distortion itself: the forgeries are refused, the claim is
    ignored, and an upload dropped in the last round is counted in relay_missing."""
    saved = {}

    def altered(i, upload):
        upload.tensors[0].data = upload.tensors[0].data[:-1] + bytes([upload.tensors[0].data[-1] ^ 1])
        return upload

    def as_sender(upload, node):
        upload.meta.sender_id = node
        return upload

    def to_round1(i, upload):
        upload.meta.round = 1
        return upload

    def distortion_zero(i, upload):
        for t in upload.meta.transforms:
            if t.stage == "encode":
                t.params["expected_distortion"] = 0.0
        return upload

    def edge(method, envelope):
        r = envelope.meta.round
        if method != "Submit":
            return Act(envelope)
        if r == 0:
            saved[0] = envelope
            # dev-00002's upload passed off as dev-00003's and the other way round
            mirrored = relayed(envelope, lambda i, u: as_sender(pb.Envelope.FromString(envelope.relay.uploads[1 - i]),
                                                                u.meta.sender_id))
            return Act(envelope, [("altered", relayed(envelope, altered)), ("mirrored", mirrored),
                                  ("distortion 0", relayed(envelope, distortion_zero))])
        if r == 1:
            old = copy(saved[0])
            old.meta.round = 1
            return Act(envelope, [("replayed", old), ("replayed as round 1", relayed(old, to_round1))])
        return Act(relayed(envelope, lambda i, u: u if i == 0 else None))  # dropped: dev-00003

    with Tamper(edge) as edg:
        tb = started(hfl_testbed, RELAY, {"edge-001": edg})
        summary = tb.wait(timeout=600)
    clean_rows = clean_relay.metrics()
    assert edg.sent_labels() == {"altered": "PERMISSION_DENIED", "mirrored": "PERMISSION_DENIED",
                                 "distortion 0": "PERMISSION_DENIED", "replayed": "FAILED_PRECONDITION",
                                 "replayed as round 1": "PERMISSION_DENIED"}, edg.sent
    rows = tb.metrics()
    assert key(rows[:2]) == key(clean_rows[:2])
    assert [r["refused"] for r in rows] == [3, 2, 0] and summary["refused"] == 5
    assert summary["refused_by_reason_at_cloud"] == {"bad_relay_tag": 4, "wrong_round": 1}
    assert [r["relay_missing"] for r in rows] == [0, 0, 1] and [r["relay_missing"] for r in clean_rows] == [0, 0, 0]
    assert rows[2]["loss"] is not None and np.isfinite(rows[2]["loss"]) and summary["aggregates_rejected"] == 0
    fused = [json.loads(x) for x in (tb.run_dir / "fusion.jsonl").read_text().splitlines()]
    clean_fused = [json.loads(x) for x in (clean_relay.run_dir / "fusion.jsonl").read_text().splitlines()]
    weights = lambda rows_, r: {x["device"]: x["weight"] for x in rows_ if x["round"] == r}  # noqa: E731
    assert weights(fused, 0) == weights(clean_fused, 0) and weights(fused, 1) == weights(clean_fused, 1)
    assert sorted(weights(fused, 2)) == ["dev-00000", "dev-00001", "dev-00002"]


def test_finding2_forged_air_side_information_is_left_out_whoever_forged_it(hfl_testbed):
    """Finding 2: a device claiming air_sigma = 1e12 (inside the registered scalar range), or an edge rewriting a
    transmitter's sigma to 1e30, made the loss NaN for the rest of the run. The medium leaves the transmitter out of
    the slot's superposition and counts it: the round's other transmissions go on, and how large the forged value
    was, or who forged it, changes nothing: the two runs below end identical, with finite losses. (No clean run is
    the reference here: an air device has one transmission per slot, so the forged one cannot be followed by an
    honest one, and the run without that transmission is the one to expect.)"""
    target = {}

    def device(method, envelope):
        m = envelope.meta
        if method == "Exchange" and m.round == 0 and envelope.air.rows and envelope.air.rows[0].HasField("tensor") \
                and not target:
            target.update(node=m.sender_id, step=m.step)
            out = copy(envelope)
            out.air.rows[0].sigma = 1e12
            return Act(out)
        return Act(envelope)

    def edge(method, envelope):
        m = envelope.meta
        if method == "Air" and m.round == 0 and m.step == target["step"]:
            out = copy(envelope)
            next(r for r in out.air.rows if r.node == target["node"]).sigma = 1e30
            return Act(out)
        return Act(envelope)

    runs = []
    for name, tamper in (("devices-000-0", device), ("edge-000", edge)):
        with Tamper(tamper) as proxy:
            tb = started(hfl_testbed, AIR, {name: proxy})
            summary = tb.wait(timeout=600)
        runs.append(tb)
        rows = tb.metrics()
        assert summary["rounds"] == 2 and summary["aggregates_rejected"] == 0 and not summary["diverged"], name
        assert [r["air_refused"] for r in rows] == [1, 0] and all(np.isfinite(r["loss"]) for r in rows), name
        assert [r["refused"] for r in rows] == [1, 0] and summary["refused_by_reason_at_cloud"] == {"air_side_info": 1}
    assert key(runs[0].metrics()) == key(runs[1].metrics())


def test_finding5_a_silent_edge_costs_one_slot_wait_and_the_others_complete(hfl_testbed):
    """Finding 5: an edge that never hands in its emission (process and presence alive) made every slot wait for
    it, the round deadline passed, every edge was marked absent and the cloud exited 1. Now the medium waits for it
    once, then goes on without it for the rest of the round; the other edges' rounds complete and the run exits 0."""
    tb = None

    def edge(method, envelope):
        m = envelope.meta
        if method == "Air" and m.round == 0:  # silent until the cloud closed round 0 without it
            return Act(envelope, hold=until(lambda: tb is not None and (tb.run_dir / "checkpoint.npz").exists(), 600))
        return Act(envelope)

    with Tamper(edge) as proxy:
        tb = started(hfl_testbed, AIR, {"edge-002": proxy})
        summary = tb.wait(timeout=600)
    rows = tb.metrics()
    assert summary["rounds"] == 2 and tb.nodes["cloud"].returncode() == 0 and not tb.deaths()
    assert rows[0]["air_edges_dropped"] == 1 and rows[0]["edges"] == 2 and rows[0]["devices"] == 6
    assert rows[0]["round_seconds"] < 2 * SLOT_WAIT  # one slot's wait, not one per slot
    assert rows[0]["air_slots"] == rows[1]["air_slots"] == 4  # every slot of the round closed (tau + 1)
    assert np.isfinite(rows[0]["loss"]) and np.isfinite(rows[1]["loss"])
    assert rows[1]["edges"] == 3 and rows[1]["air_edges_dropped"] == 0  # back the next round
    # its late emissions (one per air slot) and submit of round 0 are refused and counted
    late = rows[0]["air_slots"] + 1
    reasons = summary["refused_by_reason_at_cloud"]  # slot_closed: its first one arrived as round 1 was being set up
    assert summary["refused"] == late == sum(reasons.values()) and set(reasons) <= {"wrong_round", "slot_closed"}


def test_finding6_a_device_id_cannot_be_squatted_without_the_join_secret(hfl_testbed, clean_dp):
    """Finding 6: without TLS an outsider registering dev-00000 (with the sample count the public spec gives) before
    its host won the id, and its 1e30 uploads made the run NaN. The run's join secret (handed by the Testbed, as by
    hfl run, to its own processes only) now decides: the outsider is refused, the real host registers after it, and
    the run ends as a clean one."""
    import grpc

    from .rawclient import RawDevice

    with Tamper() as late:  # the real host of dev-00000..2 waits in this proxy until the outsider has tried
        tb = hfl_testbed(overrides=DP, via={"devices-000-0": late.address})
        outsider = RawDevice(tb.edge_addresses[0], "dev-00000", insider=False)
        with pytest.raises(grpc.RpcError) as err:
            outsider.register()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "join secret" in err.value.details()
        outsider.channel.close()
        late.upstream = tb.edge_addresses[0]
        summary = tb.wait(timeout=600)
    assert key(tb.metrics()) == key(clean_dp.metrics())
    assert summary["refused"] == 1 and tb.metrics()[0]["refused"] == 1 and tb.metrics()[0]["devices"] == 4
    assert refusals_logged(tb, "edge-000", "bad_join") == 1
