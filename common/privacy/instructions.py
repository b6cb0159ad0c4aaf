"""The round plan's noise instructions (pb.NoiseInstruction): built by the cloud's placements, read as stated by
the edge and the device. Reading checks every field before anything runs, so a plan naming an unknown noise shape,
tier or calibration is refused whole at the receiver with its reason, and no noise of another shape is added."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from hfl.proto import hfl_v1_pb2 as pb

from .shapes import NOISE_SHAPES, NoiseShape
from .wavelet import CALIBRATIONS

TIERS = ("device", "edge", "device-sample")  # the DP event tiers a release can have
CLIP_TIERS = ("device", "edge")


class NoisePlanError(ValueError):
    """A round plan's noise instruction the receiver cannot execute as stated."""


@dataclass(frozen=True)
class Instruction:
    tier: str
    stream: str
    shape: NoiseShape
    multiplier: float
    sensitivity: float
    clip: float = 0.0
    clip_at: tuple[str, ...] = ()
    calibration: str = "sound"

    @property
    def mechanism(self) -> str:
        return self.shape.mechanism


def build(tier: str, stream: str, shape: str, multiplier: float, sensitivity: float, clip: float = 0.0,
          clip_at: Sequence[str] = (), calibration: str = "") -> pb.NoiseInstruction:
    """One instruction for the plan, checked as the receiver will check it."""
    ins = pb.NoiseInstruction(tier=tier, stream=stream, shape=shape, multiplier=multiplier, sensitivity=sensitivity,
                              clip=clip, clip_at=list(clip_at), calibration=calibration)
    parse(ins)
    return ins


def parse(ins: pb.NoiseInstruction, where: str = "") -> Instruction:
    def bad(what: str) -> NoisePlanError:
        return NoisePlanError(f"round plan{where}: noise instruction ({ins.tier or '?'}, {ins.stream or '?'}): {what}")

    if ins.shape not in NOISE_SHAPES:
        raise bad(f"unknown noise shape {ins.shape!r}; registered: {', '.join(NOISE_SHAPES)}")
    if ins.tier not in TIERS:
        raise bad(f"tier must be one of {', '.join(TIERS)}")
    if not ins.stream:
        raise bad("no stream")
    for name in ("multiplier", "sensitivity", "clip"):
        value = getattr(ins, name)
        if not (np.isfinite(value) and value >= 0):
            raise bad(f"{name} must be a finite number >= 0, got {value!r}")
    if not set(ins.clip_at) <= set(CLIP_TIERS) or (ins.clip_at and not ins.clip > 0):
        raise bad(f"clip_at must name tiers of {', '.join(CLIP_TIERS)} and needs clip > 0, got {list(ins.clip_at)}")
    calibration = ins.calibration or "sound"
    if calibration not in CALIBRATIONS:
        raise bad(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {ins.calibration!r}")
    return Instruction(ins.tier, ins.stream, NOISE_SHAPES.get(ins.shape), ins.multiplier, ins.sensitivity, ins.clip,
                       tuple(ins.clip_at), calibration)


class NoisePlan:
    """The releases one receiver executes, by (tier, stream)."""

    def __init__(self, instructions: Iterable[Instruction] = ()):
        self.by_key: dict[tuple[str, str], Instruction] = {}
        for ins in instructions:
            if (ins.tier, ins.stream) in self.by_key:
                raise NoisePlanError(f"round plan: two noise instructions for ({ins.tier}, {ins.stream})")
            self.by_key[(ins.tier, ins.stream)] = ins

    def get(self, tier: str, stream: str) -> Instruction | None:
        return self.by_key.get((tier, stream))

    def clip_for(self, tier: str, stream: str) -> Instruction | None:
        """The instruction of `stream` whose clip `tier` enforces, if any."""
        return next((i for i in self.by_key.values() if i.stream == stream and tier in i.clip_at), None)

    def __bool__(self) -> bool:
        return bool(self.by_key)


def _parsed(entries: Iterable[pb.NoiseInstruction], where: str) -> list[Instruction]:
    return [parse(ins, where) for ins in entries]


def read_cluster(plan: pb.ClusterPlan) -> NoisePlan:
    """The cluster's releases (for its edge); every device's own instructions are checked too."""
    for node, device in plan.devices.items():
        NoisePlan(_parsed(device.noise, f" of {node}"))
    return NoisePlan(_parsed(plan.noise, ""))


def read_device(plan: pb.ClusterPlan, node: str) -> NoisePlan:
    """A device's releases: the cluster's, its own entry overriding them by (tier, stream)."""
    own = _parsed(plan.devices[node].noise, f" of {node}") if node in plan.devices else []
    keys = {(i.tier, i.stream) for i in own}
    return NoisePlan([i for i in _parsed(plan.noise, "") if (i.tier, i.stream) not in keys] + own)
