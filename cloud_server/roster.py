"""The cloud's view of its edges: who registered, who is live, who fetched, who a round or a shared slot still waits
for. The service feeds it from its RPCs; the round driver waits on it."""
from __future__ import annotations

import asyncio
import logging
import time

from hfl.common.service_base import Liveness

log = logging.getLogger("hfl.cloud")


class EdgeRoster:
    def __init__(self, edges: list[str], grace_s: float, presence_s: float):
        self.edges = edges
        self.live = Liveness(grace_s, presence_s)
        self.ready: set[str] = set()
        self.joined = asyncio.Event()
        self.started = False
        self.claims: dict[str, str] = {}  # an edge site's own trust claim (it can only lower the policy)
        self.slot_dropped: set[str] = set()  # edges a shared slot went on without, since the round began

    def mark_ready(self, node: str) -> None:
        self.ready.add(node)
        if set(self.edges) <= self.ready:
            self.joined.set()
        self.live.poke()

    def expected(self) -> list[str]:
        """The edges still worth waiting for in a shared slot: live or within their grace, not given up."""
        live = self.live
        return [e for e in self.edges if e not in live.absent and (live.sessions.has(e) or e in live.lost)]

    def drop(self, edges) -> None:
        """Silent in a slot: not waited for again this round, expected again from the next (issue 24, finding 5)."""
        self.live.absent |= set(edges)
        self.slot_dropped |= set(edges)
        self.live.poke()

    def new_round(self) -> None:
        """Edges a slot went on without are expected again once they are back."""
        self.live.absent -= {e for e in self.slot_dropped if self.live.sessions.has(e)}
        self.slot_dropped.clear()

    def any_live(self) -> bool:
        return any(self.live.sessions.has(e) for e in self.edges)

    async def start(self, resume: bool, timeout: float) -> None:
        """The run starts: a resumed cloud at once (edges come back with rejoin and get their grace), a fresh one once
        every edge fetched its first round or `timeout` passed."""
        if resume:
            self.started = True
            return
        await self.await_edges(timeout)
        if not self.ready:
            raise RuntimeError(f"no edge joined within net.join_timeout_s = {timeout}s (edges that registered and went "
                               "away are named in the log above)")
        self.started = True
        missing = set(self.edges) - self.ready
        self.live.absent |= missing
        if missing:
            log.warning("starting without edges %s (they may still rejoin)", sorted(missing))

    async def await_edges(self, timeout: float, every_s: float = 30.0) -> None:
        """Wait for every edge to fetch its first round, saying every `every_s` which are missing; an edge that
        registered and then went away (its process exited) is not waited for past its grace period."""
        log.info("waiting for %d edges (net.join_timeout_s = %.0f)", len(self.edges), timeout)
        start = time.monotonic()
        deadline, note = start + timeout, start + every_s
        while not self.joined.is_set():
            for node in sorted(self.live.expire()):
                log.warning("%s registered, then went away for %.0fs before the run started; not waiting for it",
                            node, self.live.grace_s)
            missing = set(self.edges) - self.ready - self.live.absent
            now = time.monotonic()
            if not missing or now >= deadline:
                return
            if now >= note:
                log.info("waiting for edges %s (%d of %d ready, %.0fs left of net.join_timeout_s)", sorted(missing),
                         len(self.ready), len(self.edges), deadline - now)
                note += every_s
            await self.live.wait(min(deadline, note))

    async def await_results(self, r: int, timeout: float, results: dict, persisting: set) -> None:
        """Wait for every expected edge's result (in `results` and not still `persisting`); a lost edge gets its
        grace period, a silent one `timeout`."""
        live = self.live
        expected = set(self.edges) - live.absent
        for node in expected:
            if not live.sessions.has(node) and node not in live.lost:
                live.lost[node] = time.monotonic()  # not connected now (a resumed cloud): same grace as a loss
        deadline = time.monotonic() + timeout
        while True:
            for node in sorted(live.expire() & expected - set(results)):
                log.warning("round %d: %s lost for %.0fs; going on without it", r, node, live.grace_s)
            pending = expected - live.absent - (set(results) - persisting)
            if not pending:
                return
            if time.monotonic() >= deadline:
                log.warning("round %d: no result from %s; going on without them", r, sorted(pending))
                live.absent |= pending
                return
            await live.wait(deadline)

    def to_tell(self, resume: bool) -> tuple[set[str], set[str]]:
        """Who must collect the final task: the live edges, and those on their way back."""
        live = {e for e in self.edges if self.live.sessions.has(e)}
        # an edge lost within its grace (reconnecting after a restart of this cloud) is told too, or it would go on
        # dialling a cloud that is gone
        returning = {e for e in self.live.lost if e in self.edges} - live
        if resume:  # a resumed cloud whose run ends at once: edges not connected yet are on their way back
            returning |= set(self.edges) - live - self.live.absent
        return live, returning
