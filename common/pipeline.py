"""The staged pipeline every uplink and downlink passes, built from registries of pure functions.

    clip -> device noise -> encode -> [wire] -> decode -> channel -> aggregate -> edge noise -> encode -> backhaul

Vector stages are `fn(vec, rng, **params) -> vec`; channels are the same shape and act on the
received (dequantized) values; aggregators are `fn(vectors, weights) -> vec`. Later mechanisms
register here by name without touching the services.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from hfl.proto import hfl_v1_pb2 as pb

from . import wire
from .registry import Registry
from .seeding import numpy_rng

VectorStage = Callable[..., np.ndarray]

VECTOR_STAGES: Registry = Registry("pipeline stage")
CHANNELS: Registry = Registry("channel")
AGGREGATORS: Registry = Registry("aggregator")

IDENTITY_NAMES = {"identity", "ideal", "float32"}


@VECTOR_STAGES.register("identity")
def identity(vec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return vec


CHANNELS.register("ideal", identity)


@AGGREGATORS.register("weighted_mean")
def weighted_mean(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum_i w_i x_i / sum_i w_i, accumulated in float64 in the given (sorted) order."""
    w = np.asarray(weights, dtype=np.float64)
    if len(vectors) == 0 or w.sum() <= 0:
        raise ValueError("weighted_mean needs at least one vector with positive weight")
    acc = np.zeros(vectors[0].shape, dtype=np.float64)
    for vec, weight in zip(vectors, w):
        acc += weight * vec
    return (acc / w.sum()).astype(np.float32)


@dataclass(frozen=True)
class StageRef:
    slot: str
    name: str
    params: Mapping[str, float] = field(default_factory=dict)

    def record(self, tier: str, bits: int = 0) -> pb.Transform:
        return pb.Transform(stage=self.slot, name=self.name, tier=tier, bits=bits,
                            params={k: float(v) for k, v in self.params.items()})


def _ref(slot: str, name: str, params: Mapping[str, Mapping[str, float]]) -> StageRef:
    return StageRef(slot, name, dict(params.get(name, {})))


@dataclass(frozen=True)
class Link:
    """One direction of one hop: sender stages (clip, noise, encode) and receiver stages (decode, channel)."""

    tier: str
    clip: StageRef
    noise: StageRef
    encoding: str
    channel: StageRef

    @classmethod
    def from_config(cls, pipeline, hop: str) -> "Link":
        p = pipeline.params
        if hop == "uplink":
            return cls("device", _ref("clip", pipeline.clip, p), _ref("device_noise", pipeline.device_noise, p),
                       pipeline.uplink_encoding, _ref("channel", pipeline.uplink_channel, p))
        if hop == "backhaul":
            return cls("edge", _ref("clip", "identity", p), _ref("edge_noise", pipeline.edge_noise, p),
                       pipeline.backhaul_encoding, _ref("backhaul", pipeline.backhaul_channel, p))
        if hop == "downlink":
            return cls("cloud", _ref("clip", "identity", p), _ref("noise", "identity", p),
                       pipeline.downlink_encoding, _ref("channel", "ideal", p))
        raise ValueError(f"unknown hop {hop!r}")

    def send(self, vec: np.ndarray, tensor_name: str, seed: int, node: int | str, round_: int, step: int
             ) -> tuple[pb.Tensor, list[pb.Transform]]:
        transforms = []
        for ref in (self.clip, self.noise):
            if ref.name not in IDENTITY_NAMES:
                rng = numpy_rng(seed, self.tier, node, round_, step, ref.slot)
                vec = VECTOR_STAGES.get(ref.name)(vec, rng, **ref.params)
                transforms.append(ref.record(self.tier))
        tensor = wire.encode(vec, self.encoding, tensor_name)
        if self.encoding not in IDENTITY_NAMES:
            transforms.append(StageRef("encode", self.encoding).record(self.tier, len(tensor.data) * 8))
        return tensor, transforms

    def receive(self, tensor: pb.Tensor, expected_len: int, seed: int, node: int | str, round_: int, step: int
                ) -> tuple[np.ndarray, list[pb.Transform]]:
        vec = wire.decode_vector(tensor, expected_len)
        transforms = []
        if self.channel.name not in IDENTITY_NAMES:
            rng = numpy_rng(seed, self.tier, node, round_, step, self.channel.slot)
            vec = CHANNELS.get(self.channel.name)(vec, rng, **self.channel.params)
            transforms.append(self.channel.record(self.tier))
        return vec, transforms


def aggregate(name: str, vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    return AGGREGATORS.get(name)(vectors, weights)
