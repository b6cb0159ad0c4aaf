"""Wire codec: float vectors <-> hfl.v1.Tensor, envelopes <-> chunk streams, and input validation.

Tensors travel as dtype + shape + encoding + bytes; nothing is ever pickled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from hfl.proto import hfl_v1_pb2 as pb

from .registry import Registry


class WireError(Exception):
    """A message that must be refused; carries the gRPC status the sender gets."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "invalid"):
        super().__init__(message)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class RawCodec:
    """Little-endian array of `dtype`, decoded to float32."""

    name: str
    dtype: str
    draws = False  # encode uses no random draw: the pipeline builds no generator for it

    def encode(self, vec: np.ndarray, tensor_name: str, rng: np.random.Generator | None = None, **params) -> pb.Tensor:
        if params:
            raise ValueError(f"encoding {self.name!r} takes no parameters, got {sorted(params)}")
        return self.fill(pb.Tensor(), vec, tensor_name)

    def fill(self, tensor: pb.Tensor, vec: np.ndarray, tensor_name: str) -> pb.Tensor:
        """Write vec into `tensor` in place (e.g. a field of an envelope: no copy of a finished message)."""
        tensor.name, tensor.dtype, tensor.encoding = tensor_name, self.dtype, self.name
        tensor.shape.extend(vec.shape)
        tensor.data = np.ascontiguousarray(vec, dtype=np.dtype(self.dtype).newbyteorder("<")).tobytes()
        return tensor

    def decode(self, tensor: pb.Tensor) -> np.ndarray:
        if tensor.dtype != self.dtype:
            raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                            f"tensor {tensor.name!r}: encoding {self.name!r} carries dtype {self.dtype}, got {tensor.dtype!r}",
                            "bad_dtype")
        count = math.prod(tensor.shape)
        itemsize = np.dtype(self.dtype).itemsize
        data = tensor.data  # each read of a bytes field copies it out of the message: read it once
        if len(data) != count * itemsize:
            raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                            f"tensor {tensor.name!r}: {len(data)} bytes for shape {list(tensor.shape)} of {self.dtype}",
                            "bad_size")
        arr = np.frombuffer(data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        return arr.astype(np.float32).reshape(tuple(tensor.shape))

    def params(self, **raw) -> dict:
        if raw:
            raise ValueError(f"encoding {self.name!r} takes no parameters, got {sorted(raw)}")
        return {}

    def bits(self, count: int, **params) -> int:
        self.params(**params)
        return count * np.dtype(self.dtype).itemsize * 8


CODECS: Registry = Registry("encoding")
CODECS.register("float32", RawCodec("float32", "float32"))
CODECS.register("float16", RawCodec("float16", "float16"))


def encode(vec: np.ndarray, encoding: str, tensor_name: str, rng: np.random.Generator | None = None,
           **params) -> pb.Tensor:
    """Codec interface: encode(vec, tensor_name, rng=None, **params) -> Tensor; decode(tensor) -> float32
    array (everything it needs travels in the tensor); params(**raw) -> validated params (ValueError naming
    the key); bits(count, **params) -> bits on the wire for `count` values; `draws = False` where encode ignores rng."""
    return CODECS.get(encoding).encode(vec, tensor_name, rng, **params)


def decode_vector(tensor: pb.Tensor, expected_len: int) -> np.ndarray:
    """Decode a flat parameter-sized vector, refusing unknown encodings, wrong shapes and non-finite values."""
    if tensor.encoding not in CODECS:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"tensor {tensor.name!r}: unknown encoding {tensor.encoding!r}; allowed: {', '.join(CODECS.names())}",
                        "bad_encoding")
    if list(tensor.shape) != [expected_len]:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"tensor {tensor.name!r}: shape {list(tensor.shape)}, expected [{expected_len}]", "bad_shape")
    vec = CODECS.get(tensor.encoding).decode(tensor)
    if not np.isfinite(vec).all():
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"tensor {tensor.name!r}: {int((~np.isfinite(vec)).sum())} non-finite values (NaN or inf)",
                        "non_finite")
    return vec


def add_raw(envelope: pb.Envelope, vec: np.ndarray, encoding: str, tensor_name: str) -> pb.Envelope:
    """Add one tensor of a raw encoding (float32, float16) to `envelope`, written in place: Envelope(tensors=[t]) or
    tensors.append(t) copies t once more (the medium's 0.9 MB rows: 45 a slot each way at paper 003's scale)."""
    CODECS.get(encoding).fill(envelope.tensors.add(), vec, tensor_name)
    return envelope


def decode_array(tensor: pb.Tensor, shape: list[int]) -> np.ndarray:
    """Decode a float32 array of exactly `shape`, refusing other encodings and non-finite values."""
    if tensor.encoding != "float32" or list(tensor.shape) != list(shape):
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"tensor {tensor.name!r}: {tensor.encoding!r} of shape {list(tensor.shape)}, expected float32 "
                        f"{list(shape)}", "bad_shape")
    arr = CODECS.get("float32").decode(tensor)
    if not np.isfinite(arr).all():
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"tensor {tensor.name!r}: non-finite values", "non_finite")
    return arr


def single_tensor(envelope: pb.Envelope, name: str) -> pb.Tensor:
    found = [t for t in envelope.tensors if t.name == name]
    if len(found) != 1 or len(envelope.tensors) != 1:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"expected exactly one tensor named {name!r}, got {[t.name for t in envelope.tensors]}",
                        "bad_tensors")
    return found[0]


def to_chunks(payload: bytes, chunk_bytes: int) -> Iterator[pb.Chunk]:
    if len(payload) <= chunk_bytes:  # the common case (a model under net.chunk_kib): no slice, no copy of ours
        yield pb.Chunk(data=bytes(payload))
        return
    view = memoryview(payload)
    for start in range(0, len(payload), chunk_bytes):
        yield pb.Chunk(data=bytes(view[start:start + chunk_bytes]))


def chunked(envelope: pb.Envelope, chunk_bytes: int) -> list[pb.Chunk]:
    return list(to_chunks(envelope.SerializeToString(), chunk_bytes))


async def read_envelope(chunks: AsyncIterator[pb.Chunk], max_bytes: int) -> tuple[pb.Envelope, int]:
    """Reassemble a chunk stream of one envelope, refusing payloads over `max_bytes` before they are buffered whole."""
    envelopes, size = await read_envelopes(chunks, max_bytes, 1)
    return envelopes[0], size


def read_chunk(chunk: pb.Chunk, max_bytes: int) -> tuple[pb.Envelope, int]:
    """The envelope of a one-chunk message (ExchangeOne), refused over `max_bytes` as read_envelope refuses a stream."""
    data = chunk.data
    if len(data) > max_bytes:
        raise WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"payload exceeds the {max_bytes} byte limit", "oversized")
    return parse_envelope(data), len(data)


def read_raw_chunk(raw: bytes, max_bytes: int) -> tuple[pb.Envelope, int]:
    """read_chunk of a Chunk's bytes as received (a rpc.raw_bytes method's request, an edge_stub's ExchangeOne reply):
    the envelope is parsed from its span of `raw`, with no Chunk and no copy of its data in between."""
    try:
        start, end = _envelope_span(raw)
    except (IndexError, ValueError):
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT, "malformed request: not a valid message", "malformed") \
            from None
    if end - start > max_bytes:
        raise WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"payload exceeds the {max_bytes} byte limit", "oversized")
    return parse_envelope(memoryview(raw)[start:end]), end - start


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def _keys(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, a, b) of each field in buf[start:end] (protobuf's wire format): a length-delimited
    field's start and end, a varint's value and 0; fixed-width fields are skipped."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        kind = key & 7
        if kind == 2:
            n, i = _varint(buf, i)
            if i + n > end:
                raise ValueError("a field runs past the end")
            yield key >> 3, kind, i, i + n
            i += n
        elif kind == 0:
            value, i = _varint(buf, i)
            yield key >> 3, kind, value, 0
        elif kind in (1, 5):
            i += 8 if kind == 1 else 4
        else:
            raise ValueError(f"wire type {kind}")
    if i > end:
        raise ValueError("a field runs past the end")


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in buf[start:end]."""
    return ((number, a, b) for number, kind, a, b in _keys(buf, start, end) if kind == 2)


def _envelope_span(raw: bytes) -> tuple[int, int]:
    """(start, end) of the envelope in a Chunk's bytes: its data field, the last one as a parser keeps it."""
    start = end = 0
    for number, s, e in _fields(raw, 0, len(raw)):
        if number == 1:  # Chunk.data
            start, end = s, e
    return start, end


def tensor_spans(raw: bytes) -> list[tuple[int, int]]:
    """Where each tensor's data lies in the bytes of a Chunk holding one Envelope: (start, end) in `raw`."""
    start, end = _envelope_span(raw)
    return [(d0, d1) for field, t0, t1 in _fields(raw, start, end) if field == 2  # Envelope.tensors
            for n, d0, d1 in _fields(raw, t0, t1) if n == 5]  # Tensor.data


def view_in(vec, raw: bytes):
    """`vec`, or the same values as a read-only view of `raw` (a Chunk's bytes as received) where `vec`'s bytes are a
    tensor's data verbatim (a float32 upload: decoding copied them out of the request that gRPC holds anyway until the
    call returns, so an edge would hold both while its barrier waits). The bytes are compared, not assumed."""
    if not isinstance(vec, np.ndarray) or not raw or not vec.flags.c_contiguous:
        return vec
    try:
        spans = tensor_spans(raw)
    except (IndexError, ValueError):
        return vec
    flat = vec.reshape(-1).view(np.uint8)
    for start, end in spans:
        if end - start == vec.nbytes and np.array_equal(np.frombuffer(raw, np.uint8, vec.nbytes, start), flat):
            return np.frombuffer(raw, vec.dtype, vec.size, start).reshape(vec.shape)
    return vec


_WHOLE: dict[int, tuple[list, bytes]] = {}


def whole_bytes(chunks: list[pb.Chunk]) -> bytes:
    """whole(chunks) serialised: once per list for as long as the list is one of the last four asked for (an edge's
    barrier reply goes to every member of its cluster; the entry keeps its list, so its id is not reused meanwhile).
    The lists are never changed after they are built (a barrier's reply)."""
    hit = _WHOLE.get(id(chunks))
    if hit is not None and hit[0] is chunks:
        return hit[1]
    out = whole(chunks).SerializeToString()
    if len(_WHOLE) >= 4:
        del _WHOLE[next(iter(_WHOLE))]
    _WHOLE[id(chunks)] = (chunks, out)
    return out


def whole(chunks: list[pb.Chunk]) -> pb.Chunk:
    """A chunk stream of one envelope as one Chunk (the reply of a unary exchange)."""
    if len(chunks) == 1:
        return chunks[0]
    return pb.Chunk(data=b"".join(c.data for c in chunks))


async def exchange(stub, envelope: pb.Envelope, chunk_bytes: int, max_bytes: int, metadata=()) -> pb.Envelope:
    """A device's upload to its edge and the edge's reply: one unary call (ExchangeOne) when the upload fits one
    chunk, else the Exchange stream."""
    return await exchange_chunks(stub, chunked(envelope, chunk_bytes), max_bytes, metadata)


async def exchange_chunks(stub, chunks: list[pb.Chunk], max_bytes: int, metadata=()) -> pb.Envelope:
    """exchange() of an upload already cut into chunks, on an edge_stub; the list is emptied as it is sent, so a
    caller's reference to it does not keep the upload's bytes while the edge waits for the rest of its cluster."""
    if len(chunks) == 1:
        return read_raw_chunk(await stub.ExchangeOne(chunks.pop().SerializeToString(), metadata=metadata),
                              max_bytes)[0]
    return (await read_envelope(stub.Exchange(_drained(chunks), metadata=metadata), max_bytes))[0]


def edge_stub(channel):
    """The generated EdgeService stub with ExchangeOne taking the request already serialised (a Chunk's bytes) and
    giving its reply as received (read_raw_chunk): grpc.aio holds a unary request until its reply arrives, so a message
    object beside its bytes is a second copy held while the edge's barrier waits."""
    from hfl.proto import hfl_v1_pb2_grpc as pbg

    stub = pbg.EdgeServiceStub(channel)
    stub.ExchangeOne = channel.unary_unary("/hfl.v1.EdgeService/ExchangeOne", _registered_method=True)
    stub.Session = channel.stream_stream("/hfl.v1.EdgeService/Session", _registered_method=True)  # bytes both ways
    return stub


def _drained(chunks: list[pb.Chunk]) -> Iterator[pb.Chunk]:
    while chunks:
        yield chunks.pop(0)


def to_frames(envelopes, chunk_bytes: int) -> Iterator[pb.Chunk]:
    """Several envelopes on one chunk stream: each one's chunks, its last marked `end` (read_envelopes splits there)."""
    for envelope in envelopes:
        chunks = list(to_chunks(envelope.SerializeToString(), chunk_bytes))
        chunks[-1].end = True
        yield from chunks


async def read_envelopes(chunks: AsyncIterator[pb.Chunk], max_bytes: int, max_count: int) -> tuple[list[pb.Envelope], int]:
    """Reassemble a stream of to_frames: each envelope refused over `max_bytes` before it is buffered whole, the stream
    refused past `max_count` envelopes; bytes after the last `end` (or an empty stream) make one more envelope.
    Returns (envelopes, bytes)."""
    out, parts, size, total = [], [], 0, 0

    def close() -> None:
        if len(out) >= max_count:
            raise WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {max_count} envelopes in the stream",
                            "oversized")
        out.append(parse_envelope(parts[0] if len(parts) == 1 else b"".join(parts)))  # one chunk: parsed in place

    try:
        async for chunk in chunks:
            size += len(chunk.data)
            if size > max_bytes:
                raise WireError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"payload {len(out)} of the stream exceeds the {max_bytes} byte limit", "oversized")
            parts.append(chunk.data)
            if chunk.end:
                close()
                total, parts, size = total + size, [], 0
    except DecodeError as exc:  # gRPC's own parse of a stream message that is not a Chunk
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed stream message: {str(exc)[:200]}",
                        "malformed") from None
    if parts or not out:
        close()
    return out, total + size


def parse_envelope(payload: bytes) -> pb.Envelope:
    envelope = pb.Envelope()
    try:
        envelope.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError, but be defensive about malformed input
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed envelope: {exc}", "malformed") from None
    return envelope


def read_envelope_sync(chunks: Iterator[pb.Chunk]) -> tuple[pb.Envelope, int]:
    payload = b"".join(c.data for c in chunks)
    return parse_envelope(payload), len(payload)

