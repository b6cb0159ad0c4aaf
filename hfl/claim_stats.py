"""The statistics and verdict names of the claims (hfl/claims.py): Welch's t-test, the bootstrap, Fisher's exact
test, the one-sided upper confidence bound of an effect, and how a cell's values are written."""
from __future__ import annotations

import math
from typing import Any

HOLDS, SHAPE, NOT_SHOWN, N_SMALL, CONTRADICTED, MAGNITUDE, NOT_RUN = (
    "holds", "holds in shape only", "not shown", "n too small", "contradicted", "contradicted in magnitude", "not run")
# a claim's verdict is its worst comparison's, a check's its primary claims' worst: this order
RANK = {CONTRADICTED: 0, MAGNITUDE: 1, NOT_RUN: 2, N_SMALL: 3, NOT_SHOWN: 4, SHAPE: 5, HOLDS: 6}
VERDICTS = tuple(sorted(RANK, key=lambda v: -RANK[v]))  # holds first
MIN_SEEDS = 5            # finished seeds a cell needs for a verdict (below: n too small)
MAGNITUDE_FRACTION = 0.5  # default: our effect's upper bound under this fraction of the paper's -> contradicted in magnitude


def stats_of(values: list[float]) -> dict[str, Any]:
    """mean, sample std (ddof 1; 0 for one value) and n."""
    n = len(values)
    mean = sum(values) / n if n else None
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else (0.0 if n else None)
    return {"mean": mean, "std": std, "n": n}


def welch(groups: list[list[float]], coefs: list[float], offset: float = 0.0, alpha: float = 0.05) -> dict[str, float]:
    """t statistic of sum(c * mean) - offset with Welch-Satterthwaite df, the one-sided p-values for the contrast
    being > 0 (p_greater) and < 0 (p_less), and the one-sided (1 - alpha) upper confidence bound of the contrast
    (upper). Two groups with (1, -1): scipy.stats.ttest_ind(equal_var=False); one group: scipy.stats.ttest_1samp."""
    from scipy import stats

    est = sum(c * sum(g) / len(g) for g, c in zip(groups, coefs)) - offset
    parts = [c * c * stats_of(g)["std"] ** 2 / len(g) for g, c in zip(groups, coefs)]
    se2 = sum(parts)
    if se2 == 0:  # no spread at all: the sign decides, exactly
        p_greater, p_less = (0.0, 1.0) if est > 0 else (1.0, 0.0) if est < 0 else (0.5, 0.5)
        return {"estimate": est, "t": math.copysign(math.inf, est) if est else 0.0, "df": math.nan,
                "p_greater": p_greater, "p_less": p_less, "upper": est}
    df = se2 ** 2 / sum(p * p / (len(g) - 1) for p, g in zip(parts, groups) if p > 0)
    t = est / math.sqrt(se2)
    return {"estimate": est, "t": t, "df": df, "p_greater": float(stats.t.sf(t, df)), "p_less": float(stats.t.cdf(t, df)),
            "upper": est + float(stats.t.ppf(1 - alpha, df)) * math.sqrt(se2)}


def bootstrap(groups: list[list[float]], coefs: list[float], offset: float = 0.0, n_boot: int = 10000,
              alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Percentile bootstrap of sum(c * mean) - offset: each group resampled with replacement, n_boot times; the
    interval is [alpha, 1 - alpha] of the resampled contrasts, its upper end the one-sided upper bound."""
    import numpy as np

    rng = np.random.default_rng(seed)
    est = sum(c * float(np.mean(g)) for g, c in zip(groups, coefs)) - offset
    draws = sum(c * rng.choice(np.asarray(g, float), size=(n_boot, len(g)), replace=True).mean(axis=1)
                for g, c in zip(groups, coefs)) - offset
    lo, hi = np.quantile(draws, [alpha, 1 - alpha])
    return {"estimate": est, "interval": [float(lo), float(hi)], "upper": float(hi),
            "p_greater": float((1 + np.sum(draws <= 0)) / (n_boot + 1)),
            "p_less": float((1 + np.sum(draws >= 0)) / (n_boot + 1))}


def seeds_for_power(groups: list[list[float]], coefs: list[float], effect: float, alpha: float = 0.05,
                    power: float = 0.8) -> int | None:
    """Seeds a cell for a one-sided test at level alpha to detect `effect` (the contrast sum(c * mean), in the
    claimed direction) with probability `power`, given the cells' spreads (normal approximation, every cell with
    the same n): the smallest n with effect / sqrt(sum(c^2 s^2) / n) >= z(1 - alpha) + z(power). None when the
    effect is not in the claimed direction (no number of seeds shows it); 2 when there is no spread."""
    from scipy import stats

    if effect <= 0:
        return None
    var = sum(c * c * stats_of(g)["std"] ** 2 for g, c in zip(groups, coefs) if len(g) > 1)
    z = float(stats.norm.ppf(1 - alpha) + stats.norm.ppf(power))
    return max(2, math.ceil(var * (z / effect) ** 2 - 1e-9))


def fisher(events: list[tuple[int, int]]) -> dict[str, float]:
    """One-sided Fisher exact test of share(a) - share(b) from [(k_a, n_a), (k_b, n_b)] (events, runs)."""
    from scipy import stats

    (ka, na), (kb, nb) = events
    table = [[ka, na - ka], [kb, nb - kb]]
    return {"estimate": ka / na - kb / nb,
            "p_greater": float(stats.fisher_exact(table, alternative="greater").pvalue),
            "p_less": float(stats.fisher_exact(table, alternative="less").pvalue)}


def worst(verdicts: list[str]) -> str:
    """The verdict that decides a set of them (contradicted first, holds last)."""
    return min(verdicts, key=RANK.__getitem__)


def num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def value_text(stat: dict) -> str:
    """A cell's values as the reports write them: mean ± std (n), or a share claim's events."""
    if not stat["n"]:
        return "not run"
    if "events" in stat:
        return f"{stat['events']}/{stat['n']} with {stat['event']} (mean {stat['mean']:.4g})"
    return f"{stat['mean']:.4g} (n = 1)" if stat["n"] == 1 else f"{stat['mean']:.4g} ± {stat['std']:.2g} (n = {stat['n']})"
