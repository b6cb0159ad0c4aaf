"""Local training as pure functions of (model architecture, flat weights, shard, generator).

The model may sit on a GPU (train.device, Trainer.placed): the shard stays on the CPU, each batch is drawn there (the
same indices from the same generator) and moved to the model's device; results come back as CPU arrays. On the CPU
nothing is moved: the same floats as before the key existed."""
from __future__ import annotations

import copy
from typing import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hfl.common.models import get_flat, set_flat
from hfl.common.privacy import optimizers
from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.instructions import Instruction
from hfl.common.privacy.dpsgd import dp_sgd
from hfl.common.shard import Shard, evaluate, make_shard  # noqa: F401 - the device's data and the shared evaluation


def _batches(n: int, batch_size: int, steps: int | None, epochs: int | None, gen: torch.Generator):
    if epochs is not None:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            yield from perm.split(batch_size)
    else:
        for _ in range(steps or 0):
            yield torch.randperm(n, generator=gen)[:batch_size]


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def batch_on(device: torch.device, shard: Shard, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mini-batch `idx` of `shard` on `device` (drawn and normalised on the CPU; moved only off it)."""
    x, y = shard.batch(idx)
    if device.type != "cpu":
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x, y


def _loss_and_backward(model: nn.Module, shard: Shard, idx: torch.Tensor) -> float:
    x, y = batch_on(model_device(model), shard, idx)
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach())


def clip_norm_(params: list[torch.Tensor], clip: float) -> None:
    """torch.nn.utils.clip_grad_norm_(params, clip): the joint L2 norm of the gradients scaled to <= clip in place.
    For CPU gradients of one dtype (every shipped model) its foreach path op for op, the same floats, without its
    per-call grouping and checks (a large share of a small model's step)."""
    grads = [p.grad for p in params]
    if any(g is None for g in grads) or len({(g.device, g.dtype) for g in grads}) != 1 or grads[0].device.type != "cpu":
        torch.nn.utils.clip_grad_norm_(params, clip)
        return
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(float(clip) / (total + 1e-6), max=1.0))


def local_sgd(model: nn.Module, w: np.ndarray, shard: Shard, lr: float, batch_size: int, gen: torch.Generator,
              steps: int | None = None, epochs: int | None = None, clip: float = 0.0) -> tuple[np.ndarray, float, int]:
    """Plain SGD from `w`: `steps` random mini-batches, or `epochs` passes over shuffled data; with
    clip > 0 every mini-batch gradient is scaled to L2 norm <= clip first (paper 000's G).

    Returns (new weights, mean mini-batch loss, steps taken)."""
    set_flat(model, w)
    model.train()
    params = list(model.parameters())
    device = params[0].device
    total, count = 0.0, 0
    for idx in _batches(len(shard), batch_size, steps, epochs, gen):
        for p in params:
            p.grad = None
        x, y = batch_on(device, shard, idx)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        total += float(loss.detach())
        count += 1
        if clip > 0:
            clip_norm_(params, clip)
        with torch.no_grad():
            torch._foreach_add_(params, [p.grad for p in params], alpha=-lr)
    return get_flat(model), (total / count if count else float("nan")), count


def local_dp_sgd(model: nn.Module, w: np.ndarray, shard: Shard, phase: Mapping[str, float], noise: Instruction | None,
                 gen, node: str, round_: int, clip_scale: float = 1.0
                 ) -> tuple[np.ndarray, float, DpRecord]:
    """A local_dp_sgd phase (plans.local_dp_sgd) with the round plan's device-sample noise instruction: its shape
    (gaussian or wavelet_gaussian), calibration and multiplier select DP-SGD or DP-SGD-WAV
    (privacy.per_example.dp_sgd), and the DP event it releases: `steps` subsampled Gaussians at the multiplier the
    noise really gives (for the paper's wavelet clip, sigma / max_c W_c). `clip_scale`: a round's clip under a
    schedule (privacy.schedules), C_r = C x clip_scale. DP-SGD runs on the CPU (its noise, lots and per-example
    clipping are built there): a model on a GPU is copied to the CPU for the call."""
    if model_device(model).type != "cpu":
        model = copy.deepcopy(model).cpu()
    clips = [phase[f"clip_{j}"] * clip_scale for j in range(len(phase)) if f"clip_{j}" in phase]
    if noise is None or not noise.multiplier > 0:
        raise ValueError("a local_dp_sgd phase needs a device-sample noise instruction with multiplier > 0 in the "
                         "round plan")
    w, loss, info = dp_sgd(model, w, shard, lr=float(phase["lr"]), steps=int(phase["steps"]), q=float(phase["q"]),
                           clip=float(phase["clip"]) * clip_scale, noise_multiplier=noise.multiplier,
                           mechanism=noise.shape.config, generator=gen, lot="fixed" if phase.get("fixed") else "poisson",
                           calibration=noise.calibration, layer_bounds=clips or None,
                           wavelet_scope="per_layer" if phase.get("per_layer") else "flat",
                           optimizer=optimizers.from_code(phase.get("optimizer", optimizers.code("sgd"))))
    fixed = info["lot"] == "fixed" and info["sampling_rate"] < 1.0
    record = DpRecord(tier="device-sample", node=node, covers=(node,), mechanism="gaussian",
                      noise_multiplier=info.get("effective_noise_multiplier", info["accounting_noise_multiplier"]),
                      sensitivity=info["sensitivity"],
                      sampling_rate=info["lot_size"] / info["dataset_size"] if fixed else info["sampling_rate"],
                      count=max(1, info["steps"]), round=round_, stream="sample",
                      population=info["dataset_size"] if fixed else 0)
    return w, loss, record


def minibatch_gradient(model: nn.Module, w: np.ndarray, shard: Shard, batch_size: int, gen: torch.Generator
                       ) -> tuple[np.ndarray, float]:
    """Gradient of the mean loss over one uniformly drawn mini-batch, as a flat float32 vector."""
    set_flat(model, w)
    model.train()
    idx = torch.randperm(len(shard), generator=gen)[:batch_size]
    loss = _loss_and_backward(model, shard, idx)
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return grad.cpu().numpy().astype(np.float32, copy=True), loss


def smoothness(model: nn.Module, w_a: np.ndarray, w_b: np.ndarray, shard: Shard, batch_size: int,
               gen: torch.Generator) -> float:
    """||g(w_b) - g(w_a)|| / ||w_b - w_a||, both gradients on one mini-batch: this device's estimate of the
    smoothness beta along its own step (digest 000 section 10, for H2FDP(ctrl)); 0 when w_a == w_b."""
    step = float(np.linalg.norm(w_b.astype(np.float64) - w_a.astype(np.float64)))
    if not step > 0:
        return 0.0
    idx = torch.randperm(len(shard), generator=gen)[:batch_size]
    grads = []
    for w in (w_a, w_b):
        set_flat(model, w)
        model.train()
        _loss_and_backward(model, shard, idx)
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    return float(torch.linalg.norm(grads[1] - grads[0])) / step
