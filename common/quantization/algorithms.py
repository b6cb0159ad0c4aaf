"""Paper 004's relay-mode algorithms (SQ-FL, DPSQ-FL and its FWO / CSO variants, LaplaceSQ-FL), registered in
plans.ALGORITHMS."""
from __future__ import annotations

from hfl.common.plans import ALGORITHMS, CLOUD_SYNC, EDGE_MODEL_SYNC, Algorithm, local_sgd, phase
from hfl.proto import hfl_v1_pb2 as pb


def quantized_fl(cfg) -> list[pb.Phase]:
    """Paper 004, Algorithm 1 on the hierarchy: every drawn device runs L = gamma local SGD steps from the global
    model, clips (pipeline.clip = "clip_l1") and quantizes its model difference with its own b_m; edges relay each
    upload unchanged (digest 004 P13) and the cloud fuses them with weights omega (uniform, FWO, FedHQ-like)."""
    return [local_sgd(cfg.train), phase(EDGE_MODEL_SYNC), phase(CLOUD_SYNC)]


for _name, _codecs, _fusion, _clusters, _ref in (
        ("sq-fl", ("sq",), "uniform", "random", "paper 004 baseline SQ-FL: Algorithm 1 with the plain b-bit SQ"),
        ("dpsq-fl", ("dpsq",), "uniform", "random", "paper 004, Algorithm 1 (omega = 1/N, random cluster sizes)"),
        ("dpsq-fl-fwo", ("dpsq",), "fwo", "random", "paper 004, Algorithm 1 + FWO (eq. 14)"),
        ("dpsq-fl-fwo-cso", ("dpsq",), "fwo", "cso", "paper 004, Algorithm 1 + FWO + CSO (eq. 27)"),
        ("laplacesq-fl", ("laplace-sq",), "fedhq", "random",
         "paper 004 baseline LaplaceSQ-FL (FedHQ-like weights; absolute numbers not reproducible, digest P4)")):
    ALGORITHMS.register(_name, Algorithm(_name, quantized_fl, "devices", "fusion", _ref, mode="relay", codecs=_codecs,
                                         fusion=_fusion, clusters=_clusters))
