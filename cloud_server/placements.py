"""Where DP noise is added, one class per placement, registered by name (`plans.Algorithm.privacy`): the cloud's
privacy policy (privacy_policy.py) calibrates, plans and charges through it and never asks which placement runs.

- by_trust (paper 000, H2FDP): a trusted edge adds noise to its cluster's aggregate, else every device to its upload;
- aggregator (DP-FedAvg, McMahan et al. 2018; paper 002): every edge is a trusted aggregator that draws its clients
  and noises the fixed-denominator sum;
- sample (DP-SGD, Abadi et al. 2016; paper 002): every device runs DP-SGD on its records.

A new placement is a subclass registered here (or from a plugin): PLACEMENTS.register(name, Class).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from hfl.common.privacy import calibration, instructions
from hfl.common.privacy import config as privacy_config
from hfl.common.privacy.trust import TRUSTED
from hfl.common.registry import Registry
from hfl.proto import hfl_v1_pb2 as pb

PLACEMENTS: Registry = Registry("privacy placement")


class Placement:
    name = ""

    def __init__(self, policy):
        self.policy = policy  # the run's PrivacyPolicy: its config, trust levels, members and sizes

    def claim_only(self) -> bool:
        """Is the reported epsilon the paper's claim (exempt from the budget stop)?"""
        return self.policy.wavelet == "paper" or self.policy.p.calibration == "paper"

    def check_levels(self, levels: Mapping[str, str]) -> None:
        """Raise if the placement cannot run with these trust levels."""

    def local_per_round(self) -> int:
        """Device-tier releases per round beside the edge's (H2FDP's local aggregations)."""
        return 0

    def calibrate(self, edge: str, common: dict) -> dict[str, calibration.NoiseSetting]:
        raise NotImplementedError

    def cluster_plan(self, edge: str, participants: Sequence[str], train, round_cfg) -> tuple[pb.ClusterPlan, bool]:
        """The edge's plan with its noise instructions; True when the cluster's DP events are checked against them."""
        raise NotImplementedError

    def planned_records(self, r: int, participants: Mapping[str, Sequence[str]]) -> list:
        raise NotImplementedError

    def describe(self) -> dict:
        return {}

    def _listed(self, edge: str, participants: Sequence[str]) -> Sequence[str]:
        return participants if len(participants) < len(self.policy.members[edge]) else ()

    def _instruction(self, setting: calibration.NoiseSetting, sensitivity: float, clip: float = 0.0,
                     clip_at: Sequence[str] = ()) -> pb.NoiseInstruction:
        pol = self.policy
        # the multiplier that scales the noise (for the paper's wavelet clip the setting records z / max_c W_c)
        return instructions.build(setting.tier, setting.stream, pol.shape, setting.std / setting.sensitivity,
                                  sensitivity, clip, clip_at, pol.wavelet)


@PLACEMENTS.register("by_trust")
class ByTrust(Placement):
    name = "by_trust"

    def local_per_round(self) -> int:
        return calibration.local_aggregations_per_round(self.policy.cfg.train.tau, self.policy.cfg.train.gamma)

    def calibrate(self, edge, common):
        pol, t, p = self.policy, self.policy.cfg.train, self.policy.p
        sizes = pol.sizes(edge)
        q = min(1.0, t.batch_size / max(1.0, float(np.mean(sizes))))
        return calibration.calibrate_h2fdp(trusted=pol.levels[edge] == TRUSTED, eta=t.lr, tau=t.tau, clip=p.clip,
                                           rounds=pol.cfg.run.rounds, local_per_round=self.local_per_round(),
                                           participants=pol.cfg.train.participants or len(pol.members[edge]), q=q,
                                           c2=p.c2, v2=None if p.v2 == -1.0 else p.v2,
                                           window=privacy_config.sensitivity_window(p, t), **common)

    def cluster_plan(self, edge, participants, train, round_cfg):
        pol = self.policy
        trusted = pol.levels[edge] == TRUSTED

        def sensitivity(s):
            return s.sensitivity if round_cfg is None else calibration.h2fdp_sensitivity(
                train.lr, privacy_config.sensitivity_window(pol.p, train), pol.p.clip,
                max(1, len(participants)) if trusted else 1)

        # an honest upload sums m clipped minibatch steps: ||d_i|| <= eta m G, enforced by a trusted edge (the
        # edge-tier releases); behind an untrusted edge the device's own gradient clip bounds it
        bound = train.lr * train.gamma * pol.p.clip
        noise = [self._instruction(s, sensitivity(s), bound, ("edge",) if s.tier == "edge" else ())
                 for s in pol.settings[edge].values()]
        return pb.ClusterPlan(participants=list(self._listed(edge, participants)), noise=noise), True

    def planned_records(self, r, participants):
        pol = self.policy
        return calibration.h2fdp_round_records(r, pol.levels, participants, pol.settings, self.local_per_round())

    def describe(self):
        return {"sensitivity": self.policy.p.sensitivity}


@PLACEMENTS.register("aggregator")
class Aggregator(Placement):
    name = "aggregator"

    def check_levels(self, levels):
        untrusted = sorted(e for e, v in levels.items() if v != TRUSTED)
        if untrusted:
            raise ValueError(f"user-level DP-FedAvg needs a trusted aggregator, but {untrusted} are untrusted "
                             "(a site lowered its trust?)")

    def calibrate(self, edge, common):
        pol, p = self.policy, self.policy.p
        setting = calibration.calibrate_dp_fedavg(rounds=pol.cfg.run.rounds, client_rate=p.client_rate, clip=p.clip,
                                                  sizes=pol.sizes(edge), **common)
        return {"global": pol.wavelet_claim(setting)}

    def cluster_plan(self, edge, participants, train, round_cfg):
        pol = self.policy
        # each client clips its update to S, and the trusted edge enforces it on what it receives
        noise = [self._instruction(s, s.sensitivity, pol.p.clip, ("device", "edge"))
                 for s in pol.settings[edge].values()]
        # the trusted edge draws its clients itself (Poisson, rate q_c) and sums them over a fixed denominator
        params = dict(client_rate=pol.p.client_rate, fixed_denominator=pol.p.client_rate * sum(pol.sizes(edge)))
        return pb.ClusterPlan(params=params, noise=noise), True

    def planned_records(self, r, participants):
        pol = self.policy
        return [pol.settings[e]["global"].record(e, pol.members[e], r) for e in pol.edges]

    def describe(self):
        return {"client_draw": "visible to the cloud (the edge reports the drawn set's counts): each drawn device is "
                               "charged an unsampled release"}


@PLACEMENTS.register("sample")
class PerSample(Placement):
    name = "sample"

    def claim_only(self) -> bool:
        # at sample level "paper" only picks sigma by the accountant, as the paper does: a sound vanilla DP-SGD
        return self.policy.wavelet == "paper"

    def calibrate(self, edge, common):
        pol = self.policy
        if pol.p.lot == "fixed":  # one setting per device: the population sampled without replacement is its data
            return {f"sample/{d}": pol.sample_setting(pol.device_sizes[d]) for d in pol.members[edge]}
        return {"sample": pol.sample_setting(0)}

    def cluster_plan(self, edge, participants, train, round_cfg):
        noise, devices = [], {}  # the devices add the noise (DP-SGD's clip is per example, in the phase)
        for key, setting in self.policy.settings[edge].items():
            ins = self._instruction(setting, setting.sensitivity)
            if key == "sample":
                noise.append(ins)
            else:  # fixed lots: each device its own multiplier
                devices[key.split("/", 1)[1]] = pb.DevicePlan(noise=[ins])
        return pb.ClusterPlan(participants=list(self._listed(edge, participants)), devices=devices, noise=noise), False

    def planned_records(self, r, participants):
        pol = self.policy
        steps, out = pol.sample_steps_per_round, []
        for e in pol.edges:
            for d in participants[e]:
                setting = pol.settings[e].get("sample") or pol.settings[e][f"sample/{d}"]
                out.append(dataclasses.replace(setting.record(d, (d,), r, steps), population=(
                    pol.device_sizes[d] if pol.p.lot == "fixed" and pol.p.lot_rate < 1 else 0)))
        return out
