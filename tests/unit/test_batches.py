"""The typed payloads of an Envelope (common/batches.py: AirRow, AirBatch, RelayBatch): the air rows' checks at the
edge and at the cloud's medium (a NaN, a stranger's row, a node twice, more rows than devices: refused, nothing
kept), and the bytes an edge forwards as received (they parse to what was sent, in one copy)."""
import grpc
import numpy as np
import pytest

from hfl.cloud_server.medium import Medium
from hfl.common import batches, config as config_mod, plans, wire
from hfl.common.channel import plane as air
from hfl.proto import hfl_v1_pb2 as pb

MEMBERS = {f"dev-{k:05d}" for k in range(4)}
BASE = ["topology.edges=3", "topology.devices_per_edge=4", "channel.model=ota", "run.algorithm=multiairfed",
        "train.tau=3", "train.gamma=1"]


def _row(env: pb.Envelope, node: str, dim: int = 16, seed: int = 0) -> pb.AirRow:
    row = env.air.rows.add(node=node, model_sum=1.5)
    bar, mu, sigma = air.normalise(np.random.default_rng(seed).normal(size=(1, dim)))
    wire.CODECS.get("float32").fill(row.tensor, bar[0].astype(np.float32), "air")
    row.mu, row.sigma = float(mu[0]), float(sigma[0])
    return row


def _refused(fn, reason: str = "bad_air") -> str:
    with pytest.raises(wire.WireError) as err:
        fn()
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.reason == reason, err.value
    return str(err.value)


def test_air_rows_refuse_nan_strangers_duplicates_and_oversized_batches():
    env = pb.Envelope()
    _row(env, "dev-00000")
    env.air.rows.add(node="dev-00001", model_sum=-2.0)  # a listener
    assert [r.node for r in batches.air_rows(env, MEMBERS, "edge-000")] == ["dev-00000", "dev-00001"]

    def bad(tweak) -> pb.Envelope:
        out = pb.Envelope()
        out.CopyFrom(env)
        tweak(out)
        return out

    cases = {
        "NaN mu": lambda e: setattr(e.air.rows[0], "mu", float("nan")),
        "inf model_sum": lambda e: setattr(e.air.rows[1], "model_sum", float("inf")),
        "unknown node": lambda e: e.air.rows.add(node="dev-00007"),
        "duplicated node": lambda e: e.air.rows.add().CopyFrom(e.air.rows[0]),
        "oversized": lambda e: [e.air.rows.add(node=f"dev-{k:05d}") for k in range(2, 5)],
        "sigma without payload": lambda e: setattr(e.air.rows[1], "sigma", 1.0),
        "a tensor beside the rows": lambda e: e.tensors.add(name="air"),
    }
    for what, tweak in cases.items():
        message = _refused(lambda: batches.air_rows(bad(tweak), MEMBERS, "edge-000"))
        assert "air" in message, what
    assert "dev-00007" in _refused(lambda: batches.air_rows(bad(cases["unknown node"]), MEMBERS, "edge-000"))
    assert "two air rows" in _refused(lambda: batches.air_rows(bad(cases["duplicated node"]), MEMBERS, "edge-000"))
    assert "which has 4 devices" in _refused(lambda: batches.air_rows(bad(cases["oversized"]), MEMBERS, "edge-000"))
    no_sigma = bad(lambda e: setattr(e.air.rows[0], "sigma", 0.0))
    _refused(lambda: batches.air_rows(no_sigma, MEMBERS, "edge-000"), "air_scalars")
    # a device's own row, bounded at its edge: a sigma of 1e30 is left to the medium's side_info_bound only when an
    # edge forwards it (unbounded there)
    huge = bad(lambda e: setattr(e.air.rows[0], "sigma", 1e30))
    assert batches.air_rows(huge, MEMBERS, "edge-000")
    assert "outside" in _refused(lambda: batches.air_rows(huge, MEMBERS, "edge-000", bounded=True))


def _emission(cfg, medium, step=0):
    phases = plans.build_plan(cfg)
    active = air.activity(medium.plane, phases, 0, step)
    env = pb.Envelope(meta=pb.Meta(run_id="r", round=0, step=step, phase=phases[step].kind, sender_id="edge-000"))
    for k in range(4):
        if active[k]:
            _row(env, f"dev-{k:05d}", medium.dim, k)
        else:
            env.air.rows.add(node=f"dev-{k:05d}")
    return env, phases


def test_the_medium_refuses_a_bad_row_whole_and_keeps_nothing(tmp_path):
    cfg = config_mod.load(None, BASE)
    medium = Medium(cfg, tmp_path, dim=16)
    env, phases = _emission(cfg, medium)
    tx = [r.node for r in env.air.rows if r.HasField("tensor")]
    assert tx, "slot 0 has a transmitter in edge-000"

    def tweaked(fn) -> pb.Envelope:
        out = pb.Envelope()
        out.CopyFrom(env)
        fn(out)
        return out

    for fn in (lambda e: setattr(next(r for r in e.air.rows if r.HasField("tensor")), "mu", float("nan")),
               lambda e: e.air.rows.add(node="dev-00005"),                       # a device of edge-001
               lambda e: e.air.rows.add().CopyFrom(e.air.rows[0]),              # dev-00000 twice
               lambda e: [e.air.rows.add(node=f"dev-{k:05d}") for k in range(4, 8)],  # 8 rows for 4 devices
               lambda e: e.scalars.update({"mu:dev-00000": 0.1})):              # the old scalar keys
        _refused(lambda: medium.parse(tweaked(fn), 0, phases))
        assert not medium.slots and not medium.stats  # refused whole: no slot, no row kept
    emission = medium.parse(env, 0, phases)  # the same emission, untouched, still goes in
    assert emission.tx == tx and emission.listen == sorted(MEMBERS)
    assert all(v.dtype == np.float32 and v.shape == (16,) for v in emission.payloads)


def test_an_edge_forwards_rows_and_uploads_as_received():
    device = pb.Envelope(meta=pb.Meta(run_id="r", sender_id="dev-00001", step=2), scalars={"train_loss": 0.5})
    row = _row(device, "dev-00001", 32, 3)
    received = pb.Chunk(data=device.SerializeToString()).SerializeToString()  # an ExchangeOne request
    parsed, _ = wire.read_raw_chunk(received, 1 << 20)
    vec = wire.decode_array(parsed.air.rows[0].tensor, [32])
    raw, view = batches.received_row(received, vec)
    assert bytes(raw) == row.SerializeToString()
    assert np.array_equal(view, vec) and not view.flags.owndata  # the payload read in place from the request
    listener = pb.Envelope(meta=device.meta)
    listener.air.rows.add(node="dev-00002", model_sum=3.0)
    raw2, none = batches.received_row(pb.Chunk(data=listener.SerializeToString()).SerializeToString(), None)
    assert none is None and pb.AirRow.FromString(bytes(raw2)).model_sum == 3.0
    # a row the parser would read as a merge of two fields is never forwarded as bytes (the caller serialises it)
    twice = pb.Chunk(data=device.SerializeToString() + device.SerializeToString()).SerializeToString()
    assert batches.received_row(twice, vec)[0] is None

    emission = batches.with_batch(pb.Envelope(meta=pb.Meta(sender_id="edge-000")), batches.AIR, [raw, raw2])
    back = pb.Envelope.FromString(emission)
    assert back.meta.sender_id == "edge-000" and list(back.air.rows) == [row, listener.air.rows[0]]
    assert batches.air_rows(back, {"dev-00001", "dev-00002"}, "edge-000")

    upload = batches.received_upload(received)
    result = batches.with_batch(pb.Envelope(meta=pb.Meta(sender_id="edge-000")), batches.RELAY, [upload, b""])
    back = pb.Envelope.FromString(result)
    assert back.WhichOneof("payload") == "relay" and list(back.relay.uploads) == [device.SerializeToString(), b""]
    assert batches.received_upload(b"") is None
