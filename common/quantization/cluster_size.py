"""Cluster sizes {c_m} of paper 004: how many devices of each precision group upload per round.

Feasible set (paper 004, constraints of eq. 27): integers 1 <= c_m <= g_m, sum_m c_m = N, sum_m b_m c_m <= B
(B counts bits per coordinate, digest 004 P12).
  cso     the linear integer program (27): minimise sum_m (c_m / g_m) sum_{u in G_m} (8 C^2 / (2^b_m - 1)^2 + sigma_{m,u}^2),
          solved by enumerating the feasible set (M is small in every experiment);
  random  one feasible assignment drawn uniformly (digest 004 section 5.3: "random cluster sizes" means drawing
          from the feasible pairs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_ASSIGNMENTS = 2_000_000


def _int_list(name: str, values, low: int, high: int | None = None) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values))
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.asarray(arr, float) == np.round(np.asarray(arr, float))):
        raise ValueError(f"{name} must be a non-empty list of integers, got {values!r}")
    arr = arr.astype(np.int64)
    if np.any(arr < low) or (high is not None and np.any(arr > high)):
        raise ValueError(f"{name} must lie in {low}..{high if high is not None else 'inf'}, got {values!r}")
    return arr


def _check(group_sizes, bits, participants: int, budget: float) -> tuple[np.ndarray, np.ndarray]:
    g = _int_list("group_sizes", group_sizes, 1)
    b = _int_list("bits", bits, 1, 16)
    if b.size != g.size:
        raise ValueError(f"bits must have one entry per group ({g.size}), got {b.size}")
    if int(participants) != participants or not g.size <= participants <= g.sum():
        raise ValueError(f"participants N must be an integer in {g.size}..{int(g.sum())} (one to g_m per group), "
                         f"got {participants!r}")
    if not math.isfinite(float(budget)) or budget <= 0:
        raise ValueError(f"bit budget B must be a finite number > 0, got {budget!r}")
    return g, b


def feasible_cluster_sizes(group_sizes, bits, participants: int, budget: float) -> np.ndarray:
    """Every feasible {c_m} as rows of an (n, M) integer array, lexicographic order (paper 004, eq. 27
    constraints). Raises ValueError naming the budget if no assignment meets sum b_m c_m <= B."""
    g, b = _check(group_sizes, bits, participants, budget)
    m = g.size
    count = math.prod(int(x) for x in g[:-1])
    if count > MAX_ASSIGNMENTS:
        raise ValueError(f"group_sizes {list(g)} give {count} candidate assignments, more than {MAX_ASSIGNMENTS}; "
                         "use fewer groups")
    # Choose c_1..c_{M-1} on a grid; c_M is whatever completes the sum N.
    if m > 1:
        grids = np.indices(tuple(int(x) for x in g[:-1])).reshape(m - 1, -1).T + 1
    else:
        grids = np.zeros((1, 0), np.int64)
    last = participants - grids.sum(axis=1)
    sizes = np.column_stack([grids, last]).astype(np.int64)
    ok = (last >= 1) & (last <= g[-1]) & (sizes @ b <= budget)
    if not ok.any():
        cheapest = _cheapest_bits(g, b, participants)
        raise ValueError(f"bit budget B = {budget!r} is infeasible: the cheapest assignment of {participants} "
                         f"participants over groups {list(g)} with bits {list(b)} needs sum b_m c_m = {cheapest}")
    return sizes[ok]


def _cheapest_bits(g: np.ndarray, b: np.ndarray, participants: int) -> int:
    """Least sum b_m c_m with 1 <= c_m <= g_m, sum c_m = N: one device per group, the rest to the cheapest bits."""
    c = np.ones_like(g)
    left = participants - g.size
    for i in np.argsort(b, kind="stable"):
        take = min(left, int(g[i]) - 1)
        c[i] += take
        left -= take
    return int(c @ b)


def cso_group_cost(bits, link_stds, clip: float) -> np.ndarray:
    """Per-device cost of each group in eq. (27): (1/g_m) sum_u (8 C^2 / (2^b_m - 1)^2 + sigma_{m,u}^2). `link_stds`
    holds, per group, one std (shared by the group) or the list of its devices' stds."""
    b = _int_list("bits", bits, 1, 16)
    if not math.isfinite(float(clip)) or clip <= 0:
        raise ValueError(f"clip C must be a finite number > 0, got {clip!r}")
    if len(link_stds) != b.size:
        raise ValueError(f"link_stds must have one entry per group ({b.size}), got {len(link_stds)}")
    noise = np.array([np.mean(np.asarray(s, float) ** 2) for s in link_stds])
    if not np.all(np.isfinite(noise)):
        raise ValueError("link_stds must be finite")
    return 8 * float(clip) ** 2 / (2.0 ** b - 1) ** 2 + noise


@dataclass(frozen=True)
class ClusterSizes:
    sizes: tuple[int, ...]
    objective: float  # eq. (27)'s objective for `sizes` (nan for mode="random" without costs)
    bits_used: int
    mode: str


def cso_cluster_sizes(group_sizes, bits, link_stds, *, participants: int, budget: float, clip: float) -> ClusterSizes:
    """Cluster-size optimisation, paper 004 eq. (27), by enumeration. Ties go to the lexicographically first."""
    sizes = feasible_cluster_sizes(group_sizes, bits, participants, budget)
    costs = cso_group_cost(bits, link_stds, clip)
    objective = sizes @ costs
    best = int(np.argmin(objective))
    return ClusterSizes(tuple(int(c) for c in sizes[best]), float(objective[best]),
                        int(sizes[best] @ np.asarray(bits, np.int64)), "cso")


def random_cluster_sizes(group_sizes, bits, *, participants: int, budget: float, rng: np.random.Generator
                         ) -> ClusterSizes:
    """A feasible {c_m} drawn uniformly from the feasible set (Algorithm 1 with random cluster sizes)."""
    sizes = feasible_cluster_sizes(group_sizes, bits, participants, budget)
    row = sizes[int(rng.integers(len(sizes)))]
    return ClusterSizes(tuple(int(c) for c in row), float("nan"), int(row @ np.asarray(bits, np.int64)), "random")
