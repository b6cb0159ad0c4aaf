"""The [privacy] section of the run configuration and its cross-checks.

    [privacy]
    enabled = true
    trust = "untrusted"                  # every edge not named in trust_table
    trust_table = { "edge-000" = "trusted" }
    # or: trusted_fraction = 0.5         # exactly round(0.5 * edges) trusted edges, drawn from the run seed
    epsilon = 1.0
    delta = 1e-5
    calibration = "sound"                # paper | sound | noise_multiplier

This module registers the section (`config.privacy`) and `validate_config`, the checks across sections.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from hfl.common.config import ConfigError, choice, doc, register_section, register_validator

from .trust import LEVELS, TRUSTED, resolve_trust, trusted_count


@dataclass(frozen=True)
class PrivacySection:
    enabled: bool = doc(False, "add DP noise and keep the privacy ledger")
    level: str = choice("user", ("user", "sample"), "unit of privacy: a device's whole data (user) or one record (sample, DP-SGD)")
    placement: str = choice("by_trust", ("by_trust", "aggregator", "sample"),
                            "by_trust: H2FDP, the trusted edge adds noise, else every device; aggregator: DP-FedAvg, "
                            "only trusted edges add noise (every edge must be trusted); sample: DP-SGD on every device "
                            "(set by the algorithm)")
    trust: str = choice("untrusted", LEVELS, "trust of every edge not named in trust_table (the cloud is never trusted)")
    trust_table: dict = field(default_factory=dict, metadata={"doc": "per-edge trust: [privacy.trust_table] edge-000 = \"trusted\""})
    trusted_fraction: float = doc(-1.0, "exactly round(p * edges) trusted edges drawn from the run seed; -1 = unset")
    epsilon: float = doc(1.0, "privacy budget per device for the whole run")
    delta: float = doc(1e-5, "delta of the (epsilon, delta) budget, in (0, 1)")
    clip: float = doc(1.0, "clip norm: G on minibatch gradients (H2FDP) or S on each update (DP-FedAvg)")
    calibration: str = choice("sound", ("paper", "sound", "noise_multiplier"),
                              "paper: the paper's formula (epsilon labelled claimed); sound: accountant-calibrated; "
                              "noise_multiplier: the given z")
    noise_multiplier: float = doc(1.0, "calibration = noise_multiplier: z = noise std / sensitivity")
    c2: float = doc(1.0, "paper calibration constant c2 (not given by paper 000)")
    v2: float = doc(-1.0, "paper constant for device noise (paper 000 Thm 4.3); -1 = equal to c2")
    accountant: str = choice("rdp", ("rdp", "pld"), "dp_accounting accountant")
    mechanism: str = choice("gaussian", ("gaussian", "laplace", "wavelet"),
                            "noise distribution; wavelet: Gaussian noise on the Haar coefficients, std / W_c (paper 002)")
    wavelet_mode: str = choice("auto", ("auto", "sound", "paper"),
                               "wavelet clip: sound clips ||W (.) H|| <= C (a true Gaussian mechanism); paper clips "
                               "||H|| <= C (paper 002, epsilon only claimed, digest P1); auto: paper when calibration "
                               "= paper, else sound")
    wavelet_scope: str = choice("flat", ("flat", "per_layer"), "Haar transform of the whole flattened model or of each "
                                "parameter tensor")
    lot_rate: float = doc(0.05, "sample level: lot sampling rate q (each record joins a lot with probability q)")
    lot: str = choice("poisson", ("poisson", "fixed"), "sample level: Poisson lots (the accountant's assumption) or "
                      "fixed-size lots of round(q n), accounted as sampling without replacement")
    layer_clips: tuple[float, ...] = doc((), "sample level: per-layer clip C_j, one per parameter tensor (sensitivity "
                                         "sqrt(sum C_j^2)); empty = flat clip at privacy.clip")
    client_rate: float = doc(1.0, "DP-FedAvg client sampling rate q_c, in (0, 1]")
    noise_source: str = choice("secret", ("secret", "seeded"),
                               "secret: every DP draw (noise, lots, client draws, DP-SQ coins) from a fresh CSPRNG key on "
                               "the node that adds it; seeded: from run.seed, for bit-identical replays only (the run "
                               "is then not private against anyone holding run.seed, and says so)")
    trace_uploads: bool = doc(False, "edges log the names (never the values) of every upload's scalars and transform "
                              "parameters (logs/edge-*.log, 'upload keys'): audit what leaves a device")
    wavelet_sigma: str = choice("algorithm", ("algorithm", "lemma2"),
                                "wavelet noise multiplier: algorithm = sigma itself (paper 002 Algs. 1-2); lemma2 = "
                                "sigma sqrt(2 / (2 + log2 m)) (paper 002 Lemma 2, corrected; m the padded length): "
                                "less noise for the same claimed epsilon, so epsilon_claimed is the paper's claim for "
                                "sigma and epsilon the accountant's for the noise really added (digest P1, P2)")
    optimizer: str = choice("sgd", "hfl.common.privacy.optimizers:OPTIMIZERS",
                            "sample-level DP-SGD: the update rule the clipped, noised lot gradient is fed to (adam: "
                            "DP-Adam, adagrad: DP-AdaGrad; post-processing, so the accounting is DP-SGD's); moments "
                            "start afresh in every local phase")
    dyn_rho_c: float = doc(0.5, "Dyn-DP (dyn-dp-sgd, dyn-dp-fedavg): the clip decays to rho_c x its first value over "
                           "the run, C_r = C rho_c^(r / rounds) (Du et al. 2021)")
    dyn_rho_mu: float = doc(0.5, "Dyn-DP: the noise multiplier decays to rho_mu x its first value, z_r = z_0 "
                            "rho_mu^(r / rounds) (Du et al. 2021)")
    dyn_budget: str = choice("accountant", ("accountant", "gdp"),
                             "Dyn-DP: z_0 spends the budget of the constant multiplier by dp_accounting's epsilon "
                             "(accountant) or by Du et al.'s CLT Gaussian-DP total (gdp, their Eq. 10); the ledger "
                             "charges the noise really added either way")
    clip_rule: str = choice("fixed", ("fixed", "median_proxy"),
                            "sample level: fixed = privacy.clip; median_proxy = the median per-example gradient norm "
                            "(Haar coefficient norm for the wavelet clip) at the initial model over privacy.clip_proxy "
                            "test images drawn from the run seed, computed once by the cloud before training (digest "
                            "002 P13; the test split is public and no device trains on it)")
    clip_proxy: int = doc(256, "clip_rule = median_proxy: size of the public proxy set", min=1)
    sensitivity: str = choice("auto", ("auto", "window", "tau"),
                              "H2FDP sensitivity: window = 2 eta m G (a release sums one window of m = train.gamma "
                              "steps: sound and tight); tau = 2 eta tau G (paper 000 Lemma 3.2, literal); auto: tau when "
                              "calibration = paper, else window")


def effective(section: PrivacySection, algorithm) -> PrivacySection:
    """The section as a run with `algorithm` (plans.Algorithm) applies it: a private algorithm enables privacy and
    fixes the placement, the level, and where it says so the trust and the noise mechanism."""
    if not algorithm.privacy:
        return section
    return dataclasses.replace(section, enabled=True, placement=algorithm.privacy,
                               trust=algorithm.trust or section.trust,
                               level="sample" if algorithm.privacy == "sample" else section.level,
                               mechanism=algorithm.noise or section.mechanism)


def wavelet_calibration(section: PrivacySection) -> str:
    """The wavelet clip in force: privacy.wavelet_mode, where "auto" follows privacy.calibration."""
    if section.wavelet_mode != "auto":
        return section.wavelet_mode
    return "paper" if section.calibration == "paper" else "sound"


def sensitivity_window(section: PrivacySection, train) -> int:
    """The number of SGD steps one H2FDP release is charged for: m = train.gamma (window) or train.tau (paper)."""
    reading = section.sensitivity
    if reading == "auto":
        reading = "tau" if section.calibration == "paper" else "window"
    return int(train.tau) if reading == "tau" else int(train.gamma)


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"privacy.{key} {message}")


def validate_privacy(section: PrivacySection, edge_ids: Sequence[str], algorithm: str = "") -> None:
    """Cross-checks the loader cannot do alone; each failure names its key. `algorithm` (run.algorithm)
    counts as DP-FedAvg when it is "dp-fedavg", like placement = "aggregator"."""
    if not section.epsilon > 0:
        _fail("epsilon", f"must be > 0, got {section.epsilon!r}")
    if not 0.0 < section.delta < 1.0:
        _fail("delta", f"must lie in (0, 1), got {section.delta!r}")
    if section.clip < 0:
        _fail("clip", f"must be >= 0 (a norm), got {section.clip!r}")
    if section.enabled and section.clip == 0:
        _fail("clip", "must be > 0 when privacy is enabled (a zero bound erases every update)")
    if section.calibration == "noise_multiplier" and not section.noise_multiplier > 0:
        _fail("noise_multiplier", f"must be > 0, got {section.noise_multiplier!r}")
    if not 0.0 < section.lot_rate <= 1.0:
        _fail("lot_rate", f"must lie in (0, 1], got {section.lot_rate!r}")
    if any(not c > 0 for c in section.layer_clips):
        _fail("layer_clips", f"must all be > 0, got {list(section.layer_clips)!r}")
    if section.placement == "sample" and section.mechanism == "laplace":
        _fail("mechanism", "laplace has no sample-level DP-SGD here (its L1 sensitivity of a sum of L2-clipped "
                           "gradients is unbounded); use gaussian or wavelet")
    if section.layer_clips and section.placement != "sample":
        _fail("layer_clips", "applies to sample-level DP-SGD only (placement = sample)")
    if section.layer_clips and section.mechanism == "wavelet" and section.wavelet_scope != "per_layer":
        _fail("wavelet_scope", "must be per_layer when privacy.layer_clips are given with the wavelet mechanism "
                               "(each layer's coefficients are clipped to its own C_j)")
    if section.enabled and section.mechanism == "wavelet" and section.placement == "by_trust":
        _fail("mechanism", "wavelet noise is built for dp-sgd-wav (sample level) and dp-fedavg-wav (trusted "
                           "aggregator), not for H2FDP's by-trust placement")
    if section.enabled and section.placement == "aggregator" and section.mechanism == "wavelet" \
            and section.wavelet_scope != "flat":
        _fail("wavelet_scope", "must be flat at a trusted aggregator (dp-fedavg-wav transforms the whole update); "
                               "per_layer applies to sample-level DP-SGD-WAV")
    if section.enabled and section.placement == "by_trust" and section.mechanism == "laplace":
        _fail("mechanism", "laplace is not available under by-trust placement (H2FDP / HFL-DP): updates are clipped "
                           "in L2 (every minibatch gradient to G), and a Laplace mechanism needs an L1 sensitivity, "
                           "which grows with sqrt(dimension) for an L2-clipped update; use gaussian")
    if section.enabled and section.placement == "aggregator" and section.mechanism == "laplace":
        _fail("mechanism", "laplace is not available for DP-FedAvg: its updates are clipped in L2, and the L1 "
                           "sensitivity of an L2-clipped update grows with sqrt(dimension)")
    if section.enabled and section.placement == "sample" and section.lot == "fixed" and section.accountant != "rdp":
        _fail("accountant", "must be rdp with fixed lots: dp_accounting's PLD accountant has no sampling without "
                            "replacement")
    if section.wavelet_sigma == "lemma2" and section.enabled and section.mechanism != "wavelet":
        _fail("wavelet_sigma", "lemma2 scales wavelet noise only (dp-sgd-wav, dp-fedavg-wav)")
    if section.optimizer != "sgd" and section.enabled and section.placement != "sample":
        _fail("optimizer", f"{section.optimizer} applies to sample-level DP-SGD only (dp-sgd, dp-sgd-wav, dyn-dp-sgd)")
    if not (0.0 < section.dyn_rho_c <= 1.0 and 0.0 < section.dyn_rho_mu <= 1.0):
        _fail("dyn_rho_c", f"and dyn_rho_mu must lie in (0, 1], got {section.dyn_rho_c!r}, {section.dyn_rho_mu!r}")
    if section.clip_rule == "median_proxy" and section.enabled and section.placement != "sample":
        _fail("clip_rule", "median_proxy sets a per-example clip: sample-level DP-SGD only (a user-level clip bounds a "
                           "whole update, not an example's gradient)")
    if section.clip_rule == "median_proxy" and section.layer_clips:
        _fail("clip_rule", "median_proxy sets one flat clip; it cannot be combined with privacy.layer_clips")
    from hfl.common import plans

    schedule = plans.ALGORITHMS.get(algorithm).schedule if algorithm in plans.ALGORITHMS else ""
    if schedule == "dyn" and section.enabled and section.mechanism != "gaussian":
        _fail("mechanism", f"{algorithm} schedules Gaussian noise (Du et al. 2021); got {section.mechanism!r}")
    if schedule == "dyn" and section.enabled and section.placement == "sample" and section.lot != "poisson":
        _fail("lot", f"{algorithm} needs Poisson lots (one multiplier per round for every device)")
    if not section.c2 > 0:
        _fail("c2", f"must be > 0, got {section.c2!r}")
    if not (section.v2 > 0 or section.v2 == -1.0):
        _fail("v2", f"must be > 0, or -1 for 'equal to c2', got {section.v2!r}")
    if not 0.0 < section.client_rate <= 1.0:
        _fail("client_rate", f"must lie in (0, 1], got {section.client_rate!r}")
    if section.trust not in LEVELS:
        _fail("trust", f"must be one of {', '.join(LEVELS)}, got {section.trust!r}")
    unknown = sorted(set(section.trust_table) - set(edge_ids))
    if unknown:
        _fail("trust_table", f"names unknown edge id(s) {', '.join(unknown)}; known edges: {', '.join(sorted(edge_ids))}")
    for edge, word in sorted(section.trust_table.items()):
        if word not in LEVELS:
            _fail(f"trust_table.{edge}", f"must be one of {', '.join(LEVELS)}, got {word!r}")
    fraction_set = section.trusted_fraction != -1.0
    if fraction_set and not 0.0 <= section.trusted_fraction <= 1.0:
        _fail("trusted_fraction", f"must lie in [0, 1] (or -1 = unset), got {section.trusted_fraction!r}")
    if fraction_set and section.trust_table:
        _fail("trusted_fraction", "cannot be combined with privacy.trust_table: give one of them")
    dp_fedavg = section.placement == "aggregator" or algorithm == "dp-fedavg"
    if section.enabled and section.placement == "sample" and section.level != "sample":
        _fail("level", f"must be sample for sample-level DP-SGD ({algorithm}), got {section.level!r}")
    if section.enabled and dp_fedavg and section.level == "user":
        # P12 (digest 002): user-level DP-FedAvg adds no device noise, so whoever aggregates raw clipped
        # updates must be trusted; the cloud never is, so every edge must be.
        if fraction_set:
            untrusted = len(edge_ids) - trusted_count(section.trusted_fraction, len(edge_ids))
            names = f"{untrusted} of {len(edge_ids)} edges"
        else:
            levels = resolve_trust(edge_ids, section.trust, table=section.trust_table)
            bad = [e for e, w in levels.items() if w != TRUSTED]
            untrusted, names = len(bad), ", ".join(bad)
        if untrusted:
            _fail("trust", f"user-level DP needs a trusted aggregator: DP-FedAvg adds noise only at the edge, and "
                           f"untrusted edges ({names}) would see raw updates (paper 002, P12); mark them trusted "
                           f"or use placement = \"by_trust\" (H2FDP / HFL-DP)")


def validate_config(config) -> None:
    """[privacy] against the algorithm, the topology and the pipeline (each failure names its key)."""
    from hfl.common import plans, topology

    algorithm = plans.ALGORITHMS.get(config.run.algorithm)
    if config.privacy.enabled and not algorithm.privacy:
        private = [n for n in plans.ALGORITHMS if plans.ALGORITHMS.get(n).privacy]
        raise ConfigError(f"privacy.enabled: {algorithm.name} adds no DP noise; use one of {', '.join(private)}")
    section = config.privacy
    if algorithm.trust and (section.trusted_fraction != -1.0 or section.trust_table):
        key = "privacy.trust_table" if section.trust_table else f"privacy.trusted_fraction = {section.trusted_fraction}"
        raise ConfigError(f"{key}: {algorithm.name} fixes every edge's trust to {algorithm.trust}; unset it "
                          "(trusted_fraction = -1.0) or use h2fdp, whose trust the policy decides")
    if section.level == "sample" and algorithm.privacy != "sample":
        sample = [n for n in plans.ALGORITHMS if plans.ALGORITHMS.get(n).privacy == "sample"]
        raise ConfigError(f"privacy.level = sample: {algorithm.name} is not sample-level DP; use one of "
                          f"{', '.join(sample)}")
    if algorithm.noise and section.mechanism not in ("gaussian", algorithm.noise):
        raise ConfigError(f"privacy.mechanism = {section.mechanism}: {algorithm.name} uses {algorithm.noise} noise")
    validate_privacy(effective(section, algorithm), topology.edge_ids(config), config.run.algorithm)
    from .stages import NOISE_STAGES

    for slot in ("device_noise", "edge_noise"):
        if getattr(config.pipeline, slot) in NOISE_STAGES:
            raise ConfigError(f"pipeline.{slot} = {getattr(config.pipeline, slot)}: noise in a pipeline slot is not "
                              "recorded as a DP event, so no epsilon would cover it; use a private algorithm (h2fdp, "
                              "hfl-dp, dp-fedavg, dp-sgd, ...) and [privacy], which place, calibrate and charge the noise")
    may_trust = algorithm.privacy == "aggregator" or (algorithm.privacy == "by_trust" and algorithm.trust != "untrusted")
    if may_trust and config.pipeline.aggregate != "weighted_mean":
        raise ConfigError(f"pipeline.aggregate = {config.pipeline.aggregate}: a trusted edge's DP noise is calibrated "
                          "to the sensitivity of a weighted mean; a robust rule's sensitivity is not bounded that way "
                          "(a median or trimmed mean moves by up to the whole clip); use weighted_mean with "
                          f"{algorithm.name}")
    if section.layer_clips:
        _check_layer_clips(config)


def _check_layer_clips(config) -> None:
    """privacy.layer_clips needs one bound per parameter tensor of the model (torch is imported only here)."""
    from hfl.common.models import build

    channels = 3 if config.data.dataset.startswith("cifar") else (
        config.data.synthetic_shape[0] if config.data.dataset == "synthetic" else 1)
    side = 32 if channels == 3 else 28
    shape = tuple(config.data.synthetic_shape) if config.data.dataset == "synthetic" else (channels, side, side)
    names = [n for n, _ in build(config.model.name, shape, 10).named_parameters()]
    if len(config.privacy.layer_clips) != len(names):
        raise ConfigError(f"privacy.layer_clips has {len(config.privacy.layer_clips)} values; model "
                          f"{config.model.name} has {len(names)} parameter tensors ({', '.join(names)}): give one "
                          "bound per tensor, in that order")


register_section("privacy", PrivacySection, after="net")
register_validator(validate_config)
