"""Randomness of DP mechanisms: secret by default, seeded only as an explicit replay option.

Every tier knows `run.seed` (it is in the config the cloud sends and in `config.toml`), so noise drawn from it can
be regenerated and subtracted by anyone who receives the release. A DP draw (noise, lots, client draws that claim
amplification, DP-SQ coins) therefore comes from a generator keyed by 256 fresh bits of the operating system's
CSPRNG (`secrets`, i.e. os.urandom), made on the node that adds the noise, per release, never logged or sent.

`privacy.noise_source = "seeded"` keeps the old behaviour (a generator seeded by run seed, tier, node, round,
purpose) for bit-identical replays; such a run is not private against anyone holding the seed, and every privacy
figure it reports says so (`SEEDED_LABEL`).

What the float samplers do not protect against: numpy's PCG64DXSM stream is statistically strong but not a
cryptographic stream (its 256-bit key is), and floating-point Gaussian / Laplace samplers leak through the
low-order bits of their outputs (Mironov 2012). A party that sees a noisy release at full float32 precision could in
principle exploit that; the emulator does not snap or use a discrete sampler (README, Privacy).
"""
from __future__ import annotations

import secrets

import numpy as np

from .seeding import numpy_rng, torch_generator

SOURCES = ("secret", "seeded")
SEEDED_LABEL = "not private against anyone holding run.seed (privacy.noise_source = seeded: DP noise is replayable)"


def _key() -> list[int]:
    return [secrets.randbits(64) for _ in range(4)]


def dp_numpy_rng(source: str, seed: int, tier: str, node, round_: int = 0, *purpose) -> np.random.Generator:
    """A generator for one DP release: fresh CSPRNG key (secret) or the run seed's stream (seeded replay)."""
    if source == "seeded":
        return numpy_rng(seed, tier, node, round_, *purpose)
    if source != "secret":
        raise ValueError(f"noise source must be one of {', '.join(SOURCES)}, got {source!r}")
    return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(_key())))


def dp_torch_generator(source: str, seed: int, tier: str, node, round_: int = 0, *purpose):
    """torch.Generator for DP-SGD lots and noise. torch's generator takes a 64-bit seed: secret mode keys it with 63
    fresh CSPRNG bits per release (phase), as Opacus does without its optional torchcsprng."""
    if source == "seeded":
        return torch_generator(seed, tier, node, round_, *purpose)
    if source != "secret":
        raise ValueError(f"noise source must be one of {', '.join(SOURCES)}, got {source!r}")
    import torch

    gen = torch.Generator()
    gen.manual_seed(secrets.randbits(63))
    return gen


def source_of(cfg) -> str:
    """The run's DP noise source (privacy.noise_source)."""
    return getattr(cfg.privacy, "noise_source", "secret")
