"""DP as it travels: the noise a device or edge adds by the round plan, and the events it records on
the message's `transforms` (stage "dp_event"), merged per cluster before they go up to the cloud."""
from __future__ import annotations

import collections
from typing import Iterable, Mapping, Sequence

import grpc
import numpy as np

from hfl.proto import hfl_v1_pb2 as pb

from ..wire import WireError
from .clipping import clip_l2
from .events import DpRecord
from .noise import add_gaussian, add_laplace

DP_STAGE = "dp_event"


def stream_of(phases: Sequence[pb.Phase], step: int) -> str:
    """H2FDP's two streams: a model sync followed by the cloud sync is the global upload, any other local."""
    return "global" if step + 1 < len(phases) and phases[step + 1].kind == "cloud_sync" else "local"


def apply_noise(vec: np.ndarray, plan: Mapping[str, float], stream: str, rng: np.random.Generator,
                ) -> tuple[np.ndarray, float, float]:
    """Add the noise the cluster plan names for `stream`; returns (vector, noise multiplier, sensitivity),
    multiplier 0 when the plan adds none."""
    z, sens = float(plan.get(f"noise_z_{stream}", 0.0)), float(plan.get(f"noise_sens_{stream}", 0.0))
    if z <= 0 or sens <= 0:
        return vec, 0.0, 0.0
    add = add_laplace if plan.get("laplace", 0.0) else add_gaussian
    return add(vec, z * sens, rng).astype(np.float32), z, sens


def record(tier: str, node: str, covers: Iterable[str], plan: Mapping[str, float], z: float, sens: float,
           round_: int, stream: str, sampling_rate: float = 1.0) -> DpRecord:
    mechanism = "laplace" if plan.get("laplace", 0.0) else "gaussian"
    return DpRecord(tier=tier, node=node, covers=tuple(covers), mechanism=mechanism, noise_multiplier=z,
                    sensitivity=sens, sampling_rate=sampling_rate, count=1, round=round_, stream=stream)


def to_transform(rec: DpRecord) -> pb.Transform:
    return pb.Transform(stage=DP_STAGE, name=rec.mechanism, tier=rec.tier, params=rec.to_transform_params())


def from_transforms(transforms: Iterable[pb.Transform], allowed: set[str] | None = None) -> list[DpRecord]:
    """The DP events a message carries; a malformed one, or one covering devices outside `allowed`, is refused."""
    out = []
    for t in transforms:
        if t.stage != DP_STAGE:
            continue
        try:
            rec = DpRecord.from_transform_params(dict(t.params))
        except (ValueError, KeyError, TypeError) as exc:
            raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed DP event: {str(exc)[:200]}", "bad_dp_event")
        if allowed is not None and not set(rec.covers) <= allowed:
            raise WireError(grpc.StatusCode.INVALID_ARGUMENT, "a DP event covers devices outside the sender's cluster",
                            "bad_dp_event")
        out.append(rec)
    return out


def merge(records: Iterable[DpRecord]) -> list[DpRecord]:
    """One record per (mechanism, tier, stream, noise, rate, releases per device), covering every device
    with exactly that many releases: the same per-device accounting in a few transforms per cluster."""
    per_device: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    nodes: dict[tuple, str] = {}
    for r in records:
        key = (r.tier, r.mechanism, r.stream, r.noise_multiplier, r.sensitivity, r.sampling_rate, r.round)
        nodes.setdefault(key, r.node if r.tier == "edge" else "devices")
        for d in r.covers:
            per_device[key][d] += r.count
    out = []
    for key, counts in sorted(per_device.items()):
        by_count: dict[int, list[str]] = collections.defaultdict(list)
        for device, n in counts.items():
            by_count[n].append(device)
        tier, mechanism, stream, z, sens, rate, round_ = key
        for n, devices in sorted(by_count.items()):
            out.append(DpRecord(tier=tier, node=nodes[key], covers=tuple(sorted(devices)), mechanism=mechanism,
                                noise_multiplier=z, sensitivity=sens, sampling_rate=rate, count=n, round=round_,
                                stream=stream))
    return out


def enforce_clip(vec: np.ndarray, bound: float) -> tuple[np.ndarray, bool]:
    """A trusted edge's check of what it receives: an upload over the bound is clipped (and counted)."""
    return clip_l2(vec, bound) if bound > 0 else (vec, False)
