"""Round plans as data: each algorithm is a function from the config to a list of phases."""
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


def h2fdp(cfg) -> list[pb.Phase]:
    """H2FDP without control (paper 000, Alg. 2 as made implementable in the digest, section 2): tau SGD
    steps per global round with every minibatch gradient clipped to G (privacy.clip), a local
    aggregation every m = gamma steps; the global aggregation subsumes the last local one, so
    K_l = tau / m - 1 (digest section 10). Who adds noise is per cluster data (RoundTask.clusters)."""
    m, tau = cfg.train.gamma, cfg.train.tau
    if m < 1 or tau < m or tau % m:
        raise ValueError(f"{cfg.run.algorithm}: train.tau ({tau}) must be a positive multiple of train.gamma ({m}), "
                         "the local aggregation period m")
    window = [phase(LOCAL_SGD, lr=cfg.train.lr, steps=m, clip=cfg.privacy.clip), phase(EDGE_MODEL_SYNC)]
    return window * (tau // m) + [phase(CLOUD_SYNC)]


def dp_fedavg(cfg) -> list[pb.Phase]:
    """User-level DP-FedAvg (McMahan et al. 2018; paper 002 P8, P9) with each trusted edge as the
    aggregator of its cluster: local training, one update per sampled device clipped to S, the edge's
    fixed-denominator sum plus noise, then the cloud's mean over clusters."""
    return [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC), phase(CLOUD_SYNC)]


def dp_sgd_steps(train, lot_rate: float) -> int:
    """Local DP-SGD steps per local phase: train.gamma steps, or gamma epochs as ceil(gamma / q) lots."""
    return int(train.gamma) if train.local_unit != "epochs" else math.ceil(train.gamma / lot_rate - 1e-9)


def local_dp_sgd(cfg) -> pb.Phase:
    """A local phase of sample-level DP-SGD; the noise multiplier comes with the cluster plan (the cloud
    calibrates it), everything else is here. Parameters are numbers: `wavelet` / `paper` / `per_layer` / `fixed`
    are 0 or 1, per-layer clips are clip_0, clip_1, ..."""
    from hfl.common.privacy import optimizers
    from hfl.common.privacy.config import effective, wavelet_calibration

    p = effective(cfg.privacy, ALGORITHMS.get(cfg.run.algorithm))
    if dp_sgd_steps(cfg.train, p.lot_rate) < 1 or cfg.train.tau < 1:
        raise ValueError(f"{cfg.run.algorithm}: train.gamma ({cfg.train.gamma}) and train.tau ({cfg.train.tau}) must be "
                         ">= 1 (DP-SGD steps per edge round, edge rounds per cloud round)")
    params = dict(lr=cfg.train.lr, steps=dp_sgd_steps(cfg.train, p.lot_rate), q=p.lot_rate, clip=p.clip,
                  fixed=float(p.lot == "fixed"), wavelet=float(p.mechanism == "wavelet"),
                  paper=float(wavelet_calibration(p) == "paper"), per_layer=float(p.wavelet_scope == "per_layer"),
                  optimizer=optimizers.code(p.optimizer))
    params.update({f"clip_{j}": c for j, c in enumerate(p.layer_clips)})
    return phase(LOCAL_DP_SGD, **params)


def dp_sgd(cfg) -> list[pb.Phase]:
    """Sample-level DP-SGD (Abadi et al. 2016) or DP-SGD-WAV (paper 002, Alg. 1) on every device, in HierFAVG's
    schedule: tau edge rounds of (gamma DP-SGD steps -> edge model sync), then cloud sync. The edges and the
    cloud only average: every model delta a device sends is already private at sample level."""
    return [local_dp_sgd(cfg), phase(EDGE_MODEL_SYNC)] * cfg.train.tau + [phase(CLOUD_SYNC)]


def quantized_fl(cfg) -> list[pb.Phase]:
    """Paper 004, Algorithm 1 on the hierarchy: every drawn device runs L = gamma local SGD steps from the global
    model, clips (pipeline.clip = "clip_l1") and quantizes its model difference with its own b_m; edges relay each
    upload unchanged (digest 004 P13) and the cloud fuses them with weights omega (uniform, FWO, FedHQ-like)."""
    return [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC), phase(CLOUD_SYNC)]


ALGORITHMS.register("hierfavg", Algorithm("hierfavg", hierfavg, "samples", "samples", "Liu et al., ICC 2020"))
ALGORITHMS.register("fedavg", Algorithm("fedavg", fedavg, "samples", "samples",
                                        "McMahan et al., AISTATS 2017 (FedAvg); edges pass through"))
ALGORITHMS.register("qhetfed", Algorithm("qhetfed", qhetfed, "devices", "devices", "paper 001, Algorithm 1"))
ALGORITHMS.register("qhetfed-gamma1", Algorithm("qhetfed-gamma1", qhetfed_gamma1, "devices", "devices",
                                                "paper 001, Corollary 2 (gamma = 1)"))
ALGORITHMS.register("hier-local-qsgd", Algorithm("hier-local-qsgd", hier_local_qsgd, "devices", "devices",
                                                 "paper 001, Algorithm 2 (Liu et al. TWC 2023), 1/N fix"))
ALGORITHMS.register("h2fdp", Algorithm("h2fdp", h2fdp, "devices", "equal", "paper 000, Algorithm 2", "by_trust"))
ALGORITHMS.register("hfl-dp", Algorithm("hfl-dp", h2fdp, "devices", "equal", "paper 000 baseline: every edge untrusted",
                                        "by_trust", trust="untrusted"))
ALGORITHMS.register("pedpfl-style", Algorithm("pedpfl-style", h2fdp, "devices", "equal",
                                              "paper 000 baseline: star-LDP (PEDPFL-style), one cluster, local DP",
                                              "by_trust", trust="untrusted", max_edges=1))
ALGORITHMS.register("dp-fedavg", Algorithm("dp-fedavg", dp_fedavg, "samples", "equal",
                                           "McMahan et al. 2018, user-level DP at a trusted aggregator", "aggregator"))
ALGORITHMS.register("dp-fedavg-wav", Algorithm("dp-fedavg-wav", dp_fedavg, "samples", "equal",
                                               "paper 002, Algorithm 2: DP-FedAvg with wavelet-domain noise at a "
                                               "trusted aggregator", "aggregator", noise="wavelet"))
ALGORITHMS.register("dp-sgd", Algorithm("dp-sgd", dp_sgd, "samples", "samples",
                                        "Abadi et al. 2016 on every device (paper 002's vanilla baseline)", "sample"))
ALGORITHMS.register("dp-sgd-wav", Algorithm("dp-sgd-wav", dp_sgd, "samples", "samples",
                                            "paper 002, Algorithm 1 (DP-SGD-WAV) on every device", "sample",
                                            noise="wavelet"))
ALGORITHMS.register("dyn-dp-sgd", Algorithm("dyn-dp-sgd", dp_sgd, "samples", "samples",
                                            "Du et al. 2021 (arXiv:2111.00173): DP-SGD with a decaying clip and noise "
                                            "multiplier per round (paper 002's Dyn-DP-SGD baseline)", "sample",
                                            schedule="dyn"))
ALGORITHMS.register("dyn-dp-fedavg", Algorithm("dyn-dp-fedavg", dp_fedavg, "samples", "equal",
                                               "Du et al. 2021's schedule on DP-FedAvg at a trusted aggregator (paper "
                                               "002's Dyn-DP-FedAvg baseline)", "aggregator", schedule="dyn"))

for _name, _codecs, _fusion, _clusters, _ref in (
        ("sq-fl", ("sq",), "uniform", "random", "paper 004 baseline SQ-FL: Algorithm 1 with the plain b-bit SQ"),
        ("dpsq-fl", ("dpsq",), "uniform", "random", "paper 004, Algorithm 1 (omega = 1/N, random cluster sizes)"),
        ("dpsq-fl-fwo", ("dpsq",), "fwo", "random", "paper 004, Algorithm 1 + FWO (eq. 14)"),
        ("dpsq-fl-fwo-cso", ("dpsq",), "fwo", "cso", "paper 004, Algorithm 1 + FWO + CSO (eq. 27)"),
        ("laplacesq-fl", ("laplace-sq",), "fedhq", "random",
         "paper 004 baseline LaplaceSQ-FL (FedHQ-like weights; absolute numbers not reproducible, digest P4)")):
    ALGORITHMS.register(_name, Algorithm(_name, quantized_fl, "devices", "fusion", _ref, mode="relay", codecs=_codecs,
                                         fusion=_fusion, clusters=_clusters))


def multiairfed(cfg) -> list[pb.Phase]:
    """MultiAirFed (paper 003, Alg. 1 on the air, digest 2.3): tau intra-cluster OTA gradient slots, each device
    stepping with its own estimate of the cluster's mean gradient; gamma local steps; one inter-cluster OTA model
    slot whose estimate is each device's model for the next round."""
    return ([phase(AIR_GRADIENT_STEP, lr=cfg.train.lr, group=0)] * cfg.train.tau
            + [phase(LOCAL_SGD, lr=cfg.train.lr, steps=cfg.train.gamma), phase(AIR_MODEL_SYNC, group=1),
               phase(CLOUD_SYNC)])


def hierfed_ota(cfg) -> list[pb.Phase]:
    """HierFed on the air (paper 003's baseline, digest 10.12): tau x (gamma local steps + intra-cluster OTA model
    aggregation), then gamma local steps + the inter-cluster step: tau + 1 slots, as MultiAirFed."""
    local = phase(LOCAL_SGD, lr=cfg.train.lr, steps=cfg.train.gamma)
    return ([local, phase(AIR_MODEL_SYNC, group=0)] * cfg.train.tau
            + [local, phase(AIR_MODEL_SYNC, group=1), phase(CLOUD_SYNC)])


def fedsgd(cfg) -> list[pb.Phase]:
    """FedSGD (McMahan et al. 2017; paper 003's baseline, digest 10.12): tau + gamma global gradient steps, each the
    mean over the active devices of all C clusters. A closing inter-cluster model slot gives the cloud a model
    to evaluate (on orthogonal links every device already holds that model: the slot changes nothing)."""
    return ([phase(AIR_GRADIENT_STEP, lr=cfg.train.lr, group=1)] * (cfg.train.tau + cfg.train.gamma)
            + [phase(AIR_MODEL_SYNC, group=1), phase(CLOUD_SYNC)])


ALGORITHMS.register("multiairfed", Algorithm("multiairfed", multiairfed, "devices", "devices",
                                             "paper 003, Algorithm 1 (MultiAirFed)", mode="air"))
ALGORITHMS.register("hierfed-ota", Algorithm("hierfed-ota", hierfed_ota, "devices", "devices",
                                             "paper 003 baseline HierFed (model averaging at both levels)", mode="air"))
ALGORITHMS.register("fedsgd", Algorithm("fedsgd", fedsgd, "devices", "devices",
                                        "paper 003 baseline FedSGD (McMahan et al. 2017)", mode="air"))


def build_plan(cfg) -> list[pb.Phase]:
    plan = ALGORITHMS.get(cfg.run.algorithm).plan(cfg)
    if not plan or plan[-1].kind != CLOUD_SYNC:
        raise ValueError("a round plan must end with cloud_sync")
    return plan


def weights_rule(cfg, tier: str) -> str:
    algorithm = ALGORITHMS.get(cfg.run.algorithm)
    chosen = cfg.aggregation.edge_weights if tier == "edge" else cfg.aggregation.cloud_weights
    if chosen != "auto":
        return chosen
    return algorithm.edge_weights if tier == "edge" else algorithm.cloud_weights


def is_private(cfg) -> bool:
    return bool(ALGORITHMS.get(cfg.run.algorithm).privacy)


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
