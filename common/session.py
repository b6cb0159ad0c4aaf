"""Session tokens and reconnection: a node proves on every call that it is the one that registered.

`Register` hands each node a random secret (from `secrets`); every later call carries it as gRPC
metadata. This holds without TLS: reading a run id and a round from an error message is no longer
enough to upload as somebody else. With mutual TLS the certificate check comes on top.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import pathlib
import random
import secrets
import time

import grpc

from .topology import DEVICE_RE, parse_index
from .validate import short
from .wire import WireError

METADATA_KEY = "hfl-session"
JOIN_KEY = "hfl-join"
JOIN_ENV = "HFL_JOIN_SECRET"  # or HFL_JOIN_SECRET_FILE: a file holding it
HOST_KEY = "hfl-host"
HOST_ENV = "HFL_HOST_TOKEN"   # a device host's credential for its own device ids only (host_token)


def join_secret() -> str:
    """The run's join secret: `hfl run` and the Testbed hand one (random) to every process they start; roles
    started by hand take it from HFL_JOIN_SECRET or the file HFL_JOIN_SECRET_FILE names. Empty: no check."""
    value = os.environ.get(JOIN_ENV, "")
    path = os.environ.get(JOIN_ENV + "_FILE", "")
    if not value and path:
        value = pathlib.Path(path).read_text().strip()
    return value


def join_metadata() -> tuple[tuple[str, str], ...]:
    """A Register's credential: the device host's token (HFL_HOST_TOKEN) when it has one, else the join secret."""
    token = os.environ.get(HOST_ENV, "")
    if token:
        return ((HOST_KEY, token),)
    secret = join_secret()
    return ((JOIN_KEY, secret),) if secret else ()


def _mac(secret: str, first: int, last: int) -> str:
    return hmac.new(secret.encode(), f"hfl-host|{first}|{last}".encode(), hashlib.sha256).hexdigest()


def host_token(secret: str, first: int, last: int) -> str:
    """A device host's credential for the device indices first..last (inclusive): the range and an HMAC of it under
    the join secret. It lets the host register its own devices and no other (the edge recomputes the HMAC)."""
    if not 0 <= first <= last:
        raise ValueError(f"bad device range {first}..{last}")
    return f"{first}-{last}.{_mac(secret, first, last)}"


def token_range(secret: str, token: str) -> tuple[int, int] | None:
    """The device range a host token grants under `secret`, or None if it is not one of its tokens."""
    span, _, mac = token.partition(".")
    first, _, last = span.partition("-")
    if not (first.isdigit() and last.isdigit() and len(mac) == 64) or int(first) > int(last):
        return None
    return (int(first), int(last)) if hmac.compare_digest(mac, _mac(secret, int(first), int(last))) else None


def _metadata_value(context, key: str) -> str:
    for item in context.invocation_metadata() or ():
        if item[0] == key:
            return item[1] if isinstance(item[1], str) else item[1].decode("ascii", "replace")
    return ""


def check_join(context, node: str) -> None:
    """A Register as `node` must carry the run's join secret when the server has one: without it, an outsider could
    claim a device id before its host registers (first Register wins). A device may instead carry its host's token,
    which covers only that host's device ids: one host cannot register another's devices. Discovery (no node id)
    stays open."""
    expected = join_secret()
    if not expected or not node:
        return
    token = _metadata_value(context, HOST_KEY)
    if token:
        span = token_range(expected, token)
        index = _device_index(node)
        if span is None or index is None or not span[0] <= index <= span[1]:
            what = "a host token that is not the run's" if span is None else f"a host token for dev-{span[0]:05d}..dev-{span[1]:05d}"
            raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                            f"register as {short(node)} with {what}: a device host registers its own devices only",
                            "bad_join")
        return
    given = _metadata_value(context, JOIN_KEY)
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                        f"register as {short(node)} {'without the' if not given else 'with a wrong'} join secret "
                        f"(HFL_JOIN_SECRET: hfl run hands it to the processes it starts)", "bad_join")


def _device_index(node: str) -> int | None:
    return parse_index(node, DEVICE_RE)


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, token),)


def token_of(context) -> str:
    for item in context.invocation_metadata() or ():
        key, value = item[0], item[1]
        if key == METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


NONCE_BYTES = 16


def new_nonce() -> bytes:
    """A link's registration nonce: kept for the link's life, so a Register retried after a lost reply is the same."""
    return secrets.token_bytes(NONCE_BYTES)


def check_nonce(nonce: bytes) -> None:
    if nonce and len(nonce) != NONCE_BYTES:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"register nonce of {len(nonce)} bytes: {NONCE_BYTES} or none", "bad_register")


class Sessions:
    """node id -> its live session (token, and the nonce it registered with), held by the server a node registered with."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}
        self._nonces: dict[str, bytes] = {}

    def admit(self, node: str, nonce: bytes = b"") -> None:
        """The registration decision: no live session, or a live one registered with this same (non-empty) nonce (the
        node retries a Register whose reply it lost: `issue` hands it the same token). Any other is a second party
        claiming a live node id: refused until the session ends."""
        if node in self._tokens and not self.replays(node, nonce):
            raise WireError(grpc.StatusCode.ALREADY_EXISTS,
                            f"{node} is registered and live: a second session is refused until the first ends",
                            "already_registered")

    def replays(self, node: str, nonce: bytes) -> bool:
        current = self._nonces.get(node, b"")
        return bool(nonce) and bool(current) and hmac.compare_digest(current, nonce)

    def issue(self, node: str, nonce: bytes = b"") -> str:
        """`node`'s token: a new session's, or the live session's again for the nonce it registered with."""
        self.admit(node, nonce)
        if node not in self._tokens:
            self._tokens[node] = secrets.token_urlsafe(24)
            self._nonces[node] = nonce
        return self._tokens[node]

    def has(self, node: str) -> bool:
        return node in self._tokens

    def end(self, node: str, token: str | None = None) -> bool:
        """End `node`'s session (only if it is still `token`'s, when given); True if one ended."""
        current = self._tokens.get(node)
        if current is None or (token is not None and current != token):
            return False
        del self._tokens[node]
        del self._nonces[node]
        return True

    def check(self, context, node: str, token: str | None = None) -> str:
        """`node`'s live session token, from the call's metadata (or `token`, a host's fetch naming it): refused if
        it is not the node's live session's."""
        token = token_of(context) if token is None else token
        current = self._tokens.get(node)
        if current is None or not token or not hmac.compare_digest(current.encode(), token.encode()):
            why = "no session token" if not token else "a session token that is not its own"
            raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                            f"call as {short(node)} with {why}: register first (or again, if the server restarted)",
                            "bad_session")
        return token

    def __len__(self) -> int:
        return len(self._tokens)


class Backoff:
    """Exponential backoff with full jitter (the AWS architecture blog's scheme), seeded per node."""

    def __init__(self, node: str, base: float = 0.2, cap: float = 5.0):
        self.base, self.cap, self.tries = base, cap, 0
        self._rng = random.Random(node)  # jitter only spreads retries in time; it never touches results
        self._since: float | None = None  # when the retries since the last success began

    async def sleep(self, give_up_after: float | None = None, what: str = "upstream") -> None:
        """Wait before the next retry; TimeoutError once the retries since the last success have gone on for
        `give_up_after` seconds (an upstream that ended, or died for good: the node stops instead of retrying
        forever)."""
        now = time.monotonic()
        self._since = self._since if self._since is not None else now
        if give_up_after is not None and now - self._since > give_up_after:
            raise TimeoutError(f"{what} unreachable for {now - self._since:.0f}s: it ended or died; stopping")
        delay = self._rng.uniform(0, min(self.cap, self.base * 2 ** self.tries))
        self.tries += 1
        await asyncio.sleep(delay)

    def reset(self) -> None:
        self.tries = 0
        self._since = None


RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def upstream_gone(exc: BaseException) -> bool:
    """The upstream died or restarted: reconnect (and re-register if the session is unknown)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in RETRYABLE


def session_lost(exc: BaseException) -> bool:
    return (isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.PERMISSION_DENIED
            and "register first" in (exc.details() or ""))
