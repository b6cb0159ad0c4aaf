"""The results of a sweep (hfl/sweep.py): per-cell mean and std over the seeds of the report fields, the claims' verdicts,
results.md / results.json, the curve plots and the provenance of both."""
from __future__ import annotations

import itertools
import json
import math
import pathlib
import statistics
import time
from typing import Any

from hfl import claims as claims_mod
from hfl.common import metrics
from hfl.sweep_spec import TARGET_BOUNDS, TARGET_COLUMNS, TIMING, Run, Spec, SweepError, _slug


# ---- results -------------------------------------------------------------------------------------
def _numbers(obj: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_numbers(v, f"{prefix}{k}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix[:-1]] = float(obj)
    return out


def to_target(rows: list[dict], target: dict) -> dict[str, float | None]:
    """The first row whose `metric` reaches `value` (>=), and the cumulative emulated seconds, energy and wall
    seconds by then; `reached` 1 or 0 (its mean over seeds is the share that got there); None for a run that
    never reaches it (left out of the mean, never counted as 0). `at_least` holds the same columns as lower
    bounds that every finished run has: the value at the target, or at the run's last row when it never got there
    (a censored run took at least that long). A claim that a reaching cell needs less than a censored one, tested
    on `target.at_least.*`, is conservative."""
    (metric, value), = target.items()
    hit = next((r for r in rows if r.get(metric) is not None and r[metric] >= value), None)
    bound = hit or (rows[-1] if rows else {})
    return {"reached": float(hit is not None), **{c: (hit.get(c) if hit else None) for c in TARGET_COLUMNS},
            "at_least": {c: bound.get(c) for c in TARGET_BOUNDS}}


def volatility(rows: list[dict], metric: str, from_round: int) -> float | None:
    """How much `metric` jumps from round to round: the standard deviation (ddof 1) of its round-to-round changes
    over the rows from round `from_round` on (past the first rise of the curve); None under three such rows."""
    values = [r[metric] for r in rows if r.get("round", 0) >= from_round and r.get(metric) is not None]
    if len(values) < 3:
        return None
    return statistics.stdev(b - a for a, b in zip(values, values[1:]))


def epsilon_fields(summary: dict) -> dict[str, float]:
    """The run-level numeric summary fields whose name holds "epsilon", at most one level deep (nested keys
    dotted: epsilon_claimed, privacy.epsilon_mean); per-edge planning details stay in summary.json."""
    return {k: v for k, v in _numbers(summary).items() if "epsilon" in k.rsplit(".", 1)[-1] and k.count(".") <= 1}


AUDIT_FILE = "audit/audit.json"


def out_dir_of(run: Run) -> pathlib.Path:
    """The cell's directory (OUT/CELL), where its audit lives."""
    return run.run_dir.parent


def epsilon_label(key: str) -> str:
    """Which kind of figure an epsilon column holds: never blur the accountant's with a paper's claim."""
    name = key.rsplit(".", 1)[-1]
    if name == "epsilon_lower_bound":
        return f"{key} (empirical 95% lower bound, one release)"
    if name == "epsilon_one_release":
        return f"{key} (what the calibration states for that release; a claim in paper mode)"
    kind = ("the paper's claim, not a measurement" if "claimed" in name else "the configured budget"
            if "budget" in name else "accountant")
    return f"{key} ({kind})"


def mean_std(values: list[float]) -> dict[str, Any]:
    """Mean and sample standard deviation (ddof = 1; 0 for one value) of the finite values."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(vals)}


def aggregate(spec: Spec, runs: list[Run], errors: dict[pathlib.Path, str]) -> list[dict]:
    """One entry per cell: varied values, per-seed runs and mean/std over seeds of the report fields and
    of every epsilon field."""
    cells: dict[str, list[Run]] = {}
    for run in runs:
        cells.setdefault(run.cell, []).append(run)
    out = []
    for cell, members in cells.items():
        summaries = {r.seed: json.loads((r.run_dir / "summary.json").read_text()) for r in members if r.done}
        if spec.report.get("target"):
            for r in members:
                if r.seed in summaries:
                    summaries[r.seed]["target"] = to_target(metrics.read_jsonl(r.run_dir / "metrics.jsonl"),
                                                            spec.report["target"])
        vol = spec.report.get("volatility")
        if vol:
            for r in members:
                if r.seed in summaries:
                    rows = metrics.read_jsonl(r.run_dir / "metrics.jsonl")
                    summaries[r.seed]["volatility"] = {vol["metric"]: volatility(rows, vol["metric"], vol["from_round"])}
        audited = out_dir_of(members[0]) / AUDIT_FILE
        if audited.is_file():  # one audit per cell: the same columns beside every seed
            found = json.loads(audited.read_text())
            for s in summaries.values():
                s["audit"] = {"epsilon_lower_bound": found["epsilon_lower_bound"],
                              "epsilon_one_release": found["epsilon_claimed"]}
        eps_keys = sorted({k for s in summaries.values() for k in epsilon_fields(s)})
        stats = {f: mean_std([_numbers(s).get(f) for s in summaries.values()]) for f in spec.report["fields"]}
        eps = {k: mean_std([epsilon_fields(s).get(k) for s in summaries.values()]) for k in eps_keys}
        timing = {k: mean_std([s.get(k) for s in summaries.values()]) for k in TIMING}
        out.append({"cell": cell, "varied": members[0].varied, "seeds": [r.seed for r in members],
                    "finished": sorted(summaries), "stats": stats, "epsilon": eps, "timing": timing,
                    "runs": [{"seed": r.seed, "run_dir": str(r.run_dir), "done": r.done,
                              **({"error": errors[r.run_dir]} if r.run_dir in errors else {}),
                              **({f: _numbers(summaries[r.seed]).get(f) for f in spec.report["fields"]}
                                 if r.seed in summaries else {})} for r in members]})
    return out


def _fmt(stat: dict) -> str:
    if stat["n"] == 0:
        return "n/a"
    digits = 4 if abs(stat["mean"]) < 100 else 1
    if stat["n"] == 1:  # one run: no spread to show
        return f"{stat['mean']:.{digits}f} (n = 1)"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def markdown(spec: Spec, cells: list[dict], claim_results: list[dict] | None = None) -> str:
    eps_keys = sorted({k for c in cells for k in c["epsilon"]})
    timing = TIMING if any("timing" in c for c in cells) else {}  # a report from before timing was recorded: none
    head = (["cell"] + spec.varied_keys + ["runs"] + list(timing.values())
            + [f"{f} (mean ± std)" for f in spec.report["fields"]] + [epsilon_label(k) for k in eps_keys])
    lines = [f"# Sweep {spec.name}", "", f"Spec: `{_shown(spec.path)}`. Mean ± sample standard deviation over seeds "
             f"(n = finished runs). A run's whole time counts everything from its config check to its last process "
             f"exiting; `wall_seconds` counts its rounds only.", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for c in cells:
        row = ([c["cell"]] + [json.dumps(c["varied"][k]) if not isinstance(c["varied"][k], str) else c["varied"][k]
                              for k in spec.varied_keys]
               + [f"{len(c['finished'])}/{len(c['seeds'])}"]
               + [_fmt(c.get("timing", {}).get(k, {"n": 0})) for k in timing]
               + [_fmt(c["stats"][f]) for f in spec.report["fields"]]
               + [_fmt(c["epsilon"][k]) if k in c["epsilon"] else "-" for k in eps_keys])
        lines.append("| " + " | ".join(row) + " |")
    if spec.variants:
        lines += ["", "Variants:", ""]
        lines += [f"- `{name}`: " + ", ".join(f"`{k} = {json.dumps(v)}`" for k, v in table.items())
                  for name, table in spec.variants.items()]
    failed = [r for c in cells for r in c["runs"] if "error" in r]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- `{r['run_dir']}`: {r['error'].splitlines()[0]}" for r in failed]
    return "\n".join(lines) + "\n" + claims_mod.markdown(claim_results or [])


def _shown(path: pathlib.Path) -> str:
    """A path relative to the working directory where it lies below it (committed reports stay portable)."""
    try:
        return path.relative_to(pathlib.Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def curve_points(runs: list[Run], curve: str, x: str) -> list[tuple[float, float, float, int]]:
    """(mean x, mean y, std y, n) per round over the runs' metrics rows that hold both fields."""
    by_round: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for row in metrics.read_jsonl(run.run_dir / "metrics.jsonl") if run.done else []:
            xv = row.get(x)  # rounds from 0, as in metrics.jsonl
            yv = row.get(curve)
            if isinstance(xv, (int, float)) and isinstance(yv, (int, float)) and math.isfinite(yv):
                by_round.setdefault(row["round"], []).append((float(xv), float(yv)))
    points = []
    for _, pairs in sorted(by_round.items()):
        xs = mean_std([p[0] for p in pairs])
        ys = mean_std([p[1] for p in pairs])
        points.append((xs["mean"], ys["mean"], ys["std"], ys["n"]))
    return points


def plot(spec: Spec, runs: list[Run], out: pathlib.Path, verdicts: list[str] = ()) -> list[pathlib.Path]:
    """Mean over seeds with a +-1 std band, one line per cell; one PNG per (curve, x[, group value]); the claims'
    verdicts in a box below the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group_by = spec.report["group_by"]
    groups: dict[Any, dict[str, list[Run]]] = {}
    for run in runs:
        key = run.varied.get(group_by) if group_by else None
        groups.setdefault(json.dumps(key), {}).setdefault(run.cell, []).append(run)
    written = []
    for curve, x in itertools.product(spec.report["curves"], spec.report["x"]):
        for group, cells in groups.items():
            lines = {cell: curve_points(members, curve, x) for cell, members in cells.items()}
            if not any(lines.values()):
                continue  # e.g. no emulated_seconds in these metrics
            fig, ax = plt.subplots(figsize=(6.5, 4.2 + 0.14 * len(verdicts)), dpi=110)
            for cell, pts in lines.items():
                if not pts:
                    continue
                xs, ys, sd = [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]
                ax.plot(xs, ys, marker="o", ms=3, label=f"{cell} (n={max(p[3] for p in pts)})")
                ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], alpha=0.2)
            title = f"{spec.name}: {curve} vs {x}" + (f" ({group_by} = {json.loads(group)})" if group_by else "")
            ax.set(xlabel=x, ylabel=f"{curve} (mean ± std over seeds)", title=title)
            if x == "round":
                metrics.round_axis(ax)
            if curve.startswith("accuracy"):
                ax.set_ylim(0, 1)  # a fixed axis: chance-level accuracy must not look like learning
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            if verdicts:
                box = 0.034 * len(verdicts) / (1 + 0.034 * len(verdicts)) + 0.02
                fig.subplots_adjust(bottom=fig.subplotpars.bottom + box)
                fig.text(0.01, 0.01, "claims: " + "; ".join(verdicts) if len(verdicts) < 3 else
                         "claims:\n" + "\n".join(verdicts), fontsize=6, va="bottom",
                         bbox={"boxstyle": "round", "facecolor": "lightyellow", "alpha": 0.8})
            suffix = f"__{_slug(group_by)}-{_slug(json.loads(group))}" if group_by else ""
            path = out / f"{_slug(curve)}_vs_{_slug(x)}{suffix}.png"
            fig.savefig(path)
            plt.close(fig)
            written.append(path)
    return written


def provenance(spec: Spec, started: float, command: str) -> dict[str, Any]:
    """What a committed report needs to be re-made: the command, the code's commit (and whether the tree had
    uncommitted changes), the dates and wall time, the machine and every seed."""
    import datetime
    import os
    import platform
    import subprocess

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  cwd=pathlib.Path(__file__).resolve().parent)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    stamp = lambda t: datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    # the committed reports are not code: rewriting one (--report-only into reproductions/) leaves the tree clean
    status = git("status", "--porcelain", "--untracked-files=no", "--", ":/", ":(exclude,top)reproductions")
    return {"command": command,
            "commit": git("rev-parse", "HEAD"), "uncommitted_changes": None if status is None else bool(status),
            "started": stamp(started), "finished": stamp(time.time()), "wall_seconds": round(time.time() - started, 1),
            "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "seeds": spec.seeds}


def provenance_markdown(prov: dict[str, Any] | None) -> str:
    if not prov:
        return ""
    dirty = " (with uncommitted changes)" if prov.get("uncommitted_changes") else ""
    return "\n".join(["", "## Provenance", "", f"- Command: `{prov['command']}`", f"- Commit: `{prov['commit']}`{dirty}",
                      f"- Started {prov['started']}, finished {prov['finished']} ({prov['wall_seconds']} s this "
                      f"invocation; runs finished before a resume are not timed again)",
                      f"- Machine: {prov['machine']}"] + ([f"- Seeds: {prov['seeds']}"] if prov.get("seeds") else [])
                     + ([f"- Ray cluster {prov['cluster']['address']}: runs per node "
                         + ", ".join(f"{k} {v}" for k, v in prov["cluster"]["runs_per_node"].items())
                         + (f"; {len(prov['cluster']['retried'])} retried after a lost node" if prov["cluster"]["retried"]
                            else "") + " (each run's node: CELL/seed-S/node.json)"] if prov.get("cluster") else []) + [""])


def round_curves(runs: list[Run], out: pathlib.Path) -> dict[str, list[dict]]:
    """Each cell's per-round curves (accuracy, loss, emulated time: mean and std over its seeds), also written as
    OUT/curves.csv; what `hfl plot` draws."""
    from hfl import plot_cli

    dirs: dict[str, list[pathlib.Path]] = {}
    for run in runs:
        if (run.run_dir / "metrics.jsonl").is_file():
            dirs.setdefault(run.cell, []).append(run.run_dir)
    curves = {cell: plot_cli.curves(found) for cell, found in dirs.items()}
    if curves:
        plot_cli.write_csv(curves, out / "curves.csv")
    return curves


def write_results(spec: Spec, runs: list[Run], out: pathlib.Path, errors: dict[pathlib.Path, str],
                  prov: dict[str, Any] | None = None) -> dict:
    cells = aggregate(spec, runs, errors)
    claim_results = claims_mod.evaluate_all(spec.claims, cells)
    extra_plots, extra = spec.sweep_runner.report(spec, runs, out)
    (out / "results.md").write_text(markdown(spec, cells, claim_results) + extra + provenance_markdown(prov))
    plots = plot(spec, runs, out, claims_mod.verdict_lines(claim_results)) + extra_plots
    plots += claims_mod.plot(claim_results, cells, out)
    curves = round_curves(runs, out)
    result = {"name": spec.name, "spec": _shown(spec.path), "runner": spec.runner, "varied_keys": spec.varied_keys,
              "report": spec.report, "cells": cells, "claims": claim_results, "plots": [p.name for p in plots],
              **({"curves": curves} if curves else {}),
              **({"runner_markdown": extra} if extra else {}), **({"provenance": prov} if prov else {})}
    metrics.write_json(out / "results.json", result)
    return result


def report_only(spec: Spec, out: pathlib.Path, prov: dict[str, Any] | None = None) -> dict:
    """The claims of `spec` evaluated on a finished sweep's OUT/results.json (the per-seed values it holds), without
    the runs: results.md and results.json rewritten with the verdicts, the claim plots drawn; the curve plots, which
    need the runs' metrics, are kept as they are."""
    path = out / "results.json"
    if not path.is_file():
        raise SweepError(f"--report-only: {path} not found (run the sweep first)")
    stored = json.loads(path.read_text())
    cells = stored["cells"]
    missing = sorted(set(spec.cells) - {c["cell"] for c in cells})
    if missing:
        raise SweepError(f"--report-only: {path} has no cell {missing[0]!r}: the spec's cells changed since it ran")
    fields = stored["report"]["fields"]
    lacking = [c.metric for c in spec.claims if c.metric not in fields]
    if lacking:
        raise SweepError(f"--report-only: {path} did not tabulate {lacking[0]!r}: re-run the sweep")
    claim_results = claims_mod.evaluate_all(spec.claims, cells)
    shown = Spec(**{**spec.__dict__, "report": stored["report"]})
    runs_prov = stored.get("provenance")
    claims_prov = {**prov, "seeds": None} if prov else None
    (out / "results.md").write_text(markdown(shown, cells, claim_results) + stored.get("runner_markdown", "")
                                    + provenance_markdown(runs_prov)
                                    + provenance_markdown(claims_prov).replace("## Provenance", "## Provenance of the verdicts"))
    plots = [p for p in stored.get("plots", []) if not p.startswith("claim_")]
    plots += [p.name for p in claims_mod.plot(claim_results, cells, out)]
    result = {**stored, "spec": _shown(spec.path), "claims": claim_results, "plots": plots,
              **({"claims_provenance": claims_prov} if claims_prov else {})}
    metrics.write_json(out / "results.json", result)
    return result
