"""Noise calibration: the paper's formula (`paper`), an accountant-backed planned run (`sound`, the
default), or a user-given noise multiplier (`noise_multiplier`).

Every result is a NoiseSetting labelled with the mode that produced it. `epsilon` is always the
accountant's (dp_accounting) figure for the planned run; `epsilon_claimed` is the paper's own arithmetic
and is set only in `paper` mode, so a claimed figure is never presented as measured.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Sequence

import dp_accounting
import numpy as np

from .accountant import epsilon_of_dp_events, epsilon_of_releases, make_accountant
from .events import MECHANISMS, DpRecord, accounting_event
from .wavelet import lemma2_multiplier

MODES = ("paper", "sound", "noise_multiplier")


@dataclass(frozen=True)
class NoiseSetting:
    """Noise for one stream at one tier: std = noise_multiplier x sensitivity."""

    mode: str
    tier: str               # "device" | "edge"
    stream: str             # "local" | "global"
    mechanism: str
    noise_multiplier: float
    sensitivity: float
    std: float
    releases: int           # releases of this stream per device over the planned run
    sampling_rate: float
    epsilon: float          # accountant's epsilon of the whole planned run, all streams, per device
    epsilon_claimed: float | None
    delta: float
    accountant: str

    def record(self, node: str, covers: Sequence[str], round_: int, count: int = 1) -> DpRecord:
        return DpRecord(tier=self.tier, node=node, covers=tuple(covers), mechanism=self.mechanism,
                        noise_multiplier=self.noise_multiplier, sensitivity=self.sensitivity,
                        sampling_rate=self.sampling_rate, count=count, round=round_, stream=self.stream)


@contextlib.contextmanager
def _quiet_search():
    """dp_accounting's RDP series log a warning (via absl) for every order they drop at the small multipliers a
    calibration search probes; the search result is unaffected, so those are silenced while it runs."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _positive(name: str, value: float) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_common(epsilon: float, delta: float, mode: str) -> None:
    _positive("epsilon", epsilon)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if mode not in MODES:
        raise ValueError(f"calibration must be one of {', '.join(MODES)}, got {mode!r}")


def calibrate_multiplier(epsilon: float, delta: float, releases: int, sampling_rate: float = 1.0,
                         mechanism: str = "gaussian", accountant: str = "rdp", tol: float = 1e-5) -> float:
    """Smallest noise multiplier z for which `releases` compositions of the (subsampled) mechanism meet
    (epsilon, delta), found by dp_accounting.calibrate_dp_mechanism (Brent's method over the accountant).

    `tol` is the search tolerance on z (absolute; on the per-release z for unsampled Gaussians). The
    result is checked against the accountant and nudged up if the search stopped a hair on the wrong
    side, so the planned run never exceeds epsilon.
    """
    _check_common(epsilon, delta, "sound")
    if int(releases) != releases or releases < 1:
        raise ValueError(f"releases must be an integer >= 1, got {releases!r}")
    if not 0.0 < sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must lie in (0, 1], got {sampling_rate!r}")
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    # n unsampled Gaussian releases at z are one Gaussian at z / sqrt(n): calibrate that, then scale back.
    folded = mechanism == "gaussian" and sampling_rate == 1.0
    scale = math.sqrt(releases) if folded else 1.0

    def event(z: float) -> dp_accounting.DpEvent:
        return accounting_event(mechanism, z, sampling_rate, 1 if folded else int(releases))

    with _quiet_search():
        z = dp_accounting.calibrate_dp_mechanism(lambda: make_accountant(accountant), event, epsilon, delta,
                                                 tol=tol) * scale
    spent = lambda z_: epsilon_of_releases([(mechanism, z_, sampling_rate, releases)], delta, accountant)
    while spent(z) > epsilon:
        z += tol * scale
    return float(z)


# ----------------------------------------------------------------------------------------------------
# H2FDP (paper 000)

def h2fdp_sensitivity(eta: float, tau: int, clip: float, participants: int = 1) -> float:
    """Delta = 2 eta tau G (device upload) or 2 eta tau G / s_c (trusted edge aggregate), paper 000 Lemma 3.2.

    Literal reading (digest 000 Sec. 10): tau, not the local window m, even for local windows, and the
    factor 2 of the lemma's statement (its proof derives eta tau G). With every minibatch gradient
    clipped to G, a window of w <= tau steps moves a device by at most eta w G, so replacing its data
    moves its upload by at most 2 eta tau G and a mean over s_c devices by 2 eta tau G / s_c: sound.
    """
    _positive("eta (step size)", eta)
    _positive("clip (G)", clip)
    if int(tau) != tau or tau < 1:
        raise ValueError(f"tau must be an integer >= 1, got {tau!r}")
    if int(participants) != participants or participants < 1:
        raise ValueError(f"participants (s_c) must be an integer >= 1, got {participants!r}")
    return 2.0 * eta * tau * clip / participants


def local_aggregations_per_round(tau: int, period: int) -> int:
    """K_l: local aggregations strictly inside a global interval, (tau - 1) // m (tau = 20, m = 5 gives 3).

    Digest 000 Sec. 10: the global aggregation at t_{k+1} subsumes the last local one.
    """
    if int(tau) != tau or tau < 1 or int(period) != period or period < 1:
        raise ValueError(f"tau and period (m) must be integers >= 1, got tau={tau!r}, period={period!r}")
    return (tau - 1) // period


def paper_sigma(sensitivity: float, q: float, releases: int, epsilon: float, delta: float, c2: float = 1.0) -> float:
    """sigma = c2 q Delta sqrt(L ln(1/delta)) / epsilon, paper 000 Prop. 3.1 (log read as natural log,
    digest 000 Sec. 10). c2 is not given by the paper: it is a knob."""
    _check_common(epsilon, delta, "paper")
    _positive("sensitivity", sensitivity)
    _positive("c2", c2)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q (record sampling ratio) must lie in (0, 1], got {q!r}")
    if int(releases) != releases or releases < 1:
        raise ValueError(f"releases (L) must be an integer >= 1, got {releases!r}")
    return c2 * q * sensitivity * math.sqrt(releases * math.log(1.0 / delta)) / epsilon


def aggregate_noise_variance(stds: Sequence[float], weights: Sequence[float]) -> float:
    """Per-coordinate variance of sum_j w_j n_j with independent n_j ~ N(0, std_j^2): sum_j w_j^2 std_j^2.

    Trusted cluster: one edge draw, weight 1. Untrusted cluster: the mean of s_c device draws, weights
    1/s_c (paper 000 Eqs. 10-12), so its variance is sigma_i^2 / s_c.
    """
    s, w = np.asarray(stds, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    if s.shape != w.shape or s.ndim != 1 or np.any(s < 0):
        raise ValueError("stds and weights must be equal-length lists, stds >= 0")
    return float(np.sum(w ** 2 * s ** 2))


def calibrate_h2fdp(*, trusted: bool, epsilon: float, delta: float, eta: float, tau: int, clip: float,
                    rounds: int, local_per_round: int, participants: int, mode: str = "sound", q: float = 1.0,
                    c2: float = 1.0, v2: float | None = None, noise_multiplier: float | None = None,
                    rounds_participating: int | None = None, accountant: str = "rdp",
                    window: int | None = None) -> dict[str, NoiseSetting]:
    """Noise of the local and global streams of one H2FDP cluster (paper 000 Sec. 3; Alg. 2).

    `window`: the steps one release sums (m, privacy.sensitivity = window: Delta = 2 eta m G, sound and tight, since
    every upload is the delta since the last aggregation); None = tau, the paper's literal reading.

    Trusted edge: one draw on the cluster mean, Delta = 2 eta tau G / s_c; untrusted: one draw per
    device, Delta = 2 eta tau G. Returns {"local": ..., "global": ...} ("local" absent when
    local_per_round is 0). The std of a later round with another eta, tau or s_c is
    noise_multiplier x h2fdp_sensitivity(eta_k, tau_k, G, s_c^k): the multiplier is what is accounted.

    Modes:
    - `paper`: sigma = c2 q Delta sqrt(L ln(1/delta)) / epsilon per stream, L = rounds x K_l (local) or
      rounds (global), v2 in place of c2 on devices (v2 = c2 by default). `epsilon_claimed` is the
      paper's claim, epsilon per stream. `epsilon` is what the accountant finds for the same noise
      with both streams composed and no amplification by q (see below); expect it to be far larger.
    - `sound` (default): one multiplier z for every release, the smallest such that all releases that
      cover one device over the planned run meet (epsilon, delta) under dp_accounting.
    - `noise_multiplier`: z given; `epsilon` reports what the planned run spends.

    Why `sound` counts what it counts:
    1. Parties. An untrusted edge sees each device's local and global uploads; the other devices of
       the cluster see the local aggregates and then the global model; the cloud sees the global
       uploads, whose cluster part w_c - w^(t_k) carries the local aggregates of the interval. Every
       party's view is thus a post-processing of (part of) the device's local and global releases, so
       composing both streams, rounds x (K_l + 1) releases, bounds every party at once. Calibrating each
       stream to the full epsilon, as the paper does, would let the edge and cluster peers see ~2x.
    2. No amplification by q. A release sums tau (or m) minibatch steps of the same device and the
       clip bounds the minibatch gradient, not a record's: a record is not included with probability q
       in the released sum, so Poisson-subsampled accounting at rate q does not apply. The unit of
       privacy is the device's whole data set (replace-one), which is what Delta above bounds.
    3. No amplification by participation. s_c^k of N_c devices are drawn each round, which would be
       valid subsampling of a device's whole round contribution if the draw were secret. Here it comes
       from the run seed and travels in the plan, so the cloud and the edges know who took part, and
       its amplification is void against them. A device is therefore charged for every round it may
       take part in: `rounds_participating` (default: every round) times (K_l + 1) releases.
    """
    _check_common(epsilon, delta, mode)
    if int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds (K_g) must be an integer >= 1, got {rounds!r}")
    if int(local_per_round) != local_per_round or local_per_round < 0:
        raise ValueError(f"local_per_round (K_l) must be an integer >= 0, got {local_per_round!r}")
    charged = rounds if rounds_participating is None else rounds_participating
    if int(charged) != charged or not 1 <= charged <= rounds:
        raise ValueError(f"rounds_participating must be an integer in [1, rounds={rounds}], got {charged!r}")
    tier = "edge" if trusted else "device"
    delta_sens = h2fdp_sensitivity(eta, tau if window is None else window, clip, participants if trusted else 1)
    counts = {"local": charged * local_per_round, "global": charged}
    streams = [s for s in ("local", "global") if counts[s] > 0]
    claimed = None
    if mode == "paper":
        const = c2 if trusted else (c2 if v2 is None else v2)
        # L in the paper is the planned number of aggregations of that kind (l_c = K_g K_l, or K_g).
        paper_l = {"local": rounds * local_per_round, "global": rounds}
        z = {s: paper_sigma(delta_sens, q, paper_l[s], epsilon, delta, const) / delta_sens for s in streams}
        claimed = float(epsilon)
    elif mode == "sound":
        z_all = calibrate_multiplier(epsilon, delta, sum(counts.values()), accountant=accountant)
        z = {s: z_all for s in streams}
    else:
        if noise_multiplier is None:
            raise ValueError("calibration = noise_multiplier needs noise_multiplier > 0")
        z = {s: _positive("noise_multiplier", noise_multiplier) for s in streams}
    spent = epsilon_of_releases([("gaussian", z[s], 1.0, counts[s]) for s in streams], delta, accountant)
    return {s: NoiseSetting(mode=mode, tier=tier, stream=s, mechanism="gaussian", noise_multiplier=z[s],
                            sensitivity=delta_sens, std=z[s] * delta_sens, releases=counts[s], sampling_rate=1.0,
                            epsilon=spent, epsilon_claimed=claimed, delta=delta, accountant=accountant)
            for s in streams}


# ----------------------------------------------------------------------------------------------------
# User-level DP-FedAvg (McMahan et al. 2018; paper 002 Alg. 2 without wavelets)

def dp_fedavg_weights(sizes: Sequence[int], client_rate: float) -> np.ndarray:
    """p_k = d_k / (q_c d), d = sum of all clients' sizes: the fixed-denominator weights (paper 002 Eq. 4)."""
    d = np.asarray(sizes, dtype=np.float64)
    if d.ndim != 1 or d.size == 0 or np.any(d <= 0):
        raise ValueError("sizes must be a non-empty list of sample counts > 0")
    if not 0.0 < client_rate <= 1.0:
        raise ValueError(f"client_rate (q_c) must lie in (0, 1], got {client_rate!r}")
    return d / (client_rate * d.sum())


def calibrate_dp_fedavg(*, epsilon: float, delta: float, rounds: int, client_rate: float, clip: float,
                        sizes: Sequence[int], mode: str = "sound", noise_multiplier: float | None = None,
                        accountant: str = "rdp", amplified: bool = False) -> NoiseSetting:
    """Noise at the trusted aggregator of user-level DP-FedAvg: each client's update clipped to S,
    w_{t+1} = w_t + sum_k p_k clip(Delta_k) + N(0, std^2 I) (paper 002 P8, P9).

    Sensitivity: adding or removing client k moves sum_k p_k Delta_k by at most S max_k p_k, so the
    sound std is z S max_k p_k. A Poisson-subsampled Gaussian at rate q_c would be valid only if the draw stayed
    secret; the edge's report (devices, samples, bytes of the drawn set) shows it to the cloud, so `sound` and
    `noise_multiplier` charge every round unsampled (`amplified` = False, the default): a client drawn in every
    round spends what the accountant finds for `rounds` plain Gaussian releases. `amplified` = True is the
    paper's claim (paper 002 via McMahan et al.), which holds only against parties that cannot see the draw.
    - `sound`: z from the accountant for (epsilon, delta); std = z S max_k p_k.
    - `paper`: paper 002 Eq. 5, std = z S / (q_c d), which drops d_k; z is `noise_multiplier` if given,
      else the one the accountant picks. `epsilon_claimed` is the accountant's figure for z (what the
      paper reports); `epsilon` is the accountant's figure for the noise really added, std / (S max p_k).
    - `noise_multiplier`: z given; std = z S max_k p_k; `epsilon` is what the run spends.
    """
    _check_common(epsilon, delta, mode)
    _positive("clip (S)", clip)
    if int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    p = dp_fedavg_weights(sizes, client_rate)
    sensitivity = clip * float(p.max())
    if mode == "noise_multiplier" or (mode == "paper" and noise_multiplier is not None):
        if noise_multiplier is None:
            raise ValueError("calibration = noise_multiplier needs noise_multiplier > 0")
        z = _positive("noise_multiplier", noise_multiplier)
    else:
        z = calibrate_multiplier(epsilon, delta, rounds, client_rate if mode == "paper" or amplified else 1.0,
                                 accountant=accountant)
    rate = client_rate if amplified else 1.0  # what the ledger charges
    claimed = None
    if mode == "paper":
        std = z * clip / (client_rate * float(np.sum(sizes)))
        claimed = epsilon_of_releases([("gaussian", z, client_rate, rounds)], delta, accountant)
        z = std / sensitivity
    spent = epsilon_of_releases([("gaussian", z, rate, rounds)], delta, accountant)
    return NoiseSetting(mode=mode, tier="edge", stream="global", mechanism="gaussian", noise_multiplier=z,
                        sensitivity=sensitivity, std=z * sensitivity, releases=int(rounds), sampling_rate=rate,
                        epsilon=spent, epsilon_claimed=claimed, delta=delta, accountant=accountant)


def h2fdp_round_records(round_: int, levels: dict[str, str], participants: dict[str, Sequence[str]],
                        settings: dict[str, dict[str, NoiseSetting]], local_per_round: int) -> list[DpRecord]:
    """The DP records one H2FDP round will produce, for the ledger's budget check before the round
    (and to compare with what the messages report after it).

    levels: edge -> "trusted"/"untrusted"; participants: edge -> device ids taking part; settings:
    edge -> {"local": ..., "global": ...} from calibrate_h2fdp. A trusted edge makes one record per
    stream covering its participants; behind an untrusted edge each participant makes its own.
    """
    per_round = {"local": local_per_round, "global": 1}
    records = []
    for edge in sorted(levels):
        members = tuple(sorted(participants.get(edge, ())))
        if not members:
            continue
        for stream, setting in sorted(settings[edge].items()):
            if per_round[stream] == 0:
                continue
            if levels[edge] == "trusted":
                records.append(setting.record(edge, members, round_, per_round[stream]))
            else:
                records.extend(setting.record(d, (d,), round_, per_round[stream]) for d in members)
    return records


# ----------------------------------------------------------------------------------------------------
# Sample-level DP-SGD and DP-SGD-WAV (Abadi et al. 2016; paper 002 Alg. 1)

def _sampled_epsilon(z: float, steps: int, rate: float, population: int, delta: float, accountant: str) -> float:
    return epsilon_of_dp_events([accounting_event("gaussian", z, rate, steps, population)], delta, accountant,
                                replace_one=population > 0 and rate < 1.0)


def calibrate_dp_sgd(*, epsilon: float, delta: float, steps: int, lot_rate: float, clip: float, mode: str = "sound",
                     noise_multiplier: float | None = None, accountant: str = "rdp", lot: str = "poisson",
                     dataset_size: int = 0, wavelet: str = "", max_weight: float = 1.0, lemma2: bool = False
                     ) -> NoiseSetting:
    """Noise of `steps` DP-SGD steps on one device's data (all rounds together): each step is a subsampled
    Gaussian on the sum of per-example vectors clipped to `clip` (C, or sqrt(sum_j C_j^2) per layer).

    z is what scales the noise (std z C, or z C / W_c on wavelet coefficient c): `noise_multiplier` when
    mode = noise_multiplier, else the accountant's smallest z for (epsilon, delta) (paper 002 takes the vanilla
    accountant's sigma, so `paper` picks z the same way). The returned `noise_multiplier` is the one the noise
    REALLY gives against the clip, which the ledger composes:
    - Poisson lots (rate q, add/remove-one): z; fixed lots of round(q n) without replacement (replace-one, where
      the clipped sum moves by up to 2C): z / 2, with `dataset_size` n as the population;
    - wavelet = "paper" (||H|| <= C, noise z C / W_c; digest 002 P1): z / max_c W_c, and `epsilon_claimed` is the
      accountant's figure for z, the paper's claim; wavelet = "sound" (||W (.) H|| <= C): z itself;
    - `lemma2` (a wavelet only): the noise is scaled by paper 002's Lemma 2, z_Haar = z sqrt(2 / (2 + log2 m)) with m =
      `max_weight` (the padded length), so the noise std is z_Haar C (/ W_c); `epsilon_claimed` is the accountant's
      figure for z (the paper's claim that the same (epsilon, delta) holds) and the multiplier really given is
      z_Haar (sound clip) or z_Haar / m (paper clip).
    """
    _check_common(epsilon, delta, mode)
    _positive("clip", clip)
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not 0.0 < lot_rate <= 1.0:
        raise ValueError(f"lot_rate must lie in (0, 1], got {lot_rate!r}")
    if lot not in ("poisson", "fixed"):
        raise ValueError(f"lot must be poisson or fixed, got {lot!r}")
    if wavelet not in ("", "sound", "paper"):
        raise ValueError(f"wavelet must be '', sound or paper, got {wavelet!r}")
    fixed = lot == "fixed" and lot_rate < 1.0
    population = int(dataset_size) if fixed else 0
    if fixed and population < 1:
        raise ValueError("fixed lots need dataset_size >= 1 (the population sampled without replacement)")
    rate = (max(1, round(lot_rate * population)) / population) if fixed else float(lot_rate)
    adjacency = 2.0 if fixed else 1.0
    if mode == "noise_multiplier":
        if noise_multiplier is None:
            raise ValueError("calibration = noise_multiplier needs noise_multiplier > 0")
        z = _positive("noise_multiplier", noise_multiplier)
    elif fixed:
        with _quiet_search():
            z = adjacency * dp_accounting.calibrate_dp_mechanism(
                lambda: make_accountant(accountant, replace_one=True),
                lambda z_: accounting_event("gaussian", z_, rate, int(steps), population), epsilon, delta, tol=1e-5,
                bracket_interval=dp_accounting.LowerEndpointAndGuess(0.05, 1.0))  # z = 0 divides by zero there
        while _sampled_epsilon(z / adjacency, steps, rate, population, delta, accountant) > epsilon:
            z += 1e-5 * adjacency
    else:
        z = calibrate_multiplier(epsilon, delta, int(steps), rate, accountant=accountant)
    claimed = None
    true_z = z / adjacency
    if lemma2:
        if not wavelet:
            raise ValueError("lemma2 scales wavelet noise only (wavelet = sound or paper)")
        claimed = _sampled_epsilon(true_z, steps, rate, population, delta, accountant)
        z = lemma2_multiplier(z, int(max_weight))
        true_z = z / adjacency
    if wavelet == "paper":
        if claimed is None:
            claimed = _sampled_epsilon(true_z, steps, rate, population, delta, accountant)
        true_z = true_z / float(max_weight)
    spent = _sampled_epsilon(true_z, steps, rate, population, delta, accountant)
    return NoiseSetting(mode=mode, tier="device-sample", stream="sample", mechanism="gaussian",
                        noise_multiplier=true_z, sensitivity=float(clip), std=z * float(clip), releases=int(steps),
                        sampling_rate=rate, epsilon=spent, epsilon_claimed=claimed, delta=delta, accountant=accountant)
