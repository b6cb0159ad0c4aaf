"""The reproductions index: REPRODUCTIONS.md (one row and one verdict per section-9 check of the papers' digests) and
one page per paper (reproductions/PAPER/README.md) with every claim of every spec that names a check.

Written by `python -m hfl.claims index --write` (hfl/claims.py, which hands in the spec loader and the claims'
evaluation) from reproductions/checks.toml, the specs' [[claim]] tables and the committed reports
reproductions/PAPER/SPEC/results.json (their runs under runs/CELL/seed-S/).

The rule of a check's verdict (stated in checks.toml before the runs that decide it): each check names its primary
spec(s) (closest to the paper's setting; one per half where the statement has halves tested apart) and, optionally,
the labels of the primary claims; without `primary_claims` every claim of the primary specs with the check's id
decides, except those labelled "ablation..." or "reference...". The check's verdict is the worst of its primary
claims' verdicts (hfl/claims.py: contradicted, contradicted in magnitude, not run, n too small, not shown, holds in
shape only, holds). Every other spec naming the check is listed in `ablations`. A seed extension (a [[pool]] of
checks.toml) runs cells of its parent spec on fresh seeds: its runs join the parent's cell by cell once every
committed run of both shares every setting but the seed (run.seed and run.name), and the parent's claims are
evaluated on the pooled seeds.
"""
from __future__ import annotations

import json
import pathlib
import tomllib
from dataclasses import dataclass
from typing import Any, Callable

from hfl.claim_stats import HOLDS, N_SMALL, NOT_RUN, RANK, VERDICTS, num, value_text, worst

CHECKS = "reproductions/checks.toml"
IGNORED = ("run.name", "run.seed")  # the keys a seed extension may change


@dataclass
class Sources:
    load_spec: Callable[[pathlib.Path], Any]             # hfl.sweep_spec.load_spec
    evaluate_all: Callable[[list, list[dict]], list[dict]]  # hfl.claims.evaluate_all
    paired_note: Callable[[dict], str]
    changed_keys: Callable[[str, str], list[str] | None]   # hfl.sweep_spec.changed_keys


# ---- seed extensions -----------------------------------------------------------------------------
def _settings_text(run_dir: pathlib.Path) -> str | None:
    path = run_dir / "config.toml"
    return path.read_text() if path.is_file() else None


def pool_problems(parent: pathlib.Path, extension: pathlib.Path, cells: list[str],
                  changed: Callable[[str, str], list[str] | None]) -> list[str]:
    """Why the runs of `extension` (a report directory) cannot join those of `parent` in `cells`: a cell without
    committed runs, a seed in both, or a setting other than run.seed and run.name that differs between two of the
    cells' committed runs. `changed(a, b)` lists the keys whose values differ between two config.toml texts
    (hfl.sweep_spec.changed_keys: a key one file lacks is no difference where the other holds its default, the field
    being newer than the run); a key counts when it differs read both ways."""
    problems = []
    for cell in cells:
        dirs = {side: sorted((root / "runs" / cell).glob("seed-*")) for side, root in
                (("parent", parent), ("extension", extension))}
        if not dirs["parent"] or not dirs["extension"]:
            problems.append(f"{cell}: no committed runs in the " + ("parent" if not dirs["parent"] else "extension"))
            continue
        shared = {d.name for d in dirs["parent"]} & {d.name for d in dirs["extension"]}
        if shared:
            problems.append(f"{cell}: {', '.join(sorted(shared))} in both")
        first_dir, first = dirs["parent"][0], _settings_text(dirs["parent"][0])
        for d in dirs["parent"] + dirs["extension"]:
            text = _settings_text(d)
            if text is None or first is None:
                problems.append(f"{cell}: {(d if text is None else first_dir).name} has no config.toml")
                continue
            one_way, other_way = changed(first, text), changed(text, first)
            differ = (["config.toml (unreadable)"] if one_way is None or other_way is None else
                      [k for k in one_way if k in other_way and k not in IGNORED])
            if differ:
                problems.append(f"{cell}: {d.parent.parent.parent.name}/{d.name} differs from "
                                f"{first_dir.parent.parent.parent.name}/{first_dir.name} in " + ", ".join(differ[:3]))
    return problems


def pooled(parent_cells: list[dict], extension_cells: list[dict]) -> list[dict]:
    """The parent's cells with the extension's runs of the same cell added."""
    extra = {c["cell"]: c for c in extension_cells}
    out = []
    for cell in parent_cells:
        more = extra.get(cell["cell"])
        if more is None:
            out.append(cell)
            continue
        out.append({**cell, "runs": cell["runs"] + more["runs"], "seeds": cell["seeds"] + more["seeds"],
                    "finished": cell.get("finished", []) + more.get("finished", [])})
    return out


# ---- gathering -----------------------------------------------------------------------------------
@dataclass
class Report:
    spec: str               # deploy/experiments/X.toml
    dir: str                # reproductions/PAPER/X
    stored: dict            # results.json
    results: list[dict]     # its claims' results (pooled with its extensions where checks.toml says so)
    pooled_from: list[str]  # the extension reports pooled into it
    pool_problems: list[str]


def gather(root: pathlib.Path, sources: Sources) -> tuple[dict, dict[str, Report], dict[str, list[str]]]:
    """(checks.toml, spec path -> its committed report, check id -> the specs naming it)."""
    checks = tomllib.loads((root / CHECKS).read_text())
    naming: dict[str, list[str]] = {}
    specs = {}
    for path in sorted((root / "deploy" / "experiments").glob("*.toml")):
        rel = path.relative_to(root).as_posix()
        specs[rel] = sources.load_spec(path)
        for claim in specs[rel].claims:
            if rel not in naming.setdefault(claim.id, []):
                naming[claim.id].append(rel)
    reports: dict[str, Report] = {}
    for path in sorted((root / "reproductions").glob("*/*/results.json")):
        stored = json.loads(path.read_text())
        reports[stored["spec"]] = Report(stored["spec"], path.parent.relative_to(root).as_posix(), stored,
                                         stored.get("claims", []), [], [])
    for pool in checks.get("pool", []):
        parent, ext = reports.get(pool["parent"]), reports.get(pool["extension"])
        if parent is None or ext is None:
            continue
        cells = [c["cell"] for c in ext.stored["cells"] if c["cell"] in {p["cell"] for p in parent.stored["cells"]}]
        problems = pool_problems(root / parent.dir, root / ext.dir, cells, sources.changed_keys) or ([] if cells else ["no cell in common"])
        parent.pool_problems += problems
        if not problems:
            parent.stored = {**parent.stored, "cells": pooled(parent.stored["cells"], ext.stored["cells"])}
            parent.pooled_from.append(ext.dir)
    for report in reports.values():
        if report.pooled_from:
            report.results = sources.evaluate_all(specs[report.spec].claims, report.stored["cells"])
    return checks, reports, naming


def primary_results(check: dict, reports: dict[str, Report]) -> list[tuple[Report, dict]]:
    """The claims that decide a check: of its primary specs' reports, those with its id that `primary_claims`
    names (default: every one not labelled ablation or reference)."""
    chosen = check.get("primary_claims")
    out = []
    for spec in check.get("primary", []):
        report = reports.get(spec)
        for r in report.results if report else []:
            if r["id"] != check["id"]:
                continue
            if (r["label"] in chosen) if chosen is not None else not r["label"].startswith(("ablation", "reference")):
                out.append((report, r))
    return out


def row_verdict(check: dict, decided: list[tuple[Report, dict]]) -> tuple[str, dict | None]:
    """(the check's verdict, the claim that decides it): the worst verdict of the primary claims."""
    if check.get("unit_tests"):
        return "unit tests", None
    if not decided:
        return NOT_RUN, None
    verdict = worst([r["verdict"] for _, r in decided])
    return verdict, min((r for _, r in decided if r["verdict"] == verdict), key=test_rank)


def test_rank(result: dict) -> int:
    """How badly a claim's test alone goes (its worst comparison's, before the seed rule): the tie-break among
    claims of one verdict."""
    comps = result.get("comparisons") or [{"verdict": result["verdict"]}]
    return min(RANK.get(c.get("test_verdict", c["verdict"]), len(RANK)) for c in comps)


def test_alone(result: dict) -> str:
    """What the test of a claim with too few seeds says by itself (its worst comparison's test verdict)."""
    return next(v for v, rank in RANK.items() if rank == test_rank(result))


# ---- writing -------------------------------------------------------------------------------------
def _setting(root: pathlib.Path, report: Report, results: list[dict]) -> str:
    """Rounds, model, data, topology of the primary claims' committed runs, and the seeds a cell."""
    found: dict[str, list[str]] = {}
    cells = list(dict.fromkeys(c for r in results for c in r["cells"]))
    for cell in cells:
        runs = sorted((root / report.dir / "runs" / cell).glob("seed-*"))
        config = tomllib.loads((runs[0] / "config.toml").read_text()) if runs and (runs[0] / "config.toml").is_file() else {}
        if report.stored.get("runner") == "dlg":
            parts = {"what": "DLG on one update", "data": config.get("data", {}).get("dataset", "?")}
        else:
            topo = config.get("topology", {})
            parts = {"rounds": f"{config.get('run', {}).get('rounds', '?')} rounds",
                     "model": config.get("model", {}).get("name", "?"),
                     "data": config.get("data", {}).get("dataset", "?"),
                     "topology": f"{topo.get('edges', '?')} x {topo.get('devices_per_edge', '?')} devices"}
        for key, value in parts.items():
            if value not in found.setdefault(key, []):
                found[key].append(value)
    ns = sorted({s["n"] for r in results for s in r["values"].values()})
    seeds = f"n = {ns[0]}" + (f"-{ns[-1]}" if ns[-1] != ns[0] else "") + " a cell" if ns else "no runs"
    return ", ".join(" / ".join(v) for v in found.values()) + f", {seeds}"


def _epsilon(report: Report, results: list[dict]) -> str:
    """The accountant's epsilon of the primary claims' private cells beside the epsilon the paper's method claims."""
    cells = {c for r in results for c in r["cells"]}
    spent, claimed = [], []
    for cell in report.stored["cells"]:
        eps = cell.get("epsilon") or {}
        if cell["cell"] in cells and eps.get("epsilon", {}).get("mean") is not None:
            spent.append(eps["epsilon"]["mean"])
            if eps.get("epsilon_claimed", {}).get("mean") is not None:
                claimed.append(eps["epsilon_claimed"]["mean"])
    if not spent:
        return ""
    text = f"{min(spent):.3g}" + (f" to {max(spent):.3g}" if max(spent) > min(spent) else "")
    if claimed:
        text += " (claimed " + ", ".join(dict.fromkeys(f"{c:.3g}" for c in sorted(claimed))) + ")"
    return text


def _effects(result: dict) -> str:
    parts = []
    for c in result["comparisons"]:
        text = f"{c['comparison']}: {num(c.get('effect'))}"
        if c.get("upper_bound") is not None:
            text += (f" [as a difference in the claimed direction: upper bound {num(c['upper_bound'])}, "
                     f"the paper's {num(c['paper_effect'])}]")
        elif c.get("paper") is not None:
            text += f" (paper {num(c['paper'])})"
        parts.append(text)
    return "; ".join(parts)


def _power(result: dict) -> str:
    """Seeds a cell for 80% power of the claim's test (its comparison that needs most): against the paper's effect
    where it gives one, else against ours; "never" when our effect is against the claim."""
    needs = [c.get("seeds_for_power", -1) for c in result["comparisons"]]
    if all(n == -1 for n in needs):
        return "-"
    if any(n is None for n in needs):
        return "never (our effect is against the claim)"
    return str(max(needs))


def _name(result: dict) -> str:
    return result["id"] + (f" ({result['label']})" if result["label"] else "")


def _anchor(heading: str) -> str:
    """The anchor a markdown renderer gives a heading: lower case, spaces to hyphens, other punctuation dropped."""
    return "".join(ch for ch in heading.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


def paper_dir(root: pathlib.Path, cid: str) -> str:
    found = sorted((root / "reproductions").glob(cid.split("/")[0] + "-*/"))
    return found[0].relative_to(root).as_posix() if found else f"reproductions/{cid.split('/')[0]}"


def pages(root: pathlib.Path, sources: Sources) -> dict[str, str]:
    checks, reports, naming = gather(root, sources)
    rules = checks.get("rules", {})
    rows, counts, papers = [], {v: 0 for v in VERDICTS}, {}
    for check in checks["check"]:
        cid, page = check["id"], paper_dir(root, check["id"])
        decided = primary_results(check, reports)
        verdict, decider = row_verdict(check, decided)
        if verdict in counts:
            counts[verdict] += 1
        anchor = f"{page}/README.md#" + _anchor(f"{cid} {check['title']}")
        primaries = [reports[s] for s in check.get("primary", []) if s in reports]
        setting = "; ".join(_setting(root, rep, [r for p, r in decided if p is rep]) for rep in primaries) or "-"
        eps = "; ".join(e for rep in primaries if (e := _epsilon(rep, [r for p, r in decided if p is rep])))
        ours = (f"{_name(decider)}: " + ("deterministic values, " if decider.get("deterministic") else "")
                + _effects(decider) if decider else
                "unit tests: " + ", ".join(f"`{t}`" for t in check["unit_tests"]) if check.get("unit_tests") else "-")
        narrowed = "<br>".join(check.get("narrowed", [])) or "-"
        alone = f" (the test alone: {test_alone(decider)})" if verdict == N_SMALL else ""
        where = f"ours: {setting}<br>paper: {check.get('paper_setting', '-')}" if "primary" in check else "-"
        rows.append(f"| [{cid} {check['title']}]({anchor}) | {check['figure']} | {ours} | **{verdict}**{alone} | {where} | "
                    f"{eps or '-'} | {narrowed} |")
        papers.setdefault(page, []).extend(_check_section(root, check, verdict, decider, decided, reports,
                                                          naming.get(cid, []), sources, page, setting, eps))
    total = sum(counts.values())
    head = ["# Reproductions", "",
            "One row and one verdict per acceptance check of the papers' digests (section 9), decided by its primary "
            "claims: those of the spec closest to the paper's setting, named in `reproductions/checks.toml` with the "
            "ablations beside it. The verdict is the worst of the primary claims' verdicts (contradicted, contradicted "
            "in magnitude, not run, n too small, not shown, holds in shape only, holds; see `hfl/claims.py` for the "
            "tests): \"contradicted in magnitude\" when the one-sided upper confidence bound of our effect is below "
            "half the paper's (each claim may state another fraction), \"n too small\" when a cell has fewer than 5 "
            "seeds (the test is shown in the paper's page but decides nothing); deterministic values (no spread over "
            "the seeds) are decided from the values. Seed extensions of a report (`[[pool]]` in checks.toml) join its "
            "cells once their runs are checked to share every setting but the seed. Every claim of every spec, with "
            "its test, is on the paper's page (`reproductions/PAPER/README.md`).", "",
            f"All committed reports were re-evaluated under these rules on {rules.get('reevaluated', '?')} "
            "(`hfl sweep SPEC --report-only --out reproductions/PAPER/SPEC`, from the committed runs); the verdicts "
            f"they showed before were decided by the earlier rules ({rules.get('before', 'see the git history')}). "
            "The primary specs, the seed rule and the magnitude fraction were stated then, after those runs: their "
            "verdicts are a re-evaluation, and only runs made after that date are decided by rules stated before them.",
            "",
            f"Verdicts of the {total} end-to-end checks: " + ", ".join(f"{v} {n}" for v, n in counts.items()) + "; "
            f"{len(checks['check']) - total} checks are unit-level (their unit tests).", "",
            "Generated by `python -m hfl.claims index --write` (this page and the papers' pages); "
            "`tests/unit/test_claims.py` fails when they are stale.", "",
            "| check | paper's figure | ours (the deciding claim) | verdict | setting: ours / the paper's | "
            "epsilon: accountant (claimed) | narrowed or dropped |",
            "|---|---|---|---|---|---|---|"]
    out = {"REPRODUCTIONS.md": "\n".join(head + rows) + "\n"}
    for page, lines in papers.items():
        title = [f"# {pathlib.PurePosixPath(page).name}: claims and verdicts", "",
                 "Every claim of every spec that names a check of this paper, with its verdict on the committed "
                 "report; the check's verdict is its primary claims' worst (see [REPRODUCTIONS.md](../../REPRODUCTIONS.md)). "
                 "Generated by `python -m hfl.claims index --write`.", ""]
        out[f"{page}/README.md"] = "\n".join(title + lines) + "\n"
    return out


def _check_section(root, check, verdict, decider, decided, reports, specs, sources, page, setting, eps) -> list[str]:
    cid = check["id"]
    up = "../../"
    lines = [f"## {cid} {check['title']}", "", f"- Paper: {check['statement']}", f"- Paper's figure: {check['figure']}"]
    if check.get("unit_tests"):
        lines += ["- Tested by unit tests: " + ", ".join(f"`{t}`" for t in check["unit_tests"]), ""]
        return lines
    lines.append(f"- Paper's setting: {check.get('paper_setting', '-')}")
    lines.append(f"- Our setting (primary): {setting or '-'}")
    if eps:
        lines.append(f"- Epsilon, the accountant's (the paper's claim): {eps}")
    lines.append("- Primary: " + (", ".join(f"[`{s}`]({up}{s})" for s in check.get("primary", [])) or "none yet")
                 + (f"; deciding claims: {', '.join(repr(c) for c in check['primary_claims'])}"
                    if check.get("primary_claims") else ""))
    for rep in (reports[s] for s in check.get("primary", []) if s in reports):
        if rep.pooled_from:
            lines.append(f"- Pooled into `{rep.dir}`: " + ", ".join(f"`{d}`" for d in rep.pooled_from)
                         + " (every setting but the seed checked equal, run by run)")
        if rep.pool_problems:
            lines.append(f"- Not pooled into `{rep.dir}`: " + "; ".join(rep.pool_problems))
    for item in check.get("narrowed", []):
        lines.append(f"- {item[:1].upper()}{item[1:]}")
    lines += [f"- Verdict: **{verdict}**" + (f", decided by {_name(decider)}" + (f": {decider['why']}" if decider["why"] else "")
                                             if decider else ""), "",
              "| spec | role | claim | verdict | ours | why | seeds for 80% power | report |",
              "|---|---|---|---|---|---|---|---|"]
    deciding = {id(r) for _, r in decided}
    for spec in sorted(specs, key=lambda s: (s not in check.get("primary", []), s)):
        report = reports.get(spec)
        role = "primary" if spec in check.get("primary", []) else "ablation"
        if report is None:
            lines.append(f"| [`{spec}`]({up}{spec}) | {role} | - | not run | - | - | - | - |")
            continue
        pooled_into = [r.spec for r in reports.values() if report.dir in r.pooled_from]
        if pooled_into:
            role = f"seed extension, pooled into `{pooled_into[0]}`"
        for r in report.results:
            if r["id"] != cid:
                continue
            shown = role if id(r) in deciding or role != "primary" else "primary spec, not deciding"
            ours = "; ".join(f"{cell} {value_text(r['values'][cell])}" for cell in r["cells"])
            why = r["why"] or "-" if r["verdict"] != HOLDS else "-"
            lines.append(f"| [`{spec}`]({up}{spec}) | {shown} | {r['label'] or '-'} | **{r['verdict']}**"
                         f"{sources.paired_note(r)} | {ours} | {why} | {_power(r)} | "
                         f"[{report.dir}]({up}{report.dir}/results.md) |")
    lines.append("")
    return lines
