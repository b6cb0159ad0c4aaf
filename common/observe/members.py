"""Device hosts as nodes of the live page: what an edge tells the cloud about its members, and the cloud's check.

An edge keeps a MemberBook (whose messages it refused, when each member uploaded in the round) and sends one
MemberState per member with every submit: a state code and four numbers, about 26 bytes a device. The cloud reads
them with `check_members` like any edge-supplied data: at most one entry per member of that edge, known ids only,
finite numbers within bounds; anything else refuses the submit (reason bad_members) and changes nothing. No round
decision reads them: they are for observers (the live page, /metrics).
"""
from __future__ import annotations

import collections
import math
import time

import grpc

from hfl.common import validate, wire
from hfl.proto import hfl_v1_pb2 as pb

# state codes on the wire (MemberState.state); "rejoined" is live again after a loss
STATES = ("waiting", "live", "late", "lost", "rejoined")
CODE = {name: i for i, name in enumerate(STATES)}
MAX_SECONDS = 1e9
MAX_COUNT = 10 ** 9
BAD = "bad_members"


def member_state(live, node: str) -> str:
    """A node's state as a server sees it (service_base.Liveness): late is lost and within its grace period."""
    if live.sessions.has(node):
        return "rejoined" if live.rejoins[node] else "live"
    if node in live.lost:
        return "late"
    if node in live.absent:
        return "lost"
    return "waiting"


def state_counts(states) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    counts.update(collections.Counter(states))
    return counts


class MemberBook:
    """An edge's per-member figures beyond its Liveness: refusals of authenticated members, this round's uploads."""

    def __init__(self, members: list[str]):
        self.members = list(members)
        self.refused: collections.Counter[str] = collections.Counter()
        self.uploads: dict[str, float] = {}
        self.round_started = time.monotonic()

    def start_round(self) -> None:
        """A new round attempt: round times count from now."""
        self.uploads.clear()
        self.round_started = time.monotonic()

    def uploaded(self, node: str) -> None:
        self.uploads[node] = time.monotonic()

    def refusal(self, node: str) -> None:
        self.refused[node] += 1

    def report(self, live) -> list[pb.MemberState]:
        now = time.monotonic()
        out = []
        for node in self.members:
            state = member_state(live, node)
            entry = pb.MemberState(id=node, state=CODE[state], refused=min(self.refused[node], MAX_COUNT),
                                   rejoins=min(live.rejoins[node], MAX_COUNT))
            if live.sessions.has(node):
                entry.last_seen_s = 0.0
            elif node in live.ended:
                entry.last_seen_s = min(now - live.ended[node], MAX_SECONDS)
            if node in self.uploads:
                entry.round_s = min(self.uploads[node] - self.round_started, MAX_SECONDS)
            out.append(entry)
        return out


def _bad(message: str) -> wire.WireError:
    return wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, message, BAD)


def _seconds(entry, name: str) -> float | None:
    if not entry.HasField(name):
        return None
    value = getattr(entry, name)
    if not (math.isfinite(value) and 0.0 <= value <= MAX_SECONDS):
        raise _bad(f"member {validate.short(entry.id)}: {name} = {value!r} outside [0, {MAX_SECONDS:g}]")
    return float(value)


def check_members(entries, members: list[str], sender: str) -> dict[str, dict]:
    """An edge's member report (repeated MemberState) -> {device id: figures}; WireError (bad_members) when it names
    a device not of `sender`'s cluster, names one twice, holds more entries than members, an unknown state code or a
    number out of bounds."""
    out = {}
    for node, entry in validate.per_member(entries, lambda e: e.id, members, sender, "member state", BAD):
        if not 0 <= entry.state < len(STATES):
            raise _bad(f"member {node}: state code {entry.state} (known: 0..{len(STATES) - 1})")
        if entry.refused > MAX_COUNT or entry.rejoins > MAX_COUNT:
            raise _bad(f"member {node}: counts above {MAX_COUNT}")
        out[node] = {"state": STATES[entry.state], "last_seen_s": _seconds(entry, "last_seen_s"),
                     "refused": int(entry.refused), "round_s": _seconds(entry, "round_s"),
                     "rejoins": int(entry.rejoins)}
    return out
