"""The [[claim]] tables of a sweep spec, parsed: a claim's kind, cells and comparisons (see hfl/claims.py for the
keys, the tests and the verdicts)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hfl.claim_stats import MAGNITUDE_FRACTION, MIN_SEEDS

KINDS = {
    "order": ("cells", "relation", "paper"),
    "threshold": ("cell", "op", "value", "than"),
    "trend": ("axis", "direction", "where", "values", "paper"),
    "gap": ("cells", "relation", "paper"),
    "gap_trend": ("pairs", "direction", "paper"),
    "ratio": ("cells", "paper"),
    "share": ("cells", "op", "value", "relation", "paper"),
}
COMMON = ("id", "label", "statement", "figure", "kind", "metric", "factor", "test", "alpha", "n_boot", "margin",
          "magnitude_fraction", "min_seeds")
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
    magnitude_fraction: float = MAGNITUDE_FRACTION   # upper bound below this fraction of the paper's effect: contradicted in magnitude
    min_seeds: int = MIN_SEEDS     # finished seeds a cell needs for a verdict

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
    fraction, min_seeds = raw.get("magnitude_fraction", MAGNITUDE_FRACTION), raw.get("min_seeds", MIN_SEEDS)
    if not (_number(fraction) and 0 < fraction <= 1):
        raise ClaimError(f"{where}: magnitude_fraction must be in (0, 1], got {fraction!r}")
    if not (isinstance(min_seeds, int) and not isinstance(min_seeds, bool) and min_seeds >= 2):
        raise ClaimError(f"{where}: min_seeds must be an integer >= 2, got {min_seeds!r}")

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
                 None if margin is None else float(margin), dict(raw), float(fraction), min_seeds)


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

