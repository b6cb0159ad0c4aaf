"""Round plans as data: each algorithm is a function from the config to a list of phases.

The plain schedules (HierFAVG, FedAvg, QHetFed, Hier-Local-QSGD) are registered here; a family registers its own
algorithms from its package (privacy.algorithms, quantization.algorithms, channel.algorithms), so this module
imports none of them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from hfl.proto import hfl_v1_pb2 as pb

from .registry import Registry

LOCAL_SGD = "local_sgd"
LOCAL_DP_SGD = "local_dp_sgd"  # sample-level DP-SGD steps (paper 002): per-example clipping, noise once per lot
EDGE_GRADIENT_STEP = "edge_gradient_step"
EDGE_MODEL_SYNC = "edge_model_sync"
CLOUD_SYNC = "cloud_sync"
# over the air (paper 003): a normalised gradient or model per active device, through the medium; param
# group = 0: the cluster's edge re-broadcasts; 1: the core sums the C clusters (channel.plane)
AIR_GRADIENT_STEP = "air_gradient_step"
AIR_MODEL_SYNC = "air_model_sync"
PHASE_KINDS = (LOCAL_SGD, LOCAL_DP_SGD, EDGE_GRADIENT_STEP, EDGE_MODEL_SYNC, CLOUD_SYNC, AIR_GRADIENT_STEP,
               AIR_MODEL_SYNC)
LOCAL_PHASES = (LOCAL_SGD, LOCAL_DP_SGD)
AIR_PHASES = (AIR_GRADIENT_STEP, AIR_MODEL_SYNC)
DEVICE_UPLOAD_PHASES = (EDGE_GRADIENT_STEP, EDGE_MODEL_SYNC) + AIR_PHASES
ESTIMATE_BETA = "estimate_beta"  # a local_sgd param: 1 = also report a smoothness estimate from this window
WITHHOLD_STATS = "withhold_stats"  # an edge_model_sync param: 1 = the device sends no statistics of its data


@dataclass(frozen=True)
class Algorithm:
    name: str
    plan: Callable[[object], list[pb.Phase]]
    edge_weights: str   # "samples" | "devices": the paper's choice, used when the config says "auto"
    cloud_weights: str  # ... | "equal"
    reference: str = ""
    privacy: str = ""   # "" (no DP) | "by_trust" (H2FDP: noise at the trusted edge, else every device) | "aggregator"
    #                     | "sample" (DP-SGD on every device)
    trust: str = ""     # a level forced on every edge by the algorithm (HFL-DP: "untrusted")
    max_edges: int = 0  # star topologies: the algorithm needs exactly one cluster
    mode: str = "digital"  # common.modes.MODES: digital, relay (edges forward each device upload unchanged, the
    #                        cloud fuses them: paper 004, digest P13) or air (the cloud's wireless medium: paper 003)
    codecs: tuple[str, ...] = ()  # relay: the uplink codecs the algorithm is defined with (the first is suggested)
    fusion: str = ""     # relay: the cloud's fusion rule when precision.fusion = "auto" (quantization.fusion)
    clusters: str = ""   # relay: cluster sizes per round when precision.cluster_mode = "auto"
    noise: str = ""      # a privacy.mechanism forced by the algorithm (the -wav variants: "wavelet")
    schedule: str = ""   # privacy.schedules.SCHEDULES: how noise and clip change over the rounds ("" = constant)


ALGORITHMS: Registry = Registry("algorithm")


def phase(kind: str, **params: float) -> pb.Phase:
    if kind not in PHASE_KINDS:
        raise ValueError(f"unknown phase {kind!r}; allowed: {', '.join(PHASE_KINDS)}")
    return pb.Phase(kind=kind, params={k: float(v) for k, v in params.items()})


def local_sgd(train) -> pb.Phase:
    unit = "epochs" if train.local_unit == "epochs" else "steps"
    return phase(LOCAL_SGD, lr=train.lr, **{unit: train.gamma})


def hierfavg(cfg) -> list[pb.Phase]:
    """HierFAVG (Liu et al. 2020): tau edge rounds of (gamma local steps -> edge model sync), then cloud sync."""
    edge_round = [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC)]
    return edge_round * cfg.train.tau + [phase(CLOUD_SYNC)]


def fedavg(cfg) -> list[pb.Phase]:
    """FedAvg (McMahan et al. 2017): every device trains gamma local steps (or epochs: train.local_unit), one
    sample-weighted mean per cloud round. The edges pass through: each sends its cluster's sample-weighted mean
    with its sample count, so the cloud's mean is the flat FedAvg mean over all devices. train.tau is unused."""
    return [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC), phase(CLOUD_SYNC)]


def qhetfed(cfg) -> list[pb.Phase]:
    """QHetFed (paper 001, Alg. 1) without quantization: tau edge gradient steps, gamma local steps,
    model deltas to the edge, cloud sync weighted by N_l / N."""
    return ([phase(EDGE_GRADIENT_STEP, lr=cfg.train.lr)] * cfg.train.tau
            + [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC), phase(CLOUD_SYNC)])


def qhetfed_gamma1(cfg) -> list[pb.Phase]:
    """QHetFed for gamma = 1 (paper 001, Corollary 2): tau + 1 quantized edge gradient steps, no local phase;
    the edge sends Q2(tracker - w_t) to the cloud."""
    return [phase(EDGE_GRADIENT_STEP, lr=cfg.train.lr)] * (cfg.train.tau + 1) + [phase(CLOUD_SYNC)]


def hier_local_qsgd(cfg) -> list[pb.Phase]:
    """Hier-Local-QSGD (paper 001's Algorithm 2, ref [28]): tau edge rounds of gamma local steps and a
    Q1-quantized model-delta upload, the edge's model broadcast unquantized, then Q2 to the cloud with
    weights N_l / N (the digest's fix of the printed 1/N_l). Q1 and Q2 are the uplink and backhaul codecs."""
    return hierfavg(cfg)


def dp_sgd_steps(train, lot_rate: float) -> int:
    """Local DP-SGD steps per local phase: train.gamma steps, or gamma epochs as ceil(gamma / q) lots."""
    return int(train.gamma) if train.local_unit != "epochs" else math.ceil(train.gamma / lot_rate - 1e-9)


ALGORITHMS.register("hierfavg", Algorithm("hierfavg", hierfavg, "samples", "samples", "Liu et al., ICC 2020"))
ALGORITHMS.register("fedavg", Algorithm("fedavg", fedavg, "samples", "samples",
                                        "McMahan et al., AISTATS 2017 (FedAvg); edges pass through"))
ALGORITHMS.register("qhetfed", Algorithm("qhetfed", qhetfed, "devices", "devices", "paper 001, Algorithm 1"))
ALGORITHMS.register("qhetfed-gamma1", Algorithm("qhetfed-gamma1", qhetfed_gamma1, "devices", "devices",
                                                "paper 001, Corollary 2 (gamma = 1)"))
ALGORITHMS.register("hier-local-qsgd", Algorithm("hier-local-qsgd", hier_local_qsgd, "devices", "devices",
                                                 "paper 001, Algorithm 2 (Liu et al. TWC 2023), 1/N fix"))
def build_plan(cfg) -> list[pb.Phase]:
    plan = ALGORITHMS.get(cfg.run.algorithm).plan(cfg)
    if not plan or plan[-1].kind != CLOUD_SYNC:
        raise ValueError("a round plan must end with cloud_sync")
    if devices_private(cfg):  # no training loss or error statistics: they are computed on the data without noise
        for phase in plan:
            if phase.kind == EDGE_MODEL_SYNC:
                phase.params[WITHHOLD_STATS] = 1.0
    return plan


def weights_rule(cfg, tier: str) -> str:
    algorithm = ALGORITHMS.get(cfg.run.algorithm)
    chosen = cfg.aggregation.edge_weights if tier == "edge" else cfg.aggregation.cloud_weights
    if chosen != "auto":
        return chosen
    return algorithm.edge_weights if tier == "edge" else algorithm.cloud_weights


def is_private(cfg) -> bool:
    return bool(ALGORITHMS.get(cfg.run.algorithm).privacy)


def devices_private(cfg) -> bool:
    """Does a device of this run send only noised statistics of its data (a DP algorithm, or a DP codec)?"""
    from . import wire

    return is_private(cfg) or getattr(wire.CODECS.get(cfg.pipeline.uplink_encoding), "private", False)


def downlink_after(plan, step: int) -> bool:
    """Does the edge send the aggregate back to devices after phase `step`?

    Gradient steps always; a model sync only when devices go on training in this round
    (when cloud_sync comes next, the edge's result goes up to the cloud instead)."""
    kind = plan[step].kind
    if kind == EDGE_GRADIENT_STEP:
        return True
    if kind == EDGE_MODEL_SYNC:
        return step + 1 < len(plan) and plan[step + 1].kind != CLOUD_SYNC
    return False
