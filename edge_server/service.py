"""Edge server: serves its cluster's devices, runs the intra-cluster phases, reports to the cloud.

Liveness: every device holds a Presence stream; a device lost mid-round has `net.rejoin_grace_s` to
come back. If every lost member comes back in time, the edge restarts its cluster's round (a new
attempt): training is a pure function of (global model, seed, device, round, step), so the restarted
round gives exactly what an uninterrupted one would have. A member lost between rounds and still within
its grace is waited for in the next attempt like one lost during it; back, it takes that attempt as it
stands (it sent nothing in it), without a restart. Members that do not come back sit out the rest of the
round and may rejoin at a later round.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import grpc
import numpy as np

from hfl.common import config as config_mod
from hfl.common import modes, plans, rpc, session, topology, validate, wire
from hfl.common.channel.round_clock import EdgeClock
from hfl.common.observe import live, members as member_states
from hfl.common.pipeline import Link
from hfl.common.privacy import instructions, on_wire
from hfl.common.secret_random import dp_numpy_rng
from hfl.common.service_base import Gate, Liveness, Refusals, RoundBoard, refuse
from hfl.common.upstream import Upstream
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .modes import EdgePorts
from .round_state import Barrier, ClusterRound, Contribution, Tally, attempt_members

log = logging.getLogger("hfl.edge")

NOT_REGISTERED = "not_registered"
RESTART, COMPLETE = "restart", "complete"


class EdgeServer(Gate, pbg.EdgeServiceServicer):
    rejoin_first = False  # started for a resumed run (hfl edge --rejoin): register with rejoin, not refused first

    def __init__(self, node_id: str, cloud_address: str, server: rpc.Server, cloud_credentials=None,
                 cloud_override_host: str | None = None, admit=None, wait_s: float = 300.0, trust: str = ""):
        self.id = node_id
        self.site_trust = trust  # "untrusted" lowers the cloud's policy for this site; it can never raise it
        self.index = topology.edge_index(node_id)
        self.cloud_address = cloud_address
        self.server = server
        self.cloud_credentials = cloud_credentials
        self.cloud_override_host = cloud_override_host
        self.admit = admit  # admit(context, claimed_id, allowed_ids) raises WireError (mutual TLS)
        self.wait_s = wait_s
        self.cfg = None
        self.spec_json = ""
        self.run_id = ""
        self.dim = 0
        self.members: list[str] = []
        self.samples: dict[str, int] = {}
        self.live = Liveness(0.0)
        self.refusals = Refusals()
        self.book = member_states.MemberBook([])  # per-member figures reported upward (the live page)
        self.board = RoundBoard()
        self.round = -1
        self.attempt = 0
        self.started = False
        self.plan: list[pb.Phase] = []
        self.mode = None  # the round mode (edge_server/modes.py), chosen once the cloud's spec is known
        self.ctx: ClusterRound | None = None  # the cluster round in progress
        self.barriers: dict[int, Barrier] = {}
        self.active_step: int | None = None
        self.round_members: set[str] = set()
        self.late: set[str] = set()  # members of the attempt lost before it began, not back yet
        self.out: set[str] = set()
        self.bytes_up = 0
        self.bytes_down = 0
        self.restarts = 0
        self.rejoined = 0
        self.joined = asyncio.Event()
        self.stop = asyncio.Event()
        self.on_submit = lambda round_, scalars: None  # /metrics' per-round callback (common/observe/live.py)

    # ---- device-facing RPCs -------------------------------------------------------------------
    def _check_ready(self) -> None:
        if self.cfg is None:
            raise wire.WireError(grpc.StatusCode.UNAVAILABLE, f"{self.id} has not joined the cloud yet", "not_ready")

    def _check_member(self, node: str) -> None:
        self._check_ready()
        validate.check_id(node, "node_id")
        if node not in self.samples:
            raise wire.WireError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{validate.short(node)} is not a device of {self.id} "
                                 f"(members {self.members[0]}..{self.members[-1]})", "unknown_device")

    def _check_peer(self, context, node: str) -> None:
        """With mutual TLS: the certificate's id must be `node` (or, for discovery, any member)."""
        if self.admit is not None:
            self.admit(context, node, self.members)

    def _authenticate(self, context, node: str) -> str:
        self._check_member(node)
        self._check_peer(context, node)
        return self.live.sessions.check(context, node)

    async def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterReply:
        node = request.node_id
        try:
            self._check_member(node) if node else self._check_ready()
            self._check_peer(context, node)
            validate.check_id(request.run_id, "run_id", validate.MAX_RUN_ID)
            if request.run_id and request.run_id != self.run_id:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"run {validate.short(request.run_id)} is not the run {self.id} serves ({self.run_id})",
                                     "wrong_run")
            if node:
                self._check_registration(request)
            session.check_join(context, node)  # last: a malformed request is refused for what is wrong with it
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        token = ""
        if node:
            if not self.live.sessions.has(node) and (node in self.live.lost or node in self.live.absent):
                self.rejoined += 1
                log.info("%s rejoined (round %d)", node, self.round)
            token = self.live.registered(node, request.nonce)
            if not self.started and all(self.live.sessions.has(m) for m in self.members):
                self.joined.set()
        round_ = self.round if self.round >= 0 else (0 if self.started else -1)
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec_json, cluster_id=self.id, members=self.members,
                                session_token=token, round=round_)

    def _check_registration(self, request: pb.RegisterRequest) -> None:
        node = request.node_id
        session.check_nonce(request.nonce)
        self.live.sessions.admit(node, request.nonce)
        if self.started and not request.rejoin:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"the run has started: {node} can only come back with rejoin", "started")
        limit = self.cfg.net.max_samples_per_device
        if not 1 <= request.num_samples <= limit:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"num_samples = {request.num_samples} outside [1, {limit}]", "bad_register")
        if request.num_samples != self.samples[node]:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{node} claims {request.num_samples} samples; the run's partition gives it "
                                 f"{self.samples[node]}", "bad_register")

    def _validate(self, envelope: pb.Envelope) -> tuple[Barrier, Contribution]:
        """Checks that depend on the round in progress; raises WireError."""
        meta = envelope.meta
        node = meta.sender_id
        if meta.run_id != self.run_id:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for run {validate.short(meta.run_id)}, not {self.run_id!r}", "wrong_run")
        if meta.round != self.round or meta.attempt != self.attempt:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for round {meta.round} attempt {meta.attempt}, but {self.id} is in round "
                                 f"{self.round} attempt {self.attempt}", "wrong_round")
        if node not in self.round_members or node in self.out:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{node} is not taking part in round {self.round} attempt {self.attempt} "
                                 "(it joins at the next round)", "not_in_round")
        if self.active_step is None or meta.step != self.active_step or meta.phase != self.plan[meta.step].kind:
            expected = "none" if self.active_step is None else f"{self.active_step} ({self.plan[self.active_step].kind})"
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for phase {meta.step} ({validate.short(meta.phase)}), expected phase {expected}",
                                 "wrong_phase")
        barrier = self.barriers[meta.step]
        if node in barrier.contributions:
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"{node} already contributed to round {meta.round} phase {meta.step}", "replay")
        if self.cfg.privacy.trace_uploads:
            log.info("upload keys %s", json.dumps({
                "sender": node, "round": meta.round, "step": meta.step, "scalars": sorted(envelope.scalars),
                "transforms": [[t.stage, t.name, sorted(t.params)] for t in meta.transforms]}))
        return barrier, self.mode.validate(self.ctx, envelope, barrier)

    async def Exchange(self, request_iterator, context):
        chunks, size = await self._exchange(lambda: wire.read_envelope(request_iterator, self.max_bytes), context)
        for chunk in chunks:
            yield chunk
        self.bytes_down += size

    @rpc.raw_bytes
    async def ExchangeOne(self, request: bytes, context) -> bytes:
        async def read():
            return wire.read_raw_chunk(request, self.max_bytes)

        chunks, size = await self._exchange(read, context, request)
        self.bytes_down += size
        return wire.whole_bytes(chunks)

    async def _exchange(self, read, context, received: bytes = b"") -> tuple[list[pb.Chunk], int]:
        """One upload (`read()` awaits its envelope and size) and, once its barrier is released, the reply's chunks.
        `received`: a unary call's request bytes, which gRPC holds until the call returns: the upload's values are
        read in place from them rather than kept in a copy (wire.view_in)."""
        # A refused message changes nothing, not even for the member it claims to come from: it may still
        # send a valid upload. (A device whose own upload is refused sits the round out; the barrier stops
        # waiting for it after net.phase_timeout_s.)
        node = None
        try:
            self._check_ready()
            envelope, size = await read()
            validate.check_meta(envelope.meta, self.cfg.run.rounds, len(self.plan) or 1)
            self._authenticate(context, envelope.meta.sender_id)
            node = envelope.meta.sender_id
            if envelope.meta.withdraw:
                self._withdraw(envelope.meta)
                return [pb.Chunk(data=b"")], 0
            barrier, contribution = self._validate(envelope)
        except wire.WireError as exc:
            if node is not None:  # an authenticated member's own message: counted against it on the live page
                self.book.refusal(node)
            await refuse(context, self.refusals, exc)
        del envelope  # decoded into the contribution: not held while the rest of the cluster uploads
        contribution.vec = wire.view_in(contribution.vec, received)
        self.bytes_up += size
        self.book.uploaded(node)
        barrier.contributions[node] = contribution
        self.clock.uploaded(barrier.step, node, size)
        self.live.poke()
        await barrier.released.wait()
        if barrier.aborted:
            await context.abort(grpc.StatusCode.ABORTED,
                                f"{self.id} restarted round {self.round} for its cluster: fetch the new attempt")
        if barrier.failed:
            await context.abort(grpc.StatusCode.ABORTED, barrier.failed)
        return barrier.replies.get(node, (barrier.reply, barrier.reply_size))

    def _withdraw(self, meta: pb.Meta) -> None:
        """A member whose own upload was refused says it sits out the rest of the round: stop waiting for it."""
        if meta.run_id != self.run_id or meta.round != self.round or meta.attempt != self.attempt:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, "withdraw from a round that is not in progress",
                                 "wrong_round")
        node = meta.sender_id
        if node in self.round_members and node not in self.out:
            self.out.add(node)
            log.warning("dropping %s from round %d: it withdrew (its upload was refused, or its training diverged)", node, self.round)
            self.live.poke()

    # ---- the edge's link with the cloud -------------------------------------------------------
    async def join_cloud(self) -> pb.RegisterReply:
        probe = rpc.channel(self.cloud_address, 2 << 20, self.cloud_credentials, self.cloud_override_host)
        await rpc.wait_serving(probe, self.wait_s, f"cloud {self.cloud_address}")
        await probe.close()
        self.cloud = Upstream(self.id, self.cloud_address, rpc.MAX_CHUNK, pbg.CloudServiceStub, self.cloud_credentials,
                              self.cloud_override_host)
        try:
            reply = await self.cloud.register("", rejoin=self.rejoin_first, trust=self.site_trust)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            reply = await self.cloud.register("", rejoin=True, trust=self.site_trust)  # restarted while the run goes on
            log.info("%s rejoined its run at round %d (restarted while the run went on)", self.id, reply.round)
        spec = json.loads(reply.spec_json)
        self.cfg = config_mod.from_dict(spec["config"], check_choices=False, remote=True)
        self.spec_json = reply.spec_json
        self.run_id = reply.run_id
        self.dim = int(spec["model_dim"])
        self.members = topology.edge_members(self.cfg, self.index)
        self.book = member_states.MemberBook(self.members)
        counts = spec.get("samples")
        self.samples = {m: int(counts[topology.device_index(m)]) for m in self.members} if counts else {}
        self.live.grace_s = self.cfg.net.rejoin_grace_s
        self.live.presence_s = self.cfg.net.presence_deadline_s
        self.uplink = Link.device_uplink(self.cfg)
        self.backhaul = Link.from_config(self.cfg.pipeline, "backhaul")
        self.downlink = Link.from_config(self.cfg.pipeline, "downlink")
        self.chunk_bytes = self.cfg.net.chunk_kib * 1024
        self.max_bytes = self.cfg.net.max_message_mb << 20
        self.clock = EdgeClock(self.cfg, self.index, self.members, self.samples)
        self.mode = modes.build(self.cfg, "edge", EdgePorts(
            self.cfg, self.id, self.index, self.dim, self.samples, self.members,
            {"uplink": self.uplink, "downlink": self.downlink, "backhaul": self.backhaul}, self.chunk_bytes, self.clock,
            self._air_call))
        log.info("%s joined run %s: %d devices expected, model dim %d", self.id, self.run_id, len(self.members), self.dim)
        await self.server.ready()
        return reply

    async def _cloud_call(self, call, what: str):
        """Run `call()` against the cloud; if the cloud died or restarted, reconnect with backoff, register
        again (rejoin) and retry. Refusals other than a lost session propagate."""
        while True:
            try:
                if self.cloud.token is None:
                    reply = await self.cloud.register(self.run_id, rejoin=True, timeout=10, trust=self.site_trust)
                    if reply.run_id != self.run_id:
                        raise RuntimeError(f"the cloud now serves run {reply.run_id}, not {self.run_id}")
                    log.info("%s registered again with the cloud (round %d)", self.id, reply.round)
                result = await call()
                self.cloud.backoff.reset()
                return result
            except grpc.aio.AioRpcError as exc:
                if not (session.upstream_gone(exc) or session.session_lost(exc)
                        or exc.code() == grpc.StatusCode.ALREADY_EXISTS and self.cloud.token is None):
                    raise
                log.warning("%s: cloud unreachable or restarted during %s (%s); retrying", self.id, what, exc.code().name)
                self.cloud.lost()
                await self.cloud.backoff.sleep(self.wait_s, f"cloud {self.cloud_address}")

    async def _air_call(self, chunks: list, what: str) -> list[pb.Envelope]:
        async def call():
            stream = self.cloud.stub.Air(iter(chunks), metadata=self.cloud.metadata)
            return (await wire.read_envelopes(stream, self.max_bytes, 1 + len(self.members)))[0]

        return await self._cloud_call(call, what)

    async def _fetch(self, after: int) -> pb.Envelope:
        async def call():
            stream = self.cloud.stub.FetchRound(pb.FetchRequest(run_id=self.run_id, node_id=self.id, after_round=after),
                                                metadata=self.cloud.metadata)
            return (await wire.read_envelope(stream, self.max_bytes))[0]

        return await self._cloud_call(call, f"fetch after round {after}")

    # ---- the edge's own loop ------------------------------------------------------------------
    async def run(self) -> int:
        reply = await self.join_cloud()
        wait = self.cfg.net.rejoin_grace_s if reply.round >= 0 else self.cfg.net.join_timeout_s
        try:
            await asyncio.wait_for(self.joined.wait(), wait)
        except asyncio.TimeoutError:
            pass
        self.started = True
        missing = [m for m in self.members if not self.live.sessions.has(m)]
        self.live.absent.update(missing)
        for node in missing:
            log.warning("dropping %s: did not register in time (it may still rejoin)", node)
        log.info("%s: %d of %d devices joined", self.id, len(self.members) - len(missing), len(self.members))
        after = -1
        try:
            while True:
                envelope = await self._fetch(after)
                task = envelope.task
                if task.finished:
                    await self.board.publish(task.round, envelope, self.chunk_bytes)
                    live = {m for m in self.members if self.live.sessions.has(m)}
                    missing = await self.board.wait_fetched(task.round, live, self.cfg.net.grace_s + 10)
                    if missing:
                        log.warning("devices that did not collect the final task: %s", sorted(missing))
                    break
                await self._round(task, envelope)
                after = task.round
        finally:
            self.stop.set()
            await self.cloud.close()
        log.info("%s done; refusals: %s", self.id, dict(self.refusals.total))
        return 0

    async def _round(self, task: pb.RoundTask, envelope: pb.Envelope) -> None:
        plan = task.clusters[self.id] if self.id in task.clusters else pb.ClusterPlan()
        noise = instructions.read_cluster(plan)  # refuses a plan it cannot execute as stated, before anything runs
        global_w, _ = self.downlink.receive(wire.single_tensor(envelope, "model"), self.dim, self.cfg.run.seed, self.index,
                                            task.round, -1)
        self.round = task.round
        self.attempt = 0
        self.cluster_plan = plan
        cplan = dict(plan.params)
        participants = set(plan.participants) if plan.participants or plan.only_listed else set(self.members)
        rate = cplan.get("client_rate", 1.0)
        if rate < 1.0:  # DP-FedAvg: the trusted aggregator draws its clients (Poisson, rate q_c) itself
            draw = dp_numpy_rng(self.cfg.privacy.noise_source, self.cfg.run.seed, "edge", self.index, task.round,
                                "clients").random(len(self.members))
            participants = {m for m, u in zip(self.members, draw) if u < rate}
        self.ctx = ClusterRound(self.run_id, task.round, cplan, participants, noise)
        while True:
            result = await self._attempt(task, global_w)
            if result is not None:
                break
            self.attempt += 1
            self.ctx.attempt = self.attempt
            self.restarts += 1
        self.active_step = None
        cluster_w, members_used, step = result
        await self._submit(task, step, cluster_w - global_w, members_used)

    async def _attempt(self, task: pb.RoundTask, global_w: np.ndarray):
        """One attempt at the cluster's part of the round; None when a lost member came back (restart)."""
        seed = self.cfg.run.seed
        self.plan = list(task.phases)
        self.round_members, self.late = attempt_members(self.members, self.ctx.participants, self.live,
                                                        self.mode.may_restart)
        self.out = set()
        self.live.returned.clear()
        self.book.start_round()
        ctx = self.ctx
        ctx.plan, ctx.tally = self.plan, Tally()
        comm_steps = [i for i, p in enumerate(self.plan) if p.kind in plans.DEVICE_UPLOAD_PHASES]
        self.barriers = {i: Barrier(i, self.plan[i].kind) for i in comm_steps}
        self.mode.start_attempt(ctx, self.barriers)
        self.active_step = comm_steps[0] if comm_steps else None
        device_task = pb.RoundTask(round=task.round, phases=task.phases, attempt=self.attempt)
        everyone = ctx.participants == set(self.members)
        if ctx.cplan or self.cluster_plan.noise or not everyone or self.cluster_plan.devices:
            listed = pb.ClusterPlan(params=ctx.cplan, participants=[] if everyone else sorted(ctx.participants),
                                    only_listed=not ctx.participants, noise=self.cluster_plan.noise)
            for node, device_plan in self.cluster_plan.devices.items():
                listed.devices[node].CopyFrom(device_plan)
            device_task.clusters[self.id].CopyFrom(listed)
        down = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=task.round, sender_id=self.id, attempt=self.attempt),
                           tensors=[self.downlink.send(global_w, "model", seed, self.index, task.round, -1)[0]],
                           task=device_task)
        await self.board.publish(task.round, down, self.chunk_bytes, self.attempt,
                                 idle=() if everyone else set(self.members) - ctx.participants)
        self.clock.start(task.round, self.plan, self.round_members, self.board.size)
        if self.attempt:
            log.info("%s: round %d attempt %d with %d devices", self.id, task.round, self.attempt, len(self.round_members))
        cluster_w = global_w.copy()
        members_used = set(self.round_members)
        for step, phase in enumerate(self.plan):
            if phase.kind in plans.DEVICE_UPLOAD_PHASES:
                barrier = self.barriers[step]
                if await self._await_barrier(barrier, step) == RESTART:
                    for b in self.barriers.values():
                        if not b.released.is_set():
                            b.aborted = True
                            b.released.set()
                    log.warning("%s: lost devices %s came back: restarting round %d", self.id,
                                sorted(self.live.returned & self.round_members), task.round)
                    return None
                later = [s for s in self.barriers if s > step]
                self.active_step = later[0] if later else None  # before any await: devices may upload the next phase
                cluster_w = await self.mode.settle(ctx, barrier, phase, step, cluster_w)
                if barrier.failed:  # the phase gave its members nothing: they sit out the rest of the round
                    self.out |= set(barrier.contributions)
                members_used = set(barrier.contributions)
            elif phase.kind == plans.CLOUD_SYNC:
                return cluster_w, members_used, step
        raise ValueError("a round plan must end with cloud_sync")

    async def _await_barrier(self, barrier: Barrier, step: int) -> str:
        deadline = time.monotonic() + self.cfg.net.phase_timeout_s
        while True:
            for node in sorted(self.live.expire() & self.round_members - self.out):
                self.out.add(node)
                log.warning("dropping %s from round %d: lost for %.0fs", node, self.round, self.live.grace_s)
            back = self.live.returned & self.late  # lost before this attempt began: they join it as it stands
            self.live.returned -= back
            self.late -= back
            lost = set(self.live.lost) & self.round_members - self.out
            returned = self.live.returned & self.round_members
            if returned and not self.mode.may_restart:
                # a cluster that cannot replay its phases alone (shared air slots): a member that comes back takes
                # part from the next round
                self.out |= returned - self.out
                self.live.returned -= returned
                returned = set()
            if returned and not lost:
                return RESTART
            expected = self.round_members if barrier.expected is None else self.round_members & barrier.expected
            pending = expected - self.out - set(barrier.contributions)
            if not pending and not returned:
                return COMPLETE
            if time.monotonic() >= deadline:
                for node in sorted(pending - lost - returned):
                    self.out.add(node)
                    log.warning("dropping %s from round %d: no upload for phase %d within %.0fs", node, self.round,
                                step, self.cfg.net.phase_timeout_s)
                deadline = float("inf")
                continue
            await self.live.wait(deadline)

    async def _submit(self, task: pb.RoundTask, step: int, delta: np.ndarray, members: set[str]) -> None:
        ctx = self.ctx
        tensors, transforms = self.mode.backhaul(ctx, step, delta)
        transforms += [on_wire.to_transform(r) for r in on_wire.merge(ctx.dp_records)]
        meta = pb.Meta(run_id=self.run_id, round=task.round, phase=plans.CLOUD_SYNC, step=step, sender_id=self.id,
                       num_samples=sum(self.samples[n] for n in members), num_devices=len(members), transforms=transforms)
        scalars = {"bytes_up": float(self.bytes_up), "bytes_down": float(self.bytes_down),
                   "refused": float(self.refusals.take() + ctx.outliers), "dropped": float(len(ctx.participants) - len(members)),
                   "restarts": float(self.restarts), "rejoined": float(self.rejoined), "clipped": float(ctx.clipped)}
        tally = ctx.tally
        if tally.losses:
            scalars["train_loss"] = float(np.mean(tally.losses))
        if tally.q_uplink:
            scalars["q_uplink"] = float(np.mean(tally.q_uplink))
        if tally.betas:
            scalars["beta_estimate"] = float(max(tally.betas))
        scalars.update(self.mode.report(ctx, members))
        scalars.update(self.clock.report())
        self.on_submit(task.round, scalars)
        self.bytes_up = self.bytes_down = 0
        self.restarts = self.rejoined = 0
        chunks = wire.chunked(pb.Envelope(meta=meta, tensors=tensors, scalars=scalars, relayed=tally.relayed,
                                          members=self.book.report(self.live)), self.chunk_bytes)

        async def call():
            return await self.cloud.stub.Submit(iter(chunks), metadata=self.cloud.metadata)

        try:
            await self._cloud_call(call, f"submit of round {task.round}")
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                log.info("%s: the cloud already has round %d from this edge", self.id, task.round)
            else:
                log.error("cloud refused round %d from %s: %s %s", task.round, self.id, exc.code().name, exc.details())


async def serve(node_id: str, listen: str, cloud_address: str, port_file: str | None = None, server_credentials=None,
                cloud_credentials=None, cloud_override_host: str | None = None, admit=None, wait_s: float = 300.0,
                trust: str = "", rejoin: bool = False, metrics_listen: str = "", web_tls=None) -> int:
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    edge = EdgeServer(node_id, cloud_address, server, cloud_credentials, cloud_override_host, admit, wait_s, trust)
    edge.rejoin_first = rejoin
    rpc.add_servicer(pbg.add_EdgeServiceServicer_to_server, edge, server.server, edge.malformed)
    await server.start(port_file)
    log.info("%s listening on %s", node_id, server.address)
    web = await live.start_edge(edge, metrics_listen, web_tls, port_file)  # Prometheus /metrics
    started = time.monotonic()
    try:
        return await edge.run()
    finally:
        edge.stop.set()
        await web.close()
        await server.stop(edge.cfg.net.grace_s if edge.cfg else 1.0)
        log.info("%s stopped after %.1fs", node_id, time.monotonic() - started)
