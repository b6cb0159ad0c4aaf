"""What cloud and edge servers share: refusal accounting, round publication to long-polling children."""
from __future__ import annotations

import asyncio
import collections
import logging

import grpc

from hfl.proto import hfl_v1_pb2 as pb

from . import wire

log = logging.getLogger("hfl.service")


class Refusals:
    """Counts refused messages by reason; `take()` returns and resets the count since the last report."""

    def __init__(self) -> None:
        self.total: collections.Counter[str] = collections.Counter()
        self._since = 0

    def add(self, reason: str, peer: str, detail: str) -> None:
        self.total[reason] += 1
        self._since += 1
        log.warning("refused %s from %s: %s", reason, peer, detail)

    def take(self) -> int:
        n, self._since = self._since, 0
        return n


class RoundBoard:
    """The current round task, serialised once and streamed to every child that long-polls for it."""

    def __init__(self) -> None:
        self.round = -1
        self.finished = False
        self.chunks: list[pb.Chunk] = []
        self.size = 0
        self.fetched: dict[int, set[str]] = collections.defaultdict(set)
        self._cond = asyncio.Condition()

    async def publish(self, round_: int, envelope: pb.Envelope, chunk_bytes: int) -> None:
        payload = envelope.SerializeToString()
        async with self._cond:
            self.round = round_
            self.finished = envelope.task.finished
            self.chunks = list(wire.to_chunks(payload, chunk_bytes))
            self.size = len(payload)
            self._cond.notify_all()

    async def wait_after(self, after: int) -> tuple[int, list[pb.Chunk], int]:
        async with self._cond:
            await self._cond.wait_for(lambda: self.round > after or (self.finished and self.round >= 0))
            return self.round, self.chunks, self.size

    async def wait_fetched(self, round_: int, members: set[str], timeout: float) -> set[str]:
        """Wait until every member fetched `round_` (used to let children see the final task); returns the missing."""
        async def all_fetched() -> None:
            async with self._cond:
                await self._cond.wait_for(lambda: members <= self.fetched[round_])

        try:
            await asyncio.wait_for(all_fetched(), timeout)
        except asyncio.TimeoutError:
            pass
        return members - self.fetched[round_]

    async def mark_fetched(self, round_: int, node: str) -> None:
        async with self._cond:
            self.fetched[round_].add(node)
            self._cond.notify_all()


async def refuse(context: grpc.aio.ServicerContext, refusals: Refusals, exc: wire.WireError) -> None:
    refusals.add(exc.reason, context.peer(), str(exc))
    await context.abort(exc.code, str(exc))
