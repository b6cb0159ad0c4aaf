"""What cloud and edge servers share: refusal accounting, round publication to long-polling children,
liveness of the nodes below (presence streams, grace periods) and their session tokens."""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from typing import Iterable

import grpc

from hfl.proto import hfl_v1_pb2 as pb

from . import wire
from .session import Sessions
from .validate import short, truncate

log = logging.getLogger("hfl.service")


class Refusals:
    """Counts refused messages by reason; `take()` returns and resets the count since the last report."""

    def __init__(self) -> None:
        self.total: collections.Counter[str] = collections.Counter()
        self._since = 0

    def add(self, reason: str, peer: str, detail: str) -> None:
        self.total[reason] += 1
        self._since += 1
        log.warning("refused %s from %s: %s", reason, truncate(peer, 100), truncate(detail))

    def take(self) -> int:
        n, self._since = self._since, 0
        return n


class RoundBoard:
    """The current round task, serialised once and streamed to every child that long-polls for it. The children `idle`
    in a round (not drawn) are not sent it: they go on waiting for the next round that draws them, or the end (100
    devices of which 10 are drawn a round made 90 calls a round for a task they only read to sit out)."""

    def __init__(self) -> None:
        self.round = -1
        self.attempt = 0
        self.finished = False
        self.chunks: list[pb.Chunk] = []
        self.size = 0
        self.idle: frozenset[str] = frozenset()
        self.fetched: dict[int, set[str]] = collections.defaultdict(set)
        self._cond = asyncio.Condition()

    async def publish(self, round_: int, envelope: pb.Envelope, chunk_bytes: int, attempt: int = 0,
                      idle: Iterable[str] = ()) -> None:
        payload = envelope.SerializeToString()
        async with self._cond:
            self.round = round_
            self.attempt = attempt
            self.finished = envelope.task.finished
            self.chunks = list(wire.to_chunks(payload, chunk_bytes))
            self.size = len(payload)
            self.idle = frozenset(idle)
            self._cond.notify_all()

    async def wait_after(self, after: int, after_attempt: int = 0, node: str | Iterable[str] = ""
                         ) -> tuple[int, list[pb.Chunk], int]:
        """The first task later than (after, after_attempt) that draws `node` (or any of several: a device host's one
        fetch for its devices, each of which sits out a task that does not draw it) (a new round, or a restart of the
        same one), or the final task."""
        nodes = {node} if isinstance(node, str) else set(node)
        async with self._cond:
            await self._cond.wait_for(lambda: (self.finished and self.round >= 0) or (
                (self.round, self.attempt) > (after, after_attempt) and not nodes <= self.idle))
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

    async def mark_fetched(self, round_: int, nodes: Iterable[str]) -> None:
        async with self._cond:
            self.fetched[round_].update(nodes)
            self._cond.notify_all()


async def refuse(context: grpc.aio.ServicerContext, refusals: Refusals, exc: wire.WireError) -> None:
    detail = truncate(str(exc))
    if exc.code == grpc.StatusCode.UNAVAILABLE:
        # "not yet" (a server still starting or joining its upstream): the caller retries; not a bad message, so not
        # counted in `refused` (its count would follow the machine's speed, not what peers sent)
        log.info("not ready for %s: %s", truncate(context.peer(), 100), detail)
    else:
        refusals.add(exc.reason, context.peer(), detail)
    await context.abort(exc.code, detail)


class Guarded:
    """Mixin: what a servicer does with a request gRPC could not parse (see rpc.add_servicer)."""

    refusals: Refusals

    async def malformed(self, context) -> None:
        await refuse(context, self.refusals, wire.WireError(grpc.StatusCode.INVALID_ARGUMENT,
                                                            "malformed request: not a valid message", "malformed"))


class Gate(Guarded):
    """The prologue cloud and edge share: presence streams and round fetches of authenticated nodes.

    A server provides `_authenticate(context, node, token=None) -> token` (raises WireError; the token from the
    call's metadata unless given), `live`, `board`, `round`, `stop`, `refusals`, `bytes_down` and `members` (the nodes below
    it: at most as many as one fetch may name); `fetching(node)` is its hook on every fetch."""

    async def Presence(self, request, context) -> None:
        try:
            token = self._authenticate(context, request.node_id)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        await hold_presence(context, self.live, request.node_id, token, self.round, self.stop)

    async def FetchRound(self, request, context):
        try:
            nodes = self._fetchers(request, context)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        for node in nodes:
            self.fetching(node)
        round_, chunks, size = await self.board.wait_after(request.after_round, request.after_attempt, nodes)
        for chunk in chunks:
            yield chunk
        self.bytes_down += size * len(nodes)  # what each node received (a host's one fetch serves several)
        await self.board.mark_fetched(round_, nodes)

    def _fetchers(self, request: pb.FetchRequest, context) -> list[str]:
        """The caller and the nodes it fetches for (`also`), each authenticated as its own call would be: a member,
        covered by the call's credentials, with its live session's token; named once each."""
        self._authenticate(context, request.node_id)
        nodes = [request.node_id]
        if len(request.also) >= len(self.members):
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"a fetch for {len(request.also) + 1} nodes: "
                                 f"at most {len(self.members)} are below this server", "malformed")
        for entry in request.also:
            if entry.node_id in nodes:
                raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"a fetch names {short(entry.node_id)} twice",
                                     "malformed")
            self._authenticate(context, entry.node_id, entry.session_token)
            nodes.append(entry.node_id)
        return nodes

    def fetching(self, node: str) -> None:
        """A node asks for its next round (the cloud counts an edge ready)."""


class Liveness:
    """Which nodes below a server hold a live session, which were lost mid-round and since when, and
    which are absent (lost for longer than the grace period: not waited for until they register again).

    A session lives while its node holds a Presence stream: it ends when the last of its streams ends, or when none
    was opened within `presence_s` of its Register (the node never got the reply, so it cannot hold the session).
    `changed` is set on every transition so that a barrier waiting for members re-evaluates at once."""

    def __init__(self, grace_s: float, presence_s: float = math.inf) -> None:
        self.grace_s = grace_s
        self.presence_s = presence_s
        self.sessions = Sessions()
        self.lost: dict[str, float] = {}
        self.absent: set[str] = set()
        self.returned: set[str] = set()
        self.ended: dict[str, float] = {}  # when each node's last session ended (its last moment seen)
        self.rejoins: collections.Counter[str] = collections.Counter()  # sessions after a first one ended
        self.streams: collections.Counter[str] = collections.Counter()  # open Presence streams by session token
        self._unattended: dict[str, asyncio.TimerHandle] = {}  # token -> its presence deadline
        self.changed = asyncio.Event()

    def poke(self) -> None:
        self.changed.set()

    def registered(self, node: str, nonce: bytes = b"") -> str:
        """Issue `node` a session (raises WireError if it holds a live one under another nonce); a Register retried
        with the live session's nonce gets its token again, and changes nothing else."""
        fresh = not self.sessions.has(node)
        token = self.sessions.issue(node, nonce)
        if math.isfinite(self.presence_s) and not self.streams[token]:
            self._watch(node, token)
        if not fresh:
            return token
        if node in self.ended:
            self.rejoins[node] += 1
        if node in self.lost:
            self.returned.add(node)
        self.lost.pop(node, None)
        self.absent.discard(node)
        self.poke()
        return token

    def _watch(self, node: str, token: str) -> None:
        old = self._unattended.pop(token, None)
        if old is not None:
            old.cancel()

        def due() -> None:
            self._unattended.pop(token, None)
            if not self.streams[token]:
                self.lose(node, token, f"no presence stream within {self.presence_s:g}s of its registration")

        self._unattended[token] = asyncio.get_running_loop().call_later(self.presence_s, due)

    def attach(self, token: str) -> None:
        """A Presence stream of the session `token` opened."""
        self.streams[token] += 1
        handle = self._unattended.pop(token, None)
        if handle is not None:
            handle.cancel()

    def detach(self, node: str, token: str, why: str | None) -> bool:
        """A Presence stream of `token` ended; the last one ends the session (unless `why` is None: the run is over)."""
        self.streams[token] -= 1
        if self.streams[token] > 0:
            return False
        del self.streams[token]
        return why is not None and self.lose(node, token, why)

    def lose(self, node: str, token: str | None, why: str) -> bool:
        """End `node`'s session (if `token` is still its own) and start its grace period."""
        if not self.sessions.end(node, token):
            return False
        self.lost[node] = self.ended[node] = time.monotonic()
        log.warning("lost %s: %s; waiting up to %.0fs for it to come back", node, why, self.grace_s)
        self.poke()
        return True

    def expire(self) -> set[str]:
        """Move the nodes lost for longer than the grace period to `absent`; returns them."""
        now = time.monotonic()
        gone = {n for n, t in self.lost.items() if now - t >= self.grace_s}
        for node in gone:
            del self.lost[node]
            self.absent.add(node)
        return gone

    def next_expiry(self) -> float | None:
        return min(self.lost.values()) + self.grace_s if self.lost else None

    async def wait(self, deadline: float) -> None:
        """Sleep until something changes, a lost node's grace ends, or `deadline` (monotonic)."""
        until = min(d for d in (deadline, self.next_expiry()) if d is not None)
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, until - time.monotonic()))
        except asyncio.TimeoutError:
            pass


async def hold_presence(context, liveness: Liveness, node: str, token: str, round_: int, stop: asyncio.Event) -> None:
    """Serve one Presence stream: the node is live while it stays open; its end (the node's process
    died, its link broke, or keepalive pings went unanswered) starts the node's grace period."""
    why = "run over"
    liveness.attach(token)
    try:
        await context.write(pb.PresenceEvent(round=round_))
        await stop.wait()
    except asyncio.CancelledError:
        why = "presence stream closed"
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the stream is the node's loss
        why = f"presence stream failed ({exc.__class__.__name__})"
    finally:
        liveness.detach(node, token, None if stop.is_set() else why)
