"""Edge server: the devices' gRPC service. It runs each round's intra-cluster phases as cluster attempts (attempt.py)
and reports to the cloud through its upward link (cloud_link.py). Every device holds a Presence stream; one lost
mid-round has `net.rejoin_grace_s` to come back, else it sits out the rest of the round and may rejoin later."""
from __future__ import annotations

import asyncio
import logging
import time

import grpc
import numpy as np

from hfl.common import modes, rpc, session, session_stream, topology, validate, wire
from hfl.common.channel.round_clock import EdgeClock
from hfl.common.observe import live, members as member_states
from hfl.common.privacy import instructions
from hfl.common.service_base import Gate, Liveness, Refusals, RoundBoard, refuse
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .attempt import ClusterAttempt, draw_participants
from .cloud_link import CloudLink, Joined
from .modes import DigitalEdge, EdgePorts
from .release import EdgeRelease
from .round_state import ClusterRound, Traffic, result_scalars

log = logging.getLogger("hfl.edge")


class EdgeServer(Gate, pbg.EdgeServiceServicer):
    def __init__(self, node_id: str, cloud_address: str, server: rpc.Server, cloud_credentials=None,
                 cloud_override_host: str | None = None, admit=None, wait_s: float = 300.0, trust: str = "",
                 rejoin: bool = False):
        self.id = node_id
        self.server = server
        self.admit = admit  # admit(context, claimed_id, allowed_ids) raises WireError (mutual TLS)
        self.link = CloudLink(node_id, cloud_address, cloud_credentials, cloud_override_host, wait_s, trust, rejoin)
        self.spec: Joined | None = None  # the run joined (None: not yet; every RPC answers UNAVAILABLE)
        self.live = Liveness(0.0)
        self.refusals = Refusals()
        self.book = member_states.MemberBook([])  # per-member figures reported upward (the live page)
        self.board = RoundBoard()
        self.started = False
        self.mode = None  # the round mode (edge_server/modes.py), chosen once the cloud's spec is known
        self.links: dict = {}  # uplink, downlink, backhaul (common.pipeline.Link)
        self.clock: EdgeClock | None = None
        self.current: ClusterAttempt | None = None  # the cluster round in progress (or the last one)
        self.traffic = Traffic()
        self.registered = asyncio.Event()  # every member registered before the run started
        self.stop = asyncio.Event()
        self.on_submit = lambda round_, scalars: None  # /metrics' per-round callback (common/observe/live.py)

    index = property(lambda self: topology.edge_index(self.id))
    cfg = property(lambda self: self.spec.cfg if self.spec else None)
    run_id = property(lambda self: self.spec.run_id if self.spec else "")
    members = property(lambda self: self.spec.members if self.spec else [])
    round = property(lambda self: self.current.round if self.current else -1)
    attempt = property(lambda self: self.current.ctx.attempt if self.current else 0)  # observers (/metrics)
    chunk_bytes = property(lambda self: self.cfg.net.chunk_kib * 1024)
    max_bytes = property(lambda self: self.cfg.net.max_message_mb << 20 if self.spec else rpc.MAX_CHUNK)  # unjoined: refused anyway
    bytes_down = property(lambda self: self.traffic.down, lambda self, n: setattr(self.traffic, "down", n))  # the gate's

    # ---- device-facing RPCs -------------------------------------------------------------------
    def _check_ready(self) -> None:
        if self.spec is None:
            raise wire.WireError(grpc.StatusCode.UNAVAILABLE, f"{self.id} has not joined the cloud yet", "not_ready")

    def _check_member(self, node: str) -> None:
        self._check_ready()
        self.spec.check_member(node, self.id)

    def _check_peer(self, context, node: str) -> None:
        """With mutual TLS: the certificate's id must be `node` (or, for discovery, any member)."""
        if self.admit is not None:
            self.admit(context, node, self.members)

    def _authenticate(self, context, node: str, token: str | None = None) -> str:
        self._check_member(node)
        self._check_peer(context, node)
        return self.live.sessions.check(context, node, token)

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
                self.traffic.rejoined += 1
                log.info("%s rejoined (round %d)", node, self.round)
            token = self.live.registered(node, request.nonce)
            if not self.started and all(self.live.sessions.has(m) for m in self.members):
                self.registered.set()
        round_ = self.round if self.round >= 0 else (0 if self.started else -1)
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec.spec_json, cluster_id=self.id, members=self.members,
                                session_token=token, round=round_)

    def _check_registration(self, request: pb.RegisterRequest) -> None:
        node = request.node_id
        session.check_nonce(request.nonce)
        self.live.sessions.admit(node, request.nonce)
        if self.started and not request.rejoin:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"the run has started: {node} can only come back with rejoin", "started")
        self.spec.check_samples(node, request.num_samples)

    def _attempt_of(self, meta: pb.Meta) -> ClusterAttempt:
        if meta.run_id != self.run_id:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for run {validate.short(meta.run_id)}, not {self.run_id!r}", "wrong_run")
        if self.current is None:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"update for round {meta.round} attempt "
                                 f"{meta.attempt}, but {self.id} has not begun a round", "wrong_round")
        return self.current

    async def Exchange(self, request_iterator, context):
        chunks, size = await self._exchange(lambda: wire.read_envelope(request_iterator, self.max_bytes), context)
        for chunk in chunks:
            yield chunk
        self.bytes_down += size

    @rpc.raw_bytes
    async def ExchangeOne(self, request: bytes, context) -> bytes:
        return await self._framed(session_stream.Upload(raw=request, max_bytes=self.max_bytes), context)

    @rpc.raw_bytes
    async def Session(self, request_iterator, context):  # each upload checked by _exchange; a refusal ends the stream
        async for frame in session_stream.serve(request_iterator, self.max_bytes, self._framed, context,
                                                lambda exc: refuse(context, self.refusals, exc)):
            yield frame

    async def _framed(self, upload: session_stream.Upload, context) -> bytes:
        chunks, size = await self._exchange(upload.read, context, upload.received)
        self.bytes_down += size
        return wire.whole_bytes(chunks)

    async def _exchange(self, read, context, received: bytes = b"") -> tuple[list[pb.Chunk], int]:
        """One upload (`read()` awaits its envelope and size) and, once its barrier is released, the reply's chunks.
        `received`: a unary call's request bytes, which gRPC holds until the call returns: the upload's values are
        read in place from them rather than kept in a copy (wire.view_in)."""
        # A refused message changes nothing, not even for the member it claims to come from: it may still send a
        # valid upload (one whose own upload is refused sits the round out: the barrier stops waiting for it).
        node = None
        try:
            self._check_ready()
            envelope, size = await read()
            validate.check_meta(envelope.meta, self.cfg.run.rounds, len(self.current.ctx.plan if self.current else ()) or 1)
            self._authenticate(context, envelope.meta.sender_id)
            node = envelope.meta.sender_id
            if envelope.meta.withdraw:
                (self.current or ClusterAttempt.NONE).withdraw(envelope.meta)
                return [pb.Chunk(data=b"")], 0
            current = self._attempt_of(envelope.meta)  # the checks that depend on the round in progress
            barrier = current.check(envelope)
            contribution = self.mode.validate(current.ctx, envelope, barrier)
        except wire.WireError as exc:
            if node is not None:  # an authenticated member's own message: counted against it on the live page
                self.book.refusal(node)
            await refuse(context, self.refusals, exc)
        self.mode.hold(contribution, envelope, received)  # values read in place from `received`, bytes to forward
        del envelope  # decoded into the contribution: not held while the rest of the cluster uploads
        self.traffic.up += size
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

    # ---- the edge's own loop ------------------------------------------------------------------
    async def join_cloud(self) -> Joined:
        spec = await self.link.join()
        cfg = spec.cfg
        self.book = member_states.MemberBook(spec.members)
        self.live.grace_s = cfg.net.rejoin_grace_s
        self.live.presence_s = cfg.net.presence_deadline_s
        self.clock = EdgeClock(cfg, self.index, spec.members, spec.samples)
        ports = EdgePorts.of(spec, self.id, self.clock, lambda chunks, what: self.link.air(chunks, what, len(spec.members)))
        self.links, self.mode = ports.links, modes.build(cfg, "edge", ports)
        self.spec = spec  # last: from here on the RPCs are served
        log.info("%s joined run %s: %d devices expected, model dim %d", self.id, spec.run_id, len(spec.members), spec.dim)
        await self.server.ready()
        return spec

    async def run(self) -> int:
        spec = await self.join_cloud()
        wait = self.cfg.net.rejoin_grace_s if spec.round >= 0 else self.cfg.net.join_timeout_s
        try:
            await asyncio.wait_for(self.registered.wait(), wait)
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
                envelope = await self.link.fetch(after)
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
            await self.link.close()
        log.info("%s done; refusals: %s", self.id, dict(self.refusals.total))
        return 0

    async def _round(self, task: pb.RoundTask, envelope: pb.Envelope) -> None:
        plan = task.clusters[self.id] if self.id in task.clusters else pb.ClusterPlan()
        noise = instructions.read_cluster(plan)  # refuses a plan it cannot execute as stated, before anything runs
        cfg, cplan = self.cfg, dict(plan.params)
        release = EdgeRelease(noise, cplan, self.id, self.index, self.spec.dim, cfg.run.seed, cfg.privacy.noise_source)
        release.require(type(self.mode).settle is not DigitalEdge.settle, type(self.mode).__name__)
        global_w, _ = self.links["downlink"].receive(wire.single_tensor(envelope, "model"), self.spec.dim,
                                                     cfg.run.seed, self.index, task.round, -1)
        participants = draw_participants(plan, self.members, cfg, self.index, task.round)
        ctx = ClusterRound(self.run_id, task.round, cplan, participants, noise, release=release)
        self.current = ClusterAttempt(self.id, ctx, self.members, self.live, self.mode.may_restart,
                                      cfg.net.phase_timeout_s, cfg.privacy.trace_uploads)
        while (result := await self._attempt(task, global_w, plan)) is None:
            self.traffic.restarts += 1
        self.current.active_step = None
        cluster_w, members_used, step = result
        await self._submit(task, step, cluster_w - global_w, members_used)

    async def _attempt(self, task: pb.RoundTask, global_w: np.ndarray, cluster_plan: pb.ClusterPlan):
        """One attempt at the cluster's part of the round; None when a lost member came back (restart)."""
        current = self.current
        ctx = current.ctx
        current.begin(task.phases)
        self.book.start_round()
        self.mode.start_attempt(ctx, current.barriers)
        device_task, idle = current.device_task(task, cluster_plan)
        tensor = self.links["downlink"].send(global_w, "model", self.cfg.run.seed, self.index, task.round, -1)[0]
        down = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=task.round, sender_id=self.id, attempt=ctx.attempt),
                           tensors=[tensor], task=device_task)
        await self.board.publish(task.round, down, self.chunk_bytes, ctx.attempt, idle=idle)
        self.clock.start(task.round, ctx.plan, current.taking, self.board.size)
        if ctx.attempt:
            log.info("%s: round %d attempt %d with %d devices", self.id, task.round, ctx.attempt, len(current.taking))
        return await current.run_phases(self.mode, global_w.copy())

    async def _submit(self, task: pb.RoundTask, step: int, delta: np.ndarray, members: set[str]) -> None:
        ctx = self.current.ctx
        tensors, transforms = self.mode.backhaul(ctx, step, delta)
        meta = self.current.result_meta(step, members, self.spec.samples, transforms)
        scalars = result_scalars(ctx, members, self.traffic.take(), self.refusals.take())
        scalars.update(self.mode.report(ctx, members))
        scalars.update(self.clock.report())
        self.on_submit(task.round, scalars)
        result = pb.Envelope(meta=meta, tensors=tensors, scalars=scalars, members=self.book.report(self.live))
        chunks = list(wire.to_chunks(self.mode.result_bytes(ctx, result), self.chunk_bytes))
        await self.link.submit(chunks, task.round)


async def serve(node_id: str, listen: str, cloud_address: str, port_file: str | None = None, server_credentials=None,
                cloud_credentials=None, cloud_override_host: str | None = None, admit=None, wait_s: float = 300.0,
                trust: str = "", rejoin: bool = False, metrics_listen: str = "", web_tls=None) -> int:
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    edge = EdgeServer(node_id, cloud_address, server, cloud_credentials, cloud_override_host, admit, wait_s, trust,
                      rejoin)
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
