"""The typed payloads of an Envelope (proto: AirRow, AirBatch, RelayBatch): the checks on the air rows a peer sends,
and the framing by which an edge forwards what it does not read.

Air (paper 003): a device uploads its own AirRow (mu, sigma, model_sum, and the normalised payload if it transmits);
its edge checks it and hands the row's bytes, as received, to the cloud's medium in one AirBatch per slot. Relay
(paper 004): an edge hands each drawn device's upload, as received, to the cloud's fusion in a RelayBatch. Neither
is parsed and serialised again on the way: the edge writes the received bytes (a memoryview of the request gRPC
holds) into its outgoing message, one copy each.
"""
from __future__ import annotations

import math
from typing import Collection, Iterable

import grpc
import numpy as np

from hfl.proto import hfl_v1_pb2 as pb

from . import wire
from .validate import per_member, short

# a device's row as its edge bounds it (the medium bounds only finiteness: channel.side_info_bound judges the rest)
BOUNDS = {"mu": (-1e12, 1e12), "sigma": (1e-30, 1e12), "model_sum": (-1e15, 1e15)}
AIR = pb.Envelope.DESCRIPTOR.fields_by_name["air"].number
RELAY = pb.Envelope.DESCRIPTOR.fields_by_name["relay"].number


def _bad(message: str, reason: str = "bad_air") -> wire.WireError:
    return wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, message, reason)


def air_rows(envelope: pb.Envelope, members: Collection[str], sender: str, bounded: bool = False) -> list[pb.AirRow]:
    """The air rows of `envelope`, checked: at most one per device of `members`, each of a member, once, with finite
    mu, sigma and model_sum, sigma > 0 where it carries a payload, mu = sigma = 0 where it does not (a listener), and
    with `bounded` each value within BOUNDS. Raises WireError (INVALID_ARGUMENT) and changes nothing."""
    if envelope.tensors or envelope.WhichOneof("payload") == "relay":
        raise _bad(f"air from {short(sender)}: the rows travel in Envelope.air, not as tensors or a relay batch")
    rows = envelope.air.rows
    for node, row in per_member(rows, lambda r: r.node, members, sender, "air row", "bad_air"):
        for name, (lo, hi) in BOUNDS.items():
            value = getattr(row, name)
            if not math.isfinite(value) or (bounded and not lo <= value <= hi and value != 0):  # 0: a listener's
                raise _bad(f"air row of {node}: {name} = {value!r}" + (f" outside [{lo:g}, {hi:g}]" if bounded else ""))
        if row.HasField("tensor") and not row.sigma > 0:
            raise _bad(f"air row of {node}: a payload needs its mu and sigma > 0 (payload normalisation, paper 003 "
                       "eqs. 12-13)", "air_scalars")
        if not row.HasField("tensor") and (row.mu or row.sigma):
            raise _bad(f"air row of {node}: mu and sigma without a payload")
    return list(rows)


def payload(tensor: pb.Tensor, dim: int) -> np.ndarray:
    """A row's normalised payload, float32 [dim], read in place (read-only) from the tensor's bytes: refused where
    wire.decode_array refuses it, without decode_array's copy into a new array."""
    if tensor.encoding != "float32" or tensor.dtype != "float32" or list(tensor.shape) != [dim]:
        wire.decode_array(tensor, [dim])  # raises its error for the shape, encoding or dtype
    data = tensor.data  # one copy out of the message, read once
    if len(data) != 4 * dim:
        raise _bad(f"tensor {short(tensor.name)}: {len(data)} bytes for [{dim}] float32", "bad_size")
    vec = np.frombuffer(data, "<f4")
    if not np.isfinite(vec).all():
        raise _bad(f"tensor {short(tensor.name)}: non-finite values", "non_finite")
    return vec


# ---- forwarding bytes as received ---------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(number: int, size: int) -> bytes:
    """A length-delimited field's tag and length (protobuf's wire format)."""
    return _varint(number << 3 | 2) + _varint(size)


def with_batch(envelope: pb.Envelope, field: int, items: Iterable) -> bytes:
    """`envelope` serialised with its payload oneof `field` (AIR: AirBatch.rows, RELAY: RelayBatch.uploads) holding
    `items`, each the serialised bytes of a row or an upload (bytes or a memoryview), copied once into the message
    as they are: never parsed or serialised again. The field follows the envelope's others, as a parser allows."""
    parts = []
    for item in items:
        parts += [_key(1, len(item)), item]
    return b"".join([envelope.SerializeToString(), _key(field, sum(len(p) for p in parts)), *parts])


def _spans(raw: bytes, start: int, end: int, number: int) -> list[tuple[int, int]]:
    return [(s, e) for n, s, e in wire._fields(raw, start, end) if n == number]


def received_upload(received: bytes) -> memoryview | None:
    """The envelope in a Chunk's bytes as received (an ExchangeOne request), the bytes read_raw_chunk parsed; None if
    there are none."""
    start, end = wire._envelope_span(received)
    return memoryview(received)[start:end] if received else None


def received_row(received: bytes, vec: np.ndarray | None) -> tuple[memoryview | None, np.ndarray | None]:
    """An air upload's one row in a Chunk's bytes as received, and `vec` (its decoded payload) read in place from
    them where the bytes are equal (compared, not assumed); (None, vec) where the row is not there exactly once (the
    caller serialises the parsed row: bytes a parser would read differently are never forwarded)."""
    if not received:
        return None, vec
    try:
        start, end = wire._envelope_span(received)
        batches = _spans(received, start, end, AIR)
        rows = _spans(received, *batches[0], 1) if len(batches) == 1 else []
        if len(rows) != 1:
            return None, vec
        row = memoryview(received)[rows[0][0]:rows[0][1]]
        tensors = _spans(received, *rows[0], 5)
        datas = _spans(received, *tensors[0], 5) if len(tensors) == 1 else []
    except (IndexError, ValueError):
        return None, vec
    if vec is not None and datas:
        s, e = datas[-1]  # a bytes field given twice: the parser keeps the last
        if e - s == vec.nbytes and np.array_equal(np.frombuffer(received, np.uint8, vec.nbytes, s), vec.view(np.uint8)):
            vec = np.frombuffer(received, vec.dtype, vec.size, s)
    return row, vec
