"""Noise and clip schedules over the rounds of a run, registered by name (`plans.Algorithm.schedule`).

A schedule turns the calibrated constant multiplier sigma and clip C of a run into round r's (z_r, C_r); the cloud's
privacy policy writes them into round r's plan, so every device or edge adds, and records as its DP event, the
noise of that round, and the ledger composes those events with dp_accounting round by round (the epsilon charged is
the one of the noise really added).

- constant: z_r = sigma, C_r = C (every algorithm but the Dyn-DP baselines).
- dyn: Dyn-DP-SGD / Dyn-DP-FedAvg, Du et al. 2021 ("Dynamic differential-privacy preserving SGD", arXiv:2111.00173),
  the baseline of paper 002. The paper's text was not at hand here; the schedule is the one of its public
  implementations (a DynamicSGD on Opacus with `mu0_search` / `cal_step_decay_rate`, and a JAX
  `DynamicDPSGDSchedule` citing the paper's Eq. 10), both read through the `search` tool:
      C_t  = C_0 rho_c^(t/T)           the clip decays to rho_c C_0 at the end of training,
      mu_t = mu_0 rho_mu^(-t/T)        the per-step Gaussian-DP parameter grows, so the multiplier z_t = 1/mu_t
                                       decays to rho_mu z_0, and the noise std is z_t C_t,
      mu_0 such that q sqrt(sum_t (e^(mu_t^2) - 1)) = q sqrt(T (e^(1/sigma^2) - 1))   (Eq. 10: the CLT GDP budget of
                                       the dynamic run equals the vanilla run's at multiplier sigma).
  Readings chosen here (the digest, 002 sections 2.4 and P16): t runs over ROUNDS, not steps (t = r, T = rounds): a
  device's steps inside one round share (z_r, C_r), because one local phase releases one DP event; Dyn-DP-FedAvg
  uses the same schedule with one release per round. `budget` picks how mu_0 is matched to sigma: "gdp" is Eq. 10
  above (unsampled releases, q = 1, compose exactly: sum_t mu_t^2 = T / sigma^2); "accountant" (the default) solves
  z_0 so that dp_accounting's epsilon of the dynamic run equals that of the constant run at sigma, which is the
  budget the project's ledger reports. The defaults rho_c = rho_mu = 0.5 are the public implementations'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import dp_accounting
import numpy as np
from dp_accounting import rdp
from scipy import optimize

from hfl.common.registry import Registry

from .calibration import _quiet_search


SCHEDULES: Registry = Registry("noise schedule")
BUDGETS = ("accountant", "gdp")


def dyn_clip_factor(rho_c: float, t: float, total: float) -> float:
    """C_t / C_0 = rho_c^(t/T) (Du et al. 2021, via its public implementations)."""
    return float(rho_c ** (t / total))


def dyn_multiplier_factor(rho_mu: float, t: float, total: float) -> float:
    """z_t / z_0 = mu_0 / mu_t = rho_mu^(t/T)."""
    return float(rho_mu ** (t / total))


def gdp_total_mu(mus: Sequence[float], q: float, counts: Sequence[int] | None = None) -> float:
    """The Gaussian-DP parameter of composed releases of GDP parameters `mus` (each `counts` times): the central-limit
    approximation q sqrt(sum_t (e^(mu_t^2) - 1)) of Poisson-subsampled ones (Bu et al. 2020; Du et al.'s Eq. 10), or
    the exact sqrt(sum_t mu_t^2) when q = 1 (unsampled Gaussians compose exactly)."""
    mu = np.asarray(mus, dtype=np.float64)
    n = np.ones_like(mu) if counts is None else np.asarray(counts, dtype=np.float64)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must lie in (0, 1], got {q!r}")
    if q == 1.0:
        return float(np.sqrt(np.sum(n * mu ** 2)))
    return float(q * np.sqrt(np.sum(n * np.expm1(mu ** 2))))


def _check(rho_c: float, rho_mu: float, rounds: int) -> None:
    if not (0.0 < rho_c <= 1.0 and 0.0 < rho_mu <= 1.0):
        raise ValueError(f"rho_c and rho_mu must lie in (0, 1], got {rho_c!r}, {rho_mu!r}")
    if int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")


def dyn_base_multiplier(sigma: float, *, rho_mu: float, rounds: int, steps: int, q: float, budget: str = "accountant",
                        delta: float = 1e-5) -> float:
    """z_0 of the dyn schedule (z_r = z_0 rho_mu^(r/R), `steps` releases per round at rate q) that spends the budget
    of `rounds` x `steps` releases at the constant multiplier sigma: by Du et al.'s Eq. 10 (budget "gdp") or by
    dp_accounting's epsilon at `delta` (budget "accountant")."""
    _check(1.0, rho_mu, rounds)
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    factors = np.array([dyn_multiplier_factor(rho_mu, r, rounds) for r in range(rounds)])
    target_mu = gdp_total_mu([1.0 / sigma], q, [rounds * steps])
    gdp_gap = lambda log_z0: gdp_total_mu(1.0 / (math.exp(log_z0) * factors), q, [steps] * rounds) - target_mu
    # larger z_0: less privacy spent; z_0 lies between sigma (the first round as noisy as vanilla) and sigma / rho_mu
    log_z0 = optimize.brentq(gdp_gap, math.log(sigma) - 1.0, math.log(sigma / rho_mu) + 1.0, xtol=1e-12)
    if budget == "gdp":
        return float(math.exp(log_z0))
    # dp_accounting's RDP accountant on integer orders: its default fractional orders cost seconds per evaluation at
    # the multipliers below 1 the schedule reaches; both sides are measured on the same orders, and the ledger then
    # charges the run with the configured accountant (its figure may differ from the constant run's by the order grid)
    target = _rdp_epsilon([sigma], q, rounds * steps, delta)
    spent = lambda log_z: _rdp_epsilon(math.exp(log_z) * factors, q, steps, delta)
    with _quiet_search():
        for width in (0.05, 1.0):  # the CLT solution is near it (a few per cent over long runs): search there first
            lo, hi = log_z0 - width, log_z0 + width
            if spent(lo) > target > spent(hi):
                break
        log_z = optimize.brentq(lambda x: spent(x) - target, lo, hi, xtol=1e-7)
    return float(math.exp(log_z))


_ORDERS = tuple(range(2, 17)) + (20, 24, 28, 32, 40, 48, 64, 96, 128, 256)


def _rdp_epsilon(multipliers, q: float, count: int, delta: float) -> float:
    acc = rdp.RdpAccountant(list(_ORDERS))
    for z in multipliers:
        event = dp_accounting.GaussianDpEvent(float(z))
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, event) if q < 1.0 else event, int(count))
    return float(acc.get_epsilon(delta))


@dataclass(frozen=True)
class RoundScale:
    """What round r's plan multiplies: the noise multiplier (z_r / sigma) and the clip (C_r / C)."""
    multiplier: float = 1.0
    clip: float = 1.0

    def apply(self, plan) -> None:
        """Scale a round plan's (pb.ClusterPlan) noise instructions, the cluster's and each device's own: the
        multiplier by the multiplier factor, the sensitivity and the clip bound by the clip factor; the devices' DP-SGD
        clips by the clip factor through the plan's clip_scale."""
        for ins in [*plan.noise, *(i for device in plan.devices.values() for i in device.noise)]:
            ins.multiplier = ins.multiplier * self.multiplier
            ins.sensitivity = ins.sensitivity * self.clip
            ins.clip = ins.clip * self.clip
        if self.clip != 1.0:
            plan.params["clip_scale"] = float(plan.params.get("clip_scale", 1.0)) * self.clip


class Constant:
    name = "constant"

    def __init__(self, section, rounds: int, sigma: float, steps: int, rate: float):
        self.rounds = rounds

    def scale(self, r: int) -> RoundScale:
        return RoundScale()

    def describe(self) -> dict:
        return {"name": self.name}


class Dyn(Constant):
    name = "dyn"

    def __init__(self, section, rounds: int, sigma: float, steps: int, rate: float):
        _check(section.dyn_rho_c, section.dyn_rho_mu, rounds)
        self.rounds, self.rho_c, self.rho_mu, self.budget = rounds, section.dyn_rho_c, section.dyn_rho_mu, \
            section.dyn_budget
        self.sigma, self.steps, self.rate = float(sigma), int(steps), float(rate)
        self.z0 = dyn_base_multiplier(sigma, rho_mu=self.rho_mu, rounds=rounds, steps=self.steps, q=rate,
                                      budget=self.budget, delta=section.delta)

    def scale(self, r: int) -> RoundScale:
        return RoundScale(self.z0 / self.sigma * dyn_multiplier_factor(self.rho_mu, r, self.rounds),
                          dyn_clip_factor(self.rho_c, r, self.rounds))

    def describe(self) -> dict:
        last = self.scale(self.rounds - 1)
        return {"name": self.name, "reference": "Du et al. 2021, arXiv:2111.00173 (schedule from its public "
                                                "implementations; per round)",
                "rho_c": self.rho_c, "rho_mu": self.rho_mu, "budget": self.budget, "sigma_constant": self.sigma,
                "z_first": self.z0, "z_last": self.sigma * last.multiplier, "clip_factor_last": last.clip}


SCHEDULES.register("constant", Constant)
SCHEDULES.register("dyn", Dyn)
