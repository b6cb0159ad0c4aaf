"""The cloud's controller plug point: before every round a registered controller turns the last round's
measurements into the next round's plan parameters (the plan stays data; no service changes per controller).

    decide(r)                -> Decision: the round's config (tau, gamma, lr), participants per cluster, and the
                                columns logged in metrics.jsonl
    observe(r, results, row) -> remembers what round r measured (emulated energy and delay per cluster, the
                                devices' smoothness estimates)
    describe(rows)           -> summary.json's "control" entry, with `plan_means` over the rows it planned

`h2fdp` is paper 000's H2FDP(ctrl) (Alg. 1, digest 000 sections 5 and 10) on the pure maths of
common.control.h2fdp_ctrl. Its per-cluster inputs come from the emulated clock each edge reports:
  e_dev_local[c] = device joules of c / (participants x (K_l + 1))   one participant, one window
  t_dev_local[c] = cluster seconds of c / (K_l + 1)                  one window (the slowest participant)
  t_up[c]        = c's largest one-device upload air time            (control.delay_reading = "sequential")
  e_glob[c]      = edge joules of c + its backhaul upload energy
  t_glob[c]      = its backhaul upload seconds
K_l stays fixed (train.tau / train.gamma - 1), so tau_k runs over multiples of K_l + 1 and the window is
m_k = tau_k / (K_l + 1) (digest 10); the realised rounds never exceed run.rounds (K_g). The noise multiplier z
of every stream stays the one the accountant calibrated, so each release costs the same privacy: only the
std moves with eta_k, tau_k and s_c^k (z x 2 eta_k tau_k G / s_c, calibration.h2fdp_sensitivity). A plan whose
round the ledger cannot afford is never chosen (the privacy policy's budget check as the feasibility test).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np

from hfl.common.channel import clock as clock_math
from hfl.common.channel.round_clock import (BACKHAUL_BYTES, CLUSTER_SECONDS, DEVICE_JOULES, EDGE_JOULES, UPLOAD_SECONDS,
                                           ClockParams)
from hfl.common.control import h2fdp_ctrl as ctrl
from hfl.common.privacy.trust import TRUSTED
from hfl.common.registry import Registry

log = logging.getLogger("hfl.control")

BETA = "beta_estimate"
S_MEAN = "s_mean"  # metrics column: s_c^k averaged over the clusters (devices taking part per cluster)
PLAN_MEANS = {"tau": "tau_mean", S_MEAN: "s_mean", "s_trusted": "s_trusted_mean", "s_untrusted": "s_untrusted_mean"}
CONTROLLERS: Registry = Registry("controller")


@dataclass
class Decision:
    cfg: object                                       # the round's config (train.tau, gamma, lr)
    participants: dict[str, int] = field(default_factory=dict)  # per edge: s_c^k (empty: as configured)
    columns: dict = field(default_factory=dict)       # logged in the round's metrics row


class H2fdpController:
    def __init__(self, cfg, policy, dim: int, device_samples, rows=()):
        self.cfg, self.policy, self.dim = cfg, policy, dim
        t, c = cfg.train, cfg.control
        self.window = t.tau // t.gamma               # K_l + 1 windows per round, fixed
        self.K_l = self.window - 1
        self.edges = list(policy.edges)
        self.trusted = np.array([policy.levels[e] == TRUSTED for e in self.edges])
        self.sizes = np.array([len(policy.members[e]) for e in self.edges], np.int64)
        self.q = min(1.0, t.batch_size / max(1.0, float(np.mean(device_samples))))
        self.tau_max = c.tau_max or 4 * t.tau
        self.s_max = c.s_max or cfg.topology.devices_per_edge
        self.horizon = c.horizon or cfg.run.rounds * t.tau
        self.clock = ClockParams.from_config(cfg)
        self.tau, self.eta = t.tau, t.lr
        self.s = {e: t.participants or len(policy.members[e]) for e in self.edges}
        self.steps_done = int(sum(r.get("tau", t.tau) for r in rows))
        self.measured: dict | None = None
        self.beta_hat: float | None = None
        self._affordable: dict = {}

    def wants_beta(self) -> bool:
        """Do the devices report smoothness estimates (control.beta < 0: the controller estimates beta)?"""
        return self.cfg.control.beta < 0

    def decide(self, r: int) -> Decision:
        columns = {"tau": self.tau, "lr": self.eta, "ctrl": "configured"}
        if r > 0 and self.measured is not None:
            columns = self._replan(r)
        s_cols = {f"s_{'trusted' if tr else 'untrusted'}": self.s[e] for e, tr in zip(self.edges, self.trusted)}
        s_cols[S_MEAN] = float(np.mean([self.s[e] for e in self.edges]))
        train = dataclasses.replace(self.cfg.train, tau=int(self.tau), gamma=int(self.tau // self.window),
                                    lr=float(self.eta))
        return Decision(dataclasses.replace(self.cfg, train=train), dict(self.s), {**columns, **s_cols})

    def _replan(self, r: int) -> dict:
        c = self.cfg.control
        beta = c.beta if c.beta > 0 else self.beta_hat
        if beta:
            _, self.eta = ctrl.step_size(beta, self.tau, self.cfg.run.rounds, r, c.eta if c.eta > 0 else None)
        elif c.eta > 0:
            self.eta = c.eta
        m = self.measured
        p = self.cfg.privacy
        problem = ctrl.CtrlProblem(
            trusted=self.trusted, sizes=self.sizes, e_dev_local=m["e_dev_local"], t_dev_local=m["t_dev_local"],
            e_glob=m["e_glob"], t_glob=m["t_glob"], t_up=m["t_up"], delay_reading=c.delay_reading, K_l=self.K_l, M=self.dim, q=self.q, G=p.clip, delta=p.delta,
            epsilon=p.epsilon, T=max(self.horizon, self.steps_done + self.window), t_k=self.steps_done,
            tau_max=self.tau_max, s_max=self.s_max, alpha1=c.alpha1, alpha2=c.alpha2, alpha3=c.alpha3, phi=c.phi,
            c2=p.c2, v2=None if p.v2 == -1.0 else p.v2, tau_min=self.window)
        solve = ctrl.nested_line_search if c.search == "line" else ctrl.exhaustive_search
        choice = solve(problem, lambda tau, s_t, s_u: self._feasible(r, tau, s_t, s_u))
        self.tau = choice.tau
        part = problem.participation(choice.s_trusted, choice.s_untrusted)
        self.s = {e: int(part[i]) for i, e in enumerate(self.edges)}
        log.info("round %d: H2FDP(ctrl) chose tau=%d, s_T=%d, s_U=%d, eta=%.4g (objective %.4g, %d evaluations, %s)",
                 r, choice.tau, choice.s_trusted, choice.s_untrusted, self.eta, choice.objective, choice.evaluations,
                 choice.method)
        return {"tau": self.tau, "lr": self.eta, "ctrl": choice.method, "ctrl_objective": choice.objective,
                "beta_hat": beta}

    def _feasible(self, r: int, tau: int, s_t: int, s_u: int) -> bool:
        """K_l fixed: tau a multiple of K_l + 1; and the ledger must afford the round this plan releases."""
        if tau % self.window:
            return False
        counts = {e: min(s_t if tr else s_u, int(n)) for e, tr, n in zip(self.edges, self.trusted, self.sizes)}
        key = (r, tuple(sorted(counts.items())))  # the releases depend on who takes part, not on tau
        if key not in self._affordable:
            self._affordable[key] = self.policy.refuse_round(r, self.policy.participants(r, counts), dry_run=True) is None
        return self._affordable[key]

    def observe(self, r: int, results: dict, row: dict) -> None:
        self.steps_done += self.tau
        betas = [res.scalars[BETA] for res in results.values() if BETA in res.scalars]
        if betas:
            self.beta_hat = max(betas)
        if not results:
            return
        per = {e: results[e].scalars if e in results else {} for e in self.edges}
        n = np.array([max(1, self.s[e]) for e in self.edges], np.float64)
        up = np.array([clock_math.backhaul_time(8 * per[e].get(BACKHAUL_BYTES, 0.0), self.clock.backhaul_rate_bps)
                       for e in self.edges], np.float64)
        self.measured = {
            "e_dev_local": np.array([per[e].get(DEVICE_JOULES, 0.0) for e in self.edges]) / (n * self.window),
            "t_dev_local": np.array([per[e].get(CLUSTER_SECONDS, 0.0) for e in self.edges]) / self.window,
            "e_glob": np.array([per[e].get(EDGE_JOULES, 0.0) for e in self.edges])
            + np.asarray(clock_math.transmit_energy(self.clock.edge_power_w, up), np.float64),
            "t_glob": up,
            "t_up": np.array([per[e].get(UPLOAD_SECONDS, 0.0) for e in self.edges], np.float64),
        }
        row.update({"ctrl_e_dev_local": float(self.measured["e_dev_local"].mean()),
                    "ctrl_t_dev_local": float(self.measured["t_dev_local"].mean()),
                    "ctrl_t_up": float(self.measured["t_up"].mean())})

    def describe(self, rows=()) -> dict:
        c = self.cfg.control
        return {**plan_means(rows), "controller": "h2fdp", "alphas": [c.alpha1, c.alpha2, c.alpha3], "phi": c.phi, "K_l": self.K_l,
                "tau_max": self.tau_max, "s_max": self.s_max, "horizon_steps": self.horizon,
                "search": c.search if ctrl.delay_reading(c.delay_reading).separable else ctrl.COUPLED_SEARCH,
                "delay_reading": c.delay_reading,
                "eta": "fixed" if c.eta > 0 else "gamma_k / sqrt(k + 1)", "beta": c.beta if c.beta > 0 else "estimated",
                "energy_delay": "emulated clock, per cluster (cloud_server/controller.py)"}


def plan_means(rows) -> dict:
    """The controller's choices averaged over the rounds it planned (metrics rows whose `ctrl` column names a
    search; round 0 runs as configured and is left out): tau_mean, s_mean (s_c^k over clusters and rounds),
    s_trusted_mean, s_untrusted_mean (None where no such round or column), and planned_rounds."""
    planned = [r for r in rows if r.get("ctrl") not in (None, "configured")]
    out = {"planned_rounds": len(planned)}
    for col, key in PLAN_MEANS.items():
        vals = [float(r[col]) for r in planned if r.get(col) is not None]
        out[key] = float(np.mean(vals)) if vals else None
    return out


CONTROLLERS.register("h2fdp", H2fdpController)


def build(cfg, policy, dim: int, device_samples, rows=()):
    """The configured controller, or None (control.controller = "none")."""
    if cfg.control.controller == "none":
        return None
    return CONTROLLERS.get(cfg.control.controller)(cfg, policy, dim, device_samples, rows)
