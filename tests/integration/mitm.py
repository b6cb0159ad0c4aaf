"""A compromised node, played on real processes: a proxy in front of an honest node's upstream (a device host's edge,
or an edge's cloud) that passes every call through unchanged, metadata included, so the upstream sees the node's own
session, except the uploads a `tamper` function rewrites. That is what a compromised device or edge can do with its
valid session; the honest traffic it still forwards lets a run end as a clean run of the same seed would.

    proxy = Tamper(tamper)              # tamper(method, envelope) -> Act
    tb = hfl_testbed(..., via={"edge-001": proxy.address})   # Testbed.via: the node dials the proxy
    proxy.upstream = tb.cloud_address   # calls wait for it
    ...
    proxy.sent                          # [(label, status code name, details)] of every hostile message
    proxy.calls                         # Counter of the node's calls by method name ("Session upload": per upload)
    proxy.replies                       # [(method, reply bytes, delivered)] of the node's unary calls (Register, ...)

An Act says what the compromised node sends instead of the one upload: `hostile` envelopes first (each in a call of
its own, its status recorded), then `forward` (the upload, possibly rewritten; None: dropped, the caller gets an
empty reply where one is allowed), after `hold` (a callable that returns once the node may speak again: silence);
`fail`, a status code: the upload is lost on the way (not forwarded) and the node gets that status.
`unary(method, request bytes) -> Unary` does the same for the node's unary calls (Register, Check): `hold` before the
call goes on, `request` (bytes) sent in its place, and `lose_reply`: the upstream handles the call (a Register: it holds
the session) but its reply is lost on the way back and the node gets UNAVAILABLE, as when its deadline ran out first.
"""
from __future__ import annotations

import collections
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable

import grpc

from hfl.common import rpc, session_stream, wire
from hfl.proto import hfl_v1_pb2 as pb

# the nodes' own message limits and keepalive pings (a server that refuses them sends GOAWAY: a lost session)
_SERVER = rpc.message_options(rpc.MAX_CHUNK) + rpc.keepalive_options(server=True)
_CLIENT = rpc.message_options(rpc.MAX_CHUNK) + rpc.keepalive_options(server=False)
# every method the edges and clouds serve, by its request / reply cardinality (_ONE: an upload in one unary call)
_UNARY, _SERVER_STREAM, _CLIENT_STREAM, _BIDI, _ONE, _SESSION = "uu", "us", "su", "ss", "one", "session"
KINDS = {"Register": _UNARY, "Check": _UNARY, "FetchRound": _SERVER_STREAM, "Presence": _SERVER_STREAM,
         "Watch": _SERVER_STREAM, "Submit": _CLIENT_STREAM, "Exchange": _BIDI, "Air": _BIDI, "ExchangeOne": _ONE,
         "Session": _SESSION}
UPLOADS = {"ExchangeOne": "Exchange"}  # what `tamper` is told: ExchangeOne is Exchange for a one-chunk upload


@dataclass
class Act:
    forward: pb.Envelope | None
    hostile: list[tuple[str, pb.Envelope]] = field(default_factory=list)  # (label, envelope)
    hold: Callable[[], None] | None = None
    fail: grpc.StatusCode | None = None


@dataclass
class Unary:
    hold: Callable[[], None] | None = None
    request: bytes | None = None
    lose_reply: bool = False


def passthrough(method: str, envelope: pb.Envelope) -> Act:
    return Act(envelope)


def chunks(envelope: pb.Envelope) -> list[bytes]:
    return [c.SerializeToString() for c in wire.chunked(envelope, 1 << 20)]


def one(envelope: pb.Envelope) -> bytes:
    return pb.Chunk(data=envelope.SerializeToString()).SerializeToString()


class Tamper:
    def __init__(self, tamper: Callable[[str, pb.Envelope], Act] = passthrough,
                 unary: Callable[[str, bytes], Unary] = lambda method, request: Unary()):
        self.tamper = tamper
        self.unary = unary
        self.replies: list[tuple[str, bytes, bool]] = []
        self._upstream: str | None = None
        self._ready = threading.Event()
        self.sent: list[tuple[str, str, str]] = []
        self.calls: collections.Counter = collections.Counter()  # the node's calls, by method name
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=_SERVER)
        self.server.add_generic_rpc_handlers((_Handler(self),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    @property
    def upstream(self) -> str | None:
        return self._upstream

    @upstream.setter
    def upstream(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=_CLIENT)
        self._upstream = address
        self._ready.set()

    def wait_upstream(self) -> grpc.Channel:
        if not self._ready.wait(120):
            raise RuntimeError("the proxy was never given its upstream")
        return self.channel

    def close(self) -> None:
        self.server.stop(0)
        if self._ready.is_set():
            self.channel.close()

    def __enter__(self) -> "Tamper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def sent_labels(self) -> dict[str, str]:
        return {label: code for label, code, _ in self.sent}


def _metadata(context) -> tuple:
    return tuple((k, v) for k, v in context.invocation_metadata() if not k.startswith(":") and k != "user-agent")


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: Tamper):
        self.proxy = proxy

    def service(self, details):
        method = details.method
        name = method.rsplit("/", 1)[-1]
        kind = KINDS.get(name)
        self.proxy.calls[name] += 1
        if kind == _UNARY:
            return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self._unary(method, name, req, ctx))
        if kind == _SERVER_STREAM:
            return grpc.unary_stream_rpc_method_handler(lambda req, ctx: self._server_stream(method, req, ctx))
        if kind == _CLIENT_STREAM or kind == _BIDI:
            handler = grpc.stream_unary_rpc_method_handler if kind == _CLIENT_STREAM else grpc.stream_stream_rpc_method_handler
            return handler(lambda it, ctx: self._upload(method, name, it, ctx, kind))
        if kind == _ONE:
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: self._upload(method, UPLOADS[name], iter([req]), ctx, kind))
        if kind == _SESSION:
            return grpc.stream_stream_rpc_method_handler(lambda it, ctx: self._session(it, ctx))
        return None

    def _session(self, frames, context):
        """A device's Session stream: each framed upload goes through `tamper` as an Exchange and on upstream as an
        ExchangeOne call of its own (the edge's checks are the same), its reply framed back; a refusal ends the
        stream with its status, as the edge's own would."""
        parts = []
        for raw in frames:
            chunk = pb.Chunk.FromString(raw)
            parts.append(chunk.data)
            if not chunk.end:
                continue
            self.proxy.calls["Session upload"] += 1
            one_chunk = pb.Chunk(data=b"".join(parts)).SerializeToString()
            parts = []
            yield self._upload("/hfl.v1.EdgeService/ExchangeOne", "Exchange", iter([one_chunk]), context, _ONE) \
                + session_stream.END

    def _unary(self, method, name, request, context):
        channel = self.proxy.wait_upstream()
        act = self.proxy.unary(name, request)
        if act.hold is not None:
            act.hold()
        try:
            reply = channel.unary_unary(method)(request if act.request is None else act.request,
                                                metadata=_metadata(context))
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
        delivered = not act.lose_reply
        self.proxy.replies.append((name, reply, delivered))
        if not delivered:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the reply was lost on the way (the test's proxy)")
        return reply

    def _server_stream(self, method, request, context):
        call = self.proxy.wait_upstream().unary_stream(method)(request, metadata=_metadata(context))
        if not context.add_callback(call.cancel):  # the node hung up: so does its stand-in upstream (presence ends)
            call.cancel()  # it hung up before the callback could be added: the callback would never run
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED or context.is_active():
                context.abort(exc.code(), exc.details() or "")

    def _upload(self, method, name, request_iterator, context, kind: str):
        channel = self.proxy.wait_upstream()
        metadata = _metadata(context)
        payload = b"".join(pb.Chunk.FromString(c).data for c in request_iterator)
        act = self.proxy.tamper(name, wire.parse_envelope(payload))

        def send(envelope: pb.Envelope, **kw):
            if kind == _BIDI:
                return iter(list(channel.stream_stream(method)(iter(chunks(envelope)), metadata=metadata, **kw)))
            if kind == _ONE:
                return channel.unary_unary(method)(one(envelope), metadata=metadata, **kw)
            return channel.stream_unary(method)(iter(chunks(envelope)), metadata=metadata, **kw)

        for label, envelope in act.hostile:
            try:
                send(envelope, timeout=120)
                self.proxy.sent.append((label, "OK", ""))
            except grpc.RpcError as exc:
                self.proxy.sent.append((label, exc.code().name, exc.details() or ""))
        if act.hold is not None:
            act.hold()
        if act.fail is not None:
            context.abort(act.fail, "the upload was lost on the way (the test's proxy)")
        if act.forward is None:
            return {_BIDI: iter(()), _ONE: pb.Chunk(data=b"").SerializeToString()}.get(
                kind, pb.Ack(accepted=True, detail="dropped on the way").SerializeToString())
        try:
            return send(act.forward)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")


def until(predicate: Callable[[], bool], timeout: float) -> Callable[[], None]:
    """A hold that returns once `predicate()` is true (or after `timeout` seconds)."""
    def hold() -> None:
        deadline = time.monotonic() + timeout
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.1)
    return hold
