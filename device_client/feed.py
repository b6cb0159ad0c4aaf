"""A device host's one fetch of an edge's round task for all its devices of that edge.

Every device of a host that dials the same edge with the same credentials receives the same task envelope (the edge
serialises it once), so the host long-polls it once (FetchRequest.also names the other devices, each with its own
session token) and hands the envelope to each device, which decodes its model as before. Each device still uploads on
its own connection, and the edge still counts each as having fetched the task. Whenever the shared call cannot serve a
device (the call failed, or the device registered after it was sent), the device fetches alone, so the errors it
acts on (its edge gone, its session lost) are its own."""
from __future__ import annotations

import asyncio
import logging

import grpc

from hfl.common import session, wire
from hfl.proto import hfl_v1_pb2 as pb

log = logging.getLogger("hfl.devices")


async def alone(device, after: tuple[int, int]) -> pb.Envelope:
    """`device`'s own fetch of the first task later than `after` that draws it (or the final one)."""
    call = device.link.stub.FetchRound(pb.FetchRequest(run_id=device.run_id, node_id=device.id, after_round=after[0],
                                                       after_attempt=after[1]), metadata=device.link.metadata)
    return (await wire.read_envelope(call, device.max_bytes))[0]


class Alone:
    """Each device fetches its own task (credentials of its own, or `net.host_fetch = false`)."""

    async def next_after(self, device, after: tuple[int, int]) -> pb.Envelope:
        return await alone(device, after)

    def leave(self, device) -> None:
        pass

    def close(self) -> None:
        pass


class RoundFeed:
    """The host's long poll of one edge for `devices` (the host's devices of that edge). At most one call is in
    flight, naming every device that holds a session; a device asking for a later task than the last one waits for
    it, or sends it. A device is served only under the session the call named it with: one that registered (again)
    after the call was sent fetches alone, so that it never takes a task fetched before its edge restarted."""

    def __init__(self, devices: list, run_id: str, max_bytes: int):
        self.devices = list(devices)
        self.run_id = run_id
        self.max_bytes = max_bytes
        self.envelope: pb.Envelope | None = None  # the last task fetched
        self.key = (-1, 0)  # its (round, attempt)
        self.finished = False
        self.covered: frozenset[tuple[str, str]] = frozenset()  # (device, session token) the call that fetched it named
        self.polling: frozenset[tuple[str, str]] | None = None  # those the call in flight names; None: no call
        self.failed: frozenset[tuple[str, str]] = frozenset()  # those the last call, which failed, named
        self.generation = 0  # calls ended
        self._poll: asyncio.Task | None = None
        self._changed = asyncio.Condition()

    def leave(self, device) -> None:
        """`device` stopped: later calls do not name it (its session may be gone)."""
        self.devices = [d for d in self.devices if d is not device]

    def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()

    async def next_after(self, device, after: tuple[int, int]) -> pb.Envelope:
        """The envelope of the first task later than `after` (or the final one): the host's for `device`, or, where
        that call cannot serve it, the device's own."""
        shared = await self._shared(device, after)
        return shared if shared is not None else await alone(device, after)

    async def _shared(self, device, after: tuple[int, int]) -> pb.Envelope | None:
        me = (device.id, device.link.token)
        async with self._changed:
            while True:
                if self.envelope is not None and (self.key > after or self.finished):
                    return self.envelope if me in self.covered else None
                if self.polling is None:
                    self._send(max(after, self.key))
                if self.polling is None or me not in self.polling:  # a newer session than the call in flight names
                    return None
                generation = self.generation
                await self._changed.wait_for(lambda: self.generation != generation)
                if me in self.failed:
                    return None

    def _send(self, after: tuple[int, int]) -> None:
        named = [(d, d.link.token) for d in self.devices if d.link.token]
        self.polling = frozenset((d.id, token) for d, token in named)
        if named:
            self._poll = asyncio.get_running_loop().create_task(self._fetch(named, after, self.polling))
        else:
            self.polling = None

    async def _fetch(self, named: list, after: tuple[int, int], ids: frozenset) -> None:
        caller, token = named[0]
        request = pb.FetchRequest(run_id=self.run_id, node_id=caller.id, after_round=after[0], after_attempt=after[1],
                                  also=[pb.FetchFor(node_id=d.id, session_token=t) for d, t in named[1:]])
        envelope = None
        try:
            envelope, _ = await wire.read_envelope(caller.link.stub.FetchRound(request, metadata=session.metadata(token)),
                                                   self.max_bytes)
        except (grpc.aio.AioRpcError, wire.WireError) as exc:
            log.debug("%s: the host's fetch for %d devices failed (%s); each fetches alone", caller.edge_id, len(ids),
                      exc)
        async with self._changed:
            if envelope is None:
                self.failed = ids
            else:
                self.envelope, self.covered, self.failed = envelope, ids, frozenset()
                self.key, self.finished = (envelope.task.round, envelope.task.attempt), envelope.task.finished
            self.polling = None
            self.generation += 1
            self._changed.notify_all()


def feeds(devices: list, run_id: str, max_bytes: int, shared: bool) -> dict[str, "RoundFeed | Alone"]:
    """Each edge's feed for a host's `devices`: one RoundFeed an edge where one fetch may speak for several of them
    (`shared`: the same credentials cover them all), each device alone otherwise."""
    by_edge: dict[str, list] = {}
    for device in devices:
        by_edge.setdefault(device.edge_id, []).append(device)
    return {edge: RoundFeed(group, run_id, max_bytes) if shared and len(group) > 1 else Alone()
            for edge, group in by_edge.items()}


async def run_all(devices: list, max_bytes: int, shared: bool) -> list[str]:
    """Run every device to its end (its outcome), each edge's devices on their feed."""
    run_feeds = feeds(devices, devices[0].run_id, max_bytes, shared)

    async def until_done(device) -> str:
        device.feed = run_feeds[device.edge_id]
        try:
            return await device.run()
        finally:
            device.feed.leave(device)

    try:
        return await asyncio.gather(*(until_done(d) for d in devices))
    finally:
        for feed in run_feeds.values():
            feed.close()
