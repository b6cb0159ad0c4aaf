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
from .wavelet import WaveletLayout, effective_multiplier, wavelet_clip, wavelet_gaussian

DP_STAGE = "dp_event"


def stream_of(phases: Sequence[pb.Phase], step: int) -> str:
    """H2FDP's two streams: a model sync followed by the cloud sync is the global upload, any other local."""
    return "global" if step + 1 < len(phases) and phases[step + 1].kind == "cloud_sync" else "local"


# Noise shapes a round plan can name (param `noise_shape`, an index here): the noise added and the multiplier it
# really gives against the clip the same plan enforces (enforce_clip), which is what the DP event records.
NOISE_SHAPES = ("gaussian", "laplace", "wavelet")
_EVENT_MECHANISM = {"gaussian": "gaussian", "laplace": "laplace", "wavelet": "gaussian"}


def shape_params(mechanism: str, wavelet: str = "") -> dict[str, float]:
    """Plan params for privacy.mechanism; `wavelet` "paper" selects paper 002's clip ||H|| <= C (digest P1)."""
    if mechanism not in NOISE_SHAPES:
        raise ValueError(f"mechanism must be one of {', '.join(NOISE_SHAPES)}, got {mechanism!r}")
    return {"noise_shape": float(NOISE_SHAPES.index(mechanism)), "wavelet_paper": float(wavelet == "paper")}


def shape_of(plan: Mapping[str, float]) -> str:
    index = plan.get("noise_shape", 0.0)
    if index not in range(len(NOISE_SHAPES)):
        raise ValueError(f"noise_shape must be an index into {NOISE_SHAPES}, got {index!r}")
    return NOISE_SHAPES[int(index)]


def _wavelet_calibration(plan: Mapping[str, float]) -> str:
    return "paper" if plan.get("wavelet_paper", 0.0) else "sound"


def _add_wavelet(vec: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    return wavelet_gaussian(vec, std, WaveletLayout([len(vec)]), rng)


_ADD = {"gaussian": add_gaussian, "laplace": add_laplace, "wavelet": _add_wavelet}


def apply_noise(vec: np.ndarray, plan: Mapping[str, float], stream: str, rng: np.random.Generator,
                ) -> tuple[np.ndarray, float, float]:
    """Add the noise the cluster plan names for `stream`; returns (vector, the noise multiplier it really gives,
    sensitivity), multiplier 0 when the plan adds none. Wavelet noise (paper 002 Alg. 2, the flat scope) has std
    z S / W_c on coefficient c; against the paper's clip that is z / max_c W_c (effective_multiplier)."""
    z, sens = float(plan.get(f"noise_z_{stream}", 0.0)), float(plan.get(f"noise_sens_{stream}", 0.0))
    if z <= 0 or sens <= 0:
        return vec, 0.0, 0.0
    shape = shape_of(plan)
    out = _ADD[shape](vec, z * sens, rng).astype(np.float32)
    if shape == "wavelet":
        z = effective_multiplier(z, WaveletLayout([len(vec)]), _wavelet_calibration(plan))
    return out, z, sens


def mean_sensitivity(plan: Mapping[str, float], stream: str, weights: Sequence[float], planned: int
                     ) -> dict[str, float]:
    """The plan with `stream`'s sensitivity for the weighted mean really taken. The plan's figure assumes `planned`
    equal-weight contributors (2 eta m G / s_c); replacing one device's data moves a weighted mean of uploads
    clipped to eta m G by 2 eta m G max_i w_i / sum_i w_i, which is larger with fewer contributors (dropouts,
    timeouts, refusals) or unequal weights. The multiplier z stays as planned, so the charge does too; the noise
    std grows with the true sensitivity."""
    key = f"noise_sens_{stream}"
    w = np.asarray(weights, dtype=np.float64)
    if key not in plan or w.size == 0 or not w.sum() > 0:
        return dict(plan)
    factor = max(1.0, planned * float(w.max() / w.sum()))
    return {**plan, key: float(plan[key]) * factor}


def check_device_records(records: Sequence[DpRecord], plan: Mapping[str, float], node: str, stream: str,
                         expected: bool) -> None:
    """A device's DP events against what the round plan told it to add: the edge refuses an event that states
    another multiplier, sensitivity, mechanism, stream or count (a forged z would make the cloud's ledger charge
    what the device chose), and an upload that omits the noise the plan requires."""
    device = [r for r in records if r.tier == "device"]
    if not expected:
        if device:
            raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node} reports device noise the plan did not ask for",
                            "bad_dp_event")
        return
    z, sens = float(plan.get(f"noise_z_{stream}", 0.0)), float(plan.get(f"noise_sens_{stream}", 0.0))
    want = (_EVENT_MECHANISM[shape_of(plan)], stream, 1, (node,))
    ok = len(device) == 1 and (device[0].mechanism, device[0].stream, device[0].count, device[0].covers) == want \
        and np.isclose(device[0].noise_multiplier, z, rtol=1e-9) and np.isclose(device[0].sensitivity, sens, rtol=1e-9)
    if not ok:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"{node}'s DP event does not match the plan (z {z:.6g}, sensitivity {sens:.6g}, {stream})",
                        "bad_dp_event")


def device_release(delta: np.ndarray, plan: Mapping[str, float], stream: str, rng: np.random.Generator,
                   node: str, round_: int) -> tuple[np.ndarray, list[DpRecord]]:
    """What the round plan asks of a device's upload (the device's code and the audit's): DP-FedAvg clips it to
    S; behind an untrusted edge the device adds its own noise draw (paper 000) and records the DP event."""
    if not plan:
        return delta, []
    if "fixed_denominator" in plan:
        delta, _ = enforce_clip(delta, plan)
    if plan.get("trusted", 0.0) == 1.0:
        return delta, []
    delta, z, sens = apply_noise(delta, plan, stream, rng)
    if not z:
        return delta, []
    return delta, [record("device", node, [node], plan, z, sens, round_, stream)]


def edge_release(agg: np.ndarray, plan: Mapping[str, float], stream: str, rng: np.random.Generator,
                 weights: Sequence[float], planned: int, edge: str, contributors: Sequence[str], round_: int
                 ) -> tuple[np.ndarray, list[DpRecord]]:
    """A trusted edge's noise on its aggregate (the edge's code and the audit's): the fixed-denominator sum of
    DP-FedAvg at its planned sensitivity, a mean at the sensitivity of the contributors really aggregated
    (mean_sensitivity); the release is charged to the contributors, unsampled."""
    if "fixed_denominator" not in plan:
        plan = mean_sensitivity(plan, stream, weights, planned)
    agg, z, sens = apply_noise(agg, plan, stream, rng)
    if not (z and len(contributors)):
        return agg, []
    return agg, [record("edge", edge, contributors, plan, z, sens, round_, stream)]


def record(tier: str, node: str, covers: Iterable[str], plan: Mapping[str, float], z: float, sens: float,
           round_: int, stream: str, sampling_rate: float = 1.0) -> DpRecord:
    return DpRecord(tier=tier, node=node, covers=tuple(covers), mechanism=_EVENT_MECHANISM[shape_of(plan)],
                    noise_multiplier=z, sensitivity=sens, sampling_rate=sampling_rate, count=1, round=round_,
                    stream=stream)


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
        key = (r.tier, r.mechanism, r.stream, r.noise_multiplier, r.sensitivity, r.sampling_rate, r.round, r.population)
        nodes.setdefault(key, r.node if r.tier == "edge" else "devices")
        for d in r.covers:
            per_device[key][d] += r.count
    out = []
    for key, counts in sorted(per_device.items()):
        by_count: dict[int, list[str]] = collections.defaultdict(list)
        for device, n in counts.items():
            by_count[n].append(device)
        tier, mechanism, stream, z, sens, rate, round_, population = key
        for n, devices in sorted(by_count.items()):
            out.append(DpRecord(tier=tier, node=nodes[key], covers=tuple(sorted(devices)), mechanism=mechanism,
                                noise_multiplier=z, sensitivity=sens, sampling_rate=rate, count=n, round=round_,
                                stream=stream, population=population))
    return out


def enforce_clip(vec: np.ndarray, plan: Mapping[str, float]) -> tuple[np.ndarray, bool]:
    """An update clipped to the plan's `delta_clip` in the norm its noise shape is calibrated for: L2, or for
    wavelet noise ||W (.) HWT(v)|| (sound) or ||HWT(v)|| (paper). A device applies it to its own update, a
    trusted edge to what it receives (an upload over the bound is clipped and counted)."""
    bound = float(plan.get("delta_clip", 0.0))
    if not bound > 0:
        return vec, False
    if shape_of(plan) == "wavelet":
        return wavelet_clip(vec, bound, WaveletLayout([len(vec)]), _wavelet_calibration(plan))
    return clip_l2(vec, bound)


def device_is_private(cfg) -> bool:
    """Does a device of this run send only noised statistics of its data (a DP algorithm, or a DP codec)?"""
    from hfl.common import plans, wire

    return bool(plans.ALGORITHMS.get(cfg.run.algorithm).privacy) or \
        getattr(wire.CODECS.get(cfg.pipeline.uplink_encoding), "private", False)
