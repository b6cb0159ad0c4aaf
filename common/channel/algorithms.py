"""Paper 003's air-mode algorithms (MultiAirFed and its baselines HierFed and FedSGD), registered in
plans.ALGORITHMS."""
from __future__ import annotations

from hfl.common.plans import (AIR_GRADIENT_STEP, AIR_MODEL_SYNC, ALGORITHMS, CLOUD_SYNC, LOCAL_SGD, Algorithm,
                              phase)
from hfl.proto import hfl_v1_pb2 as pb


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
