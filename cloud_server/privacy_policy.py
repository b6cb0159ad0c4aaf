"""The cloud's privacy policy: trust resolved once per run, noise calibrated per cluster, each round's
per-cluster plan (who adds which noise, who takes part), the budget check before a round, and the
per-device ledger built from the DP events that the messages carry."""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Mapping, Sequence

import grpc
import numpy as np

from hfl.common import plans, topology
from hfl.common.wire import WireError
from hfl.common.privacy import accountant, calibration, instructions, parties, shapes
from hfl.common.privacy import config as privacy_config
from hfl.common.privacy.schedules import SCHEDULES
from hfl.common.privacy.wavelet import lemma2_multiplier, padded_length
from hfl.common.privacy.events import DpRecord
from hfl.common.privacy.ledger import PrivacyLedger
from hfl.common.privacy.trust import effective_trust, resolve_trust, sample_participants
from hfl.common.secret_random import SEEDED_LABEL
from hfl.common.seeding import numpy_rng
from hfl.proto import hfl_v1_pb2 as pb

from .placements import PLACEMENTS

log = logging.getLogger("hfl.privacy")

DP_STAGE = "dp_event"


class PrivacyPolicy:
    def __init__(self, cfg, edges: Sequence[str], device_samples: Sequence[int], run_dir, claims: Mapping[str, str],
                 layer_sizes: Sequence[int] = ()):
        self.cfg = cfg
        self.algorithm = plans.ALGORITHMS.get(cfg.run.algorithm)
        self.p = p = privacy_config.effective(cfg.privacy, self.algorithm)
        self.wavelet = privacy_config.wavelet_calibration(p) if p.mechanism == "wavelet" else ""
        self.shape = shapes.for_mechanism(p.mechanism).stage  # the noise stage the plan's instructions name
        # the largest Haar weight max_c W_c (= the padded length of the longest transformed segment)
        if self.wavelet and not layer_sizes:
            raise ValueError("wavelet noise needs the model's layer sizes (its Haar weights)")
        scope = list(layer_sizes) if p.wavelet_scope == "per_layer" else [sum(layer_sizes)]
        self.max_weight = float(max((padded_length(n) for n in scope), default=1))
        # claimed, not measured (paper 000's formula, paper 002's wavelet clip): exempt from the budget stop. At
        # sample level "paper" only picks sigma by the accountant, as the paper does: a sound vanilla DP-SGD.
        self.lemma2 = bool(self.wavelet) and p.wavelet_sigma == "lemma2"  # paper 002 Lemma 2: a claimed saving
        self.placement = PLACEMENTS.get(self.algorithm.privacy)(self)
        self.claim_only = self.placement.claim_only() or self.lemma2
        self.edges = list(edges)
        self.members = {e: topology.edge_members(cfg, topology.edge_index(e)) for e in self.edges}
        fraction = None if p.trusted_fraction == -1.0 else p.trusted_fraction
        assigned = resolve_trust(self.edges, self.algorithm.trust or p.trust, trusted_fraction=fraction,
                                 rng=numpy_rng(cfg.run.seed, "cloud", 0, 0, "trust"),
                                 table=None if self.algorithm.trust else p.trust_table)
        self.assigned = dict(assigned)
        self.levels = {e: effective_trust(assigned[e], claims.get(e) or None) for e in self.edges}
        for e in self.edges:
            if self.levels[e] != assigned[e]:
                log.warning("%s lowered its own trust to %s", e, self.levels[e])
        devices = [d for e in self.edges for d in self.members[e]]
        self.device_sizes = {d: int(device_samples[topology.device_index(d)]) for d in devices}
        self.ledger = PrivacyLedger.open(run_dir, p.delta, p.accountant, devices)
        self.ledger.caveats = self.guarantee()
        common = dict(epsilon=p.epsilon, delta=p.delta, mode=p.calibration, accountant=p.accountant,
                      noise_multiplier=p.noise_multiplier if p.calibration == "noise_multiplier" else None)
        self.settings = {e: self.placement.calibrate(e, common) for e in self.edges}
        self.schedule = self._schedule()
        self.placement.check_levels(self.levels)
        self.stopped: str | None = None
        self.planned: dict[int, dict[str, tuple[str, ...]]] = {}  # round -> edge -> participants, as planned
        self.charged_missing = 0  # releases charged as planned for edges that never reported
        self.planned_noise: dict[int, dict[str, instructions.NoisePlan]] = {}  # round -> edge -> instructions sent

    # ---- calibration ----------------------------------------------------------------------------
    @property
    def local_per_round(self) -> int:
        return self.placement.local_per_round()

    @property
    def sample_steps_per_round(self) -> int:
        return sum(int(ph.params["steps"]) for ph in plans.build_plan(self.cfg) if ph.kind == plans.LOCAL_DP_SGD)

    @property
    def sample_sensitivity(self) -> float:
        return float(np.sqrt(np.sum(np.square(self.p.layer_clips)))) if self.p.layer_clips else float(self.p.clip)

    @functools.lru_cache(maxsize=None)
    def sample_setting(self, population: int) -> calibration.NoiseSetting:
        p = self.p
        return calibration.calibrate_dp_sgd(
            epsilon=p.epsilon, delta=p.delta, steps=self.sample_steps_per_round * self.cfg.run.rounds,
            lot_rate=p.lot_rate, clip=self.sample_sensitivity, mode=p.calibration, accountant=p.accountant,
            noise_multiplier=p.noise_multiplier if p.calibration == "noise_multiplier" else None,
            lot=p.lot, dataset_size=population, wavelet=self.wavelet, max_weight=self.max_weight, lemma2=self.lemma2)

    def wavelet_claim(self, setting: calibration.NoiseSetting) -> calibration.NoiseSetting:
        """DP-FedAvg-WAV in the paper's calibration (clip ||H|| <= S, noise std / W_c): the multiplier really given is
        z / max_c W_c (digest 002 P1); the accountant's figure for z becomes the claim. With privacy.wavelet_sigma =
        lemma2 the noise is scaled by paper 002's Lemma 2 first (z_Haar = z sqrt(2 / (2 + log2 m))), the figure for z
        again only the paper's claim."""
        if not self.wavelet or (self.wavelet != "paper" and not self.lemma2):
            return setting
        claimed = setting.epsilon_claimed if setting.epsilon_claimed is not None else setting.epsilon
        z = setting.std / setting.sensitivity  # the multiplier that scales the noise (what the plan carries)
        if self.lemma2:
            z = lemma2_multiplier(z, int(self.max_weight))
        true = z / self.max_weight if self.wavelet == "paper" else z
        spent = accountant.epsilon_of_releases([("gaussian", true, setting.sampling_rate, setting.releases)],
                                               setting.delta, setting.accountant)
        return dataclasses.replace(setting, noise_multiplier=true, std=z * setting.sensitivity, epsilon=spent,
                                   epsilon_claimed=claimed)

    def _schedule(self):
        """The run's noise and clip schedule (privacy.schedules), built on the calibrated constant multiplier."""
        setting = next(iter(self.settings[self.edges[0]].values()))
        steps = max(1, setting.releases // max(1, self.cfg.run.rounds))
        return SCHEDULES.get(self.algorithm.schedule or "constant")(
            self.p, self.cfg.run.rounds, setting.std / setting.sensitivity, steps, setting.sampling_rate)

    # ---- each round -------------------------------------------------------------------------
    def participants(self, r: int, counts: Mapping[str, int] | None = None) -> dict[str, tuple[str, ...]]:
        """Round r's participants per cluster: s_c drawn uniformly from the run seed; s_c = counts[edge] (a
        controller's choice) or train.participants (0: every member)."""
        out = {}
        for e in self.edges:
            s = counts[e] if counts else self.cfg.train.participants
            members = self.members[e]
            out[e] = tuple(members) if not s or s >= len(members) else sample_participants(
                members, s, numpy_rng(self.cfg.run.seed, "cloud", 0, r, "participants", e))
        return out

    def cluster_plans(self, r: int, participants: Mapping[str, Sequence[str]], round_cfg=None
                      ) -> dict[str, pb.ClusterPlan]:
        """`round_cfg`: this round's config when a controller changed eta, tau or s_c: the noise multipliers stay
        the calibrated ones (each release costs the same privacy), the std follows 2 eta_k tau_k G / s_c^k."""
        plans_ = {}
        self.planned[r] = {e: tuple(participants[e]) for e in self.edges}
        self.planned_noise[r] = {}
        train = (round_cfg or self.cfg).train
        scale = self.schedule.scale(r)
        for e in self.edges:
            plans_[e], checked = self.placement.cluster_plan(e, participants[e], train, round_cfg)
            scale.apply(plans_[e])  # round r's noise and clip under the schedule: in the plan and in what is checked
            if checked:
                self.planned_noise[r][e] = instructions.read_cluster(plans_[e])
        return plans_

    def check_events(self, r: int, edge: str, records: Sequence[DpRecord]) -> None:
        """The cloud checks what an edge reports against the instructions it sent: every edge- or device-tier event
        must have been instructed for its tier and stream, state the instructed multiplier and at least the
        instructed sensitivity (an edge scales its noise up for fewer contributors, never down). A forged
        multiplier is refused, not charged."""
        noise = self.planned_noise.get(r, {}).get(edge)
        if noise is None:
            return
        for rec in records:
            if rec.tier == "device-sample":
                continue
            ins = noise.get(rec.tier, rec.stream)
            z, sens = (ins.multiplier, ins.sensitivity) if ins is not None else (None, None)
            # paper-mode wavelet noise records its true multiplier z / max_c W_c (digest 002, P1)
            wanted = (z,) if z is None or not self.wavelet else (z, z / self.max_weight)
            ok = z is not None and any(np.isclose(rec.noise_multiplier, w, rtol=1e-9) for w in wanted) and \
                rec.sensitivity >= sens * (1 - 1e-9) and rec.sampling_rate == 1.0
            if not ok:
                raise WireError(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{edge}'s DP event ({rec.tier}, {rec.stream}, z {rec.noise_multiplier:.6g}) does not "
                                f"match round {r}'s plan", "bad_dp_event")

    def sizes(self, edge: str) -> list[int]:
        return [self.device_sizes[d] for d in self.members[edge]]

    def planned_records(self, r: int, participants: Mapping[str, Sequence[str]]) -> list[DpRecord]:
        scale = self.schedule.scale(r)
        return [rec.replace(noise_multiplier=rec.noise_multiplier * scale.multiplier,
                            sensitivity=rec.sensitivity * scale.clip)
                for rec in self.placement.planned_records(r, participants)]

    def refuse_round(self, r: int, participants, dry_run: bool = False) -> str | None:
        """Why round r may not start (it would take a device past privacy.epsilon), or None.

        Paper mode is exempt: its noise is the paper's formula, whose claim is the budget by construction
        while the accountant finds far more (digest 000, section 10). It runs so that the paper's curves
        can be reproduced, and every figure it reports says which of the two it is."""
        if self.claim_only:
            return None
        planned = self.planned_records(r, participants)
        if self.ledger.would_exceed(planned, self.p.epsilon):
            if dry_run:
                return "over budget"
            over = self.ledger.over_budget(planned, self.p.epsilon)
            self.stopped = (f"round {r} would take {len(over)} device(s) past privacy.epsilon = {self.p.epsilon} "
                            f"(e.g. {sorted(over)[:3]}); the run stops before it")
            return self.stopped
        return None

    def record(self, r: int, submissions: Mapping[str, Sequence[pb.Transform]]) -> dict:
        """Compose the DP events of round r's messages into the ledger; returns the metrics columns. An edge that
        took part in the plan but never reported (lost mid-round) is charged its planned releases: its devices'
        noisy uploads may have been released to it all the same."""
        records = [DpRecord.from_transform_params(dict(t.params)).replace(round=r)
                   for node in sorted(submissions) for t in submissions[node] if t.stage == DP_STAGE]
        participants = self.planned.pop(r, None)
        self.planned_noise.pop(r, None)
        missing = [e for e in self.edges if e not in submissions and participants and participants.get(e)]
        if missing:
            silent = {d for e in missing for d in participants[e]}
            charged = [rec for rec in self.planned_records(r, participants) if set(rec.covers) <= silent]
            self.charged_missing += len(charged)
            records += charged
            log.warning("round %d: %s never reported; charged their planned releases (%d events)", r, missing,
                        len(charged))
        self.ledger.record_round(r, records)
        summary = self.ledger.summary()
        row = {"epsilon_max": summary["epsilon_max"], "epsilon_mean": summary["epsilon_mean"],
               "dp_events": len(records)}
        if summary["epsilon_max"] > self.p.epsilon:
            row["budget_exceeded"] = True
        if self.claimed() is not None:
            row["epsilon_claimed"] = self.claimed()
        return row

    def claimed(self) -> float | None:
        claims = [s.epsilon_claimed for e in self.edges for s in self.settings[e].values() if s.epsilon_claimed]
        return max(claims) if claims else None

    def describe(self) -> dict:
        return {
            "algorithm": self.algorithm.name, "placement": self.algorithm.privacy, "calibration": self.p.calibration,
            "accountant": self.p.accountant, "epsilon_budget": self.p.epsilon, "delta": self.p.delta,
            "trust": self.levels, "trust_assigned": self.assigned,
            "noise": {e: {s: {"tier": v.tier, "noise_multiplier": v.noise_multiplier, "sensitivity": v.sensitivity,
                              "std": v.std, "releases": v.releases, "sampling_rate": v.sampling_rate,
                              "epsilon_planned": v.epsilon, "epsilon_claimed": v.epsilon_claimed}
                          for s, v in self.settings[e].items()} for e in self.edges},
            "level": self.p.level, "mechanism": self.p.mechanism, "wavelet_calibration": self.wavelet or None,
            "wavelet_sigma": ("lemma2: paper 002 Lemma 2's multiplier sigma sqrt(2 / (2 + log2 m)); epsilon_claimed is "
                              "the paper's claim for sigma" if self.lemma2 else "algorithm") if self.wavelet else None,
            "clip": self.p.clip, "clip_rule": self.p.clip_rule, "optimizer": self.p.optimizer,
            "schedule": self.schedule.describe(),
            "epsilon_label": ("epsilon: the accountant (dp-accounting) on the noise really added; epsilon_claimed: "
                              "the paper's arithmetic, not a measurement") if self.claimed() is not None else
                             "epsilon: the accountant (dp-accounting) on the noise really added",
            **{f"epsilon_{k.split('_')[1]}": v for k, v in self.ledger.summary().items()},
            **self.budget(),
            "noise_source": self.p.noise_source,
            "guarantee": self.guarantee(),
            "sensitivity": None, "client_draw": None, **self.placement.describe(),
            "epsilon_by_party": self.party_epsilons(),
            "charged_missing_edges": self.charged_missing,
            "stopped": self.stopped,
        }

    def party_epsilons(self) -> dict:
        """Per cluster, the accountant's epsilon against the cloud, its edge and outsiders (privacy.parties)."""
        return parties.as_json(parties.party_epsilons(self.ledger.records, self.p.delta, self.p.accountant,
                                                      self.members))

    def budget(self) -> dict:
        """Whether the ledger went past privacy.epsilon (paper modes run on; restarts and re-run rounds may too)."""
        spent = self.ledger.summary()["epsilon_max"]
        return {"budget_exceeded": bool(spent > self.p.epsilon),
                "epsilon_over_budget": max(0.0, float(spent) - self.p.epsilon)}

    def guarantee(self) -> list[str]:
        """What the reported epsilon does not cover: every caveat of this run's configuration, empty when none."""
        out = []
        if self.p.noise_source == "seeded":
            out.append(SEEDED_LABEL + ": epsilon = inf against those parties; the figures hold against outsiders")
        if self.claim_only:
            out.append("paper calibration: epsilon_claimed is the paper's arithmetic; epsilon is the accountant's "
                       "figure for the noise really added, and the budget does not stop the run")
        if self.cfg.control.controller != "none" and self.cfg.control.beta < 0:
            out.append("not DP: beta_estimate (the devices' smoothness estimates, control.beta = -1) is released in "
                       "the clear to the edges and the cloud; set control.beta > 0 for a run whose epsilon holds")
        return out
