"""The staged pipeline every uplink and downlink passes, built from registries of pure functions.

    clip -> device noise -> encode -> [wire] -> decode -> channel -> aggregate -> edge noise -> encode -> backhaul

Vector stages are `fn(vec, rng, **params) -> vec`; channels are the same shape and act on the
received (dequantized) values; aggregators are `fn(vectors, weights) -> vec`. Later mechanisms
register here by name without touching the services.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from hfl.proto import hfl_v1_pb2 as pb

from . import wire
from .registry import Registry
from .secret_random import dp_numpy_rng
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


@CHANNELS.register("awgn")
def awgn(vec: np.ndarray, rng: np.random.Generator, std: float = 0.0) -> np.ndarray:
    """y = x + n, n ~ N(0, std^2 I): the digital link of paper 004 (digest 004 section 3.6), added to the
    dequantized vector at the receiver."""
    if not (np.isfinite(std) and std >= 0):
        raise ValueError(f"awgn: std must be a finite number >= 0, got {std!r}")
    if std == 0:
        return vec
    return (vec.astype(np.float64) + std * rng.standard_normal(vec.shape)).astype(np.float32)


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

    def record(self, tier: str, bits: int = 0, extra: Mapping[str, float] | None = None) -> pb.Transform:
        return pb.Transform(stage=self.slot, name=self.name, tier=tier, bits=bits,
                            params={**_numeric(self.params), **(extra or {})})


def _numeric(params: Mapping[str, object]) -> dict[str, float]:
    """Transform params are doubles: a textual mode is kept as the key "name=value" with value 1."""
    out = {}
    for k, v in params.items():
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            out[k] = float(v)
        else:
            out[f"{k}={v}"] = 1.0
    return out


def _ref(slot: str, name: str, params: Mapping[str, Mapping[str, float]]) -> StageRef:
    return StageRef(slot, name, dict(params.get(name, {})))


def _encode_params(encoding: str, hop: str, params: Mapping[str, Mapping[str, object]],
                   defaults: Mapping[str, object] | None = None) -> dict:
    """[pipeline.params.CODEC] overridden by [pipeline.params.HOP_encoding] (e.g. uplink_encoding.levels = 4
    and backhaul_encoding.levels = 10 for QHetFed's s1, s2 on one codec), validated now so a bad key fails
    at start-up."""
    merged = {**(defaults or {}), **params.get(encoding, {}), **params.get(f"{hop}_encoding", {})}
    codec = wire.CODECS.get(encoding)
    if hasattr(codec, "params"):
        codec.params(**merged)
    return merged


@dataclass(frozen=True)
class Link:
    """One direction of one hop: sender stages (clip, noise, encode) and receiver stages (decode, channel)."""

    tier: str
    clip: StageRef
    noise: StageRef
    encoding: str
    channel: StageRef
    encode_params: Mapping[str, object] = field(default_factory=dict)
    # a private codec's coins (dpsq, laplace-sq) are DP randomness: secret unless the run replays them (seeded)
    dp_source: str = "secret"
    # a private codec's exact functions of the update (sq_error, q_measured, expected_distortion) stay on the
    # device unless FWO is told to take the device's word (precision.distortion_estimate = device, paper 004 P3)
    private_stats: bool = False

    @classmethod
    def device_uplink(cls, cfg) -> "Link":
        """A run's device -> edge link: [pipeline], with the first precision group's bits and epsilon1 as encode
        defaults under the codec's own parameters (each device's own come in its round plan, paper 004)."""
        p = cfg.precision
        defaults = {k: getattr(p, k)[0] for k in ("bits", "epsilon1") if getattr(p, k)}
        return dataclasses.replace(cls.from_config(cfg.pipeline, "uplink", defaults),
                                   dp_source=cfg.privacy.noise_source,
                                   private_stats=p.distortion_estimate == "device")

    @classmethod
    def from_config(cls, pipeline, hop: str, encode_defaults: Mapping[str, object] | None = None) -> "Link":
        p = pipeline.params
        if hop == "uplink":
            return cls("device", _ref("clip", pipeline.clip, p), _ref("device_noise", pipeline.device_noise, p),
                       pipeline.uplink_encoding, _ref("channel", pipeline.uplink_channel, p),
                       _encode_params(pipeline.uplink_encoding, hop, p, encode_defaults))
        if hop == "backhaul":
            return cls("edge", _ref("clip", "identity", p), _ref("edge_noise", pipeline.edge_noise, p),
                       pipeline.backhaul_encoding, _ref("backhaul", pipeline.backhaul_channel, p),
                       _encode_params(pipeline.backhaul_encoding, hop, p))
        if hop == "downlink":
            return cls("cloud", _ref("clip", "identity", p), _ref("noise", "identity", p),
                       pipeline.downlink_encoding, _ref("channel", "ideal", p),
                       _encode_params(pipeline.downlink_encoding, hop, p))
        raise ValueError(f"unknown hop {hop!r}")

    def send(self, vec: np.ndarray, tensor_name: str, seed: int, node: int | str, round_: int, step: int,
             overrides: Mapping[str, Mapping[str, object]] | None = None) -> tuple[pb.Tensor, list[pb.Transform]]:
        """`overrides` replaces parameters for this call only, keyed by slot: {"encode": {"bits": 2,
        "epsilon1": 1e-6}} (per-device precision from the round plan), or the clip / noise slot names."""
        overrides = dict(overrides or {})
        unknown = set(overrides) - {self.clip.slot, self.noise.slot, "encode"}
        if unknown:
            raise ValueError(f"overrides: unknown slot(s) {sorted(unknown)}; allowed: "
                             f"{self.clip.slot}, {self.noise.slot}, encode")
        transforms = []
        for ref in (self.clip, self.noise):
            if ref.slot in overrides:
                ref = StageRef(ref.slot, ref.name, {**ref.params, **overrides[ref.slot]})
            if ref.name not in IDENTITY_NAMES:
                rng = numpy_rng(seed, self.tier, node, round_, step, ref.slot)
                vec = VECTOR_STAGES.get(ref.name)(vec, rng, **ref.params)
                transforms.append(ref.record(self.tier))
        codec = wire.CODECS.get(self.encoding)
        params = {**self.encode_params, **overrides.get("encode", {})}
        private = getattr(codec, "private", False)
        if not getattr(codec, "draws", True):
            rng = None  # seeding a generator costs more than encoding a 116 KB float32 vector
        elif private:
            rng = dp_numpy_rng(self.dp_source, seed, self.tier, node, round_, step, "encode")
        else:
            rng = numpy_rng(seed, self.tier, node, round_, step, "encode")
        tensor = wire.encode(vec, self.encoding, tensor_name, rng, **params)
        if self.encoding not in IDENTITY_NAMES:
            extra = {}
            if getattr(codec, "quantizer", False) and (not private or self.private_stats):
                extra = {**_distortion(vec, codec.decode(tensor)), **codec.expected_stats(vec, **params)}
            used = codec.params(**params) if hasattr(codec, "params") else params
            transforms.append(StageRef("encode", self.encoding, used).record(self.tier, len(tensor.data) * 8, extra))
        return tensor, transforms

    def receive(self, tensor: pb.Tensor, expected_len: int, seed: int, node: int | str, round_: int, step: int,
                channel: StageRef | None = None) -> tuple[np.ndarray, list[pb.Transform]]:
        """`channel` replaces the link's channel stage for this call (a per-device link, e.g. paper 004's AWGN
        of std sigma_m); its random draw is keyed by the sender (`node`), wherever it is applied."""
        vec = wire.decode_vector(tensor, expected_len)
        transforms = []
        channel = channel or self.channel
        if channel.name not in IDENTITY_NAMES:
            rng = numpy_rng(seed, self.tier, node, round_, step, channel.slot)
            vec = CHANNELS.get(channel.name)(vec, rng, **channel.params)
            transforms.append(channel.record(self.tier))
        return vec, transforms


def _distortion(sent: np.ndarray, received: np.ndarray) -> dict[str, float]:
    """What quantization did to this message: squared error and q = ||Q(x) - x||^2 / ||x||^2 (digest 001, 9.6)."""
    x = np.asarray(sent, np.float64).ravel()
    err = np.asarray(received, np.float64).ravel() - x
    sq_error, energy = float(err @ err), float(x @ x)
    return {"sq_error": sq_error, "q_measured": sq_error / energy if energy > 0 else 0.0}


def aggregate(name: str, vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    return AGGREGATORS.get(name)(vectors, weights)
