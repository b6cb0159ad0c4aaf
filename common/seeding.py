"""Every random draw comes from a generator seeded by (run seed, tier, node, round, purpose).

No library code touches numpy's or torch's global random state.
"""
from __future__ import annotations

import hashlib

import numpy as np

TIERS = {"cloud": 0, "edge": 1, "device": 2, "data": 3}


def _words(*parts: object) -> list[int]:
    words = []
    for part in parts:
        if isinstance(part, (int, np.integer)) and part >= 0:
            words.append(int(part))
        else:
            digest = hashlib.blake2b(str(part).encode(), digest_size=8).digest()
            words.append(int.from_bytes(digest, "little"))
    return words


def seed_sequence(seed: int, tier: str, node: int | str, round_: int = 0, *purpose: object) -> np.random.SeedSequence:
    return np.random.SeedSequence(_words(seed, TIERS[tier], node, round_, *purpose))


def numpy_rng(seed: int, tier: str, node: int | str, round_: int = 0, *purpose: object) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, tier, node, round_, *purpose))


def torch_generator(seed: int, tier: str, node: int | str, round_: int = 0, *purpose: object):
    import torch  # edges never train: keep torch out of their processes

    state = seed_sequence(seed, tier, node, round_, *purpose).generate_state(1, dtype=np.uint64)[0]
    gen = torch.Generator()
    gen.manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen
