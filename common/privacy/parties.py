"""Epsilon per party: what each party that sees a cluster's messages can learn about one of its devices, by the
accountant, from the releases that party cannot see un-noised.

- the cloud (never trusted) receives every release that leaves the edge: all the device's records compose;
- the cluster's edge receives each device's uploads: the records of noise a device added itself (tiers `device`
  and `device-sample`) compose; an edge that adds the noise itself (a trusted edge) sees clipped updates before
  it, so against it there is no guarantee (inf);
- outsiders see the published models, a post-processing of what the cloud received: the cloud's figure bounds theirs.

A party with no release protecting a device against it has epsilon = inf for that device."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from .accountant import epsilon, records_by_device
from .events import DpRecord

DEVICE_TIERS = ("device", "device-sample")  # noise a device adds itself: hidden from every other party


def _worst(by_device: Mapping[str, list[DpRecord]], devices: Sequence[str], delta: float, accountant: str) -> float:
    worst = 0.0
    for d in devices:
        records = by_device.get(d, [])
        worst = max(worst, epsilon(records, delta, accountant) if records else math.inf)
    return worst


def party_epsilons(records: Sequence[DpRecord], delta: float, accountant: str,
                   members: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """cluster -> {"cloud", "edge", "outsiders"} -> the largest epsilon over the cluster's devices. An edge that added
    noise for a device (an edge-tier record covers it) received that device's update before its noise: no
    guarantee against that edge."""
    everything = records_by_device(records)
    own = records_by_device([r for r in records if r.tier in DEVICE_TIERS])
    seen_raw = {d for r in records if r.tier == "edge" for d in r.covers}
    out = {}
    for edge, devices in sorted(members.items()):
        cloud = _worst(everything, devices, delta, accountant) if devices else math.inf
        at_edge = math.inf if seen_raw & set(devices) else _worst(own, devices, delta, accountant)
        out[edge] = {"cloud": cloud, "edge": at_edge, "outsiders": cloud}
    return out


def as_json(table: Mapping[str, Mapping[str, float]]) -> dict:
    """inf as the string "inf" (JSON has no infinity)."""
    return {e: {p: ("inf" if math.isinf(v) else v) for p, v in parties.items()} for e, parties in table.items()}
