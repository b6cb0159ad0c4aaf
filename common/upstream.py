"""The lower tier's end of a session with its upstream (a device with its edge, an edge with the cloud):
register, hold the presence stream, attach the token to every call, and come back after a restart."""
from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from hfl.proto import hfl_v1_pb2 as pb

from . import rpc, session

log = logging.getLogger("hfl.upstream")


class Upstream:
    def __init__(self, node: str, address: str, chunk_bytes: int, stub_cls, credentials=None,
                 override_host: str | None = None):
        self.node = node
        self.address = address
        self.channel = rpc.channel(address, chunk_bytes, credentials, override_host)
        self.stub = stub_cls(self.channel)
        self.token: str | None = None
        self.nonce = session.new_nonce()  # one for the link's life: every Register it sends is the same registration
        self.backoff = session.Backoff(node)
        self._presence: asyncio.Task | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return session.metadata(self.token or "")

    async def register(self, run_id: str, num_samples: int = 0, rejoin: bool = False,
                       timeout: float | None = None, trust: str = "") -> pb.RegisterReply:
        """Register (or, if the upstream still holds the session of a Register whose reply was lost, get its token
        again: the nonce matches) and hold the session's presence stream before returning."""
        reply = await self.stub.Register(pb.RegisterRequest(run_id=run_id, node_id=self.node, num_samples=num_samples,
                                                            rejoin=rejoin, trust=trust, nonce=self.nonce),
                                         wait_for_ready=True, timeout=timeout, metadata=session.join_metadata())
        self.token = reply.session_token
        await self._hold_presence(reply.run_id)
        return reply

    async def _hold_presence(self, run_id: str) -> None:
        self.invalidate()
        opened = asyncio.get_running_loop().create_future()
        self._presence = asyncio.get_running_loop().create_task(self._present(run_id, self.metadata, opened))
        await opened  # the upstream counts the stream before this returns: its presence deadline no longer runs

    async def _present(self, run_id: str, metadata, opened: asyncio.Future) -> None:
        call = self.stub.Presence(pb.PresenceRequest(run_id=run_id, node_id=self.node), metadata=metadata)
        try:
            async for _ in call:
                if not opened.done():
                    opened.set_result(None)
        except grpc.aio.AioRpcError as exc:
            log.debug("%s: presence stream ended: %s", self.node, exc.code().name)
        finally:
            if not opened.done():  # refused or broken at once: the next call finds out and registers again
                opened.set_result(None)
            call.cancel()

    def invalidate(self) -> None:
        """Forget the session (the upstream restarted or refused it): the next call must register again."""
        if self._presence is not None:
            self._presence.cancel()
            self._presence = None

    def lost(self) -> None:
        self.invalidate()
        self.token = None

    async def close(self) -> None:
        self.invalidate()
        with contextlib.suppress(Exception):
            await self.channel.close()
