"""Edge server: serves its cluster's devices, runs the intra-cluster phases, reports to the cloud.

Liveness: every device holds a Presence stream; a device lost mid-round has `net.rejoin_grace_s` to
come back. If every lost member comes back in time, the edge restarts its cluster's round (a new
attempt): training is a pure function of (global model, seed, device, round, step), so the restarted
round gives exactly what an uninterrupted one would have. Members that do not come back sit out the
rest of the round and may rejoin at a later round.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from hfl.common import config as config_mod
from hfl.common import plans, robust, rpc, session, topology, validate, wire
from hfl.common.channel.round_clock import EdgeClock
from hfl.common.pipeline import Link
from hfl.common.privacy import on_wire
from hfl.common.quantization import precision
from hfl.common.secret_random import dp_numpy_rng
from hfl.common.service_base import Guarded, Liveness, Refusals, RoundBoard, hold_presence, refuse
from hfl.common.upstream import Upstream
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

log = logging.getLogger("hfl.edge")

NOT_REGISTERED = "not_registered"
RESTART, COMPLETE = "restart", "complete"


@dataclass
class Contribution:
    vec: np.ndarray
    samples: int
    scalars: dict
    dp: list = field(default_factory=list)  # DP events the device recorded on its upload
    q: float | None = None                  # the quantizer error the device measured on its upload, if any
    raw: bytes = b""                        # relay mode: the device's upload as received, forwarded unchanged


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
    expected: set[str] | None = None  # air phases: the members the channel lets take part (None: every member)
    active: set[str] = field(default_factory=set)  # air phases: the members the channel makes transmit
    failed: str = ""  # air phases: why the medium gave nothing back (the members sit the round out)


class EdgeServer(pbg.EdgeServiceServicer, Guarded):
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
        self.board = RoundBoard()
        self.round = -1
        self.attempt = 0
        self.started = False
        self.plan: list[pb.Phase] = []
        self.barriers: dict[int, Barrier] = {}
        self.active_step: int | None = None
        self.round_members: set[str] = set()
        self.out: set[str] = set()
        self.bytes_up = 0
        self.bytes_down = 0
        self.losses: list[float] = []
        self.restarts = 0
        self.rejoined = 0
        self.clipped = 0
        self.cplan: dict[str, float] = {}
        self.q_uplink: list[float] = []
        self.participants: set[str] = set()
        self.dp_records: list = []
        self.relayed: list[bytes] = []
        self.betas: list[float] = []
        self.cluster_plan = pb.ClusterPlan()
        self.plane = None  # channel.plane.Plane on the wireless medium (paper 003)
        self.air_dropped: set[str] = set()
        self.joined = asyncio.Event()
        self.stop = asyncio.Event()

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
            if node in self.live.lost or node in self.live.absent:
                self.rejoined += 1
                log.info("%s rejoined (round %d)", node, self.round)
            token = self.live.registered(node)
            if not self.started and all(self.live.sessions.has(m) for m in self.members):
                self.joined.set()
        round_ = self.round if self.round >= 0 else (0 if self.started else -1)
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec_json, cluster_id=self.id, members=self.members,
                                session_token=token, round=round_)

    def _check_registration(self, request: pb.RegisterRequest) -> None:
        node = request.node_id
        if self.live.sessions.has(node):
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"{node} is registered and live: a node registers once per run (a second session is "
                                 "refused until the first one ends)", "already_registered")
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

    async def Presence(self, request: pb.PresenceRequest, context) -> None:
        try:
            token = self._authenticate(context, request.node_id)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        await hold_presence(context, self.live, request.node_id, token, self.round, self.stop)

    async def FetchRound(self, request: pb.FetchRequest, context):
        try:
            self._authenticate(context, request.node_id)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        round_, chunks, size = await self.board.wait_after(request.after_round, request.after_attempt)
        for chunk in chunks:
            yield chunk
        self.bytes_down += size
        await self.board.mark_fetched(round_, request.node_id)

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
        if barrier.kind in plans.AIR_PHASES:
            return barrier, self._validate_air(envelope, barrier)
        name = "gradient" if barrier.kind == plans.EDGE_GRADIENT_STEP else "delta"
        dp = on_wire.from_transforms(meta.transforms, allowed={node})
        stream = on_wire.stream_of(self.plan, meta.step)
        on_wire.check_device_records(dp, self.cplan, node, stream, expected=barrier.kind == plans.EDGE_MODEL_SYNC
                                     and bool(self.cplan) and self.cplan.get("trusted", 0.0) != 1.0
                                     and self.cplan.get(f"noise_z_{stream}", 0.0) > 0)
        # charged at receipt: the noisy upload is released to this edge even if a later check or a restart of the
        # barrier discards it
        self.dp_records.extend(dp)
        # the channel's draw is the sender's own (keyed by the device, not by this edge)
        vec, _ = self.uplink.receive(wire.single_tensor(envelope, name), self.dim, self.cfg.run.seed,
                                     topology.device_index(node), self.round, meta.step)
        scalars = validate.check_scalars(envelope.scalars, node)
        if self.relay and node in self.cluster_plan.devices:  # the fusion center's header checks, on receipt (issue 24)
            precision.check_upload_header(precision.resolve(self.cfg), wire.single_tensor(envelope, name),
                                          int(self.cluster_plan.devices[node].params["bits"]), node)
        q = next((t.params["q_measured"] for t in meta.transforms if t.stage == "encode" and "q_measured" in t.params), None)
        raw = envelope.SerializeToString() if self.relay else b""
        return barrier, Contribution(vec, self.samples[node], scalars, dp, q, raw)

    def _validate_air(self, envelope: pb.Envelope, barrier: Barrier) -> Contribution:
        """An air upload: a normalised payload with its (mu, sigma) from a device the channel makes active in the
        slot, nothing but scalars from one that only listens (paper 003, eq. 15; digest 2.3)."""
        from hfl.common.channel import plane as air

        node, meta = envelope.meta.sender_id, envelope.meta
        slot = air.slot_id(meta.round, meta.step)
        if barrier.expected is not None and node not in barrier.expected:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{node} failed the downlink test th0 earlier in round {meta.round}: it sits out the "
                                 "rest of the round", "air_dropped")
        scalars = validate.check_scalars(envelope.scalars, node)
        active = node in barrier.active
        if not envelope.tensors:
            if active:
                raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node} is active in slot {slot} "
                                     "(|f|^2 >= th1): it must transmit its normalised payload", "air_missing_payload")
            return Contribution(None, self.samples[node], scalars)
        if not active:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{node} is not active in slot {slot} "
                                 "(|f|^2 < th1 to its edge): it may only listen", "air_not_active")
        if "air_mu" not in scalars or "air_sigma" not in scalars:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, "an air payload needs its air_mu and air_sigma "
                                 "(payload normalisation, paper 003 eqs. 12-13)", "air_scalars")
        vec = wire.decode_array(wire.single_tensor(envelope, "air"), [self.dim])
        mean, std = float(vec.mean(dtype=np.float64)), float(vec.std(dtype=np.float64))
        if abs(mean) > 1e-3 or abs(std - 1.0) > 1e-3:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"air payload of {node} is not normalised (mean "
                                 f"{mean:.3g}, std {std:.3g}; expected 0 and 1)", "air_not_normalised")
        return Contribution(vec, self.samples[node], scalars)

    async def Exchange(self, request_iterator, context):
        # A refused message changes nothing, not even for the member it claims to come from: it may still
        # send a valid upload. (A device whose own upload is refused sits the round out; the barrier stops
        # waiting for it after net.phase_timeout_s.)
        try:
            self._check_ready()
            envelope, size = await wire.read_envelope(request_iterator, self.max_bytes)
            validate.check_meta(envelope.meta, self.cfg.run.rounds, len(self.plan) or 1)
            self._authenticate(context, envelope.meta.sender_id)
            node = envelope.meta.sender_id
            if envelope.meta.withdraw:
                self._withdraw(envelope.meta)
                yield pb.Chunk(data=b"")
                return
            barrier, contribution = self._validate(envelope)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        self.bytes_up += size
        barrier.contributions[node] = contribution
        self.clock.uploaded(barrier.step, node, size)
        self.live.poke()
        await barrier.released.wait()
        if barrier.aborted:
            await context.abort(grpc.StatusCode.ABORTED,
                                f"{self.id} restarted round {self.round} for its cluster: fetch the new attempt")
        if barrier.failed:
            await context.abort(grpc.StatusCode.ABORTED, barrier.failed)
        chunks, size = barrier.replies.get(node, (barrier.reply, barrier.reply_size))
        for chunk in chunks:
            yield chunk
        self.bytes_down += size

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
        self.cfg = config_mod.from_dict(spec["config"], check_choices=False)
        self.spec_json = reply.spec_json
        self.run_id = reply.run_id
        self.dim = int(spec["model_dim"])
        self.members = topology.edge_members(self.cfg, self.index)
        counts = spec.get("samples")
        self.samples = {m: int(counts[topology.device_index(m)]) for m in self.members} if counts else {}
        self.live.grace_s = self.cfg.net.rejoin_grace_s
        self.uplink = Link.device_uplink(self.cfg)
        self.backhaul = Link.from_config(self.cfg.pipeline, "backhaul")
        self.downlink = Link.from_config(self.cfg.pipeline, "downlink")
        self.chunk_bytes = self.cfg.net.chunk_kib * 1024
        self.max_bytes = self.cfg.net.max_message_mb << 20
        self.edge_weights = plans.weights_rule(self.cfg, "edge")
        self.relay = plans.ALGORITHMS.get(self.cfg.run.algorithm).relay
        self.clock = EdgeClock(self.cfg, self.index, self.members, self.samples)
        if plans.ALGORITHMS.get(self.cfg.run.algorithm).medium:
            from hfl.common.channel.plane import plane_for

            self.plane = plane_for(self.cfg)
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
                await self.cloud.backoff.sleep()

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
        global_w, _ = self.downlink.receive(wire.single_tensor(envelope, "model"), self.dim, self.cfg.run.seed, self.index,
                                            task.round, -1)
        self.round = task.round
        self.attempt = 0
        plan = task.clusters[self.id] if self.id in task.clusters else pb.ClusterPlan()
        self.cluster_plan = plan
        self.cplan = dict(plan.params)
        # DP events of every attempt: an aborted attempt's noisy uploads and aggregates were released all the same
        self.dp_records = []
        self.participants = set(plan.participants) if plan.participants or plan.only_listed else set(self.members)
        rate = self.cplan.get("client_rate", 1.0)
        if rate < 1.0:  # DP-FedAvg: the trusted aggregator draws its clients (Poisson, rate q_c) itself
            draw = dp_numpy_rng(self.cfg.privacy.noise_source, self.cfg.run.seed, "edge", self.index, task.round,
                                "clients").random(len(self.members))
            self.participants = {m for m, u in zip(self.members, draw) if u < rate}
        while True:
            result = await self._attempt(task, global_w)
            if result is not None:
                break
            self.attempt += 1
            self.restarts += 1
        self.active_step = None
        cluster_w, members_used, step = result
        await self._submit(task, step, cluster_w - global_w, members_used)

    async def _attempt(self, task: pb.RoundTask, global_w: np.ndarray):
        """One attempt at the cluster's part of the round; None when a lost member came back (restart)."""
        seed = self.cfg.run.seed
        self.plan = list(task.phases)
        self.round_members = {m for m in self.members if self.live.sessions.has(m) and m in self.participants}
        self.out = set()
        self.live.returned.clear()
        self.losses = []
        self.q_uplink = []
        self.relayed = []
        self.betas: list[float] = []
        self.air_dropped = set()
        comm_steps = [i for i, p in enumerate(self.plan) if p.kind in plans.DEVICE_UPLOAD_PHASES]
        self.barriers = {i: Barrier(i, self.plan[i].kind) for i in comm_steps}
        if self.plane is not None:
            from hfl.common.channel import plane as air

            for i in air.air_steps(self.plan):
                mask = air.listeners(self.plane, self.plan, task.round, i)
                self.barriers[i].expected = {m for m in self.members if mask[topology.device_index(m)]}
                mask = air.activity(self.plane, self.plan, task.round, i)
                self.barriers[i].active = {m for m in self.members if mask[topology.device_index(m)]}
                fails = ~air.passes_th0(self.plane, task.round, i, [topology.device_index(m) for m in self.members])
                self.air_dropped |= {m for m, fail in zip(self.members, fails) if fail}
        self.active_step = comm_steps[0] if comm_steps else None
        device_task = pb.RoundTask(round=task.round, phases=task.phases, attempt=self.attempt)
        everyone = self.participants == set(self.members)
        if self.cplan or not everyone or self.cluster_plan.devices:
            listed = pb.ClusterPlan(params=self.cplan, participants=[] if everyone else sorted(self.participants),
                                    only_listed=not self.participants)
            for node, device_plan in self.cluster_plan.devices.items():
                listed.devices[node].CopyFrom(device_plan)
            device_task.clusters[self.id].CopyFrom(listed)
        down = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=task.round, sender_id=self.id, attempt=self.attempt),
                           tensors=[self.downlink.send(global_w, "model", seed, self.index, task.round, -1)[0]],
                           task=device_task)
        await self.board.publish(task.round, down, self.chunk_bytes, self.attempt)
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
                if phase.kind in plans.AIR_PHASES:
                    await self._air(barrier, phase, step, task.round)
                else:
                    cluster_w = self._aggregate(barrier, cluster_w, phase, step, task.round)
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
            lost = set(self.live.lost) & self.round_members - self.out
            returned = self.live.returned & self.round_members
            if returned and self.plane is not None:
                # on the air a cluster cannot replay its slots alone (they are shared with the other clusters):
                # a member that comes back takes part from the next round
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

    def _aggregate(self, barrier: Barrier, cluster_w: np.ndarray, phase: pb.Phase, step: int, round_: int) -> np.ndarray:
        nodes = sorted(barrier.contributions)  # arrival order must not matter
        reply_vec = None
        if self.relay:  # paper 004 (digest P13): forward every upload unchanged, never re-aggregate here
            contributions = [barrier.contributions[n] for n in nodes]
            self.relayed = [c.raw for c in contributions]
            self.losses.extend(c.scalars["train_loss"] for c in contributions if "train_loss" in c.scalars)
            self.q_uplink.extend(c.q for c in contributions if c.q is not None)
        # under Poisson client sampling an empty draw still releases noise: the accountant's subsampled
        # mechanism is "sum of the drawn / fixed denominator + N", whatever was drawn
        elif nodes or "fixed_denominator" in self.cplan:
            contributions = [barrier.contributions[n] for n in nodes]
            weights = [c.samples if self.edge_weights == "samples" else 1 for c in contributions]
            agg = self._private_aggregate(contributions, weights, nodes, phase, step, round_)
            self.losses.extend(c.scalars["train_loss"] for c in contributions if "train_loss" in c.scalars)
            self.betas.extend(c.scalars["beta_estimate"] for c in contributions if "beta_estimate" in c.scalars)
            if phase.kind == plans.EDGE_GRADIENT_STEP:
                cluster_w = cluster_w - np.float32(phase.params["lr"]) * agg
                reply_vec, name = agg, "gradient"
            else:
                cluster_w = cluster_w + agg
                if plans.downlink_after(self.plan, step):
                    reply_vec, name = cluster_w, "model"
        later = [s for s in self.barriers if s > step]
        self.active_step = later[0] if later else None  # before any await: devices may upload the next phase at once
        reply = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=round_, phase=phase.kind, step=step, sender_id=self.id,
                                         num_devices=len(nodes), attempt=self.attempt))
        if reply_vec is not None:
            reply.tensors.append(self.downlink.send(reply_vec, name, self.cfg.run.seed, self.index, round_, step)[0])
        payload = reply.SerializeToString()
        barrier.reply = list(wire.to_chunks(payload, self.chunk_bytes))
        barrier.reply_size = len(payload)
        self.clock.phase(step, barrier.contributions, barrier.reply_size)
        barrier.released.set()
        return cluster_w

    async def _air(self, barrier: Barrier, phase: pb.Phase, step: int, round_: int) -> None:
        """Hand the cluster's emissions of an air slot to the medium (the cloud's Air service) and give each member
        what it received; an edge whose members all sat out still takes part, so the medium never waits for it."""
        nodes = sorted(barrier.contributions)
        emission = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=round_, phase=phase.kind, step=step,
                                            sender_id=self.id, num_devices=len(nodes)))
        for n in nodes:
            c = barrier.contributions[n]
            emission.scalars[f"listen:{n}"] = c.scalars.get("model_sum", 0.0)
            if "train_loss" in c.scalars:
                self.losses.append(c.scalars["train_loss"])
            if c.vec is not None:
                emission.tensors.append(wire.encode(c.vec, "float32", n))
                emission.scalars[f"mu:{n}"] = c.scalars["air_mu"]
                emission.scalars[f"sigma:{n}"] = c.scalars["air_sigma"]
        chunks = list(wire.chunked(emission, self.chunk_bytes))

        async def call():
            stream = self.cloud.stub.Air(iter(chunks), metadata=self.cloud.metadata)
            return (await wire.read_envelope(stream, self.max_bytes))[0]

        later = [st for st in self.barriers if st > step]
        try:
            reply = await self._cloud_call(call, f"air slot of round {round_} phase {step}")
            rows = {t.name: t for t in reply.tensors}  # each device decodes and checks its own row
            for n in nodes:
                if n not in rows:
                    raise wire.WireError(grpc.StatusCode.INTERNAL, f"the medium sent nothing for {n}", "air_reply")
        except (grpc.aio.AioRpcError, wire.WireError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            barrier.failed = f"the medium gave nothing back for round {round_} phase {step}: {detail}"
            log.error("%s: %s", self.id, barrier.failed)
            self.out |= set(nodes)
            self.active_step = later[0] if later else None
            barrier.released.set()
            return
        for n in nodes:
            tensor = pb.Tensor()
            tensor.CopyFrom(rows[n])
            tensor.name = "air"
            out = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=round_, phase=phase.kind, step=step,
                                           sender_id=self.id, num_devices=len(nodes)),
                              tensors=[tensor], scalars=dict(reply.scalars))
            payload = out.SerializeToString()
            barrier.replies[n] = (list(wire.to_chunks(payload, self.chunk_bytes)), len(payload))
        self.active_step = later[0] if later else None
        self.clock.air_phase(step, barrier.contributions, self.plane, self.dim)
        barrier.released.set()

    def _private_aggregate(self, contributions: list[Contribution], weights: list, nodes: list[str], phase: pb.Phase,
                           step: int, round_: int) -> np.ndarray:
        """Aggregate as the round plan says: a trusted edge enforces the clip bound on each upload and adds one
        noise draw to the aggregate (paper 000: local and global streams; DP-FedAvg: the fixed-denominator sum)."""
        vecs = [c.vec for c in contributions]
        trusted = self.cplan.get("trusted", 0.0) == 1.0 and phase.kind == plans.EDGE_MODEL_SYNC
        for c in contributions:
            if c.q is not None:
                self.q_uplink.append(c.q)
        if trusted:
            for i, vec in enumerate(vecs):
                vecs[i], over = on_wire.enforce_clip(vec, self.cplan)
                self.clipped += over
        if "fixed_denominator" in self.cplan:  # sum_k p_k Delta_k, p_k = d_k / (q_c d) (paper 002, Eq. 4)
            acc = np.zeros(self.dim, np.float64)
            for vec, c in zip(vecs, contributions):
                acc += c.samples * vec.astype(np.float64)
            agg = (acc / self.cplan["fixed_denominator"]).astype(np.float32)
        else:
            agg = robust.aggregate(self.cfg.pipeline.aggregate, self.cfg.pipeline.params, vecs, weights)
        if trusted:
            stream = on_wire.stream_of(self.plan, step)
            # a fresh draw per attempt: two releases sharing one noise draw would cancel it in their difference
            rng = dp_numpy_rng(self.cfg.privacy.noise_source, self.cfg.run.seed, "edge", self.index, round_, step,
                               "dp_noise", self.attempt)
            agg, records = on_wire.edge_release(agg, self.cplan, stream, rng, weights, len(self.participants),
                                                self.id, nodes, round_)
            self.dp_records.extend(records)
        return agg

    async def _submit(self, task: pb.RoundTask, step: int, delta: np.ndarray, members: set[str]) -> None:
        seed = self.cfg.run.seed
        if self.relay or self.plane is not None:  # relayed uploads / the medium holds the round's model
            tensors, transforms = [], []
        else:
            tensor, transforms = self.backhaul.send(delta, "delta", seed, self.index, task.round, step)
            tensors = [tensor]
        transforms = list(transforms) + [on_wire.to_transform(r) for r in on_wire.merge(self.dp_records)]
        meta = pb.Meta(run_id=self.run_id, round=task.round, phase=plans.CLOUD_SYNC, step=step, sender_id=self.id,
                       num_samples=sum(self.samples[n] for n in members), num_devices=len(members), transforms=transforms)
        scalars = {"bytes_up": float(self.bytes_up), "bytes_down": float(self.bytes_down),
                   "refused": float(self.refusals.take()), "dropped": float(len(self.participants) - len(members)),
                   "restarts": float(self.restarts), "rejoined": float(self.rejoined), "clipped": float(self.clipped)}
        if self.losses:
            scalars["train_loss"] = float(np.mean(self.losses))
        if self.q_uplink:
            scalars["q_uplink"] = float(np.mean(self.q_uplink))
        if self.betas:
            scalars["beta_estimate"] = float(max(self.betas))
        if self.plane is not None:
            scalars["air_dropped"] = float(len(self.air_dropped & members))
        scalars.update(self.clock.report())
        self.bytes_up = self.bytes_down = 0
        self.restarts = self.rejoined = self.clipped = 0
        chunks = wire.chunked(pb.Envelope(meta=meta, tensors=tensors, scalars=scalars, relayed=self.relayed),
                              self.chunk_bytes)

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
                trust: str = "", rejoin: bool = False) -> int:
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    edge = EdgeServer(node_id, cloud_address, server, cloud_credentials, cloud_override_host, admit, wait_s, trust)
    edge.rejoin_first = rejoin
    rpc.add_servicer(pbg.add_EdgeServiceServicer_to_server, edge, server.server, edge.malformed)
    await server.start(port_file)
    log.info("%s listening on %s", node_id, server.address)
    started = time.monotonic()
    try:
        return await edge.run()
    finally:
        edge.stop.set()
        await server.stop(edge.cfg.net.grace_s if edge.cfg else 1.0)
        log.info("%s stopped after %.1fs", node_id, time.monotonic() - started)
