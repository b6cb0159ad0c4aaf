"""gRPC plumbing shared by the three roles: servers with health, channels, retries."""
from __future__ import annotations

import asyncio
import inspect
import logging
import pathlib
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .config_error import ConfigError

log = logging.getLogger(__name__)

MAX_CHUNK = 8 << 20  # largest stream chunk (net.chunk_kib <= 8192)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


KEEPALIVE_S = 10.0  # HTTP/2 ping interval on every channel: a silent network is noticed within ~2x this


def message_options(chunk_bytes: int) -> list[tuple[str, int]]:
    """The receiver bounds what it takes; a node sends only messages it built (an edge's ExchangeOne reply is a
    whole envelope, up to net.max_message_mb), so sends are not capped."""
    cap = chunk_bytes + (1 << 20)
    return [
        ("grpc.max_receive_message_length", cap),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ]


def keepalive_options(server: bool, keepalive_s: float = KEEPALIVE_S) -> list[tuple[str, int]]:
    ms = int(keepalive_s * 1000)
    if server:  # accept the clients' pings, however idle the connection
        return [("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.min_recv_ping_interval_without_data_ms", ms // 2),
                ("grpc.http2.max_ping_strikes", 0), ("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms)]
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms), ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)]


class HealthService(health_pb2_grpc.HealthServicer):
    """The standard health service (Check, Watch) of a node's one status, service "". Not grpcio's aio servicer:
    when any watch ends it drops the condition that every other watch waits on, and those never hear the next
    change (a device host watching an edge while another host's watch ends would wait out its whole timeout)."""

    def __init__(self) -> None:
        self.status = NOT_SERVING
        self.changed = asyncio.Condition()
        self.final = False

    async def Check(self, request, context):
        if request.service:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service[:64]!r}")
        return health_pb2.HealthCheckResponse(status=self.status)

    async def Watch(self, request, context):
        last = None
        while True:
            status = self._status(request.service)
            if status != last:  # written outside the lock: a slow reader must not hold up set()
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            async with self.changed:
                if self._status(request.service) == last:
                    await self.changed.wait()

    def _status(self, service: str):
        return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if service else self.status

    async def set(self, status) -> None:
        if self.final:
            return
        async with self.changed:
            self.status = status
            self.changed.notify_all()

    async def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING for good: later set() calls change nothing."""
        await self.set(NOT_SERVING)
        self.final = True


class Server:
    """A grpc.aio server bound to `listen`, serving the standard health service (NOT_SERVING until ready)."""

    def __init__(self, listen: str, chunk_bytes: int, credentials: grpc.ServerCredentials | None = None):
        self.server = grpc.aio.server(options=message_options(chunk_bytes) + keepalive_options(server=True))
        self.health = HealthService()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        try:
            if credentials is None:
                self.port = self.server.add_insecure_port(listen)
            else:
                self.port = self.server.add_secure_port(listen, credentials)
        except RuntimeError:  # grpc's "Failed to bind": say what to do, in one line
            self.port = 0
        if self.port == 0:
            raise ConfigError(f"cannot listen on {listen}: the port is in use (another run?) or the address is not "
                              f"this machine's; give another --listen, or port 0 for a free one")
        host = listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"

    async def start(self, port_file: str | None = None) -> None:
        await self.server.start()
        if port_file:
            path = pathlib.Path(port_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{self.port}\n")
            tmp.rename(path)  # atomic: readers never see a half-written port

    async def ready(self) -> None:
        await self.health.set(SERVING)

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


class _Capture:
    """Stands in for a grpc server while a generated add_*Servicer_to_server registers its handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict] = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.handlers[service] = handlers


_MALFORMED = object()


def raw_bytes(method):
    """Marks a unary servicer method that takes its request as the bytes received and returns its reply as the bytes
    to send (add_servicer registers it without a deserializer or serializer): grpc.aio holds a unary request for the
    whole call, and a parsed message beside its bytes would be a second copy held while the call waits (an edge's
    ExchangeOne waits at its barrier); a reply many calls share is serialised once. The method parses the request
    and refuses what does not parse."""
    method.raw_bytes = True
    return method


def add_servicer(add_fn, servicer, server: grpc.aio.Server, on_malformed) -> None:
    """Register a servicer like the generated `add_fn` does, but a unary request that does not parse reaches
    `on_malformed(context)` (which refuses it: INVALID_ARGUMENT, counted) instead of failing inside gRPC
    as UNKNOWN. Streamed requests are guarded where they are read (wire.read_envelope)."""
    capture = _Capture()
    add_fn(servicer, capture)
    for service, handlers in capture.handlers.items():
        guarded = {}
        for name, h in handlers.items():
            if h.request_streaming:
                raw = getattr(h.stream_stream, "raw_bytes", False)  # frames as received (EdgeService.Session)
                guarded[name] = h._replace(request_deserializer=None, response_serializer=None) if raw else h
                continue
            if getattr(h.unary_unary, "raw_bytes", False):
                guarded[name] = h._replace(request_deserializer=None, response_serializer=None)
                continue

            def safe(data, parse=h.request_deserializer):
                try:
                    return parse(data)
                except Exception:  # noqa: BLE001 - any undecodable request is the peer's fault
                    return _MALFORMED

            if h.unary_unary is not None:
                async def unary(request, context, fn=h.unary_unary):
                    if request is _MALFORMED:
                        await on_malformed(context)
                    return await fn(request, context)

                guarded[name] = h._replace(request_deserializer=safe, unary_unary=unary)
            elif inspect.isasyncgenfunction(h.unary_stream):
                async def stream(request, context, fn=h.unary_stream):
                    if request is _MALFORMED:
                        await on_malformed(context)
                    async for item in fn(request, context):
                        yield item

                guarded[name] = h._replace(request_deserializer=safe, unary_stream=stream)
            else:
                async def writer(request, context, fn=h.unary_stream):
                    if request is _MALFORMED:
                        await on_malformed(context)
                    return await fn(request, context)

                guarded[name] = h._replace(request_deserializer=safe, unary_stream=writer)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))
        server.add_registered_method_handlers(service, guarded)


def channel(address: str, chunk_bytes: int, credentials: grpc.ChannelCredentials | None = None,
            override_host: str | None = None) -> grpc.aio.Channel:
    options = message_options(chunk_bytes) + keepalive_options(server=False) + [("grpc.use_local_subchannel_pool", 1)]
    if override_host:
        options.append(("grpc.ssl_target_name_override", override_host))
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, credentials, options=options)


async def wait_serving(chan: grpc.aio.Channel, timeout: float, what: str) -> None:
    """Wait until the upstream's health service reports SERVING. Its Watch stream says so as it changes: a poll
    would add up to its interval at each hop of the start-up (the cloud's edges, then the edges' device hosts)."""
    stub = health_pb2_grpc.HealthStub(chan)
    deadline = time.monotonic() + timeout
    last = "no answer"
    hinted = announced = False
    while (left := deadline - time.monotonic()) > 0:
        call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=left)
        try:
            async for reply in call:
                if reply.status == SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                if not announced:
                    announced = True
                    log.info("%s answers but is not serving yet (%s): retrying for up to %.0fs", what, last, timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                break
            last = f"{exc.code().name}: {exc.details()}"
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise
            details = (exc.details() or "").lower()
            if not announced:
                announced = True
                log.info("%s not there yet (%s): retrying for up to %.0fs", what, exc.code().name, timeout)
            if not hinted and any(k in details for k in ("handshake", "ssl", "socket closed", "tls")):
                hinted = True
                log.warning("%s answers but the connection closes (%s): if it speaks TLS, check that this node uses "
                            "certificates from the same CA (or that both sides use plaintext); retrying", what,
                            exc.details())
        finally:
            call.cancel()
        await asyncio.sleep(0.2)  # not listening yet, or its watch ended (it is shutting down)
    raise TimeoutError(f"{what} not SERVING after {timeout:.0f}s ({last})")


def check_health_sync(address: str, timeout: float = 3.0, credentials: grpc.ChannelCredentials | None = None,
                      override_host: str | None = None) -> str:
    """Blocking probe used by container health checks: returns the status name."""
    options = [("grpc.ssl_target_name_override", override_host)] if override_host else []
    chan = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials, options)
    with chan:
        reply = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
