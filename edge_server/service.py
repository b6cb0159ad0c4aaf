"""Edge server: serves its cluster's devices, runs the intra-cluster phases, reports to the cloud."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from hfl.common import config as config_mod
from hfl.common import plans, rpc, topology, wire
from hfl.common.pipeline import Link, aggregate
from hfl.common.service_base import Refusals, RoundBoard, refuse
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

log = logging.getLogger("hfl.edge")

NOT_REGISTERED = "not_registered"


@dataclass
class Contribution:
    vec: np.ndarray
    samples: int
    scalars: dict


@dataclass
class Barrier:
    """Collects one phase's uploads from every live member; releases all waiters with one reply."""

    step: int
    kind: str
    contributions: dict[str, Contribution] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    reply: list[pb.Chunk] = field(default_factory=list)
    reply_size: int = 0


class EdgeServer(pbg.EdgeServiceServicer):
    def __init__(self, node_id: str, cloud_address: str, server: rpc.Server, cloud_credentials=None,
                 cloud_override_host: str | None = None, admit=None, wait_s: float = 300.0):
        self.id = node_id
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
        self.alive: set[str] = set()
        self.dropped: set[str] = set()
        self.refusals = Refusals()
        self.board = RoundBoard()
        self.round = -1
        self.plan: list[pb.Phase] = []
        self.barriers: dict[int, Barrier] = {}
        self.active_step: int | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        self.losses: list[float] = []
        self.joined = asyncio.Event()

    # ---- device-facing RPCs -------------------------------------------------------------------
    def _check_member(self, node: str) -> None:
        self._check_ready()
        if node not in self.members:
            raise wire.WireError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{node!r} is not a device of {self.id} (members {self.members[0]}..{self.members[-1]})",
                                 "unknown_device")

    async def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterReply:
        try:
            self._check_member(request.node_id) if request.node_id else self._check_ready()
            self._check_peer(context, request.node_id)
            if request.run_id and request.run_id != self.run_id:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"run {request.run_id!r} is not the run {self.id} serves ({self.run_id})", "wrong_run")
            if request.node_id in self.dropped:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"{request.node_id} was dropped from this run", "dropped")
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        if request.node_id:
            if request.num_samples < 1:
                await refuse(context, self.refusals, wire.WireError(
                    grpc.StatusCode.INVALID_ARGUMENT, "num_samples must be >= 1", "bad_register"))
            self.samples[request.node_id] = int(request.num_samples)
            if self.round < 0:
                self.alive.add(request.node_id)
            if set(self.members) <= self.alive:
                self.joined.set()
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec_json, cluster_id=self.id, members=self.members)

    def _check_ready(self) -> None:
        if self.cfg is None:
            raise wire.WireError(grpc.StatusCode.UNAVAILABLE, f"{self.id} has not joined the cloud yet", "not_ready")

    def _check_peer(self, context, node: str) -> None:
        """With mutual TLS: the certificate's id must be `node` (or, for discovery, any member)."""
        if self.admit is not None:
            self.admit(context, node, self.members)

    def _check_live(self, node: str) -> None:
        self._check_member(node)
        if node in self.dropped:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{node} was dropped from this run", "dropped")
        if node not in self.alive:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{node} has not registered", NOT_REGISTERED)

    async def FetchRound(self, request: pb.FetchRequest, context):
        try:
            self._check_live(request.node_id)
            self._check_peer(context, request.node_id)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        round_, chunks, size = await self.board.wait_after(request.after_round)
        for chunk in chunks:
            yield chunk
        self.bytes_down += size
        await self.board.mark_fetched(round_, request.node_id)

    def _validate(self, envelope: pb.Envelope) -> tuple[Barrier, str, Contribution]:
        meta = envelope.meta
        node = meta.sender_id
        self._check_live(node)
        if meta.run_id != self.run_id:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"update for run {meta.run_id!r}, not {self.run_id!r}",
                                 "wrong_run")
        if meta.round != self.round:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for round {meta.round}, but {self.id} is in round {self.round}", "wrong_round")
        if self.active_step is None or meta.step != self.active_step or meta.phase != self.plan[meta.step].kind:
            expected = "none" if self.active_step is None else f"{self.active_step} ({self.plan[self.active_step].kind})"
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for phase {meta.step} ({meta.phase}), expected phase {expected}", "wrong_phase")
        barrier = self.barriers[meta.step]
        if node in barrier.contributions:
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"{node} already contributed to round {meta.round} phase {meta.step}", "replay")
        name = "gradient" if barrier.kind == plans.EDGE_GRADIENT_STEP else "delta"
        vec, _ = self.uplink.receive(wire.single_tensor(envelope, name), self.dim, self.cfg.run.seed, self.index,
                                     self.round, meta.step)
        scalars = {k: v for k, v in envelope.scalars.items() if np.isfinite(v)}
        return barrier, node, Contribution(vec, self.samples[node], scalars)

    async def Exchange(self, request_iterator, context):
        try:
            envelope, size = await wire.read_envelope(request_iterator, self.max_bytes)
            self._check_peer(context, envelope.meta.sender_id)
            barrier, node, contribution = self._validate(envelope)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        self.bytes_up += size
        barrier.contributions[node] = contribution
        if self.alive <= set(barrier.contributions):
            barrier.complete.set()
        await barrier.released.wait()
        for chunk in barrier.reply:
            yield chunk
        self.bytes_down += barrier.reply_size

    # ---- the edge's own loop ------------------------------------------------------------------
    async def join_cloud(self) -> pbg.CloudServiceStub:
        self.cloud_channel = rpc.channel(self.cloud_address, 2 << 20, self.cloud_credentials, self.cloud_override_host)
        await rpc.wait_serving(self.cloud_channel, self.wait_s, f"cloud {self.cloud_address}")
        stub = pbg.CloudServiceStub(self.cloud_channel)
        reply = await stub.Register(pb.RegisterRequest(node_id=self.id), wait_for_ready=True)
        spec = json.loads(reply.spec_json)
        self.cfg = config_mod.from_dict(spec["config"], check_choices=False)
        self.spec_json = reply.spec_json
        self.run_id = reply.run_id
        self.dim = int(spec["model_dim"])
        self.members = topology.edge_members(self.cfg, self.index)
        self.uplink = Link.from_config(self.cfg.pipeline, "uplink")
        self.backhaul = Link.from_config(self.cfg.pipeline, "backhaul")
        self.downlink = Link.from_config(self.cfg.pipeline, "downlink")
        self.chunk_bytes = self.cfg.net.chunk_kib * 1024
        self.max_bytes = self.cfg.net.max_message_mb << 20
        self.edge_weights = plans.weights_rule(self.cfg, "edge")
        await self.cloud_channel.close()
        self.cloud_channel = rpc.channel(self.cloud_address, self.chunk_bytes, self.cloud_credentials, self.cloud_override_host)
        log.info("%s joined run %s: %d devices expected, model dim %d", self.id, self.run_id, len(self.members), self.dim)
        await self.server.ready()
        return pbg.CloudServiceStub(self.cloud_channel)

    def _drop(self, nodes, why: str) -> None:
        for node in sorted(nodes):
            self.alive.discard(node)
            self.dropped.add(node)
            log.warning("dropping %s: %s", node, why)

    async def run(self) -> int:
        cloud = await self.join_cloud()
        try:
            await asyncio.wait_for(self.joined.wait(), self.cfg.net.join_timeout_s)
        except asyncio.TimeoutError:
            pass
        self._drop(set(self.members) - self.alive, "did not register in time")
        log.info("%s: %d of %d devices joined", self.id, len(self.alive), len(self.members))
        after = -1
        while True:
            call = cloud.FetchRound(pb.FetchRequest(run_id=self.run_id, node_id=self.id, after_round=after))
            envelope, _ = await wire.read_envelope(call, self.max_bytes)
            task = envelope.task
            if task.finished:
                await self.board.publish(task.round, envelope, self.chunk_bytes)
                missing = await self.board.wait_fetched(task.round, set(self.alive), self.cfg.net.grace_s + 10)
                if missing:
                    log.warning("devices that did not collect the final task: %s", sorted(missing))
                break
            await self._round(cloud, task, envelope)
            after = task.round
        await self.cloud_channel.close()
        log.info("%s done; refusals: %s", self.id, dict(self.refusals.total))
        return 0

    async def _round(self, cloud: pbg.CloudServiceStub, task: pb.RoundTask, envelope: pb.Envelope) -> None:
        seed = self.cfg.run.seed
        global_w, _ = self.downlink.receive(wire.single_tensor(envelope, "model"), self.dim, seed, self.index, task.round, -1)
        self.round = task.round
        self.plan = list(task.phases)
        comm_steps = [i for i, p in enumerate(self.plan) if p.kind in plans.DEVICE_UPLOAD_PHASES]
        self.barriers = {i: Barrier(i, self.plan[i].kind) for i in comm_steps}
        self.active_step = comm_steps[0] if comm_steps else None
        self.losses = []
        device_task = pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=task.round, sender_id=self.id),
                                  tensors=[self.downlink.send(global_w, "model", seed, self.index, task.round, -1)[0]],
                                  task=task)
        await self.board.publish(task.round, device_task, self.chunk_bytes)
        cluster_w = global_w.copy()
        members_used = set(self.alive)
        for step, phase in enumerate(self.plan):
            if phase.kind in plans.DEVICE_UPLOAD_PHASES:
                barrier = self.barriers[step]
                if not barrier.complete.is_set() and self.alive and not self.alive <= set(barrier.contributions):
                    try:
                        await asyncio.wait_for(barrier.complete.wait(), self.cfg.net.phase_timeout_s)
                    except asyncio.TimeoutError:
                        self._drop(self.alive - set(barrier.contributions), f"no upload for round {task.round} phase {step}")
                cluster_w = self._aggregate(barrier, cluster_w, phase, step, task.round)
                members_used = set(barrier.contributions)
            elif phase.kind == plans.CLOUD_SYNC:
                await self._submit(cloud, task, step, cluster_w - global_w, members_used)

    def _aggregate(self, barrier: Barrier, cluster_w: np.ndarray, phase: pb.Phase, step: int, round_: int) -> np.ndarray:
        nodes = sorted(barrier.contributions)  # arrival order must not matter
        reply_vec = None
        if nodes:
            contributions = [barrier.contributions[n] for n in nodes]
            weights = [c.samples if self.edge_weights == "samples" else 1 for c in contributions]
            agg = aggregate(self.cfg.pipeline.aggregate, [c.vec for c in contributions], weights)
            self.losses.extend(c.scalars["train_loss"] for c in contributions if "train_loss" in c.scalars)
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
                                         num_devices=len(nodes)))
        if reply_vec is not None:
            reply.tensors.append(self.downlink.send(reply_vec, name, self.cfg.run.seed, self.index, round_, step)[0])
        payload = reply.SerializeToString()
        barrier.reply = list(wire.to_chunks(payload, self.chunk_bytes))
        barrier.reply_size = len(payload)
        barrier.released.set()
        return cluster_w

    async def _submit(self, cloud: pbg.CloudServiceStub, task: pb.RoundTask, step: int, delta: np.ndarray,
                      members: set[str]) -> None:
        seed = self.cfg.run.seed
        tensor, transforms = self.backhaul.send(delta, "delta", seed, self.index, task.round, step)
        meta = pb.Meta(run_id=self.run_id, round=task.round, phase=plans.CLOUD_SYNC, step=step, sender_id=self.id,
                       num_samples=sum(self.samples[n] for n in members), num_devices=len(members), transforms=transforms)
        scalars = {"bytes_up": float(self.bytes_up), "bytes_down": float(self.bytes_down),
                   "refused": float(self.refusals.take()), "dropped": float(len(self.dropped))}
        if self.losses:
            scalars["train_loss"] = float(np.mean(self.losses))
        self.bytes_up = self.bytes_down = 0
        envelope = pb.Envelope(meta=meta, tensors=[tensor], scalars=scalars)
        ack = await cloud.Submit(iter(wire.chunked(envelope, self.chunk_bytes)))
        if not ack.accepted:
            log.error("cloud refused round %d: %s", task.round, ack.detail)


async def serve(node_id: str, listen: str, cloud_address: str, port_file: str | None = None, server_credentials=None,
                cloud_credentials=None, cloud_override_host: str | None = None, admit=None, wait_s: float = 300.0) -> int:
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    edge = EdgeServer(node_id, cloud_address, server, cloud_credentials, cloud_override_host, admit, wait_s)
    pbg.add_EdgeServiceServicer_to_server(edge, server.server)
    await server.start(port_file)
    log.info("%s listening on %s", node_id, server.address)
    started = time.monotonic()
    try:
        return await edge.run()
    finally:
        await server.stop(edge.cfg.net.grace_s if edge.cfg else 1.0)
        log.info("%s stopped after %.1fs", node_id, time.monotonic() - started)
