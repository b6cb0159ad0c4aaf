"""Round plans as data: each algorithm is a function from the config to a list of phases."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hfl.proto import hfl_v1_pb2 as pb

from .registry import Registry

LOCAL_SGD = "local_sgd"
EDGE_GRADIENT_STEP = "edge_gradient_step"
EDGE_MODEL_SYNC = "edge_model_sync"
CLOUD_SYNC = "cloud_sync"
PHASE_KINDS = (LOCAL_SGD, EDGE_GRADIENT_STEP, EDGE_MODEL_SYNC, CLOUD_SYNC)
DEVICE_UPLOAD_PHASES = (EDGE_GRADIENT_STEP, EDGE_MODEL_SYNC)


@dataclass(frozen=True)
class Algorithm:
    name: str
    plan: Callable[[object], list[pb.Phase]]
    edge_weights: str   # "samples" | "devices": the paper's choice, used when the config says "auto"
    cloud_weights: str
    reference: str = ""


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


def qhetfed(cfg) -> list[pb.Phase]:
    """QHetFed (paper 001, Alg. 1) without quantization: tau edge gradient steps, gamma local steps,
    model deltas to the edge, cloud sync weighted by N_l / N."""
    return ([phase(EDGE_GRADIENT_STEP, lr=cfg.train.lr)] * cfg.train.tau
            + [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC), phase(CLOUD_SYNC)])


ALGORITHMS.register("hierfavg", Algorithm("hierfavg", hierfavg, "samples", "samples", "Liu et al., ICC 2020"))
ALGORITHMS.register("qhetfed", Algorithm("qhetfed", qhetfed, "devices", "devices", "paper 001, Algorithm 1"))


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
