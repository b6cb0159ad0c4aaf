"""The [channel] and [clock] config sections of the run configuration, registered here with
their checks.

Defaults: paper 003 Table I for the OTA plane (digest 003 sec. 8), paper 000 App. D for digital links
(digest 000 sec. 3/8), paper 001 Table III / paper 003 for compute (digests 001 and 003 sec. 8).
"""
from __future__ import annotations

from dataclasses import dataclass

from hfl.common.config import ConfigError, PipelineSection, choice, doc, register_section, register_validator


@dataclass(frozen=True)
class ChannelSection:
    model: str = choice("ideal", ("ideal", "orthogonal", "ota"), "device <-> edge medium: ideal digital, "
                        "orthogonal (interference-free, exact averages over the OTA active sets), ota (paper 003); "
                        "the run's topology.edges are the C collaborating clusters of topology.devices_per_edge "
                        "devices (M), the plane's other clusters are simulated interferers")
    lambda_p: float = doc(20.0, "edge-server density per km^2 (paper 003 Table I)", min=0.0)
    interferer_devices: int = doc(15, "M_n: devices per non-collaborating (interferer) cluster", min=0)
    R: float = doc(30.0, "cluster radius R in metres", min=0.0)
    r0: float = doc(4.0, "protective-zone radius r0 in metres", min=0.0)
    window_radius: float = doc(1000.0, "radius of the simulated plane in metres (digest 10.8: >= 1 km)", min=0.0)
    alpha: float = doc(4.0, "path-loss exponent (> 2 for ota)")
    th1: float = doc(0.5, "uplink activity threshold on |f|^2")
    th0: float = doc(0.01, "downlink threshold on |f_o|^2")
    P_u: float = doc(1.0, "device average transmit power (W)")
    P_d: float = doc(1.0, "edge transmit power (W)")
    sigma_d2: float = doc(10.0, "mean downlink fading gain")
    sigma_en2: float = doc(4e-15, "noise power per entry at the edge (W; paper unspecified, digest 10.14)")
    sigma_dn2: float = doc(4e-15, "noise power per entry at the device (W)")
    receiver: str = choice("unbiased", ("unbiased", "mmse", "mmse-gradients"),
                           "devices' receive factor theta: mmse = paper 003 eqs. 27 / 35 for every slot (on a model it "
                           "shrinks the weights toward their mean every round); unbiased = sum sigma / |A| (zero-forcing); "
                           "mmse-gradients = eq. 27 on gradient slots, unbiased on model slots")
    psi_mode: str = choice("corrected", ("paper", "corrected", "empirical"), "received-power term Psi (digest 10.2)")
    fading: str = choice("complex", ("complex", "real"), "complex baseband Rayleigh, or real amplitude with a sign")
    interferers: str = choice("aggregate", ("explicit", "aggregate", "independent"),
                              "the interferer clusters' iid N(0, 1) payloads: aggregate = their superposition at every "
                              "receiver drawn jointly from its exact Gaussian law (a factor of the gains; 5x faster); "
                              "explicit = every payload drawn; independent = each receiver's law alone (approximate)")
    downlink: str = choice("in-phase", ("in-phase", "complex"),
                           "what the medium delivers to a listening device: in-phase = the in-phase component of what "
                           "it hears after correcting its own edge's phase (coherent detection: the only part the "
                           "estimator uses, drawn from its own law: half the normals, a quarter of the product, half "
                           "the bytes), complex = the real and imaginary parts")
    medium_threads: int = doc(0, "threads that share the medium's column blocks (0: the machine's cores, up to 4; the "
                              "devices wait at the slot's barrier meanwhile); the rows do not depend on it", min=0)
    side_info_bound: float = doc(100.0, "the medium refuses a transmitter whose sigma exceeds this many times the "
                                 "median sigma of the slot's other transmitters, or whose mu lies further than this "
                                 "many of their median sigmas from their median mu (one device's forged side "
                                 "information would otherwise scale the whole superposition); 0 = no check", min=0.0)
    weighting: str = choice("equal", ("equal", "samples"), "how the medium averages the transmitted payloads: "
                            "equal (1 / |A|, the paper's Algorithm 1) or samples (paper 003's D_y-weighted option, "
                            "digest 2.1: sum D_y x_y / sum D_y; orthogonal links only)")
    interference: bool = doc(True, "false: every receiver hears only its own cluster")
    noise: bool = doc(True, "false: no AWGN")

    def ota_params(self):
        from .ota import OtaParams  # scipy.spatial: only where the medium runs

        return OtaParams(alpha=self.alpha, th1=self.th1, th0=self.th0, P_u=self.P_u, P_d=self.P_d,
                         sigma_d2=self.sigma_d2, sigma_en2=self.sigma_en2, sigma_dn2=self.sigma_dn2,
                         fading=self.fading, interference=self.interference, noise=self.noise,
                         interferers=self.interferers)

    @property
    def lambda_p_per_m2(self) -> float:
        return self.lambda_p * 1e-6


@dataclass(frozen=True)
class ClockSection:
    bandwidth_hz: float = doc(1e6, "W (papers 000, 001, 003)")
    device_power_dbm: float = doc(24.0, "digital uplink transmit power (paper 000 App. D)")
    noise_dbm_per_hz: float = doc(-173.0, "N_0 (paper 000 App. D)")
    beta0_db: float = doc(-30.0, "path loss at d0 (paper 000 App. D)")
    pathloss_exponent: float = doc(3.75, "digital-link path-loss exponent (paper 000 App. D)")
    d0: float = doc(1.0, "reference distance in metres (paper 000: not given, 1 m)")
    geometry: str = choice("ring", ("ring", "matern", "fixed"),
                           "device-edge distances of digital links: ring = each device uniform in the [channel] ring "
                           "[r0, R] (paper 003's offset law); matern = the MCP-H plane of [channel]; fixed = device_distance")
    device_distance: float = doc(50.0, "geometry = fixed: every device's distance to its edge (m; paper 000's example)")
    fading: bool = doc(True, "redraw Rayleigh fading per digital message (paper 000)")
    backhaul_rate_bps: float = doc(1e8, "edge <-> cloud rate (paper 000 App. D)")
    edge_power_dbm: float = doc(38.0, "edge transmit power: broadcasts to its devices and the backhaul (paper 000 App. D)")
    downlink: bool = doc(True, "count the edges' broadcasts to their devices (paper 003 does; papers 000 and 001 count "
                               "uploads only)")
    cycles_per_sample: float = doc(20.0 * 2.5e6 / 60, "CPU cycles per training sample: paper 003's c N_b / B "
                                   "(20 cycles/bit x 2.5 Mbit per 60-sample step), so t_CM = 0.05 s at 1 GHz")
    cpu_hz: float = doc(1e9, "mean device CPU frequency f (papers 001, 003)")
    cpu_spread: float = doc(0.0, "devices' f uniform in [f (1 - spread), f (1 + spread)]", min=0.0, max=0.99)
    kappa: float = doc(1e-28, "effective switched capacitance (J s^2 / cycle^3); not in the papers, a common value")
    pace: bool = doc(False, "hold each round until wall-clock time since the start reaches the emulated time (round "
                            "granularity; a run slower than its emulated time is not slowed further)")


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"{key} {message}")


def validate_channel(channel: ChannelSection, clock: ClockSection | None = None) -> None:
    """Cross-field checks the per-key ranges cannot express; each error names its key."""
    c = channel
    if c.r0 >= c.R:
        _fail("channel.r0", f"must be < channel.R = {c.R}, got {c.r0}")
    if c.weighting == "samples" and c.model != "orthogonal":
        _fail("channel.weighting", f"= samples needs channel.model = orthogonal (on {c.model} the power-normalised "
              "payloads superpose unweighted and the paper does not say how a receiver recovers the weights)")
    if c.r0 <= 0:
        _fail("channel.r0", f"must be > 0 (path loss dist^-alpha needs a protective zone), got {c.r0}")
    for key in ("P_u", "P_d", "sigma_d2"):
        if getattr(c, key) <= 0:
            _fail(f"channel.{key}", f"must be > 0, got {getattr(c, key)}")
    for key in ("sigma_en2", "sigma_dn2", "th0"):
        if getattr(c, key) < 0:
            _fail(f"channel.{key}", f"must be >= 0, got {getattr(c, key)}")
    if c.th1 <= 0:
        _fail("channel.th1", f"must be > 0 (rho uses E_1(th1), infinite at 0), got {c.th1}")
    if c.model in ("ota", "orthogonal"):
        if c.alpha <= 2:
            _fail("channel.alpha", f"must be > 2 for model={c.model} (Psi and beta of paper 003 diverge), got {c.alpha}")
        if c.lambda_p <= 0:
            _fail("channel.lambda_p", f"must be > 0, got {c.lambda_p}")
        if c.window_radius <= c.R + 2 * c.r0:
            _fail("channel.window_radius", f"must exceed R + 2 r0 = {c.R + 2 * c.r0}, got {c.window_radius}")
    elif c.alpha <= 0:
        _fail("channel.alpha", f"must be > 0, got {c.alpha}")
    if clock is None:
        return
    for key in ("bandwidth_hz", "backhaul_rate_bps", "cpu_hz", "d0", "device_distance", "pathloss_exponent"):
        if getattr(clock, key) <= 0:
            _fail(f"clock.{key}", f"must be > 0, got {getattr(clock, key)}")
    for key in ("cycles_per_sample", "kappa"):
        if getattr(clock, key) < 0:
            _fail(f"clock.{key}", f"must be >= 0, got {getattr(clock, key)}")
    if not 0 <= clock.cpu_spread < 1:
        _fail("clock.cpu_spread", f"must be in [0, 1), got {clock.cpu_spread}")


def validate_air_mode(config, algorithm, default_pipeline) -> None:
    """An algorithm of the air mode: the channel decides who transmits, the medium aggregates analog uploads."""
    if config.train.participants:
        raise ConfigError(f"train.participants: {algorithm.name} decides who transmits by the channel (th1); "
                          "leave it 0")
    for key in ("clip", "device_noise", "uplink_encoding", "uplink_channel", "aggregate"):
        if getattr(config.pipeline, key) != getattr(default_pipeline, key):
            raise ConfigError(f"pipeline.{key} = {getattr(config.pipeline, key)!r}: {algorithm.name}'s uploads are "
                              f"analog over the air, the medium aggregates them; leave it "
                              f"{getattr(default_pipeline, key)!r}")
    from hfl.common.channel.plane import plane_for

    try:
        plane_for(config)
    except ValueError as exc:
        raise ConfigError(f"channel.window_radius / channel.lambda_p: {exc}") from None


AIR_ENVELOPE_SLACK = 64 << 10  # an envelope's meta, names and scalars beside its float32 rows (a few KiB at M = 100)


def air_message_bytes(devices_per_edge: int, dim: int) -> int:
    """The largest message of an air round: an edge's emission to the medium (up to M normalised float32 payloads of
    d values); the medium's reply is split per device (d x 4 bytes each in-phase, 2 x d x 4 complex,
    cloud_server.medium.reply_envelopes)."""
    return max(devices_per_edge, 2) * 4 * dim + AIR_ENVELOPE_SLACK


def check_air_messages(config, dim: int) -> None:
    """At load time, once d is known (preflight, the medium's start): every air message fits net.max_message_mb."""
    if config.channel.model not in ("ota", "orthogonal"):
        return
    need = air_message_bytes(config.topology.devices_per_edge, dim)
    if need > config.net.max_message_mb << 20:
        raise ConfigError(f"net.max_message_mb = {config.net.max_message_mb}: an edge's air emission of "
                          f"{config.topology.devices_per_edge} devices x d = {dim:,} float32 values needs "
                          f"{-(-need // (1 << 20))} MiB; raise it (or use fewer devices per edge)")


def validate_sections(config) -> None:
    validate_channel(config.channel, config.clock)


def validate_mode(config) -> None:
    """The algorithm's round mode against channel.model (common.modes), and the air mode's own rules."""
    from hfl.common import plans
    from hfl.common.modes import MODES

    algorithm = plans.ALGORITHMS.get(config.run.algorithm)
    mode = MODES.get(algorithm.mode)
    if config.channel.model not in mode.channel_models:
        raise ConfigError(f"channel.model = {config.channel.model!r}: {algorithm.name} runs in {mode.name} mode, which "
                          f"needs channel.model = {' or '.join(mode.channel_models)}")
    if mode.name == "air":
        validate_air_mode(config, algorithm, PipelineSection())


register_section("channel", ChannelSection, after="latency")
register_section("clock", ClockSection, after="channel")
register_validator(validate_sections)
register_validator(validate_mode, after_plan=True)
