"""DP as it travels: the noise a device or edge adds by the round plan's noise instructions (instructions.py), and
the events it records on the message's `transforms` (stage "dp_event"), merged per cluster before they go up to the
cloud."""
from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

import grpc
import numpy as np

from hfl.proto import hfl_v1_pb2 as pb

from ..wire import WireError
from .events import DpRecord
from .instructions import Instruction, NoisePlan

DP_STAGE = "dp_event"


def stream_of(phases: Sequence[pb.Phase], step: int) -> str:
    """H2FDP's two streams: a model sync followed by the cloud sync is the global upload, any other local."""
    return "global" if step + 1 < len(phases) and phases[step + 1].kind == "cloud_sync" else "local"


def apply_noise(vec: np.ndarray, ins: Instruction | None, rng: np.random.Generator) -> tuple[np.ndarray, float, float]:
    """Add the noise an instruction states; returns (vector, the noise multiplier it really gives, sensitivity),
    multiplier 0 when there is none to add. The shape's multiplier against its clip can differ from the stated z
    (paper 002's wavelet clip: z / max_c W_c, shapes.FlatWaveletShape), and that is what the DP event records."""
    if ins is None or ins.multiplier <= 0 or ins.sensitivity <= 0:
        return vec, 0.0, 0.0
    out = ins.shape.add(vec, ins.multiplier * ins.sensitivity, rng).astype(np.float32)
    return out, ins.shape.effective(ins.multiplier, len(vec), ins.calibration), ins.sensitivity


def mean_sensitivity(ins: Instruction, weights: Sequence[float], planned: int) -> Instruction:
    """The instruction with its sensitivity for the weighted mean really taken. The plan's figure assumes `planned`
    equal-weight contributors (2 eta m G / s_c); replacing one device's data moves a weighted mean of uploads
    clipped to eta m G by 2 eta m G max_i w_i / sum_i w_i, which is larger with fewer contributors (dropouts,
    timeouts, refusals) or unequal weights. The multiplier z stays as planned, so the charge does too; the noise
    std grows with the true sensitivity."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not w.sum() > 0:
        return ins
    factor = max(1.0, planned * float(w.max() / w.sum()))
    return dataclasses.replace(ins, sensitivity=ins.sensitivity * factor)


def check_device_records(records: Sequence[DpRecord], ins: Instruction | None, node: str, stream: str) -> None:
    """A device's DP events against the device-tier instruction of its stream (None: the plan asks for no device
    noise): the edge refuses an event that states another multiplier, sensitivity, mechanism, stream or count (a
    forged z would make the cloud's ledger charge what the device chose), and an upload that omits the noise the
    plan requires."""
    device = [r for r in records if r.tier == "device"]
    if ins is None or not ins.multiplier > 0:
        if device:
            raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node} reports device noise the plan did not ask for",
                            "bad_dp_event")
        return
    want = (ins.mechanism, stream, 1, (node,))
    ok = len(device) == 1 and (device[0].mechanism, device[0].stream, device[0].count, device[0].covers) == want \
        and np.isclose(device[0].noise_multiplier, ins.multiplier, rtol=1e-9) \
        and np.isclose(device[0].sensitivity, ins.sensitivity, rtol=1e-9)
    if not ok:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"{node}'s DP event does not match the plan (z {ins.multiplier:.6g}, sensitivity "
                        f"{ins.sensitivity:.6g}, {stream})", "bad_dp_event")


def device_release(delta: np.ndarray, noise: NoisePlan, stream: str, rng: np.random.Generator,
                   node: str, round_: int) -> tuple[np.ndarray, list[DpRecord]]:
    """What the round plan's instructions ask of a device's upload (the device's code and the audit's): clip it
    where an instruction of its stream says the device enforces the clip (DP-FedAvg), add the device-tier noise of
    its stream (behind an untrusted edge, paper 000) and record the DP event."""
    clip = noise.clip_for("device", stream)
    if clip is not None:
        delta, _ = enforce_clip(delta, clip)
    ins = noise.get("device", stream)
    delta, z, sens = apply_noise(delta, ins, rng)
    if not z:
        return delta, []
    return delta, [record(ins, node, [node], z, sens, round_)]


def edge_release(agg: np.ndarray, ins: Instruction, rng: np.random.Generator, weights: Sequence[float], planned: int,
                 edge: str, contributors: Sequence[str], round_: int, mean: bool = True
                 ) -> tuple[np.ndarray, list[DpRecord]]:
    """An edge-tier instruction's noise on the cluster's aggregate (the edge's code and the audit's): a mean at the
    sensitivity of the contributors really aggregated (mean_sensitivity), DP-FedAvg's fixed-denominator sum
    (`mean` False) at its planned one; the release is charged to the contributors, unsampled."""
    if mean:
        ins = mean_sensitivity(ins, weights, planned)
    agg, z, sens = apply_noise(agg, ins, rng)
    if not (z and len(contributors)):
        return agg, []
    return agg, [record(ins, edge, contributors, z, sens, round_)]


def record(ins: Instruction, node: str, covers: Iterable[str], z: float, sens: float, round_: int,
           sampling_rate: float = 1.0) -> DpRecord:
    return DpRecord(tier=ins.tier, node=node, covers=tuple(covers), mechanism=ins.mechanism, noise_multiplier=z,
                    sensitivity=sens, sampling_rate=sampling_rate, count=1, round=round_, stream=ins.stream)


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


def enforce_clip(vec: np.ndarray, ins: Instruction) -> tuple[np.ndarray, bool]:
    """An update clipped to the instruction's bound in the norm its noise shape is calibrated for: L2, or for
    wavelet noise ||W (.) HWT(v)|| (sound) or ||HWT(v)|| (paper). A device applies it to its own update, an edge to
    what it receives (an upload over the bound is clipped and counted), as the instruction's clip_at says."""
    if not ins.clip > 0:
        return vec, False
    return ins.shape.clip(vec, ins.clip, ins.calibration)


class DeviceRelease:
    """A device's privacy in one round attempt, from its round plan: the clip and noise its model-sync uploads get
    (device_release), the secret draws of its DP-SGD lots and noise, and whether it may report training statistics
    (a private run's devices send nothing computed on their data without noise). Every draw is fresh per attempt:
    a repeated draw would cancel between two releases."""

    def __init__(self, noise: NoisePlan, phases: Sequence[pb.Phase], node: str, index: int, round_: int, attempt: int,
                 seed: int, source: str):
        self.noise, self.phases = noise, phases
        self.node, self.index, self.round, self.attempt = node, index, round_, attempt
        self.seed, self.source = seed, source

    def delta(self, delta: np.ndarray, step: int) -> tuple[np.ndarray, list[DpRecord]]:
        from hfl.common.secret_random import dp_numpy_rng

        rng = dp_numpy_rng(self.source, self.seed, "device", self.index, self.round, step, "dp_noise", self.attempt)
        return device_release(delta, self.noise, stream_of(self.phases, step), rng, self.node, self.round)

    def sgd_draws(self, step: int):
        """DP-SGD's lots and noise for the local phase `step`."""
        from hfl.common.secret_random import dp_draws

        return dp_draws(self.source, self.seed, "device", self.index, self.round, step, "dp_sgd", self.attempt)

    @property
    def sample_instruction(self) -> Instruction | None:
        return self.noise.get("device-sample", "sample")

    def reports_stats(self, step: int) -> bool:
        from hfl.common import plans

        return not self.phases[step].params.get(plans.WITHHOLD_STATS, 0.0)
