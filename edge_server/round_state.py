"""What an edge holds for one cluster round: the barriers of its upload phases, the uploads they collected, and
what the round's attempts reported (shared by the edge service and its round mode, edge_server/modes.py)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from hfl.common.privacy.instructions import NoisePlan
from hfl.proto import hfl_v1_pb2 as pb


@dataclass
class Contribution:
    vec: np.ndarray | None
    samples: int
    scalars: dict
    dp: list = field(default_factory=list)  # DP events the device recorded on its upload
    q: float | None = None                  # the quantizer error the device measured on its upload, if any
    raw: bytes | memoryview = b""           # what the edge forwards as received: relay, the device's upload; air, its row


@dataclass
class Barrier:
    """Collects one phase's uploads from every member of the attempt; releases all waiters with one reply."""

    step: int
    kind: str
    contributions: dict[str, Contribution] = field(default_factory=dict)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False
    reply: list[pb.Chunk] = field(default_factory=list)
    reply_size: int = 0
    replies: dict[str, tuple[list[pb.Chunk], int]] = field(default_factory=dict)  # air phases: each device its own
    expected: set[str] | None = None  # the members the mode lets take part (None: every member)
    active: set[str] = field(default_factory=set)  # air phases: the members the channel makes transmit
    failed: str = ""  # why the phase gave nothing back (the members sit the round out)


@dataclass
class Tally:
    """What one attempt's uploads carried, reported to the cloud with the cluster's result."""

    losses: list[float] = field(default_factory=list)
    q_uplink: list[float] = field(default_factory=list)
    betas: list[float] = field(default_factory=list)
    relayed: list[bytes | memoryview] = field(default_factory=list)  # relay: the uploads going up, as received
    dropped: set[str] = field(default_factory=set)  # members the mode made sit out the rest of the round


@dataclass
class ClusterRound:
    """One cluster round over all its attempts."""

    run_id: str
    round: int
    cplan: dict                 # the cloud's plan params for this cluster (e.g. DP-FedAvg's client rate)
    participants: set[str]
    noise: NoisePlan = field(default_factory=NoisePlan)  # the releases the plan instructs (instructions.py)
    release: object = None  # the edge's privacy around the mode's combine (release.EdgeRelease)
    attempt: int = 0
    plan: list = field(default_factory=list)
    dp_records: list = field(default_factory=list)  # every attempt's: an aborted attempt's releases count all the same
    clipped: int = 0
    outliers: int = 0  # uploads left out for a norm far beyond the phase's others
    tally: Tally = field(default_factory=Tally)


@dataclass
class Traffic:
    """What the edge counts between two results to the cloud."""

    up: int = 0
    down: int = 0
    restarts: int = 0
    rejoined: int = 0

    def take(self) -> dict:
        out = {"bytes_up": float(self.up), "bytes_down": float(self.down), "restarts": float(self.restarts),
               "rejoined": float(self.rejoined)}
        self.up = self.down = self.restarts = self.rejoined = 0
        return out


def result_scalars(ctx: ClusterRound, members: set[str], traffic: dict, refused: int) -> dict:
    """The scalars of a cluster's result to the cloud (before the mode's and the clock's)."""
    scalars = {"bytes_up": traffic["bytes_up"], "bytes_down": traffic["bytes_down"],
               "refused": float(refused + ctx.outliers), "dropped": float(len(ctx.participants) - len(members)),
               "restarts": traffic["restarts"], "rejoined": traffic["rejoined"], "clipped": float(ctx.clipped)}
    tally = ctx.tally
    if tally.losses:
        scalars["train_loss"] = float(np.mean(tally.losses))
    if tally.q_uplink:
        scalars["q_uplink"] = float(np.mean(tally.q_uplink))
    if tally.betas:
        scalars["beta_estimate"] = float(max(tally.betas))
    return scalars


def attempt_members(members, participants: set[str], live, may_restart: bool) -> tuple[set[str], set[str]]:
    """Who an attempt waits for, and which of them are late: the participating members with a live session, and
    those lost (before the attempt began) and still within their grace, unless the cluster cannot restart (a member
    back then takes the next round, as one lost during the attempt does)."""
    live_now = {m for m in members if m in participants and live.sessions.has(m)}
    late = {m for m in members if m in participants and m in live.lost} if may_restart else set()
    return live_now | late, late
