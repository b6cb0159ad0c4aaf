"""The medium's reply split per device (cloud_server.medium.reply_envelopes, wire.to_frames / read_envelopes) and the
load-time check that an air run's messages fit net.max_message_mb (channel.config.check_air_messages), at paper 003's
scale: M = 15 devices per cluster, d = 225,034 (its MNIST CNN)."""
import asyncio
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from hfl.cloud_server.medium import Medium, reply_envelopes
from hfl.common import config as config_mod
from hfl.common import wire
from hfl.common.channel.config import air_message_bytes, check_air_messages
from hfl.proto import hfl_v1_pb2 as pb

M, D = 15, 225_034  # paper 003: devices per cluster, parameters of ota-cnn
MIB = 1 << 20


async def _stream(chunks):
    for chunk in chunks:
        yield chunk


def _run(reader):
    """asyncio.run(reader) without returning through the main task: Python 3.11's asyncio.run looks up its SIGINT
    handler, a partial holding the task, by value, and the failed lookup formats the task with its result (seconds
    for a 27 MB envelope)."""
    out = []

    async def main():
        out.append(await reader)

    asyncio.run(main())
    return out[0]


def _read_all(chunks, max_bytes, max_count):
    return _run(wire.read_envelopes(_stream(list(chunks)), max_bytes, max_count))


def _slot_result(n, d, seed=0):
    rng = np.random.default_rng(seed)
    return SimpleNamespace(rows=rng.standard_normal((n, 2, d), dtype=np.float32), n_active=np.full(n, 9.0),
                           E=np.full(n, 6e-5), sigma_sum=np.full(n, 0.3), mu_mean=np.full(n, -1e-3))


def test_split_reply_at_paper_scale_gives_the_same_tensors_as_the_whole_one():
    res = _slot_result(M, D)
    listen = [f"dev-{k:05d}" for k in range(M)]
    meta = pb.Meta(round=3, step=6, phase="air_model_sync", sender_id="medium")
    # the whole reply, as the medium sent it before: one envelope with every device's row (M x 2 x d x 4 bytes)
    whole = pb.Envelope(meta=meta, tensors=[wire.encode(res.rows[i], "float32", n) for i, n in enumerate(listen)])
    whole.scalars.update(n_active=9.0, E=6e-5, sigma_sum=0.3, mu_mean=-1e-3, psi=2e-4)
    whole_back, whole_size = _run(wire.read_envelope(_stream(wire.chunked(whole, MIB)), 64 * MIB))
    assert whole_size > M * 2 * D * 4

    cap = 2 * D * 4 + 4096  # one device's row and its envelope: a tenth of the whole reply
    split = reply_envelopes(meta, res, list(range(M)), listen, 2e-4)
    envelopes, size = _read_all(wire.to_frames(split, MIB), cap, 1 + M)
    assert size == sum(e.ByteSize() for e in split) and len(envelopes) == 1 + M
    head, rows = envelopes[0], envelopes[1:]
    assert head.meta == meta and dict(head.scalars) == dict(whole_back.scalars) and not head.tensors
    assert [t.name for r in rows for t in r.tensors] == listen
    for i, (part, t_whole) in enumerate(zip(rows, whole_back.tensors)):
        got = wire.decode_array(wire.single_tensor(part, listen[i]), [2, D])
        assert np.array_equal(got, wire.decode_array(t_whole, [2, D])) and np.array_equal(got, res.rows[i])
    with pytest.raises(wire.WireError, match="byte limit"):  # the whole reply does not fit where the split one does
        _run(wire.read_envelope(_stream(wire.chunked(whole, MIB)), cap))


def test_a_subset_of_listeners_gets_only_its_own_rows():
    res = _slot_result(6, 50, seed=1)
    listen = [f"dev-{k:05d}" for k in range(6)]
    split = reply_envelopes(pb.Meta(round=0, step=0), res, [4, 1], listen, 1.0)
    assert [t.name for e in split[1:] for t in e.tensors] == ["dev-00004", "dev-00001"]
    assert np.array_equal(wire.decode_array(split[1].tensors[0], [2, 50]), res.rows[4])
    empty = reply_envelopes(pb.Meta(round=0, step=0), res, [], listen, 1.0)  # an edge whose members all sat out
    assert len(empty) == 1 and not empty[0].scalars


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
def test_frames_survive_any_chunk_size(chunk_bytes):
    envelopes = [pb.Envelope(scalars={"k": float(i)}, tensors=[wire.encode(np.arange(i + 3, dtype=np.float32),
                                                                           "float32", f"t{i}")]) for i in range(4)]
    back, _ = _read_all(wire.to_frames(envelopes, chunk_bytes), 1 << 20, 4)
    assert back == envelopes


def test_read_envelopes_limits_each_envelope_and_the_count():
    big = pb.Envelope(tensors=[wire.encode(np.zeros(1000, np.float32), "float32", "x")])
    small = pb.Envelope(scalars={"a": 1.0})
    with pytest.raises(wire.WireError) as exc:
        _read_all(wire.to_frames([small, big], 256), 2000, 5)
    assert exc.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "payload 1 of the stream" in str(exc.value)
    assert len(_read_all(wire.to_frames([small, big], 256), 5000, 5)[0]) == 2  # the limit is per envelope
    with pytest.raises(wire.WireError, match="more than 2 envelopes"):
        _read_all(wire.to_frames([small] * 3, 256), 5000, 2)
    # a plain one-envelope stream (no end mark) reads as one envelope; read_envelope refuses a second one
    assert _read_all(wire.chunked(big, 256), 5000, 1)[0] == [big]
    assert _run(wire.read_envelope(_stream(wire.chunked(big, 256)), 5000)) == (big, big.ByteSize())
    assert _run(wire.read_envelope(_stream([]), 5000)) == (pb.Envelope(), 0)
    with pytest.raises(wire.WireError, match="more than 1 envelopes"):
        _run(wire.read_envelope(_stream(list(wire.to_frames([small, small], 256))), 5000))


def test_air_messages_are_checked_against_the_cap_at_load_time(tmp_path):
    paper = ["run.algorithm=multiairfed", "channel.model=ota", "topology.edges=3", f"topology.devices_per_edge={M}"]
    # M = 15 at d = 225,034: the largest message is an edge's emission, 13 MiB; the reply goes per device (1.7 MiB)
    assert air_message_bytes(M, D) < 14 * MIB
    check_air_messages(config_mod.load(None, paper), D)
    with pytest.raises(config_mod.ConfigError, match=r"net\.max_message_mb = 12: .* needs 13 MiB"):
        check_air_messages(config_mod.load(None, paper + ["net.max_message_mb=12"]), D)
    check_air_messages(config_mod.load(None, ["net.max_message_mb=1"]), D)  # not an air run: nothing to check
    with pytest.raises(config_mod.ConfigError, match=r"net\.max_message_mb"):  # the medium's start checks it too
        Medium(config_mod.load(None, paper + ["net.max_message_mb=12"]), tmp_path, dim=D)
