"""A small read-only HTTP/1.1 server on asyncio streams, for the live page and /metrics.

Why not aiohttp or prometheus_client's start_http_server: the services already run on grpc.aio's event loop, and
this server runs on that same loop (no thread, no second event loop, no extra dependency to pin), and it parses
requests strictly: every bad request gets a clear 4xx and reaches no handler. It answers GET only, one request per
connection, and never reads a request body.

    server = WebServer({"/metrics": handler}, "127.0.0.1:8780", ssl_context=None)
    await server.start(); ...; await server.close()

A handler takes the parsed query (dict of str -> str) and returns (status, content type, body bytes).
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import urllib.parse
from typing import Awaitable, Callable

log = logging.getLogger("hfl.observe")

MAX_LINE = 2048        # request line: method, target, version
MAX_TARGET = 1024      # path and query together
MAX_QUERY = 256        # the query string alone (the API takes one short parameter)
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16384
READ_TIMEOUT_S = 10.0

Response = tuple[int, str, bytes]
Handler = Callable[[dict], Response | Awaitable[Response]]

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           413: "Content Too Large", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 505: "HTTP Version Not Supported"}

# The page loads only its own files: no inline script, no other origin, no framing.
SECURITY_HEADERS = ("Content-Security-Policy: default-src 'self'; img-src 'self' data:; style-src 'self'; "
                    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'\r\n"
                    "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\nCache-Control: no-store\r\n")


class BadRequest(Exception):
    def __init__(self, status: int, detail: str, headers: str = ""):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


def split_address(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {listen!r}: HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_request_line(line: bytes) -> tuple[str, dict]:
    """(path, query) of a GET request line; BadRequest (4xx) for anything else."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise BadRequest(414, f"request line longer than {MAX_LINE} bytes")
    try:
        method, target, version = line.decode("ascii").strip().split(" ")
    except (UnicodeDecodeError, ValueError):
        raise BadRequest(400, "malformed request line: METHOD TARGET HTTP/1.x") from None
    if not version.startswith("HTTP/1."):
        raise BadRequest(505, f"{version[:16]!r}: HTTP/1.0 or HTTP/1.1 only")
    if method != "GET":
        raise BadRequest(405, f"method {method[:16]!r}: this server is read-only, GET only", "Allow: GET\r\n")
    if len(target) > MAX_TARGET:
        raise BadRequest(414, f"request target longer than {MAX_TARGET} bytes")
    if not target.startswith("/"):
        raise BadRequest(400, "request target must be a path")
    parts = urllib.parse.urlsplit(target)
    if len(parts.query) > MAX_QUERY:
        raise BadRequest(414, f"query longer than {MAX_QUERY} bytes")
    try:
        query = dict(urllib.parse.parse_qsl(parts.query, strict_parsing=bool(parts.query), max_num_fields=8))
    except ValueError:
        raise BadRequest(400, "malformed query string") from None
    return parts.path, query


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def host_name(header: str) -> str:
    """The name in a Host header, without its port (IPv6 literals keep no brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class WebServer:
    def __init__(self, routes: dict[str, Handler], listen: str, ssl_context: ssl.SSLContext | None = None):
        self.routes = routes
        self.host, self.port = split_address(listen)
        self.ssl = ssl_context
        # bound to loopback: only requests that name a loopback host (a web page whose DNS name was rebound to
        # 127.0.0.1 names its own host, and is refused)
        self.allowed_hosts = LOOPBACK if self.host in LOOPBACK else None
        self.server: asyncio.base_events.Server | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.ssl else "http"

    def url(self, host: str | None = None) -> str:
        shown = host or ("127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host)
        return f"{self.scheme}://{shown}:{self.port}/"

    async def start(self, fallback_to_free_port: bool = False) -> None:
        try:
            self.server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl,
                                                     limit=MAX_HEADER_BYTES)
        except OSError as exc:
            if not fallback_to_free_port or self.port == 0:
                raise
            log.warning("%s:%d is taken (%s): serving on a free port instead", self.host, self.port, exc.strerror)
            self.server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.ssl, limit=MAX_HEADER_BYTES)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            try:
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                status, ctype, body, extra = await asyncio.wait_for(self._handle(reader), READ_TIMEOUT_S)
            except asyncio.TimeoutError:
                status, ctype, body, extra = 408, "text/plain; charset=utf-8", b"request not received in time\n", ""
            head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n{SECURITY_HEADERS}{extra}\r\n")
            writer.write(head.encode("ascii") + body)
            await writer.drain()
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):  # the client went away: nothing to answer
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass

    async def _handle(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes, str]:
        try:
            try:
                line = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                raise BadRequest(414, f"request line longer than {MAX_LINE} bytes") from None
            path, query = parse_request_line(line)
            host = await self._read_headers(reader)
            if self.allowed_hosts is not None and host_name(host) not in self.allowed_hosts:
                raise BadRequest(400, f"Host {host[:60]!r}: this server answers requests for 127.0.0.1 or localhost")
            handler = self.routes.get(path)
            if handler is None:
                raise BadRequest(404, f"no such page: {path[:80]!r}; pages: {', '.join(sorted(self.routes))}")
            result = handler(query)
            if asyncio.iscoroutine(result):
                result = await result
            status, ctype, body = result
            return status, ctype, body, ""
        except BadRequest as exc:
            return exc.status, "text/plain; charset=utf-8", f"{exc.status} {exc.detail}\n".encode(), exc.headers
        except Exception:  # noqa: BLE001 - a handler's bug answers 500, never takes the server down
            log.exception("live page: handler failed")
            return 500, "text/plain; charset=utf-8", b"500 internal error (see the server's log)\n", ""

    @staticmethod
    async def _read_headers(reader: asyncio.StreamReader) -> str:
        """Read and check the headers; returns the Host header ("" when none)."""
        total, host, seen_host = 0, "", False
        for _ in range(MAX_HEADERS + 1):
            try:
                line = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                raise BadRequest(431, "a header line is too long") from None
            total += len(line)
            if total > MAX_HEADER_BYTES:
                raise BadRequest(431, f"headers larger than {MAX_HEADER_BYTES} bytes")
            if line in (b"\r\n", b"\n", b""):
                return host
            name = line.split(b":", 1)[0].strip().lower()
            if name == b"host":
                if seen_host:  # two Host headers: which one a proxy checked is unknowable
                    raise BadRequest(400, "more than one Host header")
                seen_host = True
                host = line.split(b":", 1)[1].strip().decode("latin-1")
            if name in (b"content-length", b"transfer-encoding") and line.split(b":", 1)[-1].strip() not in (b"0", b""):
                raise BadRequest(413, "a GET request carries no body")
        raise BadRequest(431, f"more than {MAX_HEADERS} headers")
