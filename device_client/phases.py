"""A device's round as data: one handler per phase kind, registered by name (a round mode registers its own, e.g.
the air phases in modes.py). A handler runs phase `step` of the round for one device, reading and updating the
round's state; it returns False when the round ends early for this device (it withdrew).

Every handler gets the device (its trainer, shard, links and upload port) and the round's state; the device's
privacy for the round (on_wire.DeviceRelease, from the plan) is part of that state, and a phase kind has exactly one
handler (the registry refuses a second), so no mode can replace the release of the edge's model sync.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from hfl.common import plans, wire
from hfl.common.privacy.on_wire import DeviceRelease
from hfl.common.registry import Registry
from hfl.common.seeding import torch_generator
from hfl.proto import hfl_v1_pb2 as pb

from .training import local_dp_sgd, local_sgd, minibatch_gradient, smoothness

log = logging.getLogger("hfl.devices")


@dataclass
class RoundState:
    """What a device holds through one round: its model, the anchor its deltas are taken from, what its next upload
    reports. It holds the fewest model-sized arrays it can while it waits (see edge_model_sync)."""

    task: pb.RoundTask
    cluster: pb.ClusterPlan
    release: DeviceRelease
    w: np.ndarray | None
    anchor: np.ndarray | None
    encode: dict | None = None  # this device's own encode parameters this round (per-device precision)
    losses: list = field(default_factory=list)     # training losses since the last upload
    extra: dict = field(default_factory=dict)      # scalars for the next upload (e.g. a smoothness estimate)
    sample_dp: list = field(default_factory=list)  # DP-SGD events since the last upload, sent with it


def encode_overrides(device_plan) -> dict:
    """The encode parameters a device's round-plan entry sets (per-device precision, paper 004)."""
    out: dict = {}
    if "bits" in device_plan:
        out["bits"] = int(device_plan["bits"])
    if "epsilon1" in device_plan:
        out["epsilon1"] = float(device_plan["epsilon1"])
    return out


Handler = Callable[[object, RoundState, int], Awaitable[bool]]
PHASES: Registry[Handler] = Registry("device phase")


async def run(device, state: RoundState, step: int) -> bool:
    return await PHASES.get(state.task.phases[step].kind)(device, state, step)


@PHASES.register(plans.LOCAL_SGD)
async def local_sgd_phase(device, state: RoundState, step: int) -> bool:
    task, p = state.task, state.task.phases[step].params
    start = state.w
    steps = int(p["steps"]) if "steps" in p else None
    epochs = int(p["epochs"]) if "epochs" in p else None
    batch = device.cfg.train.batch_size
    state.w, loss, taken = await device.trainer.run(local_sgd, state.w, device.shard, p["lr"], batch,
                                                    device.batches(task.round, step), steps=steps, epochs=epochs,
                                                    clip=p.get("clip", 0.0))
    if taken:
        state.losses.append(loss)
    if p.get(plans.ESTIMATE_BETA, 0.0) == 1.0 and taken:  # the plan asks (a controller that estimates beta)
        beta = await device.trainer.run(smoothness, start, state.w, device.shard, batch, torch_generator(
            device.cfg.run.seed, "device", device.index, task.round, step, "beta"))
        if np.isfinite(beta):
            state.extra["beta_estimate"] = beta
    return True


@PHASES.register(plans.LOCAL_DP_SGD)
async def local_dp_sgd_phase(device, state: RoundState, step: int) -> bool:
    task = state.task
    state.w, loss, rec = await device.trainer.run(local_dp_sgd, state.w, device.shard, task.phases[step].params,
                                                  state.release.sample_instruction, state.release.sgd_draws(step),
                                                  device.id, task.round, state.cluster.params.get("clip_scale", 1.0))
    if np.isfinite(loss):
        state.losses.append(loss)
    state.sample_dp.append(rec)
    return True


@PHASES.register(plans.EDGE_GRADIENT_STEP)
async def edge_gradient_step(device, state: RoundState, step: int) -> bool:
    task, lr = state.task, np.float32(state.task.phases[step].params["lr"])
    grad, loss = await device.trainer.run(minibatch_gradient, state.w, device.shard, device.cfg.train.batch_size,
                                          device.batches(task.round, step))
    state.losses.append(loss)
    upload = device.upload(task, step, "gradient", grad, {"train_loss": loss})
    del grad
    g, _ = device.downlink.receive(wire.single_tensor(await device.send(upload), "gradient"), device.dim,
                                   device.cfg.run.seed, device.index, task.round, step)
    state.w = state.w - lr * g
    state.anchor = state.anchor - lr * g
    return True


@PHASES.register(plans.EDGE_MODEL_SYNC)
async def edge_model_sync(device, state: RoundState, step: int) -> bool:
    """The model delta since the anchor, through the device's release (clip, noise, DP event), to the edge; the
    cluster model back if the devices go on training in this round."""
    task = state.task
    scalars = {"train_loss": float(np.mean(state.losses))} if state.losses and state.release.reports_stats(step) else {}
    scalars.update(state.extra)
    state.extra = {}
    if not np.isfinite(state.w).all():  # a diverged model: nothing sound to send; the round goes on without us
        device.diverged += 1
        log.warning("%s: local training diverged in round %d (non-finite weights); sitting out the rest of the round",
                    device.id, task.round)
        await device.withdraw((task.round, task.attempt))
        return False
    delta, dp = state.release.delta(state.w - state.anchor, step)
    dp, state.sample_dp = dp + state.sample_dp, []
    upload = device.upload(task, step, "delta", delta, scalars, dp, state.encode)
    del delta
    # while the edge waits for the rest of the cluster, hold no model the round will not read again: the reply's
    # model replaces both, or the round ends here (a failed exchange restarts from a fetch)
    state.anchor = None
    back = plans.downlink_after(task.phases, step)
    if back or not device.mode.keeps_model:
        state.w = None
    reply = await device.send(upload)
    if back:
        w, _ = device.downlink.receive(wire.single_tensor(reply, "model"), device.dim, device.cfg.run.seed,
                                       device.index, task.round, step)
        state.w = state.anchor = device.trainer.shared(w)
    del reply
    state.losses = []
    return True


@PHASES.register(plans.CLOUD_SYNC)
async def cloud_sync(device, state: RoundState, step: int) -> bool:
    """Nothing to do on a device: the next round task carries the new global model."""
    return True


async def mode_phase(device, state: RoundState, step: int) -> bool:
    """A phase the round mode runs itself (DigitalDevice.run_phase); each upload reports the steps since the last."""
    state.w = await device.mode.run_phase(state.task, step, state.w, state.losses)
    state.losses = []
    return True
