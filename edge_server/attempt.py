"""One cluster round at an edge, over its attempts: who takes part, the barriers of its upload phases, the phase
devices may upload to now, the members lost before an attempt began (late), those sitting the round out, and the
decision to restart the round when a lost member comes back.

Training is a pure function of (global model, seed, device, round, step), so a restarted round gives exactly what an
uninterrupted one would have. A member lost between rounds and still within its grace is waited for in the next
attempt like one lost during it; back, it takes that attempt as it stands (it sent nothing in it), without a
restart. A cluster that cannot replay its phases alone (shared air slots) never restarts: a member back takes the
next round.
"""
from __future__ import annotations

import json
import logging
import time

import grpc

from hfl.common import plans, validate, wire
from hfl.common.privacy import on_wire
from hfl.common.secret_random import dp_numpy_rng
from hfl.proto import hfl_v1_pb2 as pb

from .round_state import Barrier, ClusterRound, Tally, attempt_members

log = logging.getLogger("hfl.edge")

RESTART, COMPLETE = "restart", "complete"


def draw_participants(plan: pb.ClusterPlan, members: list[str], cfg, index: int, round_: int) -> set[str]:
    """The members taking part in a round: the plan's list, or every member; under DP-FedAvg the trusted aggregator
    draws its clients itself (Poisson, rate q_c) with its own secret randomness."""
    participants = set(plan.participants) if plan.participants or plan.only_listed else set(members)
    rate = plan.params.get("client_rate", 1.0)
    if rate < 1.0:
        draw = dp_numpy_rng(cfg.privacy.noise_source, cfg.run.seed, "edge", index, round_, "clients").random(len(members))
        participants = {m for m, u in zip(members, draw) if u < rate}
    return participants


class ClusterAttempt:
    def __init__(self, edge_id: str, ctx: ClusterRound, members: list[str], live, may_restart: bool,
                 phase_timeout_s: float, trace_uploads: bool = False):
        self.id = edge_id
        self.ctx = ctx  # what the round mode reads and writes (round_state.ClusterRound)
        self.members = members
        self.live = live
        self.may_restart = may_restart
        self.phase_timeout_s = phase_timeout_s
        self.trace_uploads = trace_uploads
        self.barriers: dict[int, Barrier] = {}
        self.taking: set[str] = set()  # the members this attempt waits for
        self.late: set[str] = set()    # members of the attempt lost before it began, not back yet
        self.out: set[str] = set()     # members sitting the rest of the round out
        self.active_step: int | None = None

    @property
    def round(self) -> int:
        return self.ctx.round

    @property
    def attempt(self) -> int:
        return self.ctx.attempt

    def begin(self, phases) -> list[int]:
        """A new attempt with the round's `phases`; its upload steps."""
        ctx = self.ctx
        ctx.plan, ctx.tally = list(phases), Tally()
        self.taking, self.late = attempt_members(self.members, ctx.participants, self.live, self.may_restart)
        self.out = set()
        self.live.returned.clear()
        steps = [i for i, p in enumerate(ctx.plan) if p.kind in plans.DEVICE_UPLOAD_PHASES]
        self.barriers = {i: Barrier(i, ctx.plan[i].kind) for i in steps}
        self.active_step = steps[0] if steps else None
        return steps

    def device_task(self, task: pb.RoundTask, cluster_plan: pb.ClusterPlan) -> tuple[pb.RoundTask, set[str]]:
        """The attempt's task for the members (the round's phases, the participants, the plan's entries for this
        cluster), and the members it leaves idle."""
        ctx = self.ctx
        device_task = pb.RoundTask(round=task.round, phases=task.phases, attempt=ctx.attempt)
        everyone = ctx.participants == set(self.members)
        if ctx.cplan or cluster_plan.noise or not everyone or cluster_plan.devices:
            listed = pb.ClusterPlan(params=ctx.cplan, participants=[] if everyone else sorted(ctx.participants),
                                    only_listed=not ctx.participants, noise=cluster_plan.noise)
            for node, device_plan in cluster_plan.devices.items():
                listed.devices[node].CopyFrom(device_plan)
            device_task.clusters[self.id].CopyFrom(listed)
        return device_task, set() if everyone else set(self.members) - ctx.participants

    def result_meta(self, step: int, members: set[str], samples: dict[str, int], transforms: list) -> pb.Meta:
        """The meta of the cluster's result: who contributed, and every DP event of every attempt, merged."""
        ctx = self.ctx
        transforms = list(transforms) + [on_wire.to_transform(r) for r in on_wire.merge(ctx.dp_records)]
        return pb.Meta(run_id=ctx.run_id, round=ctx.round, phase=plans.CLOUD_SYNC, step=step, sender_id=self.id,
                       num_samples=sum(samples[n] for n in members), num_devices=len(members), transforms=transforms)

    def restart(self) -> None:
        """Abort the attempt's barriers still waiting (their uploaders fetch the new attempt); the next attempt."""
        for b in self.barriers.values():
            if not b.released.is_set():
                b.aborted = True
                b.released.set()
        log.warning("%s: lost devices %s came back: restarting round %d", self.id,
                    sorted(self.live.returned & self.taking), self.round)
        self.ctx.attempt += 1

    def advance(self, step: int) -> None:
        """Phase `step` settles: devices may upload to the next one at once."""
        later = [s for s in self.barriers if s > step]
        self.active_step = later[0] if later else None

    def settled(self, barrier: Barrier) -> set[str]:
        """The members the phase used; a phase that gave its members nothing has them sit out the rest of the round."""
        if barrier.failed:
            self.out |= set(barrier.contributions)
        return set(barrier.contributions)

    async def run_phases(self, mode, cluster_w):
        """The attempt's phases in order, each upload phase settled by the round mode once its barrier completes:
        (cluster model, the members the last phase used, the cloud_sync step), or None when the round restarts."""
        members_used = set(self.taking)
        for step, phase in enumerate(self.ctx.plan):
            if phase.kind in plans.DEVICE_UPLOAD_PHASES:
                barrier = self.barriers[step]
                if await self.wait(barrier, step) == RESTART:
                    self.restart()
                    return None
                self.advance(step)  # before any await: devices may upload the next phase
                cluster_w = await mode.settle(self.ctx, barrier, phase, step, cluster_w)
                members_used = self.settled(barrier)
            elif phase.kind == plans.CLOUD_SYNC:
                return cluster_w, members_used, step
        raise ValueError("a round plan must end with cloud_sync")

    def check(self, envelope: pb.Envelope) -> Barrier:
        """An upload's checks that depend on the attempt in progress (raises WireError); the barrier it goes to."""
        meta = envelope.meta
        node, plan = meta.sender_id, self.ctx.plan
        if meta.round != self.round or meta.attempt != self.attempt:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for round {meta.round} attempt {meta.attempt}, but {self.id} is in round "
                                 f"{self.round} attempt {self.attempt}", "wrong_round")
        if node not in self.taking or node in self.out:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{node} is not taking part in round {self.round} attempt {self.attempt} "
                                 "(it joins at the next round)", "not_in_round")
        if self.active_step is None or meta.step != self.active_step or meta.phase != plan[meta.step].kind:
            expected = "none" if self.active_step is None else f"{self.active_step} ({plan[self.active_step].kind})"
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for phase {meta.step} ({validate.short(meta.phase)}), expected phase {expected}",
                                 "wrong_phase")
        barrier = self.barriers[meta.step]
        if node in barrier.contributions:
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"{node} already contributed to round {meta.round} phase {meta.step}", "replay")
        if self.trace_uploads:
            log.info("upload keys %s", json.dumps({
                "sender": node, "round": meta.round, "step": meta.step, "scalars": sorted(envelope.scalars),
                "transforms": [[t.stage, t.name, sorted(t.params)] for t in meta.transforms]}))
        return barrier

    def withdraw(self, meta: pb.Meta) -> None:
        """A member whose own upload was refused says it sits out the rest of the round: stop waiting for it."""
        if meta.run_id != self.ctx.run_id or meta.round != self.round or meta.attempt != self.attempt:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, "withdraw from a round that is not in progress",
                                 "wrong_round")
        node = meta.sender_id
        if node in self.taking and node not in self.out:
            self.out.add(node)
            log.warning("dropping %s from round %d: it withdrew (its upload was refused, or its training diverged)",
                        node, self.round)
            self.live.poke()

    async def wait(self, barrier: Barrier, step: int) -> str:
        """Until every member the phase expects uploaded, sat out or was given up (COMPLETE), or a member lost during
        the attempt came back while no other is still lost (RESTART)."""
        live = self.live
        deadline = time.monotonic() + self.phase_timeout_s
        while True:
            for node in sorted(live.expire() & self.taking - self.out):
                self.out.add(node)
                log.warning("dropping %s from round %d: lost for %.0fs", node, self.round, live.grace_s)
            back = live.returned & self.late  # lost before this attempt began: they join it as it stands
            live.returned -= back
            self.late -= back
            lost = set(live.lost) & self.taking - self.out
            returned = live.returned & self.taking
            if returned and not self.may_restart:
                # a cluster that cannot replay its phases alone (shared air slots): a member that comes back takes
                # part from the next round
                self.out |= returned - self.out
                live.returned -= returned
                returned = set()
            if returned and not lost:
                return RESTART
            expected = self.taking if barrier.expected is None else self.taking & barrier.expected
            pending = expected - self.out - set(barrier.contributions)
            if not pending and not returned:
                return COMPLETE
            if time.monotonic() >= deadline:
                for node in sorted(pending - lost - returned):
                    self.out.add(node)
                    log.warning("dropping %s from round %d: no upload for phase %d within %.0fs", node, self.round,
                                step, self.phase_timeout_s)
                deadline = float("inf")
                continue
            await live.wait(deadline)


ClusterAttempt.NONE = ClusterAttempt("", ClusterRound("", -1, {}, set()), [], None, False, 0.0)  # before any round
