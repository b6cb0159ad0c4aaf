"""(tau, gamma) choice of QHetFed under a per-round deadline (paper 001, Sec. IV; digest 001 section 5).

Latency model (paper 001, Sec. IV, from its ref. [28]):
    T_di(tau, gamma) = (tau + gamma) t_CP + tau t_DE + t_EC          (QHetFed)
    T_di^HLQ(tau, gamma) = tau gamma t_CP + tau t_DE + t_EC          (Hier-Local-QSGD, eq. 50)
The paper counts tau device uploads although QHetFed makes tau + 1 (digest 001 section 10, "Timing
formula"): `uploads="paper"` (default, the paper's formula) or `uploads="exact"` (tau + 1 uploads).

Objective (second term of Lemma 2): Phi(tau, gamma) = k tau (1 + (gamma - 1)/(tau + gamma)) + gamma (gamma - 1)/(tau + gamma),
k = C (1 + q1) / N. With the deadline binding, gamma = A - (1 + r) tau - eps_c and Phi becomes J(tau).

Two solvers:
  `choose_tau_gamma` (default): brute force over integers tau >= 1, gamma = floor(slack) >= 1 (digest 001
      section 10 "Closed-form optimiser": the paper's candidate set ignores integrality, gamma >= 1, complex
      roots and the upper boundary, so the sound choice is the integer search).
  `closed_form_tau_gamma`: the paper's candidates {1, roots of a0 tau^2 + b0 tau + c0 = 0}, reported for
      comparison and tests; its tau and gamma are real numbers, possibly infeasible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

UPLOAD_MODES = ("paper", "exact")


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return v


def _uploads(uploads: str) -> int:
    if uploads not in UPLOAD_MODES:
        raise ValueError(f"uploads must be one of {UPLOAD_MODES}, got {uploads!r}")
    return 1 if uploads == "exact" else 0


def link_times(*, cycles_per_bit: float, data_bits: float, cpu_hz: float, model_bits: float,
               bandwidth_hz: float, gain: float, power_w: float, noise_w: float,
               ec_over_de: float = 10.0) -> tuple[float, float, float]:
    """(t_CP, t_DE, t_EC) of paper 001 Sec. IV: t_CP = c D / f, t_DE = d_b / (B log2(1 + h p / N0)),
    t_EC = ec_over_de * t_DE (Table III: 10)."""
    t_cp = _positive("cycles_per_bit", cycles_per_bit) * _positive("data_bits", data_bits) / _positive("cpu_hz", cpu_hz)
    snr = _positive("gain", gain) * _positive("power_w", power_w) / _positive("noise_w", noise_w)
    t_de = _positive("model_bits", model_bits) / (_positive("bandwidth_hz", bandwidth_hz) * math.log2(1 + snr))
    return t_cp, t_de, _positive("ec_over_de", ec_over_de, allow_zero=True) * t_de


# Paper 001's Table III radio and compute constants, and its CIFAR CNN (d = 591,274, D = 100 x 3072 x 8 bits):
# the [latency] defaults t_CP = 0.049152 s, t_DE = 3.3356 s, t_EC = 33.356 s.
TABLE_III = dict(cycles_per_bit=20.0, cpu_hz=1e9, bandwidth_hz=1e6, gain=1e-8, power_w=0.5, noise_w=1e-10,
                 ec_over_de=10.0)
PAPER_001_D = 591_274


def model_link_times(d: int, batch: int, input_size: int, bits_per_param: int = 32, bits_per_input: int = 8,
                     **radio) -> tuple[float, float, float]:
    """(t_CP, t_DE, t_EC) of paper 001 for the model a run trains: D = batch x input_size x bits_per_input bits per
    SGD step, d_b = bits_per_param x d per upload, Table III's radio unless `radio` overrides it."""
    if int(d) != d or d < 1 or int(batch) != batch or batch < 1 or int(input_size) != input_size or input_size < 1:
        raise ValueError(f"d, batch and input_size must be integers >= 1, got {d!r}, {batch!r}, {input_size!r}")
    return link_times(data_bits=batch * input_size * bits_per_input, model_bits=bits_per_param * d,
                      **{**TABLE_III, **radio})


def round_latency(tau, gamma, t_cp: float, t_de: float, t_ec: float, uploads: str = "paper"):
    """T_di(tau, gamma) = (tau + gamma) t_CP + (tau [+1]) t_DE + t_EC (paper 001, Sec. IV); vectorised."""
    tau, gamma = np.asarray(tau, float), np.asarray(gamma, float)
    return (tau + gamma) * t_cp + (tau + _uploads(uploads)) * t_de + t_ec


def hier_local_qsgd_latency(tau, gamma, t_cp: float, t_de: float, t_ec: float):
    """T_di^HLQ = tau gamma t_CP + tau t_DE + t_EC (paper 001, eq. 50); vectorised."""
    tau, gamma = np.asarray(tau, float), np.asarray(gamma, float)
    return tau * gamma * t_cp + tau * t_de + t_ec


def split_constant(num_edges: int, num_devices: int, q1: float) -> float:
    """k = C (1 + q1) / N (paper 001, Sec. IV)."""
    if int(num_edges) != num_edges or num_edges < 1:
        raise ValueError(f"num_edges must be an integer >= 1, got {num_edges!r}")
    if int(num_devices) != num_devices or num_devices < num_edges:
        raise ValueError(f"num_devices must be an integer >= num_edges ({num_edges}), got {num_devices!r}")
    return num_edges * (1 + _positive("q1", q1, allow_zero=True)) / num_devices


def phi(tau, gamma, k: float):
    """Phi(tau, gamma) = k tau (1 + (gamma - 1)/(tau + gamma)) + gamma (gamma - 1)/(tau + gamma): the second term
    of paper 001's Lemma 2 without its constant factor (Sec. IV); vectorised."""
    tau, gamma = np.asarray(tau, float), np.asarray(gamma, float)
    s = tau + gamma
    return k * tau * (1 + (gamma - 1) / s) + gamma * (gamma - 1) / s


def j_of_tau(tau, k: float, a: float, r: float, eps_c: float):
    """J(tau) = (1 - (1 + tau)/(A - r tau - eps_c)) ((k - 1 - r) tau + A - eps_c) + k tau: Phi with the deadline
    binding, gamma = A - (1 + r) tau - eps_c (paper 001, Sec. IV); vectorised."""
    tau = np.asarray(tau, float)
    return (1 - (1 + tau) / (a - r * tau - eps_c)) * ((k - 1 - r) * tau + a - eps_c) + k * tau


def stationary_coefficients(k: float, a: float, r: float, eps_c: float) -> tuple[float, float, float]:
    """(a0, b0, c0) of J'(tau) (A - r tau - eps_c)^2 = a0 tau^2 + b0 tau + c0 (paper 001, Sec. IV)."""
    m, u = k - 1 - r, a - eps_c
    a0 = m * (r * r + r) + k * r * r
    b0 = m * (r + eps_c - a - 2 * u * r) + (-a + eps_c - r) * m - 2 * k * u * r
    c0 = m * (u * u - a + eps_c) + (-a + eps_c - r) * u + k * u * u
    return a0, b0, c0


@dataclass(frozen=True)
class ScaledInputs:
    """The paper's shorthand: A = T_di / t_CP, r = t_DE / t_CP, eps_c = t_EC / t_CP (plus t_DE / t_CP with
    uploads="exact", which charges one more upload per round), k = C (1 + q1) / N."""
    a: float
    r: float
    eps_c: float
    k: float


def scaled_inputs(deadline: float, t_cp: float, t_de: float, t_ec: float, num_edges: int, num_devices: int,
                  q1: float, uploads: str = "paper") -> ScaledInputs:
    t_cp = _positive("t_cp", t_cp)
    t_de, t_ec = _positive("t_de", t_de, allow_zero=True), _positive("t_ec", t_ec, allow_zero=True)
    deadline = _positive("deadline", deadline)
    eps_c = (t_ec + _uploads(uploads) * t_de) / t_cp
    return ScaledInputs(deadline / t_cp, t_de / t_cp, eps_c, split_constant(num_edges, num_devices, q1))


@dataclass(frozen=True)
class TauGammaChoice:
    """Integer (tau, gamma) minimising Phi under the deadline, and the whole cost curve it was picked from:
    curve_tau[i], curve_gamma[i] = floor(slack), curve_phi[i], curve_latency[i] (seconds)."""
    tau: int
    gamma: int
    phi: float
    latency: float
    deadline: float
    uploads: str
    method: str = "brute_force"
    curve_tau: np.ndarray = field(default_factory=lambda: np.zeros(0, int), repr=False)
    curve_gamma: np.ndarray = field(default_factory=lambda: np.zeros(0, int), repr=False)
    curve_phi: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    curve_latency: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def as_dict(self) -> dict:
        return {"tau": self.tau, "gamma": self.gamma, "phi": self.phi, "latency": self.latency,
                "deadline": self.deadline, "uploads": self.uploads, "method": self.method,
                "curve": [{"tau": int(t), "gamma": int(g), "phi": float(p), "latency": float(lat)}
                          for t, g, p, lat in zip(self.curve_tau, self.curve_gamma, self.curve_phi,
                                                  self.curve_latency)]}


def feasible_pairs(deadline: float, t_cp: float, t_de: float, t_ec: float, uploads: str = "paper"
                   ) -> tuple[np.ndarray, np.ndarray]:
    """All integer tau >= 1 with gamma = floor((deadline - T_di(tau, 0)) / t_CP) >= 1, i.e. the deadline spent
    (the paper's equality constraint, rounded down to whole steps; digest 001 section 10)."""
    s = scaled_inputs(deadline, t_cp, t_de, t_ec, 1, 1, 0.0, uploads)
    tau_max = math.floor((s.a - s.eps_c - 1) / (1 + s.r)) if s.a - s.eps_c - 1 >= 1 + s.r else 0
    tau = np.arange(1, tau_max + 1)
    # Small epsilon: A - (1+r) tau - eps_c computed in floats may land a hair below an exact integer.
    gamma = np.floor(s.a - (1 + s.r) * tau - s.eps_c + 1e-9).astype(int)
    keep = gamma >= 1
    return tau[keep], gamma[keep]


def choose_tau_gamma(deadline: float, t_cp: float, t_de: float, t_ec: float, *, num_edges: int, num_devices: int,
                     q1: float, uploads: str = "paper") -> TauGammaChoice:
    """Brute-force integer minimiser of Phi(tau, gamma) under T_di(tau, gamma) <= deadline (paper 001 Sec. IV
    objective; integer search as digest 001 section 10 recommends). Ties go to the larger tau.
    A deadline that no (tau >= 1, gamma >= 1) meets raises ValueError naming the deadline."""
    k = split_constant(num_edges, num_devices, q1)
    tau, gamma = feasible_pairs(deadline, t_cp, t_de, t_ec, uploads)
    if tau.size == 0:
        least = float(round_latency(1, 1, t_cp, t_de, t_ec, uploads))
        raise ValueError(f"deadline must be at least T_di(1, 1) = {least:.6g} s, got {deadline!r}")
    cost = phi(tau, gamma, k)
    best = int(np.flatnonzero(cost == cost.min())[-1])
    latency = round_latency(tau, gamma, t_cp, t_de, t_ec, uploads)
    return TauGammaChoice(int(tau[best]), int(gamma[best]), float(cost[best]), float(latency[best]), float(deadline),
                          uploads, "brute_force", tau, gamma, cost, latency)


@dataclass(frozen=True)
class ClosedFormChoice:
    """The paper's closed-form pick: tau in {1, real roots}, gamma = A - (1 + r) tau - eps_c (real numbers).
    `feasible` says whether tau >= 1 and gamma >= 1; `roots` are the real stationary points of J."""
    tau: float
    gamma: float
    j: float
    roots: tuple[float, ...]
    coefficients: tuple[float, float, float]
    feasible: bool
    method: str = "closed_form"


def closed_form_tau_gamma(deadline: float, t_cp: float, t_de: float, t_ec: float, *, num_edges: int,
                          num_devices: int, q1: float, uploads: str = "paper") -> ClosedFormChoice:
    """Paper 001 Sec. IV: tau_opt = argmin over {1, (-b0 +- sqrt(b0^2 - 4 a0 c0)) / (2 a0)} of J(tau).
    Complex roots are dropped (the paper is silent; digest 001 section 10), as are roots where the
    deadline leaves no time (A - r tau - eps_c <= 0, where J has its pole)."""
    s = scaled_inputs(deadline, t_cp, t_de, t_ec, num_edges, num_devices, q1, uploads)
    a0, b0, c0 = stationary_coefficients(s.k, s.a, s.r, s.eps_c)
    if a0 != 0:
        roots = np.roots([a0, b0, c0])
    else:
        roots = np.array([-c0 / b0]) if b0 != 0 else np.zeros(0)
    real = tuple(sorted(float(x.real) for x in np.atleast_1d(roots) if abs(complex(x).imag) < 1e-9 * max(1, abs(x))))
    candidates = [1.0] + [x for x in real if s.a - s.r * x - s.eps_c > 0]
    values = [float(j_of_tau(x, s.k, s.a, s.r, s.eps_c)) for x in candidates]
    tau = candidates[int(np.argmin(values))]
    gamma = s.a - (1 + s.r) * tau - s.eps_c
    return ClosedFormChoice(tau, gamma, min(values), real, (a0, b0, c0), tau >= 1 and gamma >= 1)


def random_feasible_pair(deadline: float, t_cp: float, t_de: float, t_ec: float, rng: np.random.Generator,
                         uploads: str = "paper") -> tuple[int, int]:
    """Fig. 9's baseline: tau uniform over the feasible integers, gamma = floor(slack) (digest 001 section 10)."""
    tau, gamma = feasible_pairs(deadline, t_cp, t_de, t_ec, uploads)
    if tau.size == 0:
        raise ValueError(f"deadline must be at least T_di(1, 1) = "
                         f"{float(round_latency(1, 1, t_cp, t_de, t_ec, uploads)):.6g} s, got {deadline!r}")
    i = int(rng.integers(tau.size))
    return int(tau[i]), int(gamma[i])


def format_choice(choice: TauGammaChoice, closed: ClosedFormChoice | None = None, limit: int = 40) -> str:
    """Human-readable choice and cost curve (for `hfl plan`); at most `limit` curve rows, evenly spaced."""
    lines = [f"chosen tau={choice.tau} gamma={choice.gamma} Phi={choice.phi:.6g} T_di={choice.latency:.6g} s "
             f"(deadline {choice.deadline:.6g} s, uploads={choice.uploads}, {choice.method})"]
    if closed is not None:
        lines.append(f"closed form (paper): tau={closed.tau:.4g} gamma={closed.gamma:.4g} J={closed.j:.6g} "
                     f"roots={[round(r, 4) for r in closed.roots]} feasible={closed.feasible}")
    rows = np.unique(np.linspace(0, choice.curve_tau.size - 1, min(limit, choice.curve_tau.size)).astype(int))
    lines.append(f"{'tau':>6} {'gamma':>7} {'Phi':>12} {'T_di (s)':>10}")
    lines += [f"{choice.curve_tau[i]:>6} {choice.curve_gamma[i]:>7} {choice.curve_phi[i]:>12.6g} "
              f"{choice.curve_latency[i]:>10.4g}" for i in rows]
    return "\n".join(lines)
