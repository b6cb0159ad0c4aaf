"""Rayleigh fading as a pure function of (run seed, slot, link, transmitter, receiver).

Any process recomputes the same coefficient without being told: a device knows its own uplink channel
for power control, the medium knows every channel of the slot. Each pair's draw comes from a
counter-based hash (splitmix64 rounds over the key words), so a draw does not depend on which other
pairs are asked for in the same call.
"""
from __future__ import annotations

import numpy as np

from hfl.common.seeding import seed_sequence

LINKS = {"up": 1, "down": 2, "digital": 3}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (Steele, Lea, Flood 2014), elementwise on uint64 arrays (wrap-around maths)."""
    x = (x + _GOLDEN).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _key(seed: int, slot: int, link: str) -> np.uint64:
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    if slot < 0:
        raise ValueError(f"slot must be >= 0, got {slot}")
    state = seed_sequence(seed, "cloud", "channel-fading", int(slot), LINKS[link]).generate_state(1, dtype=np.uint64)
    return np.uint64(state[0])


def _unit_uniforms(seed: int, slot: int, link: str, tx, rx) -> tuple[np.ndarray, np.ndarray]:
    tx = np.asarray(tx)
    rx = np.asarray(rx)
    if np.any(tx < 0) or np.any(rx < 0):
        raise ValueError("transmitter and receiver indices must be >= 0")
    tx, rx = np.broadcast_arrays(tx.astype(np.uint64), rx.astype(np.uint64))
    with np.errstate(over="ignore"):
        h = _mix(np.full(tx.shape, _key(seed, slot, link), dtype=np.uint64) ^ tx)
        h = _mix(h ^ (rx * _GOLDEN))
        a = _mix(h ^ np.uint64(1))
        b = _mix(h ^ np.uint64(2))
    scale = 2.0 ** -53
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 1.0) * scale  # (0, 1]: log is finite
    u2 = (b >> np.uint64(11)).astype(np.float64) * scale  # [0, 1)
    return u1, u2


def rayleigh(seed: int, slot: int, tx, rx, link: str = "up", mean_gain: float = 1.0,
             kind: str = "complex") -> np.ndarray:
    """Fading coefficients f ~ CN(0, mean_gain) for every (tx, rx) pair (arrays broadcast together).

    Paper 003, sec. II (digest 3.2): uplink |f|^2 ~ Exp(1); downlink |f|^2 ~ Exp with mean sigma_d^2.
    |f|^2 = -ln(u1) * mean_gain (exactly exponential), phase uniform from u2.
    kind="real" is the digest 10.6 alternative: the same Rayleigh amplitude with a random sign.
    """
    if mean_gain <= 0:
        raise ValueError(f"mean_gain must be > 0, got {mean_gain}")
    u1, u2 = _unit_uniforms(seed, slot, link, tx, rx)
    amplitude = np.sqrt(-np.log(u1) * mean_gain)
    if kind == "complex":
        return amplitude * np.exp(2j * np.pi * u2)
    if kind == "real":
        return np.where(u2 < 0.5, amplitude, -amplitude)
    raise ValueError(f"kind must be 'complex' or 'real', got {kind!r}")


def path_gain(distance, alpha: float) -> np.ndarray:
    """Power path loss dist^-alpha, distances in metres, no reference constant (paper 003, eq. 14)."""
    distance = np.asarray(distance, dtype=np.float64)
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if np.any(distance <= 0):
        raise ValueError("distance must be > 0 (co-located nodes have no finite path gain)")
    return distance ** -alpha
