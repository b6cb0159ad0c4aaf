import asyncio

import grpc
import numpy as np
import pytest

from hfl.common import rpc, wire
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg


def vec(n=1000, seed=0):
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def test_float32_round_trip_is_exact():
    v = vec()
    t = wire.encode(v, "float32", "delta")
    assert (t.dtype, list(t.shape), t.encoding, len(t.data)) == ("float32", [1000], "float32", 4000)
    assert np.array_equal(wire.decode_vector(t, 1000), v)


def test_float16_round_trip_within_half_precision():
    v = vec()
    t = wire.encode(v, "float16", "delta")
    assert len(t.data) == 2000
    out = wire.decode_vector(t, 1000)
    assert np.allclose(out, v, rtol=2 ** -10, atol=1e-4)
    assert np.array_equal(out, v.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("mutate, reason", [
    (lambda t: setattr(t, "encoding", "pickle"), "bad_encoding"),
    (lambda t: (t.ClearField("shape"), t.shape.extend([999])), "bad_shape"),
    (lambda t: setattr(t, "dtype", "float64"), "bad_dtype"),
    (lambda t: setattr(t, "data", t.data[:-4]), "bad_size"),
    (lambda t: setattr(t, "data", np.full(1000, np.nan, np.float32).tobytes()), "non_finite"),
    (lambda t: setattr(t, "data", np.full(1000, np.inf, np.float32).tobytes()), "non_finite"),
])
def test_decode_refuses_bad_tensors(mutate, reason):
    t = wire.encode(vec(), "float32", "delta")
    mutate(t)
    with pytest.raises(wire.WireError) as err:
        wire.decode_vector(t, 1000)
    assert err.value.reason == reason and err.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_chunks_reassemble_large_payloads():
    v = vec(3_000_000)  # 12 MB: over gRPC's 4 MiB default message cap
    env = pb.Envelope(meta=pb.Meta(round=3), tensors=[wire.encode(v, "float32", "model")])
    chunks = wire.chunked(env, 1 << 20)
    assert len(chunks) == 12 and all(len(c.data) <= 1 << 20 for c in chunks)

    async def stream():
        for c in chunks:
            yield c

    out, size = asyncio.run(wire.read_envelope(stream(), 64 << 20))
    assert size == env.ByteSize() and out.meta.round == 3
    assert np.array_equal(wire.decode_vector(out.tensors[0], 3_000_000), v)


def test_oversized_payload_refused_before_buffering():
    async def stream():
        for _ in range(10):
            yield pb.Chunk(data=b"x" * 1000)

    with pytest.raises(wire.WireError) as err:
        asyncio.run(wire.read_envelope(stream(), 5000))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_malformed_envelope():
    with pytest.raises(wire.WireError, match="malformed"):
        wire.parse_envelope(b"\xff\xff\xff\xff")


def test_single_tensor():
    env = pb.Envelope(tensors=[wire.encode(vec(4), "float32", "delta")])
    assert wire.single_tensor(env, "delta").name == "delta"
    with pytest.raises(wire.WireError):
        wire.single_tensor(env, "gradient")


@pytest.mark.parametrize("encoding, dtype", [("float32", "<f4"), ("float16", "<f2")])
def test_decode_gives_the_same_writable_array_as_a_copy_of_the_bytes(encoding, dtype):
    """Fixed input, against the reading decode had before it read the bytes field once: frombuffer, then astype."""
    v = np.linspace(-3, 3, 1001, dtype=np.float32) ** 3
    t = wire.encode(v, encoding, "delta")
    out = wire.decode_vector(t, 1001)
    reference = np.frombuffer(bytes(t.data), dtype=dtype).astype(np.float32)
    assert out.dtype == np.float32 and out.tobytes() == reference.tobytes()
    out[0] = 1.0  # a copy of its own, not a view of the message's bytes
    assert wire.decode_vector(t, 1001).tobytes() == reference.tobytes()


def test_read_chunk_parses_one_chunk_and_refuses_what_read_envelope_refuses():
    env = pb.Envelope(meta=pb.Meta(round=2, sender_id="dev-00001"), tensors=[wire.encode(vec(), "float32", "delta")])
    chunk = wire.chunked(env, 1 << 20)[0]
    out, size = wire.read_chunk(chunk, 64 << 20)
    assert out == env and size == env.ByteSize()
    with pytest.raises(wire.WireError) as err:
        wire.read_chunk(chunk, size - 1)
    assert (err.value.code, err.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "oversized")
    with pytest.raises(wire.WireError) as err:
        wire.read_chunk(pb.Chunk(data=b"\xff\xff\xff\xff"), 64 << 20)
    assert (err.value.code, err.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "malformed")
    assert wire.read_chunk(pb.Chunk(), 64 << 20) == (pb.Envelope(), 0)  # as an empty stream reads


def test_whole_joins_a_chunk_stream_into_one_chunk():
    env = pb.Envelope(tensors=[wire.encode(vec(3000), "float32", "model")])
    chunks = wire.chunked(env, 5000)
    assert len(chunks) == 3
    assert wire.whole(chunks).data == env.SerializeToString()
    assert wire.whole(chunks[:1]) is chunks[0]


class _Edge(pbg.EdgeServiceServicer):
    """An EdgeService on a real grpc.aio server that answers both exchange calls with the upload's tensor plus one."""

    def __init__(self):
        self.calls = []

    def reply(self, envelope):
        t = envelope.tensors[0]
        out = wire.decode_vector(t, t.shape[0]) + np.float32(1)
        return wire.chunked(pb.Envelope(meta=envelope.meta, tensors=[wire.encode(out, "float32", "model")]), 5000)

    async def Exchange(self, request_iterator, context):
        self.calls.append("Exchange")
        for chunk in self.reply((await wire.read_envelope(request_iterator, 1 << 20))[0]):
            yield chunk

    @rpc.raw_bytes
    async def ExchangeOne(self, request, context):
        self.calls.append("ExchangeOne")
        assert isinstance(request, bytes)  # the request as received: no parsed copy beside it
        try:
            envelope = wire.read_raw_chunk(request, 1 << 20)[0]
        except wire.WireError as exc:  # as the edge refuses it (service_base.refuse)
            await context.abort(exc.code, str(exc))
        return wire.whole_bytes(self.reply(envelope))

    async def malformed(self, context):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed")


async def _with_edge(call):
    """(the _Edge, call(stub)) with the _Edge served on a real grpc.aio server as EdgeServer registers it and the
    stub a device host uses (wire.edge_stub)."""
    edge = _Edge()
    server = grpc.aio.server(options=rpc.message_options(5000))
    rpc.add_servicer(pbg.add_EdgeServiceServicer_to_server, edge, server, edge.malformed)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        chan = rpc.channel(f"127.0.0.1:{port}", 1 << 20)
        try:
            return edge, await call(wire.edge_stub(chan))
        finally:
            await chan.close()
    finally:
        await server.stop(0)


@pytest.mark.parametrize("n, call", [(1000, "ExchangeOne"), (3000, "Exchange")])
def test_exchange_sends_one_chunk_in_one_call_and_gets_the_same_tensors(n, call):
    """4,000 bytes fit one 5,000-byte chunk (unary call), 12,000 do not (stream); the edge's reply of 3 chunks
    comes back whole either way."""
    v = vec(n, seed=n)
    env = pb.Envelope(meta=pb.Meta(round=4, sender_id="dev-00002"), tensors=[wire.encode(v, "float32", "delta")])

    chunks = wire.chunked(env, 5000)
    edge, reply = asyncio.run(_with_edge(lambda stub: wire.exchange_chunks(stub, chunks, 1 << 20)))
    calls = edge.calls
    assert calls == [call] and reply.meta == env.meta
    assert chunks == []  # sent chunks leave the caller's list: a device does not hold its upload while its edge waits
    assert wire.decode_vector(wire.single_tensor(reply, "model"), n).tobytes() == (v + np.float32(1)).tobytes()


def test_tensor_spans_find_each_tensors_bytes_in_a_chunk():
    a, b = vec(300, seed=1), vec(7, seed=2)
    env = pb.Envelope(meta=pb.Meta(round=3, sender_id="dev-00001", transforms=[pb.Transform(stage="encode")]),
                      tensors=[wire.encode(a, "float32", "delta"), wire.encode(b, "float16", "extra")],
                      scalars={"train_loss": 0.5})
    raw = pb.Chunk(data=env.SerializeToString(), end=True).SerializeToString()
    spans = wire.tensor_spans(raw)
    assert [raw[s:e] for s, e in spans] == [t.data for t in env.tensors]


def test_view_in_reads_an_upload_in_place_from_the_request_and_only_where_the_bytes_match():
    v = vec(1000, seed=3)
    env = pb.Envelope(meta=pb.Meta(sender_id="dev-00001"), tensors=[wire.encode(v, "float32", "delta")])
    raw = pb.Chunk(data=env.SerializeToString()).SerializeToString()
    decoded = wire.decode_vector(pb.Envelope.FromString(pb.Chunk.FromString(raw).data).tensors[0], 1000)
    seen = wire.view_in(decoded, raw)
    assert np.shares_memory(seen, np.frombuffer(raw, np.uint8)) and seen.tobytes() == v.tobytes()
    assert not seen.flags.writeable  # nothing may write into the request's bytes
    other = decoded + np.float32(1)  # same length, other values: kept as it is
    assert wire.view_in(other, raw) is other
    half = wire.decode_vector(wire.encode(v, "float16", "delta"), 1000)  # float16 on the wire: no verbatim bytes
    assert wire.view_in(half, raw) is half
    assert wire.view_in(decoded, b"\xff\xff") is decoded and wire.view_in(None, raw) is None  # unreadable, nothing


def test_a_raw_bytes_method_gets_the_request_as_received_and_refuses_what_does_not_parse():
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(_with_edge(lambda stub: stub.ExchangeOne(b"\x0a\xff\xff")))  # a length past the end
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_read_raw_chunk_reads_what_read_chunk_reads_and_refuses_the_same():
    env = pb.Envelope(meta=pb.Meta(round=2, sender_id="dev-00003"), tensors=[wire.encode(vec(500), "float32", "delta")])
    chunk = pb.Chunk(data=env.SerializeToString(), end=True)
    raw = chunk.SerializeToString()
    assert wire.read_raw_chunk(raw, 1 << 20) == wire.read_chunk(chunk, 1 << 20)
    assert wire.read_raw_chunk(b"", 10)[0] == pb.Envelope()  # an empty chunk: an empty envelope, as the parser reads
    with pytest.raises(wire.WireError, match="byte limit"):
        wire.read_raw_chunk(raw, 100)
    for bad in (raw[:-1], b"\x0a\xff\xff", raw + b"\x0b", b"\x0a\x02\xff\xff"):  # truncated, a group, not an envelope
        with pytest.raises(wire.WireError, match="malformed"):
            wire.read_raw_chunk(bad, 1 << 20)


def test_whole_bytes_serialises_a_shared_reply_once_and_a_new_list_afresh():
    a = wire.chunked(pb.Envelope(meta=pb.Meta(round=1)), 5000)
    first = wire.whole_bytes(a)
    assert wire.whole_bytes(a) is first and pb.Chunk.FromString(first) == wire.whole(a)
    b = wire.chunked(pb.Envelope(meta=pb.Meta(round=2)), 5000)
    assert pb.Chunk.FromString(wire.whole_bytes(b)) == wire.whole(b)
    for i in range(5):  # pushed out by four newer lists: serialised again, the same bytes
        wire.whole_bytes(wire.chunked(pb.Envelope(meta=pb.Meta(round=10 + i)), 5000))
    again = wire.whole_bytes(a)
    assert again is not first and again == first
