"""The [control] config section: which controller re-plans each round at the cloud, and its knobs (paper 000's
H2FDP(ctrl) weights; digest 000 sections 5 and 10). This module registers the section and its check."""
from __future__ import annotations

from dataclasses import dataclass

from hfl.common.config import ConfigError, choice, doc, register_section, register_validator


@dataclass(frozen=True)
class ControlSection:
    controller: str = choice("none", ("none", "h2fdp"), "re-plans every round from the last one's measurements: "
                             "none, or h2fdp (paper 000 Alg. 1: eta, tau, participation of trusted / untrusted clusters)")
    alpha1: float = doc(1.0, "h2fdp: weight of the emulated energy of the remaining rounds", min=0.0)
    alpha2: float = doc(1.0, "h2fdp: weight of the emulated delay of the remaining rounds", min=0.0)
    alpha3: float = doc(1.0, "h2fdp: weight of the DP term nu of Thm 4.3 (divided by phi)", min=0.0)
    phi: float = doc(1.0, "h2fdp: scale of nu against energy and delay (not given by the paper)", min=1e-300)
    tau_max: int = doc(0, "h2fdp: largest tau_k in SGD steps (0 = 4 x train.tau)", min=0)
    s_max: int = doc(0, "h2fdp: largest participation level per cluster (0 = topology.devices_per_edge)", min=0)
    horizon: int = doc(0, "h2fdp: T, the training horizon in SGD steps (0 = run.rounds x train.tau)", min=0)
    eta: float = doc(-1.0, "h2fdp: a fixed eta_k (digest 10 'tiny steps'); -1 = gamma_k / sqrt(k + 1) with gamma_k = "
                     "min(1/tau_{k-1}, 1/K_g) / beta_hat")
    beta: float = doc(-1.0, "h2fdp: smoothness beta; -1 = the largest estimate the devices report")
    search: str = choice("line", ("line", "exhaustive"), "h2fdp: nested line search or exhaustive search")
    delay_reading: str = choice("parallel", ("parallel", "sequential"),
                                "h2fdp: D_c,Loc, a cluster's local-round delay: parallel (the emulated clock: uploads at once, "
                                "the slowest participant's window, free of s_c) or sequential (digest 000 Sec. 5: all selected "
                                "devices transmit in turn, window + (s_c - 1) x one upload; the search is then exhaustive)")


def validate_control(cfg) -> None:
    c = cfg.control
    if c.controller == "none":
        return
    if cfg.run.algorithm != "h2fdp":
        raise ConfigError(f"control.controller = \"h2fdp\" steers run.algorithm = \"h2fdp\", not {cfg.run.algorithm!r}")
    if cfg.latency.auto_tau_gamma:
        raise ConfigError("control.controller and latency.auto_tau_gamma both choose tau: use one")
    if not (c.eta == -1.0 or c.eta > 0):
        raise ConfigError(f"control.eta must be > 0, or -1 for the paper's step size, got {c.eta!r}")
    if not (c.beta == -1.0 or c.beta > 0):
        raise ConfigError(f"control.beta must be > 0, or -1 to estimate it, got {c.beta!r}")
    window = cfg.train.tau // cfg.train.gamma if cfg.train.gamma else 0
    tau_max = c.tau_max or 4 * cfg.train.tau
    if window and tau_max < window:
        raise ConfigError(f"control.tau_max = {tau_max} leaves no tau_k: it must be at least K_l + 1 = {window} "
                          "(train.tau / train.gamma local aggregations per round, kept fixed)")
    if c.s_max > cfg.topology.devices_per_edge:
        raise ConfigError(f"control.s_max = {c.s_max} exceeds topology.devices_per_edge = {cfg.topology.devices_per_edge}")


register_section("control", ControlSection, after="precision")
register_validator(validate_control)
