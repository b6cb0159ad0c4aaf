"""The device's side of each round mode (common/modes.py): where a round starts from, which phases a device takes
part in, the mode's own phases, and what seals an upload. The device host calls these at fixed points and never
asks which mode runs; a mode gets narrow ports, never the host."""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np
import torch

from hfl.common import modes, plans, relay_tag, wire
from hfl.proto import hfl_v1_pb2 as pb

from . import phases as device_phases
from .training import Shard, minibatch_gradient

log = logging.getLogger("hfl.devices")


@dataclass
class DevicePorts:
    cfg: object
    id: str
    run_id: str
    index: int
    dim: int
    shard: Shard
    train: Callable[..., Awaitable]                      # trainer.run(fn, *args): on the host's training thread
    exchange: Callable[[pb.Envelope], Awaitable[pb.Envelope]]  # one upload to the edge, its reply back
    batches: Callable[[int, int], torch.Generator]        # the seeded batch generator of (round, step)


class DigitalDevice:
    keeps_model = False  # end_round reads the round's final model (else the host drops it while its upload waits)

    def __init__(self, ports: DevicePorts):
        self.ports = ports

    def start_round(self, task: pb.RoundTask, w: np.ndarray) -> np.ndarray:
        """The model the round starts from, given the one the edge sent."""
        return w

    def takes_part(self, task: pb.RoundTask, step: int) -> bool:
        return True

    async def run_phase(self, task: pb.RoundTask, step: int, w: np.ndarray, losses: list) -> np.ndarray:
        """A phase of the mode's own (registered to phases.mode_phase by the mode's module)."""
        raise NotImplementedError(f"{type(self).__name__} has no phase {task.phases[step].kind!r}")

    def seal(self, task: pb.RoundTask, step: int, tensor: pb.Tensor, transforms: list[pb.Transform]) -> list[pb.Transform]:
        """Transforms the mode adds to an upload (after the pipeline's and the DP events, `transforms`)."""
        return []

    def end_round(self, w: np.ndarray | None) -> None:
        """The round ended (None: this device did not finish it)."""


class RelayDevice(DigitalDevice):
    """Uploads reach the cloud unchanged through the edge: each carries a tag the edge cannot forge."""

    def __init__(self, ports: DevicePorts):
        super().__init__(ports)
        secret = relay_tag.secret_from_env()
        self.key = relay_tag.device_key(secret, ports.id) if secret else None

    def seal(self, task, step, tensor, transforms):
        # what the cloud must receive unchanged (the relay test compares these)
        log.info("%s round %d: %s %d bytes sha256=%s", self.ports.id, task.round, tensor.name, len(tensor.data),
                 hashlib.sha256(tensor.data).hexdigest())
        if self.key is None:
            return []
        return [pb.Transform(stage=relay_tag.STAGE, tier="device", name=relay_tag.tag(
            self.key, self.ports.run_id, task.round, task.attempt, self.ports.id, step, tensor, transforms))]


class AirDevice(DigitalDevice):
    """Analog uploads over the medium (paper 003): a device keeps its own estimate of the global model across
    rounds, sits out a round's remaining slots once it fails the downlink test, and runs the air phases."""

    def __init__(self, ports: DevicePorts):
        super().__init__(ports)
        from hfl.common.channel.plane import plane_for

        self.plane = plane_for(ports.cfg)
        self.own_w: np.ndarray | None = None  # this device's own estimate of the global model
        self.begun: tuple[int, np.ndarray] | None = None  # the last round started, and the model it started from

    def start_round(self, task, w):
        # paper 003: a device starts each round from its own estimate of the last downlink; a round this device
        # does not finish (refused, aborted) leaves no estimate: the next starts from the cloud's. The same round
        # run again (a new attempt, or a resumed cloud re-running it from its checkpoint) starts where it first did,
        # so that a resume gives the uninterrupted run's models
        if self.begun is not None and self.begun[0] == task.round:
            self.own_w = None
            return self.begun[1]
        start, self.own_w = (self.own_w if self.own_w is not None else w), None
        self.begun = (task.round, start)
        return start

    def takes_part(self, task, step):
        from hfl.common.channel import plane as air

        return bool(air.listeners(self.plane, task.phases, task.round, step)[self.ports.index])

    keeps_model = True

    def end_round(self, w):
        self.own_w = w

    async def run_phase(self, task, step, w, losses):
        """One air phase (paper 003, digest 2.3): send the normalised gradient or model if the channel makes this
        device active in the slot, else only listen; estimate from what this device itself received."""
        from hfl.common.channel import plane as air

        p = self.ports
        phase = task.phases[step]
        group = phase.params.get("group", 0.0) == 1.0
        transmits = air.activity(self.plane, task.phases, task.round, step)[p.index]
        if phase.kind == plans.AIR_GRADIENT_STEP:
            payload, loss = await p.train(minibatch_gradient, w, p.shard, p.cfg.train.batch_size,
                                          p.batches(task.round, step))
            losses.append(loss)
        else:
            payload = w
        meta = pb.Meta(run_id=p.run_id, round=task.round, phase=phase.kind, step=step, sender_id=p.id,
                       num_samples=len(p.shard), num_devices=1, attempt=task.attempt)
        envelope = pb.Envelope(meta=meta, scalars={"train_loss": float(np.mean(losses))} if losses else {})
        row = envelope.air.rows.add(node=p.id, model_sum=float(np.sum(w, dtype=np.float64)))  # its one row
        if transmits:
            bar, mu, sigma = air.normalise(payload[None, :])
            row.mu, row.sigma = float(mu[0]), float(sigma[0])
            wire.CODECS.get("float32").fill(row.tensor, bar[0].astype(np.float32), "air")  # in place: no copy
        reply = await p.exchange(envelope)
        n_active = reply.scalars.get("n_active", 0.0)
        if n_active < 1 or not air.passes_th0(self.plane, task.round, step, [p.index])[0]:
            return w  # nothing to estimate from, or the downlink test failed: no update (digest 10.11)
        row = wire.decode_array(wire.single_tensor(reply, "air"), self.plane.row_shape(p.dim))
        s = reply.scalars
        est = air.device_estimates(self.plane, row[None], [p.index], task.round, step, n_active, s["E"],
                                   s["sigma_sum"], s["mu_mean"], self.plane.C if group else 1, s["psi"],
                                   phase.kind == plans.AIR_GRADIENT_STEP)[0]
        if not np.isfinite(est).all():
            return w
        if phase.kind == plans.AIR_GRADIENT_STEP:
            return w - np.float32(phase.params["lr"]) * est
        return est


for _kind in plans.AIR_PHASES:
    device_phases.PHASES.register(_kind, device_phases.mode_phase)


modes.register_tier("device", "digital", DigitalDevice)
modes.register_tier("device", "relay", RelayDevice)
modes.register_tier("device", "air", AirDevice)
