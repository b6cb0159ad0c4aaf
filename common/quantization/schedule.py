"""Paper 001's latency model applied to runs: virtual runtime per round and the cloud's (tau, gamma) choice.

`[latency]` holds the model's inputs (t_CP, t_DE, t_EC, the per-round deadline T_di; defaults from digest 001
sections 5 and 8). With `latency.time_base = "model"` (the default) t_CP, t_DE and t_EC are those of the model the
run trains (Table III's radio and CPU, d and D of this model: `with_time_base`); `"config"` takes the keys as set. For the algorithms registered in LATENCY_MODELS the cloud records `virtual_seconds`, the
cumulative sum of T_di(tau_r, gamma_r) over the rounds run (the x axis of the paper's runtime figures 5-8).

With `latency.auto_tau_gamma = true` (qhetfed only) the cloud picks (tau, gamma) before every round with the
brute-force optimiser of latency_opt (paper 001 Sec. IV) and builds that round's plan from them. The q1 in
k = C (1 + q1) / N is the uplink q measured in the previous round (`q_uplink`), or before any round has been
measured the theoretical one: QSGD's bound min(d/s^2, sqrt(d)/s) for the uplink levels s1 (d = the bucket, or
the whole model), 0 for an exact float encoding. Which one was used is logged and recorded per round
(`q1_source`: "measured" | "theory").
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Callable

from hfl.common.registry import Registry

from hfl.common.seeding import numpy_rng

from . import latency_opt as lo
from . import theory

log = logging.getLogger("hfl.schedule")

TIME_KEYS = ("t_cp_s", "t_de_s", "t_ec_s")
MAX_DEADLINE_RATIO = 1000  # latency.source = "emulated": a deadline this many T_di(1, 1) would enumerate ~1e6 pairs
EXACT_ENCODINGS = ("float32", "float16")  # q ~ 0 (float16 rounds to 2^-11 relative: negligible against QSGD's q)


@dataclass(frozen=True)
class LatencyModel:
    """T_di(tau, gamma, latency section) of one algorithm; `optimisable`: latency.auto_tau_gamma applies."""
    seconds: Callable[[int, int, object], float]
    reference: str
    optimisable: bool = False


LATENCY_MODELS: Registry = Registry("latency model")
LATENCY_MODELS.register("qhetfed", LatencyModel(
    lambda tau, gamma, s: float(lo.round_latency(tau, gamma, s.t_cp_s, s.t_de_s, s.t_ec_s, s.uploads)),
    "paper 001 Sec. IV: (tau + gamma) t_CP + tau t_DE + t_EC", optimisable=True))
LATENCY_MODELS.register("qhetfed-gamma1", LatencyModel(
    lambda tau, gamma, s: float(lo.round_latency(tau, 1, s.t_cp_s, s.t_de_s, s.t_ec_s, s.uploads)),
    "paper 001 Sec. IV with gamma = 1 (Corollary 2): (tau + 1) t_CP + tau t_DE + t_EC"))
LATENCY_MODELS.register("hier-local-qsgd", LatencyModel(
    lambda tau, gamma, s: float(lo.hier_local_qsgd_latency(tau, gamma, s.t_cp_s, s.t_de_s, s.t_ec_s)),
    "paper 001 eq. 50: tau gamma t_CP + tau t_DE + t_EC"))


def latency_model(cfg) -> LatencyModel | None:
    """The algorithm's latency model, or None (no model, or gamma counted in epochs, which T_di cannot time)."""
    if cfg.run.algorithm not in LATENCY_MODELS or cfg.train.local_unit != "steps":
        return None
    return LATENCY_MODELS.get(cfg.run.algorithm)


def validate(cfg) -> None:
    """Config checks of [latency] (ConfigError naming the key); feasibility of the deadline when auto."""
    from hfl.common.config import ConfigError

    s = cfg.latency
    for key in ("deadline_s", *TIME_KEYS):
        value = getattr(s, key)
        if not math.isfinite(value):
            raise ConfigError(f"latency.{key} must be finite, got {value!r}")
    if s.t_cp_s <= 0 or s.deadline_s <= 0:
        key = "t_cp_s" if s.t_cp_s <= 0 else "deadline_s"
        raise ConfigError(f"latency.{key} must be > 0, got {getattr(s, key)!r}")
    if s.time_base == "model":
        defaults = type(s)()
        for key in TIME_KEYS:
            if getattr(s, key) != getattr(defaults, key):
                raise ConfigError(f"latency.{key} = {getattr(s, key)!r} would be unused: latency.time_base = \"model\" "
                                  f"(the default) times T_di with the model the run trains; set latency.time_base = "
                                  f"\"config\" to use your t_cp_s, t_de_s, t_ec_s")
    if not s.auto_tau_gamma:
        return
    model = LATENCY_MODELS.get(cfg.run.algorithm) if cfg.run.algorithm in LATENCY_MODELS else None
    if model is None or not model.optimisable:
        allowed = [n for n in LATENCY_MODELS if LATENCY_MODELS.get(n).optimisable]
        raise ConfigError(f"latency.auto_tau_gamma: paper 001's (tau, gamma) optimiser is defined for "
                          f"{', '.join(allowed)}, not run.algorithm = {cfg.run.algorithm!r}")
    if cfg.train.local_unit != "steps":
        raise ConfigError("latency.auto_tau_gamma needs train.local_unit = \"steps\" (T_di counts SGD steps)")
    encoding = cfg.pipeline.uplink_encoding
    if encoding != "qsgd" and encoding not in EXACT_ENCODINGS:
        raise ConfigError(f"latency.auto_tau_gamma: pipeline.uplink_encoding = {encoding!r} has no relative-error "
                          f"bound q1; use qsgd or one of {', '.join(EXACT_ENCODINGS)}")
    if s.source == "config" and s.time_base == "config":  # emulated / model: known once the model is built or run
        check_deadline(s)


def check_deadline(s) -> None:
    """The deadline must leave room for tau = gamma = 1."""
    from hfl.common.config import ConfigError

    least = float(lo.round_latency(1, 1, s.t_cp_s, s.t_de_s, s.t_ec_s, s.uploads))
    if s.deadline_s < least:
        raise ConfigError(f"latency.deadline_s = {s.deadline_s!r} leaves no (tau >= 1, gamma >= 1): it must be at "
                          f"least T_di(1, 1) = {least:.6g} s with these t_cp_s, t_de_s, t_ec_s")


def theoretical_q(cfg, dim: int) -> tuple[float, str]:
    """q1 before any measurement and how it was obtained (for the log and summary.json)."""
    from hfl.common.pipeline import Link

    link = Link.from_config(cfg.pipeline, "uplink")
    if link.encoding in EXACT_ENCODINGS:
        return 0.0, f"{link.encoding} uplink (exact)"
    if link.encoding != "qsgd":
        raise ValueError(f"pipeline.uplink_encoding = {link.encoding!r}: no theoretical q1 (use qsgd)")
    from hfl.common.wire import CODECS

    p = CODECS.get("qsgd").params(**link.encode_params)
    d = p["bucket_size"] if 0 < p["bucket_size"] < dim else dim
    return float(theory.qsgd_variance_bound(d, p["levels"])), \
        f"QSGD bound min(d/s^2, sqrt(d)/s) with s1 = {p['levels']}, d = {d}"


def choose(cfg, dim: int, q1: float | None = None, times: dict | None = None, round_: int = 0
           ) -> tuple[lo.TauGammaChoice, float, str]:
    """(choice, q1 used, where q1 came from): q1 given = measured, else the theoretical q1. `times` replaces
    [latency]'s t_cp_s, t_de_s, t_ec_s (latency.source = "emulated": the previous round's emulated clock)."""
    if q1 is None:
        q1, source = theoretical_q(cfg, dim)
        source = f"theory ({source})"
    else:
        source = "measured"
    s = cfg.latency if not times else dataclasses.replace(cfg.latency, **times)
    check_deadline(s)
    choice = lo.choose_tau_gamma(s.deadline_s, s.t_cp_s, s.t_de_s, s.t_ec_s, num_edges=cfg.topology.edges,
                                 num_devices=cfg.num_devices, q1=q1, uploads=s.uploads)
    if s.pick == "random":  # a feasible pair of the same curve, uniformly (seed, round): the optimiser's baseline
        i = int(numpy_rng(cfg.run.seed, "cloud", 0, round_, "tau_gamma").integers(choice.curve_tau.size))
        choice = dataclasses.replace(choice, tau=int(choice.curve_tau[i]), gamma=int(choice.curve_gamma[i]),
                                     phi=float(choice.curve_phi[i]), latency=float(choice.curve_latency[i]),
                                     method="random_feasible")
    return choice, float(q1), source


def with_tau_gamma(cfg, tau: int, gamma: int):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, tau=int(tau), gamma=int(gamma)))


def with_time_base(cfg, dim: int, input_size: int | None = None) -> tuple[object, dict]:
    """latency.time_base = "model" (the default): the config with t_cp_s, t_de_s, t_ec_s of the model the run
    trains (d = dim, D = batch x input x 8 bits; input_size loaded from the dataset when not given). Also the record
    of which d and D the T_di model uses (summary.json: tau_gamma.time_base)."""
    s = cfg.latency
    if s.time_base != "model":
        return cfg, {"source": "config", "t_cp_s": s.t_cp_s, "t_de_s": s.t_de_s, "t_ec_s": s.t_ec_s,
                     "d_model": int(dim), "note": f"latency.time_base = 'config': t_de_s as configured (default: paper "
                                                  f"001's d = {lo.PAPER_001_D:,}), not the model trained"}
    if input_size is None:
        from hfl.common.data import load_dataset

        input_size = math.prod(load_dataset(cfg.data).input_shape)
    t_cp, t_de, t_ec = lo.model_link_times(int(dim), cfg.train.batch_size, int(input_size))
    latency = dataclasses.replace(s, t_cp_s=t_cp, t_de_s=t_de, t_ec_s=t_ec)
    return dataclasses.replace(cfg, latency=latency), {
        "source": "model", "d": int(dim), "d_b_bits": 32 * int(dim), "data_bits": cfg.train.batch_size * int(input_size) * 8,
        "t_cp_s": t_cp, "t_de_s": t_de, "t_ec_s": t_ec, "radio": "paper 001 Table III"}


class RoundSchedule:
    """The cloud's per-round (tau, gamma) and virtual clock. `rows` are the metrics rows already written
    (a resumed run continues its virtual clock and uses its last measured q)."""

    def __init__(self, cfg, dim: int, rows: list[dict] | None = None, input_size: int | None = None):
        from hfl.common import plans

        cfg, self.time_base = with_time_base(cfg, dim, input_size)
        self.cfg, self.dim = cfg, dim
        self.model = latency_model(cfg)
        self.auto = cfg.latency.auto_tau_gamma
        rows = rows or []
        self.virtual = float(rows[-1].get("virtual_seconds") or 0.0) if rows else 0.0
        self.measured_q = next((r["q_uplink"] for r in reversed(rows) if r.get("q_uplink") is not None), None)
        self.fixed = None if self.auto else plans.build_plan(cfg)
        self.current: dict = {"tau": cfg.train.tau, "gamma": cfg.train.gamma}
        self.choices: list[dict] = []
        last = rows[-1] if rows else {}
        # latency.source = "emulated": t_cp_s, t_de_s, t_ec_s of the last round (a resumed run: its last row's)
        self.emulated: dict | None = ({"t_cp_s": last["t_cp_emulated"], "t_de_s": last["t_de_emulated"],
                                       "t_ec_s": last["t_ec_emulated"]} if last.get("t_cp_emulated") else None)

    def plan(self, r: int) -> list:
        """Round r's phases: the configured plan, or one built from this round's optimised (tau, gamma)."""
        if not self.auto:
            return self.fixed
        from hfl.common import plans

        times = self.emulated if self.cfg.latency.source == "emulated" else None
        if self.cfg.latency.source == "emulated" and times is None:  # round 0: nothing measured yet
            self.current = {"tau": self.cfg.train.tau, "gamma": self.cfg.train.gamma, "phi": None, "q1_used": None,
                            "q1_source": "none", "latency_source": "configured plan (nothing emulated yet)",
                            "t_cp_s_used": None, "t_de_s_used": None, "t_ec_s_used": None}
            self.choices.append({"round": r, **self.current})
            return plans.build_plan(self.cfg)
        if times is not None:
            least = float(lo.round_latency(1, 1, times["t_cp_s"], times["t_de_s"], times["t_ec_s"],
                                           self.cfg.latency.uploads))
            if not least <= self.cfg.latency.deadline_s <= MAX_DEADLINE_RATIO * least:
                log.warning("round %d: latency.deadline_s = %g s is not within [1, %d] x the emulated T_di(1, 1) = "
                            "%.4g s; keeping tau = %d, gamma = %d", r, self.cfg.latency.deadline_s, MAX_DEADLINE_RATIO,
                            least, self.current["tau"], self.current["gamma"])
                self.current = {**self.current, "latency_source": "kept (deadline out of range)"}
                self.choices.append({"round": r, **self.current})
                return plans.build_plan(with_tau_gamma(self.cfg, self.current["tau"], self.current["gamma"]))
        choice, q1, source = choose(self.cfg, self.dim, self.measured_q, times, r)
        used = times or {k: getattr(self.cfg.latency, k) for k in ("t_cp_s", "t_de_s", "t_ec_s")}
        self.current = {"tau": choice.tau, "gamma": choice.gamma, "phi": choice.phi, "q1_used": q1,
                        "q1_source": "measured" if source == "measured" else "theory",
                        "latency_source": "emulated" if times else "config", **{f"{k}_used": v for k, v in used.items()}}
        self.choices.append({"round": r, **self.current, "round_virtual_seconds": choice.latency,
                             "q1_detail": source if source != "measured" else f"q_uplink of round {r - 1}"})
        log.info("round %d: tau=%d gamma=%d (Phi %.4g, T_di %.4g s of %.4g s) with q1=%.4g from %s", r, choice.tau,
                 choice.gamma, choice.phi, choice.latency, self.cfg.latency.deadline_s, q1, self.choices[-1]["q1_detail"])
        return plans.build_plan(with_tau_gamma(self.cfg, choice.tau, choice.gamma))

    def record(self, stats: dict) -> dict:
        """Metrics columns for the round just aggregated; remembers its measured q for the next choice."""
        if stats.get("q_uplink") is not None:
            self.measured_q = float(stats["q_uplink"])
        if stats.get("t_cp_emulated"):
            self.emulated = {"t_cp_s": stats["t_cp_emulated"], "t_de_s": stats["t_de_emulated"],
                             "t_ec_s": stats["t_ec_emulated"]}
        out = {}
        if self.model is not None:
            self.virtual += self.model.seconds(self.current["tau"], self.current["gamma"], self.cfg.latency)
            out["virtual_seconds"] = self.virtual
        if self.auto:
            out.update({k: self.current[k] for k in ("tau", "gamma", "q1_used", "q1_source", "latency_source",
                                                     "t_cp_s_used", "t_de_s_used", "t_ec_s_used")})
        return out

    def describe(self) -> dict:
        """summary.json entry: how tau and gamma were set, and the latency model behind virtual_seconds."""
        s = self.cfg.latency
        out: dict = {"mode": "auto" if self.auto else "fixed"}
        if self.model is not None:
            out["time_base"] = self.time_base
        if self.model is not None:
            out["latency_model"] = {"formula": self.model.reference, "t_cp_s": s.t_cp_s, "t_de_s": s.t_de_s,
                                    "t_ec_s": s.t_ec_s, "uploads": s.uploads, "virtual_seconds": self.virtual}
        if not self.auto:
            out.update(tau=self.cfg.train.tau, gamma=self.cfg.train.gamma)
            return out
        out.update(deadline_s=s.deadline_s, optimiser="brute_force (paper 001 Sec. IV objective, integer search)"
                   if s.pick == "optimised" else "random feasible pair per round (the optimiser's baseline)",
                   choices=self.choices)
        if self.choices:
            out.update(first=self.choices[0], last=self.choices[-1],
                       q1_sources=sorted({c["q1_source"] for c in self.choices}))
        return out
