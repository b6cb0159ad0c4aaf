"""A device's exchanges with its edge on one stream held open for its session (EdgeService.Session): each upload a
framed envelope (serialised Chunks, the last with `end` set), each reply the one-Chunk reply ExchangeOne gives, with
`end` set. Messages travel as the bytes of a Chunk (no message objects at either end), as ExchangeOne's do, so an
edge reads a one-frame upload's values in place (wire.view_in). A stream costs gRPC's per-call work once per
session instead of once per exchange (benchmarks/bench_rpc.py: `session` against `current`)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

import grpc

from hfl.proto import hfl_v1_pb2 as pb

from . import wire

END = b"\x10\x01"  # Chunk.end = true (field 2, varint 1): appended to a serialised Chunk, a parser reads it as set
METHOD = "/hfl.v1.EdgeService/Session"


def frame_fields(raw: bytes) -> tuple[int, int, bool]:
    """(start, end) of the serialised Chunk `raw`'s data and whether its `end` is set, in one pass (the last value of
    a field wins, as a parser reads it)."""
    start = stop = 0
    end = False
    for number, kind, a, b in wire._keys(raw, 0, len(raw)):
        if number == 1 and kind == 2:
            start, stop = a, b
        elif number == 2 and kind == 0:
            end = a != 0
    return start, stop, end


def frame_end(raw: bytes) -> bool:
    """Whether the serialised Chunk `raw` has `end` set."""
    return frame_fields(raw)[2]


@dataclass
class Upload:
    """One framed upload as received: `raw`, the bytes of its only frame (read in place), or `parts`, the data of its
    frames."""
    raw: bytes = b""
    parts: tuple[bytes, ...] = ()
    max_bytes: int = 0

    async def read(self) -> tuple[pb.Envelope, int]:
        if self.parts:
            data = b"".join(self.parts)
            return wire.parse_envelope(data), len(data)
        return wire.read_raw_chunk(self.raw, self.max_bytes)

    @property
    def received(self) -> bytes:
        return self.raw


async def uploads(frames: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[Upload]:
    """The uploads of a Session stream, one per framed envelope; WireError for a frame that does not parse or an
    upload over `max_bytes` (refused before it is buffered whole). A stream that ends inside an upload ends it."""
    parts: list[bytes] = []
    size = 0
    async for raw in frames:
        try:
            start, stop, last = frame_fields(raw)
        except (IndexError, ValueError):
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, "malformed stream message: not a Chunk",
                                 "malformed") from None
        size += stop - start
        if size > max_bytes:
            raise wire.WireError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"payload exceeds the {max_bytes} byte limit", "oversized")
        if last and not parts:
            yield Upload(raw=raw, max_bytes=max_bytes)
        else:
            parts.append(bytes(memoryview(raw)[start:stop]))
            if last:
                yield Upload(parts=tuple(parts), max_bytes=max_bytes)
        if last:
            parts, size = [], 0


async def serve(frames: AsyncIterator[bytes], max_bytes: int, exchange, context, refuse) -> AsyncIterator[bytes]:
    """An edge's end of a Session stream: `await exchange(upload, context)` (the one-chunk reply's bytes) for each
    upload, framed back; `await refuse(exc)` (which ends the call) for a frame that does not parse or an upload over
    `max_bytes`."""
    stream = uploads(frames, max_bytes)
    while True:
        try:
            upload = await anext(stream, None)
        except wire.WireError as exc:
            await refuse(exc)
            return
        if upload is None:
            return
        yield reply(await exchange(upload, context))


def reply(whole: bytes) -> bytes:
    """The serialised one-Chunk reply of an exchange (wire.whole_bytes) as a Session frame."""
    return whole + END


class SessionStream:
    """A device's end: one Session call per session token, opened at the first exchange and again after a refusal,
    a restart of the round or a new registration ended it. Exchanges on one stream never overlap (a device awaits
    each reply before its next upload)."""

    def __init__(self) -> None:
        self.call = None
        self.token: str | None = None

    async def exchange(self, stub, chunks: list[pb.Chunk], max_bytes: int, metadata, token: str | None) -> pb.Envelope:
        """Send the upload's chunks (the list is emptied as they go) and return the edge's reply; the edge's refusal
        is the AioRpcError ExchangeOne would raise (and the stream is dropped)."""
        if self.call is None or token != self.token:
            self.close()
            self.call, self.token = stub.Session(metadata=metadata), token
        call = self.call
        try:
            try:
                while chunks:
                    chunk = chunks.pop(0)
                    await call.write(chunk.SerializeToString() + (END if not chunks else b""))
            except asyncio.InvalidStateError:  # the call ended already (the edge died or refused): read() raises its status
                pass
            raw = await call.read()
            if raw is grpc.aio.EOF:
                raise wire.WireError(grpc.StatusCode.UNAVAILABLE, "the edge ended the session stream", "stream_ended")
            return wire.read_raw_chunk(raw, max_bytes)[0]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
            self.call = None
