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
    magnitude_fraction = 0.5              # optional: below this fraction of the paper's effect -> contradicted in magnitude
    min_seeds = 5                         # optional: finished seeds a cell needs for a verdict

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
more than `factor`), **contradicted in magnitude** (the paper gives the effect's size and the one-sided (1 - alpha)
upper confidence bound of ours, in the claimed direction, is below `magnitude_fraction` (default 0.5) of the paper's:
our effect is significantly smaller than half the paper's, whether or not its direction is significant), **not
shown** (not significant either way), **contradicted** (significant the other way, at alpha / number of comparisons:
Bonferroni), **n too small** (a cell with fewer than `min_seeds` (default 5) finished seeds, or a paired test with
fewer pairs: the test is run and shown, but decides nothing), **not run** (a cell without a finished run).

The upper bound is Welch's (the contrast plus t(1 - alpha, Welch-Satterthwaite df) standard errors, the bound of
scipy.stats.ttest_ind(equal_var=False, alternative="less").confidence_interval), the paired test's over the per-seed
contrasts, or the bootstrap's upper percentile. A ratio claim's paper effect is taken on the difference scale:
(1 - paper ratio) x mean(b); a weak relation's bound is that of the difference itself (its margin left out), so a
paper that gives a step (80% against 75%) is held to it. Share claims have no magnitude verdict.

Deterministic values (every cell of a comparison has at least two seeds and no spread: a controller's plan, an
exact formula) are decided from the values, not by a test (a p-value of 0 carries no information there): the
sign of the contrast (equal values where the claim states a difference contradict it) and, where the paper gives
one, its size; more seeds would add nothing, so `min_seeds` does not apply, and the result says "deterministic".

A weak relation (>=, <=) is a non-inferiority test: `a >= b` reads
"a is not below b by more than the margin" and is tested as the strict relation a - b + margin > 0; it holds when that
is significant, is contradicted when a - b < -margin is significant, and is otherwise not shown. The margin is the
claim's `margin` (on the metric's scale); without one it is 2% of the magnitude of the compared-to side (b's mean),
or 0 for a threshold (its `value` already states the tolerance). The claim's verdict
is its worst comparison's, in the order contradicted, contradicted in magnitude, not run, n too small, not shown,
shape only, holds: "holds" needs every step significant (an intersection-union test, level alpha without correction).

Optional keys of every kind: `magnitude_fraction` (default 0.5) and `min_seeds` (default 5), stated in the spec
before its runs.
"""
from __future__ import annotations

import math
import operator
import pathlib
import re
import sys
import textwrap
from typing import Any

from hfl.claim_kinds import (COMMON, ID, KINDS, RELATIONS, TESTS, Claim, ClaimError, Comparison, _sign,  # noqa: F401
                             parse_claim, parse_claims)
from hfl.claim_stats import (CONTRADICTED, HOLDS, MAGNITUDE, N_SMALL, NOT_RUN, NOT_SHOWN, RANK, SHAPE,  # noqa: F401
                             bootstrap, fisher, num as _num, seeds_for_power, stats_of as _stats, value_text as _value,
                             welch)

WEAK_MARGIN = 0.02  # a weak relation's default margin, relative to the compared-to side's mean
ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKS = "reproductions/checks.toml"


# ---- evaluation ----------------------------------------------------------------------------------
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


def paper_effect(comp: Comparison, means: dict[str, float]) -> float | None:
    """The paper's effect on the contrast's scale, signed so that the claimed direction is positive (a ratio's:
    (paper - 1) x mean(b)); None where the paper gives no size."""
    if comp.paper is None or comp.event is not None:
        return None
    if comp.ratio:
        return _sign(comp.relation) * (comp.paper - 1) * means[comp.terms[1][0]]
    return _sign(comp.relation) * comp.paper


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
    """The comparison whose verdict decides a claim's (contradicted first, holds last; among those with too few
    seeds, the one whose test alone says least)."""
    return min(comps, key=lambda c: (RANK[c["verdict"]], RANK.get(c.get("test_verdict"), len(RANK))))


def _paired(comp: Comparison, coefs: list[float], values: dict[str, list[float]],
            seeds: dict[str, list[int]]) -> list[float]:
    """The comparison's contrast seed by seed, over the seeds finished in every one of its cells."""
    by_seed = [dict(zip(seeds[cell], values.get(cell, []))) for cell, _ in comp.terms]
    common = sorted(set.intersection(*(set(b) for b in by_seed)))
    return [sum(c * b[s] for c, b in zip(coefs, by_seed)) for s in common]


def _too_few(claim: Claim, out: dict[str, Any], n: int, unit: str = "finished seeds in a cell") -> dict[str, Any]:
    """A comparison's test at n below min_seeds: shown, but the verdict is n too small."""
    return {**out, "verdict": N_SMALL, "test_verdict": out["verdict"],
            "why": f"{n} {unit}, under the {claim.min_seeds} a verdict needs (the test alone: {out['verdict']}, "
                   f"{out['why']})"}


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
        out |= {"verdict": CONTRADICTED,
                "why": f"{shares}: significant the other way (p = {p_other:.3g} < {claim.alpha / k:.3g})"}
    elif p >= claim.alpha:
        out |= {"verdict": NOT_SHOWN, "why": f"{shares}: not significant (p = {p:.3g} >= {claim.alpha})"}
    else:
        ratio = res["estimate"] / comp.paper if comp.paper else None
        out["magnitude_vs_paper"] = ratio
        if ratio is not None and not (1 / claim.factor <= ratio <= claim.factor):
            out |= {"verdict": SHAPE, "why": f"{shares}: significant (p = {p:.3g}); the difference {ratio:.2g}x the paper's"}
        else:
            out |= {"verdict": HOLDS, "why": f"{shares}: p = {p:.3g} < {claim.alpha}"}
    n = min(len(g) for g in groups)
    return _too_few(claim, out, n) if n < claim.min_seeds else out


def _decide(claim: Claim, out: dict[str, Any], res: dict[str, Any], k: int, margin: float | None,
            ratio_to_paper: float | None, paper: float | None) -> dict[str, Any]:
    """The verdict of one comparison from its test `res` (on the contrast signed so that the claim is > 0)."""
    p, p_other = res["p_greater"], res["p_less"]
    out["p"], out["p_other_way"] = p, p_other
    within = f" by more than the margin {margin:.3g}" if margin else ""
    if p_other < claim.alpha / k:
        return {**out, "verdict": CONTRADICTED,
                "why": f"significant the other way{within} (p = {p_other:.3g} < {claim.alpha / k:.3g})"}
    if paper is not None and paper > 0:  # a weak relation's bound is the difference's itself, without the margin
        upper = res["upper"] - (margin or 0.0)
        out["upper_bound"], out["paper_effect"] = upper, paper
        if upper < claim.magnitude_fraction * paper:
            return {**out, "verdict": MAGNITUDE,
                    "why": f"our effect's one-sided {1 - claim.alpha:.0%} upper bound {upper:.3g} is below "
                           f"{claim.magnitude_fraction:g} x the paper's {paper:.3g}"}
    if margin is not None:  # a weak relation: non-inferiority
        test = f"within the margin {margin:.3g} (non-inferiority p = {p:.3g}" if margin else f"(p = {p:.3g}"
        if p >= claim.alpha:
            return {**out, "verdict": NOT_SHOWN, "why": f"not shown {test} >= {claim.alpha})"}
        return {**out, "verdict": HOLDS, "why": f"{test})"}
    if p >= claim.alpha:
        return {**out, "verdict": NOT_SHOWN, "why": f"not significant (p = {p:.3g} >= {claim.alpha})"}
    out["magnitude_vs_paper"] = ratio_to_paper
    if ratio_to_paper is not None and not (1 / claim.factor <= ratio_to_paper <= claim.factor):
        return {**out, "verdict": SHAPE,
                "why": f"direction significant (p = {p:.3g}); magnitude {ratio_to_paper:.2g}x the paper's, "
                       f"outside 1/{claim.factor:g}..{claim.factor:g}"}
    return {**out, "verdict": HOLDS, "why": f"p = {p:.3g} < {claim.alpha}"}


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
    deterministic = all(len(g) >= 2 and _stats(g)["std"] == 0 for g in groups)
    if n == 1:
        return {**out, "verdict": N_SMALL, "why": "a cell has one finished seed: no spread to test against"}
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
        out["pairs"] = n = len(contrasts)
        if n < 2:
            return {**out, "verdict": N_SMALL, "why": f"{n} seed(s) finished in every cell: nothing to pair"}
        res = welch([contrasts], [1.0], offset, claim.alpha)
        out["t"], out["df"] = sign * res["t"], res["df"]
    elif claim.test == "bootstrap":
        res = bootstrap(groups, coefs, offset, claim.n_boot, claim.alpha)
        out["interval"] = [sign * x for x in (res["interval"] if sign > 0 else res["interval"][::-1])]
    else:
        res = welch(groups, coefs, offset, claim.alpha)
        out["t"], out["df"] = sign * res["t"], res["df"]
    paper = paper_effect(comp, means)
    out = _decide(claim, out, res, k, margin if weak else None, ratio_to_paper, paper)
    # seeds a cell for 80% power against the paper's effect where it gives one, else against ours
    target = paper if paper is not None and paper > 0 and not weak else res["estimate"]
    spread = [contrasts] if claim.test == "paired" else groups
    out["seeds_for_power"] = seeds_for_power(spread, [1.0] if claim.test == "paired" else coefs, target, claim.alpha)
    if deterministic:
        if out["verdict"] == NOT_SHOWN:  # equal values where the claim states a difference: none, exactly
            out = {**out, "verdict": CONTRADICTED, "why": "the values are equal where the claim states a difference"}
        return {**out, "deterministic": True,
                "why": f"deterministic values (no spread over {n} seeds), decided from the values: {out['why']}"}
    if n < claim.min_seeds:
        return _too_few(claim, out, n, "pairs" if claim.test == "paired" else "finished seeds in a cell")
    return out


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
            "magnitude_fraction": claim.magnitude_fraction, "min_seeds": claim.min_seeds,
            "deterministic": all(c.get("deterministic") for c in comps),
            "cells": claim.cells, "values": per_cell,
            "paper_values": paper_values(claim), "comparisons": comps, "verdict": worst["verdict"],
            "why": "" if worst["verdict"] == HOLDS else f"{worst['comparison']}: {worst['why']}"}


def cell_values(cells: list[dict], metric: str) -> dict[str, list[float]]:
    """Per cell, the finite per-seed values of `metric` from a sweep's aggregated cells (results.json)."""
    return {c["cell"]: [float(r[metric]) for r in c["runs"] if _finite(r.get(metric))] for c in cells}


def cell_seeds(cells: list[dict], metric: str) -> dict[str, list[int]]:
    """Per cell, the seed of each value cell_values returns, in the same order."""
    return {c["cell"]: [r.get("seed", i) for i, r in enumerate(c["runs"]) if _finite(r.get(metric))] for c in cells}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def evaluate_all(claims: list[Claim], cells: list[dict]) -> list[dict[str, Any]]:
    return [evaluate(claim, cell_values(cells, claim.metric), cell_seeds(cells, claim.metric)) for claim in claims]


# ---- writing -------------------------------------------------------------------------------------
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
        lines.append(f"- Test: {r['test']}; shape only beyond a factor {r['factor']:g} of the paper's magnitude, "
                     f"contradicted in magnitude when the upper bound is under {r.get('magnitude_fraction', 0.5):g} "
                     f"of it; a verdict needs {r.get('min_seeds', 5)} seeds a cell")
        if r.get("deterministic"):
            lines.append("- Deterministic values (no spread over the seeds): decided from the values, not by a test")
        if r["why"]:
            lines.append(f"- Why: {r['why']}")
        if r.get("paired"):
            ps = ", ".join(_num(p) for p in r["paired"]["p"])
            lines.append(f"- Paired over seeds (a sensitivity check, not the verdict): {r['paired']['verdict']} "
                         f"(one-sided paired t-test per comparison, p = {ps})")
        lines += ["", "| comparison | effect | upper bound | paper | p | p other way | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for c in r["comparisons"]:
            lines.append(f"| {c['comparison']} | {_num(c.get('effect'))} | {_num(c.get('upper_bound'))} | "
                         f"{_num(c['paper'])} | {_num(c.get('p'))} | {_num(c.get('p_other_way'))} | {c['verdict']} |")
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


# ---- the index: REPRODUCTIONS.md and reproductions/PAPER/README.md --------------------------------
def _paired_note(result: dict) -> str:
    paired = result.get("paired")
    return f" [paired: {paired['verdict']}]" if paired and paired["verdict"] != result["verdict"] else ""


def index_pages(root: pathlib.Path = ROOT) -> dict[str, str]:
    """REPRODUCTIONS.md and one page per paper (reproductions/PAPER/README.md), path -> text: see hfl/claims_index.py."""
    from hfl import claims_index, sweep_spec

    return claims_index.pages(root, claims_index.Sources(sweep_spec.load_spec, evaluate_all, _paired_note, sweep_spec.changed_keys))


def index(root: pathlib.Path = ROOT) -> str:
    """REPRODUCTIONS.md: one row and one verdict per section-9 check of the digests (reproductions/checks.toml)."""
    return index_pages(root)["REPRODUCTIONS.md"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["index"]:
        sys.stdout.write(index())
        return 0
    if argv == ["index", "--write"]:
        for rel, text in index_pages().items():
            (ROOT / rel).write_text(text)
            print(rel)
        return 0
    print("usage: python -m hfl.claims index [--write]   (prints REPRODUCTIONS.md; --write writes it and the "
          "papers' pages reproductions/PAPER/README.md)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
