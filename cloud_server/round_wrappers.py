"""Privacy and control wrap the cloud's round mode (cloud_server/modes.py), the way the clock is wired: the service
calls the outermost object and never asks whether the run is private or controlled.

    mode = Controlled(Private(DigitalCloud(ports), policy), controller)
"""
from __future__ import annotations

import logging

from hfl.common import metrics, plans
from hfl.proto import hfl_v1_pb2 as pb

from .modes import RoundRefused

log = logging.getLogger("hfl.cloud")


class ModeWrapper:
    """Hands every call to the wrapped mode; a wrapper overrides the calls it adds to."""

    def __init__(self, inner):
        self.inner = inner

    def accept(self, edge, envelope, round_, records):
        return self.inner.accept(edge, envelope, round_, records)

    async def air(self, edge, envelope, round_, phases):
        return await self.inner.air(edge, envelope, round_, phases)

    def decide(self, r):
        return self.inner.decide(r)

    def plan(self, r, decision, schedule):
        return self.inner.plan(r, decision, schedule)

    def cluster_plans(self, r, decision):
        return self.inner.cluster_plans(r, decision)

    def model(self, r, results, w):
        return self.inner.model(r, results, w)

    def evaluated(self, r):
        return self.inner.evaluated(r)

    def columns(self, r, results, stats):
        self.inner.columns(r, results, stats)

    def describe(self, rows):
        return self.inner.describe(rows)

    def plots(self, rows, title):
        self.inner.plots(rows, title)

    def state(self):
        return self.inner.state()

    def restore(self, state, round_):
        self.inner.restore(state, round_)

    @property
    def result_size(self):
        return self.inner.result_size

    def component(self, name):
        own = {"policy": getattr(self, "policy", None), "controller": getattr(self, "controller", None)}.get(name)
        return own if own is not None else self.inner.component(name)


class Private(ModeWrapper):
    """The privacy policy (cloud_server/privacy_policy.py) plans each round's noise, refuses a round the budget
    forbids, checks every edge's DP events against its plan and charges them."""

    def __init__(self, inner, policy, cfg, run_dir):
        super().__init__(inner)
        self.policy, self.cfg, self.run_dir = policy, cfg, run_dir
        metrics.write_json(run_dir / "privacy.json", policy.describe())
        log.info("privacy: %s calibration, trust %s", cfg.privacy.calibration, policy.levels)

    def accept(self, edge, envelope, round_, records):
        self.policy.check_events(round_, edge, records)
        return self.inner.accept(edge, envelope, round_, records)

    def cluster_plans(self, r, decision):
        participants = self.policy.participants(r, decision.participants if decision is not None else None)
        reason = self.policy.refuse_round(r, participants)
        if reason:
            log.warning("privacy budget: %s", reason)
            raise RoundRefused(reason)
        return self.policy.cluster_plans(r, participants, decision.cfg if decision is not None else None)

    def columns(self, r, results, stats):
        stats.update(self.policy.record(r, {e: res.transforms for e, res in results.items()}))
        metrics.write_json(self.run_dir / "privacy.json", self.policy.describe())
        self.inner.columns(r, results, stats)

    def describe(self, rows):
        out = self.inner.describe(rows)
        privacy = self.policy.describe()
        out.update(privacy=privacy, epsilon=privacy["epsilon_max"], budget_exceeded=privacy["budget_exceeded"],
                   epsilon_over_budget=privacy["epsilon_over_budget"])
        if privacy["guarantee"]:
            out["privacy_caveats"] = privacy["guarantee"]
        if self.policy.claimed() is not None:
            out["epsilon_claimed"] = self.policy.claimed()
        return out

    def plots(self, rows, title):
        self.inner.plots(rows, title)
        metrics.plot_privacy(rows, self.run_dir / "privacy.png", f"{self.cfg.run.algorithm}: privacy spent "
                             f"({self.cfg.privacy.calibration} calibration)", self.cfg.privacy.epsilon,
                             self.policy.claimed())


class Controlled(ModeWrapper):
    """A controller (cloud_server/controller.py) re-plans each round: its decision sets the round's schedule and
    participants, and it observes what the round measured."""

    def __init__(self, inner, controller):
        super().__init__(inner)
        self.controller = controller
        self.decision = None

    def decide(self, r):
        self.decision = self.controller.decide(r)
        return self.decision

    def plan(self, r, decision, schedule) -> list[pb.Phase]:
        phases = plans.build_plan(decision.cfg)
        if self.controller.wants_beta():  # once per round, from the round's first local window
            first = next((p for p in phases if p.kind == plans.LOCAL_SGD), None)
            if first is not None:
                first.params[plans.ESTIMATE_BETA] = 1.0
        return phases

    def columns(self, r, results, stats):
        self.inner.columns(r, results, stats)
        stats.update(self.decision.columns)
        self.controller.observe(r, results, stats)

    def describe(self, rows):
        return {**self.inner.describe(rows), "control": self.controller.describe(rows)}


def wrap(mode, cfg, run_dir, edges, device_samples, claims, layer_sizes, rows):
    """The mode wrapped by what the config asks for: privacy (a private algorithm), then control."""
    from . import controller as controller_mod

    policy = None
    if plans.is_private(cfg):
        from .privacy_policy import PrivacyPolicy  # dp_accounting and scipy: ~2 s of CPU a plain run need not pay

        policy = PrivacyPolicy(cfg, edges, device_samples, run_dir, claims, layer_sizes)
        mode = Private(mode, policy, cfg, run_dir)
    controller = controller_mod.build(cfg, policy, sum(layer_sizes), device_samples, rows)
    return mode if controller is None else Controlled(mode, controller)
