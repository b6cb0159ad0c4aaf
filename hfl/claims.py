"""Claims as data: what a paper states, tested over a sweep's seeds, with a verdict.

A sweep spec names the section-9 checks it tests in `[[claim]]` tables:

    [[claim]]
    id = "000/9.2"                        # the digest's check (PAPER/9.N); several claims may share an id
    label = "paper calibration"           # optional: tells claims of one id apart
    statement = "at round 200: no DP >= p = 1 > p = 0.5 > HFL-DP"   # the paper's statement
    figure = "Fig. 3: about +6 pts for p = 0.5 over HFL-DP, twice that for p = 1"   # optional: its figure, as text
    kind = "order"                        # order | threshold | trend | gap | gap_trend | ratio | share
    metric = "final_accuracy"             # one of [report] fields
    cells = ["nodp", "p1-paper", "p05-paper", "hfldp-paper"]
    relation = [">=", ">", ">"]           # between neighbours (one value: every step); > >= < <=
    paper = [0.78, 0.76, 0.70, 0.64]      # optional: the paper's value per cell (nan: not given)
    factor = 2.0                          # optional (default 2): magnitude off by more -> "holds in shape only"
    test = "welch"                        # welch (default) | bootstrap | paired (fisher: a share claim's, always)
    alpha = 0.05                          # default 0.05
    margin = 0.01                         # optional: a weak relation's tolerance on the metric's scale (see below)

Kinds and their keys:

- order: `cells`, `relation`, optional `paper` per cell. Each neighbouring pair is one comparison.
- threshold: `cell`, `op` (> >= < <=), `value`, optional `than` (another cell: metric(cell) - metric(than) op value).
- trend: `axis` (a [grid] key), `direction` (increasing | decreasing), optional `where` (the other varied keys
  fixed, e.g. { variant = "qhetfed" }), optional `values` (a subset of the axis, in order), optional `paper` per
  value. Each neighbouring step is one comparison.
- gap: `cells = [a, b]`, `relation` (default >), optional `paper` (the paper's a - b).
- gap_trend: `pairs = [[a1, b1], [a2, b2], ...]`, `direction` (increasing | decreasing): the gap a - b grows (or
  shrinks) along the list; optional `paper` per pair (its gaps).
- ratio: `cells = [a, b]`, `paper` (the paper's mean(a) / mean(b), e.g. 0.75: a needs 25% less than b); the
  direction comes from `paper` (< 1: a < b); the magnitude compares log ratios.
- share: `cells = [a, b]`, an event on each run, `op` and `value` (e.g. `op = "<"`, `value = 0.15`: the run ends
  at chance), `relation` (> or <, default >): the share of a's runs with the event is larger (smaller) than b's. For
  outcomes that are bimodal across seeds (a run collapses or it does not), which a test of means cannot show at a
  few seeds; optional `paper` (the paper's share(a) - share(b)). Always tested by Fisher's exact test; a run whose
  metric is not finite is left out (as in every kind), so state the event on a metric that stays finite.

The test, per comparison, over the seeds of each cell (n = finished runs):

- welch: a one-sided Welch t-test of the contrast (mean a - mean b, or mean a - value), Welch-Satterthwaite degrees
  of freedom; for two cells it is scipy.stats.ttest_ind(equal_var=False, alternative=...), for one cell
  scipy.stats.ttest_1samp; for a difference of gaps (gap_trend) the same statistic over four cells.
- paired: the seeds that finished in every cell of the comparison are paired (seed s of every cell shares its data,
  initial model and channel draws) and the contrast is taken seed by seed: a one-sided one-sample t-test of the
  per-seed contrasts (scipy.stats.ttest_1samp; for two cells scipy.stats.ttest_rel). Where seeds move every cell
  together, this removes the seed-to-seed spread that the Welch test counts as noise.
- fisher (share claims): a one-sided Fisher exact test of the 2 x 2 table (event, no event) x (a, b)
  (scipy.stats.fisher_exact); the effect is share(a) - share(b).
- bootstrap: every cell's seeds resampled with replacement (n_boot draws, default 10,000, fixed generator seed 0);
  the one-sided p-value is (1 + the resampled contrasts on the wrong side of zero) / (n_boot + 1), and the interval
  reported is the percentile interval [alpha, 1 - alpha] of the contrast minus the threshold (a - b for two cells),
  plus a weak relation's margin.

Verdict of a comparison: **holds** (significant at alpha in the claimed direction, and, where the paper gives a
magnitude, within `factor` of it), **holds in shape only** (significant in the claimed direction, magnitude off by
more than `factor`), **not shown** (not significant either way), **contradicted** (significant the other way, at
alpha / number of comparisons: Bonferroni), **not shown (n = 1)** (a cell with a single seed: no spread, no test),
**not run** (a cell without a finished run). A weak relation (>=, <=) is a non-inferiority test: `a >= b` reads
"a is not below b by more than the margin" and is tested as the strict relation a - b + margin > 0; it holds when that
is significant, is contradicted when a - b < -margin is significant, and is otherwise not shown. The margin is the
claim's `margin` (on the metric's scale); without one it is 2% of the magnitude of the compared-to side (b's mean),
or 0 for a threshold (its `value` already states the tolerance). The claim's verdict
is its worst comparison's, in the order contradicted, not run, not shown (n = 1), not shown, shape only, holds:
"holds" needs every step significant (an intersection-union test, level alpha without correction).
"""
from __future__ import annotations

import json
import math
import operator
import pathlib
import re
import sys
import textwrap
import tomllib
from dataclasses import dataclass, field
from typing import Any

HOLDS, SHAPE, NOT_SHOWN, ONE_SEED, CONTRADICTED, NOT_RUN = (
    "holds", "holds in shape only", "not shown", "not shown (n = 1)", "contradicted", "not run")
RANK = {CONTRADICTED: 0, NOT_RUN: 1, ONE_SEED: 2, NOT_SHOWN: 3, SHAPE: 4, HOLDS: 5}
KINDS = {
    "order": ("cells", "relation", "paper"),
    "threshold": ("cell", "op", "value", "than"),
    "trend": ("axis", "direction", "where", "values", "paper"),
    "gap": ("cells", "relation", "paper"),
    "gap_trend": ("pairs", "direction", "paper"),
    "ratio": ("cells", "paper"),
    "share": ("cells", "op", "value", "relation", "paper"),
}
COMMON = ("id", "label", "statement", "figure", "kind", "metric", "factor", "test", "alpha", "n_boot", "margin")
WEAK_MARGIN = 0.02  # a weak relation's default margin, relative to the compared-to side's mean
RELATIONS = (">", ">=", "<", "<=")
TESTS = ("welch", "bootstrap", "paired", "fisher")
ID = re.compile(r"\d{3}/9\.\d+")


class ClaimError(ValueError):
    pass


@dataclass(frozen=True)
class Comparison:
    """sum(coef * mean(cell)) - offset  RELATION  0, with the paper's value of that contrast if it gives one."""
    label: str
    terms: tuple[tuple[str, float], ...]
    relation: str
    offset: float = 0.0
    paper: float | None = None     # the paper's contrast (a difference), or its ratio for a ratio claim
    ratio: bool = False            # effect = mean(a) / mean(b), magnitude on the log scale
    event: tuple[str, float] | None = None   # a share claim's event on a run: metric OP value


@dataclass
class Claim:
    id: str
    statement: str
    kind: str
    metric: str
    comparisons: list[Comparison]
    label: str = ""
    figure: str = ""
    factor: float = 2.0
    test: str = "welch"
    alpha: float = 0.05
    n_boot: int = 10000
    margin: float | None = None    # a weak relation's tolerance; None: WEAK_MARGIN of the compared-to side (0 for a threshold)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.id} ({self.label})" if self.label else self.id

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(c for comp in self.comparisons for c, _ in comp.terms))

    def test_text(self) -> str:
        if self.test == "paired":
            return f"one-sided paired t-test over the seeds common to the cells, alpha {self.alpha}"
        if self.test == "fisher":
            return f"one-sided Fisher exact test of the shares, alpha {self.alpha}"
        if self.test == "bootstrap":
            return (f"one-sided bootstrap of the difference ({self.n_boot} resamples, percentile interval), "
                    f"alpha {self.alpha}")
        return f"one-sided Welch t-test, alpha {self.alpha}"


# ---- parsing -------------------------------------------------------------------------------------
def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _paper_list(raw: dict, n: int, where: str) -> list[float | None] | None:
    paper = raw.get("paper")
    if paper is None:
        return None
    if not isinstance(paper, list) or len(paper) != n or not all(_number(v) for v in paper):
        raise ClaimError(f"{where}: paper must be a list of {n} numbers (nan where the paper gives none), got {paper!r}")
    return [None if math.isnan(v) else float(v) for v in paper]


def _step_effect(paper: list[float | None] | None, i: int) -> float | None:
    if paper is None or paper[i] is None or paper[i + 1] is None:
        return None
    return paper[i] - paper[i + 1]


def _sign(relation: str) -> float:
    return 1.0 if relation.startswith(">") else -1.0


def parse_claim(raw: Any, cells: dict[str, dict[str, Any]], fields: list[str], where: str = "claim") -> Claim:
    """One [[claim]] table checked against the sweep's cells (name -> varied values) and report fields."""
    if not isinstance(raw, dict):
        raise ClaimError(f"{where} must be a table ([[claim]])")
    if "id" in raw:
        where = f"claim {raw['id']}" + (f" ({raw['label']})" if raw.get("label") else "")
    for key in ("id", "statement", "kind", "metric"):
        if key not in raw:
            raise ClaimError(f"{where}: missing key {key!r}")
    if not isinstance(raw["id"], str) or not ID.fullmatch(raw["id"]):
        raise ClaimError(f"{where}: id must name a digest check as PAPER/9.N (e.g. \"000/9.2\"), got {raw['id']!r}")
    kind = raw["kind"]
    if kind not in KINDS:
        raise ClaimError(f"{where}: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
    unknown = sorted(set(raw) - set(COMMON) - set(KINDS[kind]))
    if unknown:
        raise ClaimError(f"{where}: unknown key {unknown[0]!r} for kind {kind!r}; allowed keys: "
                         f"{', '.join(COMMON + KINDS[kind])}")
    metric = raw["metric"]
    if metric not in fields:
        raise ClaimError(f"{where}: metric {metric!r} is not one of [report] fields ({', '.join(fields)})")
    test = raw.get("test", "fisher" if kind == "share" else "welch")
    if test not in TESTS:
        raise ClaimError(f"{where}: test must be one of {', '.join(TESTS)}, got {test!r}")
    if (test == "fisher") != (kind == "share"):
        raise ClaimError(f"{where}: a share claim is tested by Fisher's exact test (test = \"fisher\"), and only a "
                         f"share claim is; got test {test!r} for kind {kind!r}")
    alpha, factor, n_boot = raw.get("alpha", 0.05), raw.get("factor", 2.0), raw.get("n_boot", 10000)
    if not (_number(alpha) and 0 < alpha < 0.5):
        raise ClaimError(f"{where}: alpha must be in (0, 0.5), got {alpha!r}")
    if not (_number(factor) and factor >= 1):
        raise ClaimError(f"{where}: factor must be a number >= 1, got {factor!r}")
    if not (isinstance(n_boot, int) and n_boot >= 100):
        raise ClaimError(f"{where}: n_boot must be an integer >= 100, got {n_boot!r}")
    margin = raw.get("margin")
    if margin is not None and not (_number(margin) and margin >= 0):
        raise ClaimError(f"{where}: margin must be a number >= 0 (the metric's scale), got {margin!r}")

    def cell(name: Any, key: str) -> str:
        if name not in cells:
            raise ClaimError(f"{where}: {key}: unknown cell {name!r}; cells: {', '.join(cells)}")
        return name

    def cell_list(key: str, n: int | None = None) -> list[str]:
        value = raw.get(key)
        if not isinstance(value, list) or len(value) < 2 or (n is not None and len(value) != n):
            raise ClaimError(f"{where}: {key} must be a list of {n or 'at least 2'} cell names, got {value!r}")
        return [cell(v, key) for v in value]

    def relations(n: int, default: str = ">") -> list[str]:
        rel = raw.get("relation", default)
        rels = [rel] * n if isinstance(rel, str) else rel
        if not isinstance(rels, list) or len(rels) != n or any(r not in RELATIONS for r in rels):
            raise ClaimError(f"{where}: relation must be one of {' '.join(RELATIONS)} or a list of {n} of them, "
                             f"got {rel!r}")
        return rels

    def direction() -> str:
        d = raw.get("direction")
        if d not in ("increasing", "decreasing"):
            raise ClaimError(f"{where}: direction must be increasing or decreasing, got {d!r}")
        return ">" if d == "decreasing" else "<"  # relation of each step's earlier value to the later one

    def chain(names: list[str], rels: list[str], paper: list[float | None] | None) -> list[Comparison]:
        return [Comparison(f"{a} {r} {b}", ((a, 1.0), (b, -1.0)), r, paper=_step_effect(paper, i))
                for i, (a, b, r) in enumerate(zip(names, names[1:], rels))]

    comparisons: list[Comparison]
    if kind == "order":
        names = cell_list("cells")
        comparisons = chain(names, relations(len(names) - 1), _paper_list(raw, len(names), where))
    elif kind == "threshold":
        a = cell(raw.get("cell"), "cell")
        op, value = raw.get("op"), raw.get("value")
        if op not in RELATIONS:
            raise ClaimError(f"{where}: op must be one of {' '.join(RELATIONS)}, got {op!r}")
        if not _number(value):
            raise ClaimError(f"{where}: value must be a number, got {value!r}")
        terms = ((a, 1.0),) + (((cell(raw["than"], "than"), -1.0),) if "than" in raw else ())
        text = f"{a}" + (f" - {raw['than']}" if "than" in raw else "") + f" {op} {value:g}"
        comparisons = [Comparison(text, terms, op, offset=float(value))]
    elif kind == "trend":
        axis = raw.get("axis")
        varied = {k for v in cells.values() for k in v}
        if axis not in varied:
            raise ClaimError(f"{where}: axis {axis!r} is not varied by the sweep; varied keys: {', '.join(sorted(varied))}")
        fixed = raw.get("where", {})
        if not isinstance(fixed, dict):
            raise ClaimError(f"{where}: where must be a table of varied keys and values")
        free = sorted(varied - {axis} - set(fixed))
        if free:
            raise ClaimError(f"{where}: a trend over {axis} needs `where` to fix {free[0]!r}")
        along = [(v[axis], name) for name, v in cells.items() if all(v.get(k) == x for k, x in fixed.items())]
        if "values" in raw:
            order = raw["values"]
            if not isinstance(order, list) or any(x not in [v for v, _ in along] for x in order):
                raise ClaimError(f"{where}: values must list values of {axis} in the sweep's cells, got {order!r}")
            along = [next(p for p in along if p[0] == x) for x in order]
        if len(along) < 2:
            raise ClaimError(f"{where}: fewer than two cells along {axis} where {fixed!r}")
        names = [name for _, name in along]
        comparisons = chain(names, [direction()] * (len(names) - 1), _paper_list(raw, len(names), where))
    elif kind == "gap":
        a, b = cell_list("cells", 2)
        rel, = relations(1)
        paper = raw.get("paper")
        if paper is not None and not _number(paper):
            raise ClaimError(f"{where}: paper must be the paper's gap {a} - {b} (a number), got {paper!r}")
        comparisons = [Comparison(f"{a} {rel} {b}", ((a, 1.0), (b, -1.0)), rel, paper=paper)]
    elif kind == "gap_trend":
        pairs = raw.get("pairs")
        if not isinstance(pairs, list) or len(pairs) < 2 or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ClaimError(f"{where}: pairs must be a list of at least two [a, b] cell pairs, got {pairs!r}")
        pairs = [(cell(a, "pairs"), cell(b, "pairs")) for a, b in pairs]
        rel = direction()
        paper = _paper_list(raw, len(pairs), where)
        comparisons = []
        for i, ((a1, b1), (a2, b2)) in enumerate(zip(pairs, pairs[1:])):
            # gap1 REL gap2, i.e. sign * (gap1 - gap2) > 0
            comparisons.append(Comparison(f"({a1} - {b1}) {rel} ({a2} - {b2})",
                                          ((a1, 1.0), (b1, -1.0), (a2, -1.0), (b2, 1.0)), rel,
                                          paper=_step_effect(paper, i)))
    elif kind == "share":
        a, b = cell_list("cells", 2)
        op, value = raw.get("op"), raw.get("value")
        if op not in RELATIONS:
            raise ClaimError(f"{where}: op must be one of {' '.join(RELATIONS)} (the event: {raw['metric']} OP value), "
                             f"got {op!r}")
        if not _number(value):
            raise ClaimError(f"{where}: value must be a number (the event: {raw['metric']} {op} value), got {value!r}")
        rel = raw.get("relation", ">")
        if rel not in (">", "<"):
            raise ClaimError(f"{where}: relation of a share claim must be > or <, got {rel!r}")
        paper = raw.get("paper")
        if paper is not None and not (_number(paper) and -1 <= paper <= 1):
            raise ClaimError(f"{where}: paper must be the paper's share({a}) - share({b}), in [-1, 1], got {paper!r}")
        event = f"{raw['metric']} {op} {value:g}"
        comparisons = [Comparison(f"share({event}): {a} {rel} {b}", ((a, 1.0), (b, -1.0)), rel, paper=paper,
                                  event=(op, float(value)))]
    else:  # ratio
        a, b = cell_list("cells", 2)
        paper = raw.get("paper")
        if not (_number(paper) and paper > 0 and paper != 1):
            raise ClaimError(f"{where}: paper must be the paper's ratio mean({a}) / mean({b}), a positive number "
                             f"other than 1, got {paper!r}")
        rel = "<" if paper < 1 else ">"
        comparisons = [Comparison(f"{a} / {b} {rel} 1", ((a, 1.0), (b, -1.0)), rel, paper=float(paper), ratio=True)]
    return Claim(raw["id"], str(raw["statement"]), kind, metric, comparisons, str(raw.get("label", "")),
                 str(raw.get("figure", "")), float(factor), test, float(alpha), n_boot,
                 None if margin is None else float(margin), dict(raw))


def parse_claims(raw: Any, cells: dict[str, dict[str, Any]], fields: list[str]) -> list[Claim]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ClaimError("claim must be an array of tables: write [[claim]]")
    claims = [parse_claim(r, cells, fields, f"claim #{i + 1}") for i, r in enumerate(raw)]
    seen: set[str] = set()
    for c in claims:
        if c.name in seen:
            raise ClaimError(f"claim {c.name} appears twice: give each a distinct label")
        seen.add(c.name)
    return claims


# ---- statistics ----------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict[str, Any]:
    n = len(values)
    mean = sum(values) / n if n else None
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else (0.0 if n else None)
    return {"mean": mean, "std": std, "n": n}


def welch(groups: list[list[float]], coefs: list[float], offset: float = 0.0) -> dict[str, float]:
    """t statistic of sum(c * mean) - offset with Welch-Satterthwaite df, and the one-sided p-values for the
    contrast being > 0 (p_greater) and < 0 (p_less). Two groups with (1, -1): scipy.stats.ttest_ind(equal_var=False);
    one group: scipy.stats.ttest_1samp."""
    from scipy import stats

    est = sum(c * sum(g) / len(g) for g, c in zip(groups, coefs)) - offset
    parts = [c * c * _stats(g)["std"] ** 2 / len(g) for g, c in zip(groups, coefs)]
    se2 = sum(parts)
    if se2 == 0:  # no spread at all: the sign decides, exactly
        p_greater, p_less = (0.0, 1.0) if est > 0 else (1.0, 0.0) if est < 0 else (0.5, 0.5)
        return {"estimate": est, "t": math.copysign(math.inf, est) if est else 0.0, "df": math.nan,
                "p_greater": p_greater, "p_less": p_less}
    df = se2 ** 2 / sum(p * p / (len(g) - 1) for p, g in zip(parts, groups) if p > 0)
    t = est / math.sqrt(se2)
    return {"estimate": est, "t": t, "df": df, "p_greater": float(stats.t.sf(t, df)), "p_less": float(stats.t.cdf(t, df))}


def bootstrap(groups: list[list[float]], coefs: list[float], offset: float = 0.0, n_boot: int = 10000,
              alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Percentile bootstrap of sum(c * mean) - offset: each group resampled with replacement, n_boot times."""
    import numpy as np

    rng = np.random.default_rng(seed)
    est = sum(c * float(np.mean(g)) for g, c in zip(groups, coefs)) - offset
    draws = sum(c * rng.choice(np.asarray(g, float), size=(n_boot, len(g)), replace=True).mean(axis=1)
                for g, c in zip(groups, coefs)) - offset
    lo, hi = np.quantile(draws, [alpha, 1 - alpha])
    return {"estimate": est, "interval": [float(lo), float(hi)],
            "p_greater": float((1 + np.sum(draws <= 0)) / (n_boot + 1)),
            "p_less": float((1 + np.sum(draws >= 0)) / (n_boot + 1))}


def _magnitude(comp: Comparison, means: dict[str, float]) -> tuple[float | None, float | None]:
    """(measured effect, measured / paper on the effect's scale) or (effect, None) without a paper value."""
    if comp.ratio:
        (a, _), (b, _) = comp.terms
        if not means[b] or means[a] / means[b] <= 0:
            return None, None
        effect = means[a] / means[b]
        return effect, math.log(effect) / math.log(comp.paper)
    effect = sum(c * means[cell] for cell, c in comp.terms)
    if comp.paper is None or comp.paper == 0:
        return effect, None
    return effect, effect / comp.paper


def weak_margin(claim: Claim, comp: Comparison, means: dict[str, float]) -> float:
    """The tolerance of a weak relation: the claim's margin, else WEAK_MARGIN of the compared-to side's magnitude
    (the cells entering with a negative coefficient), else 0 for a threshold, whose value is the tolerance."""
    if claim.margin is not None:
        return claim.margin
    if claim.kind == "threshold":
        return 0.0
    return WEAK_MARGIN * abs(sum(c * means[cell] for cell, c in comp.terms if c < 0))


OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def _holds(op: str, x: float, value: float) -> bool:
    return OPS[op](x, value)


def _worst(comps: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison whose verdict decides a claim's (contradicted first, holds last)."""
    return min(comps, key=lambda c: RANK[c["verdict"]])


def fisher(events: list[tuple[int, int]]) -> dict[str, float]:
    """One-sided Fisher exact test of share(a) - share(b) from [(k_a, n_a), (k_b, n_b)] (events, runs)."""
    from scipy import stats

    (ka, na), (kb, nb) = events
    table = [[ka, na - ka], [kb, nb - kb]]
    return {"estimate": ka / na - kb / nb,
            "p_greater": float(stats.fisher_exact(table, alternative="greater").pvalue),
            "p_less": float(stats.fisher_exact(table, alternative="less").pvalue)}


def _paired(comp: Comparison, coefs: list[float], values: dict[str, list[float]],
            seeds: dict[str, list[int]]) -> list[float]:
    """The comparison's contrast seed by seed, over the seeds finished in every one of its cells."""
    by_seed = [dict(zip(seeds[cell], values.get(cell, []))) for cell, _ in comp.terms]
    common = sorted(set.intersection(*(set(b) for b in by_seed)))
    return [sum(c * b[s] for c, b in zip(coefs, by_seed)) for s in common]


def _evaluate_share(claim: Claim, comp: Comparison, groups: list[list[float]], out: dict[str, Any],
                    k: int) -> dict[str, Any]:
    op, value = comp.event
    events = [(sum(_holds(op, x, value) for x in g), len(g)) for g in groups]
    res = fisher(events)
    out["effect"], out["events"] = res["estimate"], [list(e) for e in events]
    p, p_other = (res["p_greater"], res["p_less"]) if comp.relation == ">" else (res["p_less"], res["p_greater"])
    out["p"], out["p_other_way"] = p, p_other
    shares = f"{events[0][0]}/{events[0][1]} against {events[1][0]}/{events[1][1]}"
    if p_other < claim.alpha / k:
        return {**out, "verdict": CONTRADICTED,
                "why": f"{shares}: significant the other way (p = {p_other:.3g} < {claim.alpha / k:.3g})"}
    if p >= claim.alpha:
        return {**out, "verdict": NOT_SHOWN, "why": f"{shares}: not significant (p = {p:.3g} >= {claim.alpha})"}
    ratio = res["estimate"] / comp.paper if comp.paper else None
    if ratio is not None and not (1 / claim.factor <= ratio <= claim.factor):
        return {**out, "verdict": SHAPE, "magnitude_vs_paper": ratio,
                "why": f"{shares}: significant (p = {p:.3g}); the difference {ratio:.2g}x the paper's"}
    return {**out, "verdict": HOLDS, "magnitude_vs_paper": ratio, "why": f"{shares}: p = {p:.3g} < {claim.alpha}"}


def evaluate_comparison(claim: Claim, comp: Comparison, values: dict[str, list[float]], k: int,
                        seeds: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """One comparison's test and verdict. `seeds` names the seed of each value per cell (paired test); without it
    the i-th values of the cells share a seed."""
    groups = [values.get(cell, []) for cell, _ in comp.terms]
    out: dict[str, Any] = {"comparison": comp.label, "relation": comp.relation, "paper": comp.paper}
    n = min(len(g) for g in groups)
    if n == 0:
        return {**out, "verdict": NOT_RUN, "why": "a cell has no finished run"}
    if comp.event is not None:
        return _evaluate_share(claim, comp, groups, out, k)
    means = {cell: sum(g) / len(g) for (cell, _), g in zip(comp.terms, groups)}
    out["effect"], ratio_to_paper = _magnitude(comp, means)
    if n == 1:
        return {**out, "verdict": ONE_SEED, "why": "a cell has one finished seed: no spread to test against"}
    sign = _sign(comp.relation)
    coefs = [sign * c for _, c in comp.terms]
    weak = comp.relation in (">=", "<=")
    margin = weak_margin(claim, comp, means) if weak else 0.0
    if weak:
        out["margin"] = margin
    offset = sign * comp.offset - margin  # weak: sign * (contrast - offset) + margin > 0
    if claim.test == "paired":
        seeds = seeds or {cell: list(range(len(values.get(cell, [])))) for cell, _ in comp.terms}
        contrasts = _paired(comp, coefs, values, seeds)
        out["pairs"] = len(contrasts)
        if len(contrasts) < 2:
            return {**out, "verdict": ONE_SEED, "why": f"{len(contrasts)} seed(s) finished in every cell: nothing to pair"}
        res = welch([contrasts], [1.0], offset)
        out["t"], out["df"] = sign * res["t"], res["df"]
    elif claim.test == "bootstrap":
        res = bootstrap(groups, coefs, offset, claim.n_boot, claim.alpha)
        out["interval"] = [sign * x for x in (res["interval"] if sign > 0 else res["interval"][::-1])]
    else:
        res = welch(groups, coefs, offset)
        out["t"], out["df"] = sign * res["t"], res["df"]
    p, p_other = res["p_greater"], res["p_less"]
    out["p"], out["p_other_way"] = p, p_other
    within = f" by more than the margin {margin:.3g}" if weak and margin else ""
    if p_other < claim.alpha / k:
        return {**out, "verdict": CONTRADICTED,
                "why": f"significant the other way{within} (p = {p_other:.3g} < {claim.alpha / k:.3g})"}
    if weak:
        test = f"within the margin {margin:.3g} (non-inferiority p = {p:.3g}" if margin else f"(p = {p:.3g}"
        if p >= claim.alpha:
            return {**out, "verdict": NOT_SHOWN, "why": f"not shown {test} >= {claim.alpha})"}
        return {**out, "verdict": HOLDS, "why": f"{test})"}
    if p >= claim.alpha:
        return {**out, "verdict": NOT_SHOWN, "why": f"not significant (p = {p:.3g} >= {claim.alpha})"}
    if ratio_to_paper is not None and not (1 / claim.factor <= ratio_to_paper <= claim.factor):
        return {**out, "verdict": SHAPE, "magnitude_vs_paper": ratio_to_paper,
                "why": f"direction significant (p = {p:.3g}); magnitude {ratio_to_paper:.2g}x the paper's, "
                       f"outside 1/{claim.factor:g}..{claim.factor:g}"}
    return {**out, "verdict": HOLDS, "magnitude_vs_paper": ratio_to_paper, "why": f"p = {p:.3g} < {claim.alpha}"}


def evaluate(claim: Claim, values: dict[str, list[float]], seeds: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """The claim's result: the statement, the measured values per cell (mean, std, n; a share claim's events too),
    each comparison's test and verdict, and the claim's verdict (its worst comparison's)."""
    k = len(claim.comparisons)
    comps = [evaluate_comparison(claim, c, values, k, seeds) for c in claim.comparisons]
    worst = _worst(comps)
    per_cell = {cell: _stats(values.get(cell, [])) for cell in claim.cells}
    event = next((c.event for c in claim.comparisons if c.event is not None), None)
    if event is not None:
        op, value = event
        for cell in claim.cells:
            per_cell[cell]["event"] = f"{claim.metric} {op} {value:g}"
            per_cell[cell]["events"] = sum(_holds(op, x, value) for x in values.get(cell, []))
    paired = {}
    if claim.test in ("welch", "bootstrap"):
        # the same claim under the paired test: seeds share data, initial model and channel draws across cells,
        # so a per-seed contrast can be consistent where the spread across seeds hides it, or the reverse. Shown
        # beside the verdict as a sensitivity check; the verdict is the spec's test.
        other = Claim(**{**claim.__dict__, "test": "paired"})
        pcomps = [evaluate_comparison(other, c, values, k, seeds) for c in other.comparisons]
        paired = {"paired": {"verdict": _worst(pcomps)["verdict"],
                             "p": [c.get("p") for c in pcomps], "pairs": [c.get("pairs") for c in pcomps]}}
    return {**({"event": {"op": event[0], "value": event[1]}} if event else {}), **paired,
            "id": claim.id, "label": claim.label, "statement": claim.statement, "figure": claim.figure,
            "kind": claim.kind, "metric": claim.metric, "test": claim.test_text(), "factor": claim.factor,
            "cells": claim.cells, "values": per_cell,
            "paper_values": paper_values(claim), "comparisons": comps, "verdict": worst["verdict"],
            "why": "" if worst["verdict"] == HOLDS else f"{worst['comparison']}: {worst['why']}"}


def cell_values(cells: list[dict], metric: str) -> dict[str, list[float]]:
    """Per cell, the finite per-seed values of `metric` from a sweep's aggregated cells (results.json)."""
    return {c["cell"]: [float(r[metric]) for r in c["runs"] if _number(r.get(metric)) and math.isfinite(r[metric])]
            for c in cells}


def cell_seeds(cells: list[dict], metric: str) -> dict[str, list[int]]:
    """Per cell, the seed of each value cell_values returns, in the same order."""
    return {c["cell"]: [r.get("seed", i) for i, r in enumerate(c["runs"]) if _number(r.get(metric)) and math.isfinite(r[metric])]
            for c in cells}


def evaluate_all(claims: list[Claim], cells: list[dict]) -> list[dict[str, Any]]:
    return [evaluate(claim, cell_values(cells, claim.metric), cell_seeds(cells, claim.metric)) for claim in claims]


# ---- writing -------------------------------------------------------------------------------------
def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _value(stat: dict) -> str:
    if not stat["n"]:
        return "not run"
    if "events" in stat:
        return f"{stat['events']}/{stat['n']} with {stat['event']} (mean {stat['mean']:.4g})"
    return f"{stat['mean']:.4g} (n = 1)" if stat["n"] == 1 else f"{stat['mean']:.4g} ± {stat['std']:.2g} (n = {stat['n']})"


def markdown(results: list[dict[str, Any]]) -> str:
    """The claims section of results.md."""
    if not results:
        return ""
    lines = ["", "## Claims", "",
             "Each claim is tested over the seeds, comparison by comparison (see `hfl/claims.py`); its verdict is its "
             "worst comparison's.", ""]
    for r in results:
        name = f"{r['id']}" + (f" ({r['label']})" if r["label"] else "")
        lines += [f"### {name}: **{r['verdict']}**", "", f"- Paper: {r['statement']}"]
        if r["figure"]:
            lines.append(f"- Paper's figure: {r['figure']}")
        lines.append(f"- Measured `{r['metric']}` (mean ± std over seeds): "
                     + "; ".join(f"{cell} {_value(s)}" for cell, s in r["values"].items()))
        lines.append(f"- Test: {r['test']}; shape only beyond a factor {r['factor']:g} of the paper's magnitude")
        if r["why"]:
            lines.append(f"- Why: {r['why']}")
        if r.get("paired"):
            ps = ", ".join(_num(p) for p in r["paired"]["p"])
            lines.append(f"- Paired over seeds (a sensitivity check, not the verdict): {r['paired']['verdict']} "
                         f"(one-sided paired t-test per comparison, p = {ps})")
        lines += ["", "| comparison | effect | paper | p | p other way | verdict |", "|---|---|---|---|---|---|"]
        for c in r["comparisons"]:
            lines.append(f"| {c['comparison']} | {_num(c.get('effect'))} | {_num(c['paper'])} | {_num(c.get('p'))} | "
                         f"{_num(c.get('p_other_way'))} | {c['verdict']} |")
        lines.append("")
    return "\n".join(lines)


def verdict_lines(results: list[dict[str, Any]]) -> list[str]:
    return [f"{r['id']}{' ' + r['label'] if r['label'] else ''}: {r['verdict']}" for r in results]


def slug(result: dict[str, Any]) -> str:
    text = result["id"] + (f"-{result['label']}" if result["label"] else "")
    return "claim_" + (re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_"))


def plot(results: list[dict[str, Any]], cells: list[dict], out: pathlib.Path) -> list[pathlib.Path]:
    """One PNG per claim: every seed's value per cell, the mean ± std, the paper's value where the claim gives one,
    and the verdict in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for r in results:
        values = cell_values(cells, r["metric"])
        names = list(r["values"])
        fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(names) + 2), 3.8), dpi=110)
        for i, cell in enumerate(names):
            vals = values.get(cell, [])
            ax.scatter([i] * len(vals), vals, s=14, color="tab:blue", alpha=0.6)
            s = r["values"][cell]
            if s["n"]:
                ax.errorbar([i + 0.12], [s["mean"]], yerr=[s["std"]], fmt="o", color="black", capsize=3)
        if r.get("event"):
            ax.axhline(r["event"]["value"], ls="--", color="tab:red", lw=1,
                       label=f"event: {r['metric']} {r['event']['op']} {r['event']['value']:g}")
            ax.legend(fontsize=7)
        paper = r.get("paper_values")
        if paper:
            ax.scatter([names.index(c) for c in paper], list(paper.values()), marker="x", color="tab:red", s=40,
                       label="paper")
            ax.legend(fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=7)
        ax.set(ylabel=f"{r['metric']} (seeds, mean ± std)")
        ax.set_title(textwrap.fill(f"{r['id']}{' ' + r['label'] if r['label'] else ''}: {r['verdict']}",
                                   max(40, int(14 * fig.get_figwidth()))), fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{slug(r)}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def paper_values(claim: Claim) -> dict[str, float]:
    """The paper's value per cell where the claim lists one per cell (order, trend)."""
    raw = claim.raw.get("paper")
    if claim.kind not in ("order", "trend") or raw is None:
        return {}
    return {cell: v for cell, v in zip(claim.cells, raw) if not math.isnan(v)}


# ---- the index: REPRODUCTIONS.md -----------------------------------------------------------------
ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKS = "reproductions/checks.toml"


def _paired_note(result: dict) -> str:
    paired = result.get("paired")
    return f" [paired: {paired['verdict']}]" if paired and paired["verdict"] != result["verdict"] else ""


def index(root: pathlib.Path = ROOT) -> str:
    """REPRODUCTIONS.md: one row per section-9 check of the digests (reproductions/checks.toml), with the specs
    whose claims test it, the verdicts of the committed reports under reproductions/, the paper's figure and ours."""
    from hfl import sweep

    checks = tomllib.loads((root / CHECKS).read_text())["check"]
    specs: dict[str, list[str]] = {}
    for path in sorted((root / "deploy" / "experiments").glob("*.toml")):
        for claim in sweep.load_spec(path).claims:
            specs.setdefault(claim.id, [])
            rel = path.relative_to(root).as_posix()
            if rel not in specs[claim.id]:
                specs[claim.id].append(rel)
    reports: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted((root / "reproductions").glob("*/*/results.json")):
        for result in json.loads(path.read_text()).get("claims", []):
            reports.setdefault(result["id"], []).append((path.parent.relative_to(root).as_posix(), result))
    lines = ["# Reproductions", "",
             "One row per acceptance check of the papers' digests (section 9). Generated by "
             "`python -m hfl.claims index > REPRODUCTIONS.md` from `reproductions/checks.toml`, the `[[claim]]` tables "
             "of `deploy/experiments/*.toml` and the committed reports `reproductions/PAPER/SPEC/results.json`; "
             "`tests/unit/test_claims.py` fails when this page is stale. Verdicts: holds, holds in shape only, "
             "not shown, contradicted (see `hfl/claims.py` for the tests); a check without a committed report says "
             "not run. A report's verdict holds for that report's scale and cells, stated in its `PROVENANCE.md`. "
             "[paired: ...] marks a verdict that a paired t-test over the seeds would give instead (a sensitivity "
             "check: seed s of every cell shares data, initial model and channel draws).", "",
             "| check | what the paper states | spec | verdict | paper's figure | ours | report |",
             "|---|---|---|---|---|---|---|"]
    for check in checks:
        cid = check["id"]
        found = reports.get(cid, [])
        spec_cell = "<br>".join(f"[`{s}`]({s})" for s in specs.get(cid, [])) or (
            f"unit tests: {', '.join(f'`{t}`' for t in check['unit_tests'])}" if check.get("unit_tests")
            else "no spec yet")
        if found:
            verdict = "<br>".join(f"{d.rsplit('/', 1)[-1]}: **{r['verdict']}**" + (f" ({r['label']})" if r["label"] else "")
                                  + _paired_note(r) for d, r in found)
            ours = "<br>".join("; ".join(f"{cell} {_value(r['values'][cell])}" for cell in r.get("cells", r["values"]))
                               for _, r in found)
            links = "<br>".join(f"[{d}]({d}/results.md)" for d in dict.fromkeys(d for d, _ in found))
        else:
            verdict = "not run" + (" (a unit-level check: its unit tests)" if check.get("unit_tests") else "")
            ours, links = "-", "-"
        lines.append(f"| {cid} {check['title']} | {check['statement']} | {spec_cell} | {verdict} | {check['figure']} | "
                     f"{ours} | {links} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["index"]:
        print("usage: python -m hfl.claims index   (prints REPRODUCTIONS.md)", file=sys.stderr)
        return 2
    sys.stdout.write(index())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
