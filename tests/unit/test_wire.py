import asyncio

import grpc
import numpy as np
import pytest

from hfl.common import wire
from hfl.proto import hfl_v1_pb2 as pb


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
