"""Bad messages sent with a raw gRPC client get a clear status, change nothing, and are counted.

The test plays two devices of edge-001 by hand (their hosts are not started) so it controls when
the edge's barrier can complete; a clean run with the same seed is the reference: the metrics of
both runs must be identical, so the refused messages provably left every aggregate untouched.
"""
import numpy as np
from grpc import StatusCode as S

from hfl.common import wire

from .conftest import SMALL
from .rawclient import RawDevice, RawEdge, status_of

OVERRIDES = SMALL + ["topology.hosts_per_edge=3", "train.tau=1", "run.rounds=2", "net.max_message_mb=1"]
PLAYED = ["devices-001-1", "devices-001-2"]  # dev-00004 and dev-00005


def play(tb, attack: bool) -> tuple[dict, int]:
    """The two played devices' rounds; with `attack`, the statuses of the bad messages and how many probes of b's
    upload the edge refused (RawDevice.wait_held)."""
    a, b = RawDevice(tb.edge_addresses[1], "dev-00004"), RawDevice(tb.edge_addresses[1], "dev-00005")
    a.register()
    b.register()
    statuses, probes = {}, 0
    after = -1
    while True:
        task_a, task_b = a.fetch(after), b.fetch(after)
        task = task_a.task
        if task.finished:
            assert task_b.task.finished
            return statuses, probes
        for step, phase in enumerate(task.phases):
            if phase.kind != "edge_model_sync":
                continue
            good_b = b.envelope(task.round, step, phase.kind)
            if attack and task.round == 0:
                statuses, pending, probes = attack_edge_and_cloud(tb, b, task.round, step, phase.kind, good_b)
            else:
                pending = b.exchange_in_background(good_b)
            a.exchange(a.envelope(task.round, step, phase.kind))
            pending.join(timeout=60)
            assert "reply" in pending.result
        after = task.round


def attack_edge_and_cloud(tb, dev, round_, step, kind, good):
    bad = {}
    from hfl.proto import hfl_v1_pb2 as pb

    def env(**kw):
        return dev.envelope(kw.pop("round_", round_), kw.pop("step", step), kind, **kw)

    bad["register unknown id"] = status_of(lambda: RawDevice(tb.edge_addresses[1], "dev-09999").register())
    bad["register other cluster"] = status_of(lambda: RawDevice(tb.edge_addresses[1], "dev-00000").register())
    bad["unknown sender"] = status_of(lambda: dev.exchange(env(sender="dev-09999")))
    bad["impersonate dev-00004 (no token)"] = status_of(lambda: dev.exchange(env(sender="dev-00004"), metadata=(("x", "y"),)))
    bad["impersonate dev-00004 (b's token)"] = status_of(lambda: dev.exchange(env(sender="dev-00004")))
    bad["second register of a live device"] = status_of(lambda: RawDevice(tb.edge_addresses[1], "dev-00004").register())
    bad["weight hijack (num_samples 10**12)"] = status_of(
        lambda: RawDevice(tb.edge_addresses[1], "dev-00005").register(num_samples=10**12, rejoin=True))
    bad["wrong round"] = status_of(lambda: dev.exchange(env(round_=round_ + 1)))
    bad["round out of range"] = status_of(lambda: dev.exchange(env(round_=round_ + 5)))
    bad["wrong phase"] = status_of(lambda: dev.exchange(env(step=step + 1)))
    bad["wrong shape"] = status_of(lambda: dev.exchange(env(vec=np.zeros(dev.dim - 1, np.float32))))
    f64 = wire.encode(np.zeros(dev.dim, np.float32), "float32", "delta")
    f64.dtype, f64.data = "float64", np.zeros(dev.dim, np.float64).tobytes()
    bad["wrong dtype"] = status_of(lambda: dev.exchange(env(tensor=f64)))
    nan = np.zeros(dev.dim, np.float32)
    nan[7] = np.nan
    bad["nan"] = status_of(lambda: dev.exchange(env(vec=nan)))
    bad["oversized"] = status_of(lambda: dev.exchange(b"\x00" * (2 << 20)))
    bad["malformed"] = status_of(lambda: dev.exchange(b"\xff\xff\xff\xff\x0f"))
    pending = dev.exchange_in_background(good)
    probes = dev.wait_held(good)  # the edge holds the genuine upload: what comes next is its replay
    bad["replay"] = status_of(lambda: dev.exchange(good))
    # the cloud, while edge-001 cannot have submitted yet
    edge = RawEdge(tb.cloud_address)
    delta = wire.encode(np.zeros(dev.dim, np.float32), "float32", "delta")

    def sub(sender, r=round_, tensor=delta):
        meta = pb.Meta(run_id=dev.run_id, round=r, phase="cloud_sync", step=2, sender_id=sender, num_devices=3,
                       num_samples=1200)
        return pb.Envelope(meta=meta, tensors=[tensor])

    bad["cloud: unknown edge"] = status_of(lambda: edge.submit(sub("edge-999")))
    nan_delta = wire.encode(np.full(dev.dim, np.nan, np.float32), "float32", "delta")
    bad["cloud: nan, impersonating edge-001"] = status_of(lambda: edge.submit(sub("edge-001", tensor=nan_delta)))
    bad["cloud: edge-001's run id and round, no token"] = status_of(lambda: edge.submit(sub("edge-001")))
    bad["cloud: second register of a live edge"] = status_of(lambda: edge.register("edge-001", rejoin=True))
    return bad, pending, probes


def test_bad_messages_refused_without_effect(hfl_testbed):
    clean = hfl_testbed(overrides=OVERRIDES, skip_hosts=PLAYED)
    assert play(clean, attack=False) == ({}, 0)
    clean_summary = clean.wait(timeout=300)

    attacked = hfl_testbed(overrides=OVERRIDES, skip_hosts=PLAYED)
    statuses, probes = play(attacked, attack=True)
    summary = attacked.wait(timeout=300)

    assert statuses == {
        "register unknown id": S.PERMISSION_DENIED, "register other cluster": S.PERMISSION_DENIED,
        "unknown sender": S.PERMISSION_DENIED, "wrong round": S.FAILED_PRECONDITION, "round out of range": S.INVALID_ARGUMENT,
        "wrong phase": S.FAILED_PRECONDITION, "wrong shape": S.INVALID_ARGUMENT, "wrong dtype": S.INVALID_ARGUMENT,
        "nan": S.INVALID_ARGUMENT, "oversized": S.RESOURCE_EXHAUSTED, "malformed": S.INVALID_ARGUMENT,
        "replay": S.ALREADY_EXISTS,
        "cloud: unknown edge": S.PERMISSION_DENIED, "cloud: nan, impersonating edge-001": S.PERMISSION_DENIED,
        "cloud: edge-001's run id and round, no token": S.PERMISSION_DENIED,
        "cloud: second register of a live edge": S.ALREADY_EXISTS,
        "impersonate dev-00004 (no token)": S.PERMISSION_DENIED, "impersonate dev-00004 (b's token)": S.PERMISSION_DENIED,
        "second register of a live device": S.ALREADY_EXISTS, "weight hijack (num_samples 10**12)": S.ALREADY_EXISTS,
    }
    # every refusal counted in the metrics (the probes of the genuine upload too), and not one changed an aggregate
    assert clean_summary["refused"] == 0 and summary["refused"] == len(statuses) + probes
    assert attacked.metrics()[0]["refused"] == len(statuses) + probes
    key = lambda rows: [(r["accuracy"], r["loss"], r["train_loss"]) for r in rows]
    assert key(attacked.metrics()) == key(clean.metrics())
    assert summary["rounds"] == clean_summary["rounds"] == 2
    log = (attacked.run_dir / "logs" / "edge-001.log").read_text()
    assert "refused non_finite" in log and "refused replay" in log
