"""Trust policy: which edges may see raw (clipped) updates, resolved once per run at the cloud.

Paper 000 Sec. 4: a trusted edge adds one noise draw to its cluster aggregate; behind an untrusted edge
every device adds its own. The cloud is never trusted. The paper's analysis draws trust per subnet with
probability p_c; following digest 000 Sec. 10 the experiments fix exactly round(p N) trusted edges.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

TRUSTED = "trusted"
UNTRUSTED = "untrusted"
LEVELS = (UNTRUSTED, TRUSTED)  # ordered: a site may only move left
CLOUD = "cloud"


def _check_word(word: str, name: str) -> str:
    if word not in LEVELS:
        raise ValueError(f"{name} must be one of {', '.join(LEVELS)}, got {word!r}")
    return word


def trusted_count(fraction: float, edges: int) -> int:
    """round(p * edges) with halves rounded up (Python's round() would send 2.5 to 2)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"trusted_fraction must lie in [0, 1], got {fraction!r}")
    return int(math.floor(fraction * edges + 0.5))


def resolve_trust(edge_ids: Sequence[str], trust: str | Mapping[str, str] = UNTRUSTED,
                  trusted_fraction: float | None = None, rng: np.random.Generator | None = None,
                  table: Mapping[str, str] | None = None) -> dict[str, str]:
    """Trust level of every edge, fixed for the run.

    - `trust` one word: every edge gets it; `trust` a table (or `table`): named edges get their word and
      the rest get the word (untrusted when `trust` is itself the table);
    - `trusted_fraction` p in [0, 1] (None or negative = unset): exactly round(p * edges) edges are
      trusted, chosen uniformly without replacement by `rng` (derived from the run seed) over the
      sorted edge ids, so one seed gives one assignment. It cannot be combined with a table.
    """
    ids = sorted(edge_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("edge_ids must be distinct")
    if CLOUD in ids:
        raise ValueError("edge_ids must not contain the cloud: the cloud is never trusted")
    if isinstance(trust, Mapping):
        table, default = {**trust, **(table or {})}, UNTRUSTED
    else:
        default = _check_word(trust, "trust")
        table = dict(table or {})
    if CLOUD in table:
        raise ValueError("trust table names the cloud: the cloud is never trusted")
    unknown = sorted(set(table) - set(ids))
    if unknown:
        raise ValueError(f"trust table names unknown edge ids {unknown}; known edges: {ids}")
    for edge, word in table.items():
        _check_word(word, f"trust[{edge!r}]")
    if trusted_fraction is not None and trusted_fraction >= 0:
        if table:
            raise ValueError("give either a trust table or trusted_fraction, not both")
        if rng is None:
            raise ValueError("trusted_fraction needs rng (a generator derived from the run seed)")
        chosen = set(rng.choice(len(ids), size=trusted_count(trusted_fraction, len(ids)), replace=False).tolist())
        return {e: TRUSTED if i in chosen else UNTRUSTED for i, e in enumerate(ids)}
    return {e: table.get(e, default) for e in ids}


def effective_trust(assigned: str, claimed: str | None) -> str:
    """The trust a site ends up with: it may lower the level the cloud assigned (HFL_TRUST=untrusted, its
    devices then add their own noise) but never raise it; the lower of the two words wins."""
    _check_word(assigned, "assigned trust")
    if claimed in (None, ""):
        return assigned
    _check_word(claimed, "claimed trust (HFL_TRUST / --trust)")
    return LEVELS[min(LEVELS.index(assigned), LEVELS.index(claimed))]


def noise_tier(level: str) -> str:
    """Where user-level noise goes for a cluster: at the edge if trusted, else on every device."""
    return "edge" if _check_word(level, "trust level") == TRUSTED else "device"


def sample_participants(members: Sequence[str], count: int, rng: np.random.Generator) -> tuple[str, ...]:
    """s_c^k devices of a cluster drawn uniformly without replacement (digest 000 Sec. 10), sorted by id.

    The draw comes from a generator the cloud derives from the run seed and sends in the plan, so it is
    public to the cloud and the edges: calibration takes no amplification from it (see calibration.py).
    """
    ids = sorted(members)
    if not 1 <= count <= len(ids):
        raise ValueError(f"count (participants s_c^k) must lie in [1, {len(ids)}], got {count!r}")
    picked = rng.choice(len(ids), size=count, replace=False)
    return tuple(ids[i] for i in sorted(picked.tolist()))
