"""The private algorithms' round plans (papers 000 and 002, DP-FedAvg, DP-SGD), registered in plans.ALGORITHMS."""
from __future__ import annotations

from hfl.common.plans import (ALGORITHMS, CLOUD_SYNC, EDGE_MODEL_SYNC, LOCAL_DP_SGD, LOCAL_SGD, Algorithm, dp_sgd_steps,
                              local_sgd, phase)
from hfl.proto import hfl_v1_pb2 as pb

from . import optimizers
from .config import effective


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


def local_dp_sgd(cfg) -> pb.Phase:
    """A local phase of sample-level DP-SGD; the noise (shape, calibration, multiplier) comes with the cluster plan's
    device-sample instruction (the cloud calibrates it), everything else is here. Parameters are numbers:
    `per_layer` / `fixed` are 0 or 1, per-layer clips are clip_0, clip_1, ..."""
    p = effective(cfg.privacy, ALGORITHMS.get(cfg.run.algorithm))
    if dp_sgd_steps(cfg.train, p.lot_rate) < 1 or cfg.train.tau < 1:
        raise ValueError(f"{cfg.run.algorithm}: train.gamma ({cfg.train.gamma}) and train.tau ({cfg.train.tau}) must be "
                         ">= 1 (DP-SGD steps per edge round, edge rounds per cloud round)")
    params = dict(lr=cfg.train.lr, steps=dp_sgd_steps(cfg.train, p.lot_rate), q=p.lot_rate, clip=p.clip,
                  fixed=float(p.lot == "fixed"), per_layer=float(p.wavelet_scope == "per_layer"),
                  optimizer=optimizers.code(p.optimizer))
    params.update({f"clip_{j}": c for j, c in enumerate(p.layer_clips)})
    return phase(LOCAL_DP_SGD, **params)


def dp_sgd(cfg) -> list[pb.Phase]:
    """Sample-level DP-SGD (Abadi et al. 2016) or DP-SGD-WAV (paper 002, Alg. 1) on every device, in HierFAVG's
    schedule: tau edge rounds of (gamma DP-SGD steps -> edge model sync), then cloud sync. The edges and the
    cloud only average: every model delta a device sends is already private at sample level."""
    return [local_dp_sgd(cfg), phase(EDGE_MODEL_SYNC)] * cfg.train.tau + [phase(CLOUD_SYNC)]


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
