"""The emulated clock: air time of every message, compute time and energy of every device.

Digital links: paper 000 App. D (digest 000 sec. 3; the rate/time/energy forms are the digest's choice,
the paper defers them) and paper 001 sec. IV (t_DE). OTA slots and compute: paper 003, eq. 36
(t_BC = d / W, t_CM = c N_b / f). Compute energy kappa f^2 per cycle is the usual CMOS model; none of
the five papers states it. A phase lasts as long as its slowest participant (barrier semantics).
"""
from __future__ import annotations

import numpy as np

from .fading import rayleigh

SLOTS_PER_ROUND = 1 << 16  # fading slot of (round, step): round * SLOTS_PER_ROUND + step + 1 (step -1: round start)


def slot(round_: int, step: int) -> int:
    return round_ * SLOTS_PER_ROUND + step + 1


def dbm_to_watts(dbm) -> np.ndarray:
    return 10.0 ** ((np.asarray(dbm, dtype=np.float64) - 30.0) / 10.0)


def db_to_linear(db) -> np.ndarray:
    return 10.0 ** (np.asarray(db, dtype=np.float64) / 10.0)


def pathloss_linear(distance, beta0_db: float = -30.0, exponent: float = 3.75, d0: float = 1.0) -> np.ndarray:
    """Large-scale gain beta = beta0 - 10 alpha log10(d / d0) in dB, returned linear (paper 000, App. D)."""
    distance = np.asarray(distance, dtype=np.float64)
    if np.any(distance <= 0) or d0 <= 0:
        raise ValueError("distance and d0 must be > 0")
    return db_to_linear(beta0_db - 10.0 * exponent * np.log10(distance / d0))


def snr(power_w, channel_gain, noise_dbm_per_hz: float, bandwidth_hz: float) -> np.ndarray:
    """p |h|^2 / (N_0 W) (paper 000, App. D)."""
    if bandwidth_hz <= 0:
        raise ValueError(f"bandwidth_hz must be > 0, got {bandwidth_hz}")
    if np.any(np.asarray(power_w) < 0):
        raise ValueError("power_w must be >= 0")
    return np.asarray(power_w) * np.asarray(channel_gain) / (dbm_to_watts(noise_dbm_per_hz) * bandwidth_hz)


def shannon_rate(bandwidth_hz: float, snr_linear) -> np.ndarray:
    """W log2(1 + SNR) in bit/s (paper 001, t_DE denominator; paper 000, App. D)."""
    if bandwidth_hz <= 0:
        raise ValueError(f"bandwidth_hz must be > 0, got {bandwidth_hz}")
    return bandwidth_hz * np.log2(1.0 + np.asarray(snr_linear, dtype=np.float64))


def digital_air_time(bits, bandwidth_hz: float, snr_linear) -> np.ndarray:
    """bits / (W log2(1 + SNR)) seconds (paper 001, t_DE; paper 000's MQ / R_j)."""
    bits = np.asarray(bits, dtype=np.float64)
    if np.any(bits < 0):
        raise ValueError("bits must be >= 0")
    rate = shannon_rate(bandwidth_hz, snr_linear)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(bits == 0, 0.0, bits / rate)


def digital_link_gain(seed: int, slot: int, tx, rx, distance, beta0_db: float = -30.0, exponent: float = 3.75,
                      d0: float = 1.0, fading: bool = True) -> np.ndarray:
    """|h|^2 = beta(d) |u|^2 with u ~ CN(0,1) redrawn per message (paper 000, App. D); the fading draw is
    the same counter-based function as the OTA layer's (link "digital"), so any process recomputes it."""
    gain = pathloss_linear(distance, beta0_db, exponent, d0)
    if fading:
        gain = gain * np.abs(rayleigh(seed, slot, tx, rx, "digital")) ** 2
    return gain


def ota_slot_time(d: int, bandwidth_hz: float) -> float:
    """One analog slot carries d entries on d subcarriers: t_BC = d / W (paper 003, eq. 36)."""
    if d < 0 or bandwidth_hz <= 0:
        raise ValueError(f"need d >= 0 and bandwidth_hz > 0, got d={d}, bandwidth_hz={bandwidth_hz}")
    return d / bandwidth_hz


def backhaul_time(bits, rate_bps: float) -> np.ndarray:
    """Wired edge <-> cloud transfer: bits / rate (paper 000, App. D: 100 Mb/s)."""
    if rate_bps <= 0:
        raise ValueError(f"rate_bps must be > 0, got {rate_bps}")
    bits = np.asarray(bits, dtype=np.float64)
    if np.any(bits < 0):
        raise ValueError("bits must be >= 0")
    return bits / rate_bps


def device_frequencies(n: int, mean_hz: float, spread: float, rng: np.random.Generator) -> np.ndarray:
    """Heterogeneous CPU frequencies, uniform in [f (1 - spread), f (1 + spread)]; spread 0 gives f for all."""
    if mean_hz <= 0:
        raise ValueError(f"mean_hz must be > 0, got {mean_hz}")
    if not 0 <= spread < 1:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    return mean_hz * (1.0 + spread * (2.0 * rng.random(n) - 1.0))


def compute_cycles(samples, cycles_per_sample) -> np.ndarray:
    samples = np.asarray(samples, dtype=np.float64)
    if np.any(samples < 0) or np.any(np.asarray(cycles_per_sample) < 0):
        raise ValueError("samples and cycles_per_sample must be >= 0")
    return samples * np.asarray(cycles_per_sample, dtype=np.float64)


def compute_time(samples, cycles_per_sample, cpu_hz) -> np.ndarray:
    """samples x cycles per sample / f (paper 003, t_CM = c N_b / f; paper 001, t_CP = c D / f)."""
    cpu_hz = np.asarray(cpu_hz, dtype=np.float64)
    if np.any(cpu_hz <= 0):
        raise ValueError("cpu_hz must be > 0")
    return compute_cycles(samples, cycles_per_sample) / cpu_hz


def transmit_energy(power_w, air_time_s) -> np.ndarray:
    """p x air time (paper 000, App. D: p_j M Q / R_j)."""
    power_w = np.asarray(power_w, dtype=np.float64)
    if np.any(power_w < 0):
        raise ValueError("power_w must be >= 0")
    return power_w * np.asarray(air_time_s, dtype=np.float64)


def compute_energy(cycles, cpu_hz, kappa: float) -> np.ndarray:
    """kappa f^2 per cycle (CMOS dynamic power; not stated by the papers)."""
    if kappa < 0:
        raise ValueError(f"kappa must be >= 0, got {kappa}")
    return kappa * np.asarray(cpu_hz, dtype=np.float64) ** 2 * np.asarray(cycles, dtype=np.float64)


def device_energy(power_w, air_time_s, cycles, cpu_hz, kappa: float) -> np.ndarray:
    """Per-device energy: p x air time + kappa f^2 x cycles."""
    return transmit_energy(power_w, air_time_s) + compute_energy(cycles, cpu_hz, kappa)


def phase_time(participant_times) -> float:
    """A phase ends when its slowest participant does (the barrier); an empty phase takes no time."""
    times = np.asarray(participant_times, dtype=np.float64)
    if np.any(times < 0):
        raise ValueError("participant times must be >= 0")
    return float(times.max()) if times.size else 0.0


def multiairfed_round_latency(tau: int, gamma: int, t_cm: float, t_bc: float, t_bh: float) -> float:
    """T_L per round = t_BH + 2 t_BC + gamma t_CM + tau (t_CM + 2 t_BC) (paper 003, eq. 36 divided by T)."""
    return t_bh + 2 * t_bc + gamma * t_cm + tau * (t_cm + 2 * t_bc)


def qhetfed_round_delay(tau: int, gamma: int, t_cp: float, t_de: float, t_ec: float) -> float:
    """T_di = (tau + gamma) t_CP + tau t_DE + t_EC (paper 001, sec. IV; digest 10 notes it counts tau, not
    tau + 1, uploads: the emulator's own clock counts every message)."""
    return (tau + gamma) * t_cp + tau * t_de + t_ec
