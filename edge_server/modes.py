"""The edge's side of each round mode (common/modes.py): what a device upload must hold, how a phase's uploads
settle into the reply the members get, and what goes up to the cloud. The edge service calls these at fixed points
and never asks which mode runs; a mode gets narrow ports, never the server object."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc
import numpy as np

from hfl.common import batches, modes, plans, robust, topology, validate, wire
from hfl.common.pipeline import Link
from hfl.common.privacy import on_wire
from hfl.common.quantization import precision
from hfl.proto import hfl_v1_pb2 as pb

from .round_state import Barrier, ClusterRound, Contribution

log = logging.getLogger("hfl.edge")


@dataclass
class EdgePorts:
    cfg: object
    id: str
    index: int
    dim: int
    samples: dict[str, int]
    members: list[str]
    links: dict                 # uplink, downlink, backhaul (common.pipeline.Link)
    chunk_bytes: int
    clock: object               # common.channel.round_clock.EdgeClock
    air_call: Callable[[list, str], Awaitable[list[pb.Envelope]]]  # a shared slot on the cloud's medium (reconnects)

    @classmethod
    def of(cls, spec, edge: str, clock, air_call) -> "EdgePorts":
        """The ports of the run an edge joined (cloud_link.Joined), with the links its config states."""
        cfg = spec.cfg
        links = {"uplink": Link.device_uplink(cfg), "downlink": Link.from_config(cfg.pipeline, "downlink"),
                 "backhaul": Link.from_config(cfg.pipeline, "backhaul")}
        return cls(cfg, edge, topology.edge_index(edge), spec.dim, spec.samples, spec.members, links,
                   cfg.net.chunk_kib * 1024, clock, air_call)


class DigitalEdge:
    """Device model deltas (or gradients) in, the cluster's aggregate back to the members and up to the cloud."""

    may_restart = True   # a member lost and back mid-round restarts the cluster's round (a new attempt)

    def __init__(self, ports: EdgePorts):
        self.ports, self.cfg, self.id, self.index, self.dim = ports, ports.cfg, ports.id, ports.index, ports.dim
        self.uplink, self.downlink, self.backhaul_link = (ports.links[k] for k in ("uplink", "downlink", "backhaul"))
        self.edge_weights = plans.weights_rule(self.cfg, "edge")

    def start_attempt(self, ctx: ClusterRound, barriers: dict[int, Barrier]) -> None:
        """Set who takes part in each upload phase of a new attempt (barrier.expected; default: every member)."""

    # ---- one device upload --------------------------------------------------------------------
    def validate(self, ctx: ClusterRound, envelope: pb.Envelope, barrier: Barrier) -> Contribution:
        """Decode a member's upload for `barrier` (raises WireError and changes nothing but the DP charge)."""
        meta, node = envelope.meta, envelope.meta.sender_id
        name = "gradient" if barrier.kind == plans.EDGE_GRADIENT_STEP else "delta"
        dp = on_wire.from_transforms(meta.transforms, allowed={node})
        stream = on_wire.stream_of(ctx.plan, meta.step)
        device_noise = ctx.noise.get("device", stream) if barrier.kind == plans.EDGE_MODEL_SYNC else None
        on_wire.check_device_records(dp, device_noise, node, stream)
        # charged at receipt: the noisy upload is released to this edge even if a later check or a restart of the
        # barrier discards it
        ctx.dp_records.extend(dp)
        # the channel's draw is the sender's own (keyed by the device, not by this edge)
        vec, _ = self.uplink.receive(wire.single_tensor(envelope, name), self.dim, self.cfg.run.seed,
                                     topology.device_index(node), ctx.round, meta.step)
        scalars = validate.check_scalars(envelope.scalars, node)
        q = next((t.params["q_measured"] for t in meta.transforms if t.stage == "encode" and "q_measured" in t.params), None)
        return Contribution(vec, self.ports.samples[node], scalars, dp, q)

    def hold(self, contribution: Contribution, envelope: pb.Envelope, received: bytes) -> None:
        """What the edge keeps of an accepted upload while its barrier waits: its values read in place from
        `received` (a unary call's request bytes, which gRPC holds until the call returns) rather than a copy."""
        contribution.vec = wire.view_in(contribution.vec, received)

    # ---- a phase's uploads are in ----------------------------------------------------------------
    def combine(self, vectors: list[np.ndarray], weights: list) -> np.ndarray:
        """The phase's aggregate of the members' uploads (by pipeline.aggregate); the edge's release runs around it."""
        return robust.aggregate(self.cfg.pipeline.aggregate, self.cfg.pipeline.params, vectors, weights)

    async def settle(self, ctx: ClusterRound, barrier: Barrier, phase: pb.Phase, step: int,
                     cluster_w: np.ndarray) -> np.ndarray:
        """Aggregate the phase's uploads, give the members their reply (and release the barrier); the cluster model."""
        nodes = self._bounded(ctx, barrier, sorted(barrier.contributions))  # arrival order must not matter
        reply_vec, name = None, ""
        if nodes or ctx.release.always:
            contributions = [barrier.contributions[n] for n in nodes]
            weights = [c.samples if self.edge_weights == "samples" else 1 for c in contributions]
            ctx.tally.q_uplink.extend(c.q for c in contributions if c.q is not None)
            agg = ctx.release(self.combine, ctx, [c.vec for c in contributions], weights,
                              [c.samples for c in contributions], nodes, phase, step)
            ctx.tally.losses.extend(c.scalars["train_loss"] for c in contributions if "train_loss" in c.scalars)
            ctx.tally.betas.extend(c.scalars["beta_estimate"] for c in contributions if "beta_estimate" in c.scalars)
            if phase.kind == plans.EDGE_GRADIENT_STEP:
                cluster_w = cluster_w - np.float32(phase.params["lr"]) * agg
                reply_vec, name = agg, "gradient"
            else:
                cluster_w = cluster_w + agg
                if plans.downlink_after(ctx.plan, step):
                    reply_vec, name = cluster_w, "model"
        self._release(ctx, barrier, phase, step, nodes, reply_vec, name)
        return cluster_w

    def _bounded(self, ctx: ClusterRound, barrier: Barrier, nodes: list[str]) -> list[str]:
        """The uploads to aggregate: one far beyond the phase's others is left out (an insider's 1e30 would otherwise
        swamp the cluster and, refused at the cloud, freeze the global model)."""
        out = robust.outliers([barrier.contributions[n].vec for n in nodes], self.cfg.aggregation.max_member_ratio)
        for i, why in out.items():
            log.warning("refused outlier from %s (round %d step %d): %s", nodes[i], ctx.round, barrier.step, why)
        ctx.outliers += len(out)
        return [n for i, n in enumerate(nodes) if i not in out]

    def _release(self, ctx: ClusterRound, barrier: Barrier, phase: pb.Phase, step: int, nodes: list[str],
                 reply_vec: np.ndarray | None, name: str) -> None:
        reply = pb.Envelope(meta=pb.Meta(run_id=ctx.run_id, round=ctx.round, phase=phase.kind, step=step,
                                         sender_id=self.id, num_devices=len(nodes), attempt=ctx.attempt))
        if reply_vec is not None:
            reply.tensors.append(self.downlink.send(reply_vec, name, self.cfg.run.seed, self.index, ctx.round, step)[0])
        payload = reply.SerializeToString()
        barrier.reply = list(wire.to_chunks(payload, self.ports.chunk_bytes))
        barrier.reply_size = len(payload)
        self.ports.clock.phase(step, barrier.contributions, barrier.reply_size)
        barrier.released.set()

    # ---- the cluster's result ---------------------------------------------------------------------
    def backhaul(self, ctx: ClusterRound, step: int, delta: np.ndarray) -> tuple[list[pb.Tensor], list[pb.Transform]]:
        """What the edge's result to the cloud carries: the encoded cluster delta."""
        tensor, transforms = self.backhaul_link.send(delta, "delta", self.cfg.run.seed, self.index, ctx.round, step)
        return [tensor], list(transforms)

    def report(self, ctx: ClusterRound, members: set[str]) -> dict:
        """The mode's scalars in the edge's result."""
        return {}

    def result_bytes(self, ctx: ClusterRound, envelope: pb.Envelope) -> bytes:
        """The edge's result to the cloud as sent (the mode may add its payload to `envelope`)."""
        return envelope.SerializeToString()


class RelayEdge(DigitalEdge):
    """Every member upload is forwarded unchanged to the cloud's fusion, never re-aggregated here (paper 004, digest
    P13); the members get an empty reply."""

    def __init__(self, ports: EdgePorts):
        super().__init__(ports)
        self.groups = precision.resolve(self.cfg)

    def validate(self, ctx, envelope, barrier):
        # the fusion center's header checks (planned bits, range inside the group's clip), on receipt: a device whose
        # upload is refused may still send an honest one, and its cluster's result is not refused for it (issue 24)
        node = envelope.meta.sender_id
        precision.check_upload_header(self.groups, wire.single_tensor(envelope, "delta"),
                                      int(self.groups.device_plan(topology.device_index(node))["bits"]), node)
        return super().validate(ctx, envelope, barrier)

    def hold(self, contribution, envelope, received):
        # the upload goes to the cloud as the device sent it: its bytes as received, else the parsed envelope's
        contribution.vec = None  # the cloud's fusion reads it, the edge does not
        contribution.raw = batches.received_upload(received) or envelope.SerializeToString()

    async def settle(self, ctx, barrier, phase, step, cluster_w):
        nodes = sorted(barrier.contributions)
        contributions = [barrier.contributions[n] for n in nodes]
        ctx.tally.relayed = [c.raw for c in contributions]
        ctx.tally.losses.extend(c.scalars["train_loss"] for c in contributions if "train_loss" in c.scalars)
        ctx.tally.q_uplink.extend(c.q for c in contributions if c.q is not None)
        self._release(ctx, barrier, phase, step, nodes, None, "")
        return cluster_w

    def backhaul(self, ctx, step, delta):
        return [], []

    def result_bytes(self, ctx, envelope):
        return batches.with_batch(envelope, batches.RELAY, ctx.tally.relayed)


class AirEdge(DigitalEdge):
    """Members send normalised payloads over the air (paper 003, digest 2.3); the edge hands its cluster's emissions
    of each slot to the cloud's medium and gives each member what it received."""

    may_restart = False  # a cluster cannot replay its slots alone (they are shared): a member back takes the next round

    def __init__(self, ports: EdgePorts):
        super().__init__(ports)
        from hfl.common.channel.plane import plane_for

        self.plane = plane_for(self.cfg)

    def start_attempt(self, ctx, barriers):
        from hfl.common.channel import plane as air

        members = self.ports.members
        for i in air.air_steps(ctx.plan):
            mask = air.listeners(self.plane, ctx.plan, ctx.round, i)
            barriers[i].expected = {m for m in members if mask[topology.device_index(m)]}
            mask = air.activity(self.plane, ctx.plan, ctx.round, i)
            barriers[i].active = {m for m in members if mask[topology.device_index(m)]}
            fails = ~air.passes_th0(self.plane, ctx.round, i, [topology.device_index(m) for m in members])
            ctx.tally.dropped |= {m for m, fail in zip(members, fails) if fail}

    def validate(self, ctx, envelope, barrier):
        """An air upload: the sender's one AirRow, with a normalised payload and its (mu, sigma) from a device the
        channel makes active in the slot, without from one that only listens (paper 003, eq. 15; digest 2.3)."""
        from hfl.common.channel import plane as air

        node, meta = envelope.meta.sender_id, envelope.meta
        slot = air.slot_id(meta.round, meta.step)
        if barrier.expected is not None and node not in barrier.expected:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{node} failed the downlink test th0 earlier in round {meta.round}: it sits out the "
                                 "rest of the round", "air_dropped")
        scalars = validate.check_scalars(envelope.scalars, node)
        rows = batches.air_rows(envelope, {node}, node, bounded=True)
        if len(rows) != 1:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node}'s air upload carries no row of its own",
                                 "bad_air")
        active = node in barrier.active
        if not rows[0].HasField("tensor"):
            if active:
                raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node} is active in slot {slot} "
                                     "(|f|^2 >= th1): it must transmit its normalised payload", "air_missing_payload")
            return Contribution(None, self.ports.samples[node], scalars)
        if not active:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{node} is not active in slot {slot} "
                                 "(|f|^2 < th1 to its edge): it may only listen", "air_not_active")
        vec = wire.decode_array(rows[0].tensor, [self.dim])
        mean = float(vec.sum(dtype=np.float64)) / vec.size
        std = math.sqrt(max(0.0, float(np.dot(vec, vec)) / vec.size - mean * mean))  # a 1e-3 check: float32 dot
        if abs(mean) > 1e-3 or abs(std - 1.0) > 1e-3:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"air payload of {node} is not normalised (mean "
                                 f"{mean:.3g}, std {std:.3g}; expected 0 and 1)", "air_not_normalised")
        return Contribution(vec, self.ports.samples[node], scalars)

    def hold(self, contribution, envelope, received):
        # the row goes to the medium as the device sent it: its bytes as received (the payload read in place from
        # them), else the parsed row's
        row, contribution.vec = batches.received_row(received, contribution.vec)
        contribution.raw = row if row is not None else envelope.air.rows[0].SerializeToString()

    async def settle(self, ctx, barrier, phase, step, cluster_w):
        """Hand the cluster's emissions of an air slot to the medium (each member's row as it sent it) and give each
        member what it received; an edge whose members all sat out still takes part, so the medium never waits."""
        nodes = sorted(barrier.contributions)
        meta = pb.Meta(run_id=ctx.run_id, round=ctx.round, phase=phase.kind, step=step, sender_id=self.id,
                       num_devices=len(nodes))
        ctx.tally.losses.extend(barrier.contributions[n].scalars["train_loss"] for n in nodes
                                if "train_loss" in barrier.contributions[n].scalars)
        emission = batches.with_batch(pb.Envelope(meta=meta), batches.AIR, [barrier.contributions[n].raw for n in nodes])
        chunks = list(wire.to_chunks(emission, self.ports.chunk_bytes))
        try:
            reply = await self.ports.air_call(chunks, f"air slot of round {ctx.round} phase {step}")
            if not reply:
                raise wire.WireError(grpc.StatusCode.INTERNAL, "the medium sent an empty reply", "air_reply")
            head = reply[0]  # then one envelope per device (cloud_server.medium.reply_envelopes)
            rows = {t.name: t for part in reply[1:] for t in part.tensors}  # each device decodes and checks its own row
            for n in nodes:
                if n not in rows:
                    raise wire.WireError(grpc.StatusCode.INTERNAL, f"the medium sent nothing for {n}", "air_reply")
        except (grpc.aio.AioRpcError, wire.WireError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            barrier.failed = f"the medium gave nothing back for round {ctx.round} phase {step}: {detail}"
            log.error("%s: %s", self.id, barrier.failed)
            barrier.released.set()  # the service makes the phase's members sit out the rest of the round
            return cluster_w
        for n in nodes:
            out = pb.Envelope(meta=meta, scalars=dict(head.scalars))
            tensor = out.tensors.add()
            tensor.CopyFrom(rows[n])  # the row's one copy on its way (Envelope(tensors=[t]) would copy it again)
            tensor.name = "air"
            payload = out.SerializeToString()
            barrier.replies[n] = (list(wire.to_chunks(payload, self.ports.chunk_bytes)), len(payload))
        self.ports.clock.air_phase(step, barrier.contributions, self.plane, self.dim)
        barrier.released.set()
        return cluster_w

    def backhaul(self, ctx, step, delta):
        return [], []  # the medium holds the round's model

    def report(self, ctx, members):
        return {"air_dropped": float(len(ctx.tally.dropped & members))}


modes.register_tier("edge", "digital", DigitalEdge)
modes.register_tier("edge", "relay", RelayEdge)
modes.register_tier("edge", "air", AirEdge)
