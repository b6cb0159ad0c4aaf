"""Per-device precision of paper 004, resolved by the cloud: which group each device is in (its b_m, epsilon_1,
sigma_m), the cluster sizes {c_m} of each round (all, random feasible, or CSO under the bit budget), the devices
drawn (c_m uniformly without replacement per group, digest 004 P7), and each drawn device's plan entry.

Pure functions of the config and a generator; the cloud calls them and sends the result in the round plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cluster_size

ALGORITHM_DEFAULT = "auto"


@dataclass(frozen=True)
class Groups:
    sizes: tuple[int, ...]
    bits: tuple[int, ...]
    epsilon1: tuple[float, ...] | None  # None: every device uses the codec's own epsilon1 (or has none)
    link_std: tuple[float, ...]
    clip: float | None                  # l1 clipping constant C of the uplink (pipeline.clip = "clip_l1"), if any

    def group_of(self, device_index: int) -> int:
        return int(np.searchsorted(np.cumsum(self.sizes), device_index, side="right"))

    def members(self, group: int) -> range:
        start = int(sum(self.sizes[:group]))
        return range(start, start + self.sizes[group])

    def device_plan(self, device_index: int) -> dict[str, float]:
        """What the device's round-plan entry says: its bits (and epsilon1) for the encode stage, its link std."""
        m = self.group_of(device_index)
        out = {"bits": float(self.bits[m]), "group": float(m), "link_std": self.link_std[m]}
        if self.epsilon1 is not None:
            out["epsilon1"] = self.epsilon1[m]
        return out


def check_upload_header(groups: Groups, tensor, bits: int, node: str):
    """A relayed upload's header against what its receiver knows (issue 24, finding 3): the levels of the device's
    planned b bits, and a range inside [-C, C] (an l1-clipped update has every coordinate there). The edge checks it
    on receipt, so that the device may still send an honest upload, and the fusion center again. Returns the parsed
    payload; raises WireError (INVALID_ARGUMENT, bad_header)."""
    import grpc

    from ..wire import WireError
    from .codecs import read_payload

    payload = read_payload(tensor)
    if payload.levels != 1 << bits:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node} quantized with {payload.levels} levels; its plan "
                        f"gives b = {bits} bits ({1 << bits} levels)", "bad_header")
    lo, hi = float(payload.side[0]), float(payload.side[1])
    bound = None if groups.clip is None else groups.clip * (1 + 1e-6)  # float32 side values
    if bound is not None and not -bound <= lo <= hi <= bound:
        raise WireError(grpc.StatusCode.INVALID_ARGUMENT, f"{node}'s quantizer range [{lo:.6g}, {hi:.6g}] exceeds its "
                        f"group's clip C = {groups.clip:g}", "bad_header")
    return payload


def resolve(cfg) -> Groups:
    """The run's groups: [precision] groups, or one group of every device at the uplink codec's bits."""
    p = cfg.precision
    params = cfg.pipeline.params
    codec = {**params.get(cfg.pipeline.uplink_encoding, {}), **params.get("uplink_encoding", {})}
    clip = params.get("clip_l1", {}).get("clip") if cfg.pipeline.clip == "clip_l1" else None
    if p.group_sizes:
        sizes, bits = tuple(p.group_sizes), tuple(p.bits)
        eps = tuple(p.epsilon1) if p.epsilon1 else None
    else:
        sizes, bits, eps = (cfg.num_devices,), (int(codec.get("bits", 4)),), None
    link = tuple(p.link_std) if len(p.link_std) == len(sizes) else (tuple(p.link_std) * len(sizes) if p.link_std
                                                                     else (0.0,) * len(sizes))
    return Groups(sizes, bits, eps, link, float(clip) if clip else None)


def cluster_mode(cfg) -> str:
    from hfl.common import plans

    mode = cfg.precision.cluster_mode
    return plans.ALGORITHMS.get(cfg.run.algorithm).clusters if mode == ALGORITHM_DEFAULT else mode


def fusion_rule(cfg) -> str:
    from hfl.common import plans

    rule = cfg.precision.fusion
    return plans.ALGORITHMS.get(cfg.run.algorithm).fusion if rule == ALGORITHM_DEFAULT else rule


def effective_budget(groups: Groups, budget: float) -> float:
    return budget if budget > 0 else float(np.dot(groups.sizes, groups.bits))  # 0 = no budget: never binding


def cluster_sizes(groups: Groups, mode: str, participants: int, budget: float, rng: np.random.Generator
                  ) -> cluster_size.ClusterSizes:
    """{c_m} for one round. "all": every device (c_m = g_m, the budget is not applied); "random": a feasible
    assignment drawn uniformly; "cso": eq. (27) (static inputs: the same every round)."""
    if mode == "all":
        return cluster_size.ClusterSizes(groups.sizes, float("nan"), int(np.dot(groups.sizes, groups.bits)), "all")
    n = participants or sum(groups.sizes)
    if mode == "random":
        return cluster_size.random_cluster_sizes(groups.sizes, groups.bits, participants=n,
                                                 budget=effective_budget(groups, budget), rng=rng)
    if mode == "cso":
        return cluster_size.cso_cluster_sizes(groups.sizes, groups.bits, groups.link_std, participants=n,
                                              budget=effective_budget(groups, budget), clip=groups.clip)
    raise ValueError(f"cluster mode must be one of all, random, cso, got {mode!r}")


def draw_devices(groups: Groups, sizes, rng: np.random.Generator) -> list[int]:
    """c_m device indices drawn uniformly without replacement from each group (digest 004 P7), sorted."""
    drawn: list[int] = []
    for m, c in enumerate(sizes):
        members = np.asarray(groups.members(m))
        drawn.extend(int(i) for i in (members if c >= members.size else rng.choice(members, int(c), replace=False)))
    return sorted(drawn)
