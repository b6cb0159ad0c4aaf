"""The [precision] config section: paper 004's groups of devices with their own bit widths, DP levels and link
noise, the per-round cluster sizes and bit budget, and the cloud's fusion rule. This module registers the
section and the checks of [latency] and [precision].

    [precision]
    group_sizes = [50, 50]        # devices in each group, in device order (device-0000.. first)
    bits = [2, 4]                 # b_m
    epsilon1 = [1e-6, 1e-6]       # per-coordinate DP level (dpsq, laplace-sq); empty = the codec's epsilon1
    link_std = [6.25e-4, 0.125]   # sigma_m of the AWGN on each device's upload; empty = no link noise
    participants = 10             # N devices per round over all groups
    bit_budget = 30               # B: sum_m c_m b_m <= B
"""
from __future__ import annotations

from dataclasses import dataclass

from hfl.common.config import ConfigError, choice, doc, register_section, register_validator

from .fusion import DISTORTION_ESTIMATES

CLUSTER_MODES = ("auto", "all", "random", "cso")
FUSIONS = ("auto", "uniform", "fwo", "fedhq")


@dataclass(frozen=True)
class PrecisionSection:
    group_sizes: tuple[int, ...] = doc((), "devices per precision group, in device order; empty = one group of every "
                                       "device at the uplink codec's own bits")
    bits: tuple[int, ...] = doc((), "b_m: bits per coordinate of each group (1..16)")
    epsilon1: tuple[float, ...] = doc((), "per-coordinate DP level of each group (dpsq, laplace-sq); empty = the "
                                      "codec's epsilon1")
    link_std: tuple[float, ...] = doc((), "sigma_m: std of the AWGN added to each device's dequantized upload "
                                      "(paper 004's digital link); empty = no link noise")
    participants: int = doc(0, "N: devices drawn per round over all groups (relay algorithms; 0 = every device)", min=0)
    bit_budget: float = doc(0.0, "B: per-round budget sum_m c_m b_m <= B (bits per coordinate; 0 = none)", min=0.0)
    cluster_mode: str = choice("auto", CLUSTER_MODES, "cluster sizes c_m per round: all devices, random feasible, or "
                               "cso (paper 004 eq. 27); auto = the algorithm's")
    fusion: str = choice("auto", FUSIONS, "the cloud's fusion weights (relay algorithms): uniform, fwo (eq. 14), fedhq "
                         "(LaplaceSQ-FL baseline); auto = the algorithm's")
    distortion_estimate: str = choice("uniform_cell", DISTORTION_ESTIMATES, "FWO's squared quantization error E(Q(v)-v)^2 (digest 004 P3): "
                                      "uniform_cell (the cloud's, from the received range and bits; default: nothing "
                                      "un-noised leaves the device), device (eq. 7 reported by the device: the paper's "
                                      "option, an exact function of the update sent in the clear), bound (4 d C^2 / (2^b-1)^2)")


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"precision.{key} {message}")


def validate_precision(cfg) -> None:
    """Cross-checks naming the key; the pure resolver (precision.resolve) repeats none of them."""
    from hfl.common import plans

    from . import cluster_size, precision

    p, algorithm = cfg.precision, plans.ALGORITHMS.get(cfg.run.algorithm)
    if p.group_sizes:
        if any(s < 1 for s in p.group_sizes):
            _fail("group_sizes", f"must hold sizes >= 1, got {list(p.group_sizes)}")
        if sum(p.group_sizes) != cfg.num_devices:
            _fail("group_sizes", f"sums to {sum(p.group_sizes)}, but the topology has {cfg.num_devices} devices")
        for key in ("bits", "epsilon1", "link_std"):
            values = getattr(p, key)
            if (key == "bits" or values) and len(values) != len(p.group_sizes):
                _fail(key, f"needs one value per group ({len(p.group_sizes)}), got {list(values)}")
    elif p.bits or p.epsilon1 or len(p.link_std) > 1:
        _fail("group_sizes", "is empty: bits / epsilon1 per group need the groups they apply to")
    if any(not 1 <= b <= 16 for b in p.bits):
        _fail("bits", f"must lie in 1..16, got {list(p.bits)}")
    if any(not e >= 0 for e in p.epsilon1):
        _fail("epsilon1", f"must be >= 0, got {list(p.epsilon1)}")
    if any(not s >= 0 for s in p.link_std):
        _fail("link_std", f"must be >= 0, got {list(p.link_std)}")
    if p.participants > cfg.num_devices:
        _fail("participants", f"= {p.participants} exceeds the {cfg.num_devices} devices of the topology")
    uses = bool(p.group_sizes or p.participants or p.bit_budget or p.link_std) or p.cluster_mode != "auto" \
        or p.fusion != "auto"
    if algorithm.mode != "relay":
        if uses:
            relay = [n for n in plans.ALGORITHMS if plans.ALGORITHMS.get(n).mode == "relay"]
            _fail("group_sizes" if p.group_sizes else "*", f"applies to the relay algorithms ({', '.join(relay)}), "
                  f"not {algorithm.name}")
        return
    if cfg.pipeline.uplink_encoding not in algorithm.codecs:
        raise ConfigError(f"pipeline.uplink_encoding = {cfg.pipeline.uplink_encoding!r}: {algorithm.name} uploads "
                          f"{' or '.join(algorithm.codecs)} indices; set pipeline.uplink_encoding = "
                          f"\"{algorithm.codecs[0]}\"")
    if cfg.aggregation.cloud_weights != "auto" or cfg.aggregation.edge_weights != "auto":
        raise ConfigError(f"aggregation.*_weights: {algorithm.name} fuses at the cloud with precision.fusion; leave "
                          "aggregation.edge_weights and cloud_weights at \"auto\"")
    if p.epsilon1 and cfg.pipeline.uplink_encoding not in ("dpsq", "laplace-sq"):
        _fail("epsilon1", f"is set, but the {cfg.pipeline.uplink_encoding} codec has no epsilon1")
    from hfl.common.pipeline import Link

    try:
        Link.device_uplink(cfg)
    except ValueError as exc:
        raise ConfigError(f"pipeline.params.{cfg.pipeline.uplink_encoding}: {exc}") from None
    resolved = precision.resolve(cfg)
    mode = precision.cluster_mode(cfg)
    if mode == "cso" and resolved.clip is None:
        raise ConfigError("precision.cluster_mode = \"cso\": the CSO cost needs the l1 clipping constant C; set "
                          "pipeline.clip = \"clip_l1\" with [pipeline.params.clip_l1] clip = C")
    if precision.fusion_rule(cfg) == "fwo" and p.distortion_estimate == "bound" and resolved.clip is None:
        _fail("distortion_estimate", "= \"bound\" needs pipeline.clip = \"clip_l1\" (its C)")
    if precision.fusion_rule(cfg) == "fwo" and p.distortion_estimate == "device" and \
            cfg.pipeline.uplink_encoding != "dpsq":
        _fail("distortion_estimate", f"= \"device\": only the dpsq codec reports eq. (7); {cfg.pipeline.uplink_encoding} "
              "needs \"uniform_cell\" or \"bound\"")
    if mode in ("random", "cso"):
        n = p.participants or cfg.num_devices
        try:
            cluster_size.feasible_cluster_sizes(resolved.sizes, resolved.bits, n, precision.effective_budget(resolved, p.bit_budget))
        except ValueError as exc:
            key = "bit_budget" if p.bit_budget else "participants"
            _fail(key, f"= {getattr(p, key)}: {exc}")


def validate_latency(cfg) -> None:
    from . import schedule

    schedule.validate(cfg)


register_section("precision", PrecisionSection, after="clock")
register_validator(validate_latency)
register_validator(validate_precision)
