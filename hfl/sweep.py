"""`hfl sweep SPEC.toml`: run a grid of whole testbeds (variants x grid x seeds) and tabulate them.

A spec (paths relative to the spec file):

    name = "smoke"                      # default: the spec's file name
    runner = "testbed"                  # what one run executes (hfl/runners.py): testbed (default) | dlg
    config = "../configs/default.toml"  # base config file (optional)
    seeds = [0, 1, 2]                   # run.seed of each repetition (default: the base config's)
    [base]                              # overrides of the base config: dotted keys or nested tables
    "run.rounds" = 2
    [grid]                              # every combination of these values is a cell
    "train.lr" = [0.05, 0.1]
    [variants.qhetfed]                  # named override sets (optional), crossed with the grid
    "run.algorithm" = "qhetfed"
    [report]
    fields = ["final_accuracy"]         # summary.json fields: mean +- std over seeds
    curves = ["accuracy"]               # metrics.jsonl fields plotted against each of `x`
    x = ["round", "emulated_seconds"]   # an x absent from the metrics is skipped
    group_by = "run.algorithm"          # one plot per value of this varied key (optional)
    target = { accuracy = 0.75 }        # optional: per run, the first round whose metric reaches the value, and
                                        # the cumulative virtual (paper 001's T_di) and emulated seconds and
                                        # the energy then (target.* columns)
    audit = { trials = 2000 }           # optional: `hfl audit privacy` once per private cell (its first seed's
                                        # config), columns audit.epsilon_lower_bound and audit.epsilon_one_release
    [[claim]]                           # optional, repeated: a paper's claim tested over the seeds (hfl/claims.py)
    id = "000/9.2"
    statement = "no DP >= p = 1 > p = 0.5 > HFL-DP"
    kind = "order"
    metric = "final_accuracy"
    cells = ["nodp", "p1", "p05", "hfldp"]

    [cluster]                           # optional, `hfl sweep --cluster` only (hfl/cluster.py): what one run
    cpus = 4                            # reserves on a Ray node (default: one CPU and 0.5 GiB per role process);
    memory_gb = 2                       # a variant or the grid overrides it per run with "cluster.cpus" = 8

A runner other than testbed takes its own sections out of the cell's keys (runner dlg: `attack.*`, the settings of
`hfl attack dlg`) and has its own default [report] and extra report sections.

Each run goes to OUT/CELL/seed-S; a run whose summary.json exists is not run again. At the end:
OUT/results.md, OUT/results.json and OUT/CURVE_vs_X[__KEY-VALUE].png, with each claim's verdict (and
OUT/claim_ID.png per claim). `--report-only` re-evaluates the claims of a finished sweep from its results.json.
"""
from __future__ import annotations

import itertools
import json
import math
import pathlib
import re
import signal
import statistics
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hfl import claims as claims_mod
from hfl import cluster as cluster_mod  # imports Ray only when a sweep runs on a cluster
from hfl import runners as runners_mod
from hfl import families  # noqa: F401  (a spec's configs name their sections and algorithms)
from hfl.common import config as config_mod
from hfl.common import metrics
from hfl.preflight import devices_elsewhere

SPEC_KEYS = ("name", "description", "config", "runner", "seeds", "base", "grid", "variants", "report", "claim",
             "cluster")
REPORT_KEYS = ("fields", "curves", "x", "group_by", "target", "audit", "volatility")
DEFAULT_REPORT = {"fields": ["final_accuracy"], "curves": ["accuracy"], "x": ["round", "emulated_seconds"], "group_by": None,
                  "target": None, "audit": None, "volatility": None}
TARGET_COLUMNS = ("round", "virtual_seconds", "emulated_seconds", "energy_joules_total", "wall_seconds")
TARGET_BOUNDS = ("round", "emulated_seconds", "energy_joules_total")  # target.at_least.*: lower bounds, censored runs too
VARIANT = "variant"  # the varied key that names a [variants.NAME] table
TIMING = {"total_seconds": "whole run s (start-up incl.)", "startup_seconds": "start-up s"}  # always tabulated


class SweepError(ValueError):
    pass


@dataclass(frozen=True)
class Run:
    cell: str                 # the cell's directory name: the varied values
    varied: dict[str, Any]    # varied key -> value ("variant" -> NAME for variants)
    seed: int
    config: config_mod.Config
    run_dir: pathlib.Path
    settings: Any = None      # the runner's own settings (runner dlg: AttackSettings)
    resources: dict | None = None  # its cluster.* keys: what it reserves on a Ray node (hfl/cluster.py)

    @property
    def done(self) -> bool:
        return (self.run_dir / "summary.json").is_file()


@dataclass
class Spec:
    name: str
    path: pathlib.Path
    base: dict[str, Any]
    grid: dict[str, list]
    variants: dict[str, dict[str, Any]]
    seeds: list[int] | None
    report: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_REPORT))
    claims: list[claims_mod.Claim] = field(default_factory=list)
    runner: str = "testbed"
    cluster: dict[str, float] = field(default_factory=dict)  # [cluster]: what a run reserves (hfl/cluster.py)

    @property
    def sweep_runner(self) -> runners_mod.SweepRunner:
        return runners_mod.RUNNERS.get(self.runner)

    @property
    def varied_keys(self) -> list[str]:
        return ([VARIANT] if self.variants else []) + list(self.grid)

    @property
    def cells(self) -> dict[str, dict[str, Any]]:
        """Cell name -> its varied values, in the order the sweep runs them."""
        out = {}
        for variant in list(self.variants) or [None]:
            for values in itertools.product(*self.grid.values()):
                varied = ({VARIANT: variant} if variant is not None else {}) | dict(zip(self.grid, values))
                out[cell_name(varied)] = varied
        return out


# ---- spec ----------------------------------------------------------------------------------------
def flatten(table: dict[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """{"run": {"rounds": 2}, "train.lr": 0.1} -> {"run.rounds": 2, "train.lr": 0.1}."""
    if not isinstance(table, dict):
        raise SweepError(f"[{where}] must be a table of config keys, got {table!r}")
    flat: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, where, path + "."))
        else:
            if path.count(".") < 1:
                raise SweepError(f"[{where}] key {path!r} must name a config key as section.key (e.g. run.rounds)")
            flat[path] = value
    return flat


ABSENT = object()


def _default_flat() -> dict[str, Any]:
    return flatten(tomllib.loads(config_mod.to_toml(config_mod.Config())), "config")


def changed_keys(stored: str, now: str) -> list[str] | None:
    """The keys whose values differ between a finished run's config.toml and the one the spec gives now (None: one
    does not parse). A key the stored file lacks whose value now is its default is not a change: the field was added
    after the run, and its default is what the run did (a new field defaults to the old behaviour)."""
    try:
        old, new = (flatten(tomllib.loads(t), "config") for t in (stored, now))
    except (tomllib.TOMLDecodeError, SweepError):
        return None
    defaults = _default_flat()
    return [k for k in sorted(old.keys() | new.keys()) if old.get(k, ABSENT) != new.get(k, ABSENT)
            and not (k not in old and k in defaults and new[k] == defaults[k])]


def config_changes(stored: str, now: str, most: int = 3) -> str:
    """What differs between a finished run's config.toml and the one the spec gives now, key by key
    ("data.class_draw: absent -> 'deck'"), for the message that refuses to resume it."""
    keys = changed_keys(stored, now)
    if keys is None:
        return "its config.toml differs"
    old, new = (flatten(tomllib.loads(t), "config") for t in (stored, now))
    shown = [f"{k}: {'absent' if k not in old else repr(old[k])} -> "
             f"{'absent' if k not in new else repr(new[k])}" for k in keys[:most]]
    more = f"; {len(keys) - most} more" if len(keys) > most else ""
    return "; ".join(shown) + more if shown else "its config.toml differs in form only"


def _check_keys(table: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise SweepError(f"unknown key {unknown[0]!r} in {where}; allowed keys: {', '.join(allowed)}")


def parse_spec(text: str, path: pathlib.Path) -> Spec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{path}: {exc}") from None
    _check_keys(raw, SPEC_KEYS, "the sweep spec")
    runner_name = raw.get("runner", "testbed")
    if runner_name not in runners_mod.RUNNERS:
        raise SweepError(f"runner = {runner_name!r}: unknown; runners: {', '.join(runners_mod.RUNNERS.names())}")
    runner = runners_mod.RUNNERS.get(runner_name)
    base: dict[str, Any] = {}
    if "config" in raw:
        config_path = (path.parent / str(raw["config"])).resolve()
        if not config_path.is_file():
            raise SweepError(f"config: file not found: {config_path} (relative to the spec)")
        base = flatten(tomllib.loads(config_path.read_text()), f"config {config_path.name}")
    base.update(flatten(raw.get("base", {}), "base"))
    grid = flatten(raw.get("grid", {}), "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"[grid] {key} must be a non-empty list of values, got {values!r}")
        if key == "run.seed":
            raise SweepError("[grid] run.seed: list the seeds in the top-level `seeds` instead")
    variants_raw = raw.get("variants", {})
    if not isinstance(variants_raw, dict) or not all(isinstance(v, dict) for v in variants_raw.values()):
        raise SweepError("variants must be tables: [variants.NAME] with config keys")
    variants = {name: flatten(table, f"variants.{name}") for name, table in variants_raw.items()}
    for name, table in variants.items():
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
            raise SweepError(f"[variants.{name}]: a variant name may hold letters, digits and _ . + - only")
        clash = sorted(set(table) & set(grid))
        if clash:
            raise SweepError(f"[variants.{name}] sets {clash[0]!r}, which [grid] varies too: vary it in one place")
    seeds = raw.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not seeds
                              or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise SweepError(f"seeds must be a non-empty list of non-negative integers, got {seeds!r}")
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise SweepError(f"seeds: {seeds!r} repeats a seed")
    report_raw = raw.get("report", {})
    if not isinstance(report_raw, dict):
        raise SweepError("[report] must be a table")
    _check_keys(report_raw, REPORT_KEYS, "[report]")
    report = {**DEFAULT_REPORT, **runner.default_report, **report_raw}
    for key in ("fields", "curves", "x"):
        if isinstance(report[key], str):
            report[key] = [report[key]]
        if not isinstance(report[key], list) or not all(isinstance(v, str) for v in report[key]):
            raise SweepError(f"report.{key} must be a list of names, got {report[key]!r}")
    target = report["target"]
    if target is not None:
        if not isinstance(target, dict) or len(target) != 1 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in target.values()):
            raise SweepError(f"report.target must be one metric and its value, e.g. {{ accuracy = 0.75 }}, got {target!r}")
        report["fields"] = list(report["fields"]) + [f"target.{c}" for c in ("reached",) + TARGET_COLUMNS] + [
            f"target.at_least.{c}" for c in TARGET_BOUNDS]
    vol = report["volatility"]
    if vol is not None:
        if not (isinstance(vol, dict) and set(vol) == {"metric", "from_round"} and isinstance(vol["metric"], str)
                and isinstance(vol["from_round"], int) and not isinstance(vol["from_round"], bool)
                and vol["from_round"] >= 0):
            raise SweepError("report.volatility must be a table like { metric = \"accuracy\", from_round = 25 }, "
                             f"got {vol!r}")
        report["fields"] = list(report["fields"]) + [f"volatility.{vol['metric']}"]
    audit = report["audit"]
    if audit is not None and not (isinstance(audit, dict) and set(audit) <= {"trials"} and isinstance(
            audit.get("trials", 2000), int) and audit.get("trials", 2000) >= 4):
        raise SweepError(f"report.audit must be a table like {{ trials = 2000 }} (trials >= 4), got {audit!r}")
    if audit is not None and not runner.audits:
        raise SweepError(f"report.audit: runner {runner_name!r} has no privacy audit (runner testbed has)")
    try:
        cluster = cluster_mod.check_table(raw.get("cluster", {}), "[cluster]")
    except cluster_mod.ClusterError as exc:
        raise SweepError(str(exc)) from None
    spec = Spec(str(raw.get("name", path.stem)), path, base, grid, variants, seeds, report, runner=runner_name,
                cluster=cluster)
    group_by = report["group_by"]
    if group_by is not None and group_by not in spec.varied_keys:
        raise SweepError(f"report.group_by = {group_by!r} is not varied by the sweep; varied keys: "
                         f"{', '.join(spec.varied_keys) or '(none)'}")
    try:
        spec.claims = claims_mod.parse_claims(raw.get("claim"), spec.cells, report["fields"])
    except claims_mod.ClaimError as exc:
        raise SweepError(str(exc)) from None
    return spec


def load_spec(path: str | pathlib.Path) -> Spec:
    p = pathlib.Path(path)
    if not p.is_file():
        raise SweepError(f"sweep spec not found: {p}")
    return parse_spec(p.read_text(), p.resolve())


def _slug(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_") or "_"


def cell_name(varied: dict[str, Any]) -> str:
    if not varied:
        return "base"
    return ",".join(_slug(v) if k == VARIANT else f"{k}={_slug(v)}" for k, v in varied.items())


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in flat.items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SweepError(f"{key}: {part!r} is a value, not a section")
        node[parts[-1]] = value
    return data


def expand(spec: Spec, out: pathlib.Path) -> list[Run]:
    """Every run of the sweep, each config built and validated (ConfigError names the bad key)."""
    variant_items = list(spec.variants.items()) or [(None, {})]
    runner = spec.sweep_runner
    runs = []
    for (variant, overrides), values in itertools.product(variant_items, itertools.product(*spec.grid.values())):
        varied = ({VARIANT: variant} if variant is not None else {}) | dict(zip(spec.grid, values))
        flat = {**spec.base, **overrides, **dict(zip(spec.grid, values))}
        cell = cell_name(varied)
        where = f"cell {cell}" + (f" (variants.{variant})" if variant else "")
        flat, own = runners_mod.split(runner, flat)
        reserve = {k.split(".", 1)[1]: flat.pop(k) for k in [k for k in flat if k.startswith("cluster.")]}
        try:
            reserve = cluster_mod.check_table(reserve, f"{where}: cluster.*") if reserve else None
        except cluster_mod.ClusterError as exc:
            raise SweepError(str(exc)) from None
        try:
            first = config_mod.from_dict(_nest(flat))
            settings = runner.settings(own)
        except (config_mod.ConfigError, ValueError) as exc:
            hint = (" (a variant name with a dot needs quotes: [variants.\"a.b\"])"
                    if variant is not None and "the top level" in str(exc) else "")
            raise SweepError(f"{where}: {exc}{hint}") from None
        for seed in spec.seeds if spec.seeds is not None else [first.run.seed]:
            cfg = config_mod.from_dict(_nest({**flat, "run.seed": seed, "run.name": f"{spec.name}-{cell}"}))
            runs.append(Run(cell, varied, seed, cfg, out / cell / f"seed-{seed}", settings, reserve))
    cells: dict[str, dict] = {}
    for run in runs:
        if cells.setdefault(run.cell, run.varied) != run.varied:
            raise SweepError(f"two cells share the directory name {run.cell!r}: make the varied values distinct")
    for run in runs:
        stored = run.run_dir / "config.toml"
        if not (run.done and stored.is_file()):
            continue
        before, text = stored.read_text(), runner.config_text(run)
        if before != text and changed_keys(before, text) != []:
            raise SweepError(f"{run.run_dir} finished with another config than the spec now gives "
                             f"({config_changes(before, text)}): delete it or use another --out")
    return runs


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


# ---- running -------------------------------------------------------------------------------------
def run_one(run: Run, on_round=None, timeout: float = 24 * 3600, active: dict | None = None,
            runner: str = "testbed") -> dict:
    """One run into run.run_dir by the named runner (hfl/runners.py); a testbed sits in `active` while it runs,
    so that an interrupt can stop it from another thread."""
    return runners_mod.RUNNERS.get(runner).run(run, on_round=on_round, timeout=timeout, active=active)


def audit_cells(spec: Spec, runs: list[Run], console) -> None:
    """`hfl audit privacy` on the first run's config of every cell whose algorithm it covers (kept; not redone)."""
    from hfl import audit_cli
    from hfl.common import plans

    trials = int(spec.report["audit"].get("trials", 2000))
    firsts: dict[str, Run] = {}
    for run in runs:
        firsts.setdefault(run.cell, run)
    for cell, run in firsts.items():
        target = out_dir_of(run) / AUDIT_FILE
        if target.is_file() or plans.ALGORITHMS.get(run.config.run.algorithm).privacy not in audit_cli.LEVELS:
            continue
        try:
            report = audit_cli.run_audit(run.config, target.parent, trials, 0, log=lambda *_: None)
        except Exception as exc:  # one failed audit must not cost the sweep's table
            console.print(f"audit {cell} FAILED: {exc.__class__.__name__}: {exc}", markup=False)
            continue
        console.print(f"audit {cell}: epsilon lower bound {report['epsilon_lower_bound']:.3g} vs "
                      f"{report['epsilon_claimed']:.3g} stated for one release", markup=False)


def command(spec_path, out, jobs: int, only_report: bool, cluster: str | None = None,
            max_seeds: int | None = None) -> str:
    """The command line that re-makes this sweep's results (paths relative to the working directory)."""
    parts = ["hfl sweep", _shown(pathlib.Path(spec_path).resolve())]
    parts += ["--out", _shown(pathlib.Path(out).resolve())] if out else []
    parts += ["--jobs", str(jobs)] if jobs != 1 else []
    parts += ["--cluster", cluster] if cluster else []
    parts += ["--max-seeds", str(max_seeds)] if max_seeds else []
    return " ".join(parts + (["--report-only"] if only_report else []))


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the sweep like Ctrl-C


def first_seeds(runs: list[Run], most: int | None) -> list[Run]:
    """The runs seed by seed (every cell at a seed before the next seed, so that a stopped sweep leaves its cells
    at equal numbers of seeds), cut to the first `most` seeds of the spec's list."""
    order = list(dict.fromkeys(r.seed for r in runs))
    kept = set(order[:most] if most is not None else order)
    return sorted((r for r in runs if r.seed in kept), key=lambda r: order.index(r.seed))


def run_sweep(spec_path: str | pathlib.Path, out: str | pathlib.Path | None = None, jobs: int = 1,
              dry_run: bool = False, quiet: bool = False, only_report: bool = False, cluster: str | None = None,
              max_seeds: int | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    try:
        if jobs < 1:
            raise SweepError(f"--jobs must be at least 1, got {jobs}")
        if max_seeds is not None and max_seeds < 1:
            raise SweepError(f"--max-seeds must be at least 1, got {max_seeds}")
        spec = load_spec(spec_path)
        out_dir = pathlib.Path(out or pathlib.Path("runs") / f"sweep-{spec.name}").resolve()
        if only_report:
            result = report_only(spec, out_dir, provenance(spec, time.time(), command(spec_path, out, jobs, True)))
            for line in claims_mod.verdict_lines(result["claims"]):
                console.print(line, markup=False)
            console.print(f"results: {out_dir / 'results.md'}, results.json and claim plots", markup=False)
            return 0
        runs = first_seeds(expand(spec, out_dir), max_seeds)
        if cluster is not None and not dry_run:  # the nodes' workers start while the runs are checked here
            cluster_mod.warm_up(cluster, [r for r in runs if not r.done], spec.cluster, spec.runner)
        for run in runs:  # data present, devices against samples, model against data: before any run starts
            try:
                with devices_elsewhere(cluster is not None):  # train.device = "cuda": the cluster's GPUs, not ours
                    spec.sweep_runner.preflight(run)
            except config_mod.ConfigError as exc:
                raise SweepError(f"cell {run.cell}: {exc}") from None
    except SweepError as exc:
        console.print(f"sweep spec error: {exc}", markup=False, soft_wrap=True)
        return 2
    todo = [r for r in runs if not r.done]
    ray = None
    if cluster is not None:  # Ray present, the head reachable, every run fitting a node: before anything starts
        try:
            ray = cluster_mod.connect(cluster)
            cluster_mod.check_fits(todo, spec.cluster, cluster_mod.alive_nodes(ray))
        except cluster_mod.ClusterError as exc:
            console.print(f"cluster error: {exc}", markup=False, soft_wrap=True)
            return 2
    started = time.time()
    console.print(f"sweep {spec.name}: {len(runs)} runs in {len({r.cell for r in runs})} cells, {len(todo)} to run, "
                  f"{len(runs) - len(todo)} already finished; output {out_dir}", markup=False)
    if dry_run and ray is not None:
        nodes = cluster_mod.alive_nodes(ray)
        console.print(f"cluster {cluster}: {len(nodes)} nodes, " + ", ".join(
            f"{n['name']} ({n['cpus']:g} CPU)" for n in nodes.values()), markup=False)
        for line in cluster_mod.estimate_lines(spec, runs, todo, spec.cluster, out_dir):
            console.print(line, markup=False)
        return 0
    if dry_run:
        for r in runs:
            console.print(f"  {'done' if r.done else 'todo'}  {r.run_dir.relative_to(out_dir)}", markup=False)
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    errors: dict[pathlib.Path, str] = {}
    lock = threading.Lock()
    active: dict = {}
    stopping = threading.Event()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console, disable=quiet or not console.is_terminal) as progress:
        overall = progress.add_task("runs", total=len(runs), completed=len(runs) - len(todo))

        def execute(run: Run) -> None:
            if stopping.is_set():
                return
            label = f"{run.cell} seed {run.seed}"
            task = progress.add_task(label, total=spec.sweep_runner.steps(run))
            t0 = time.monotonic()
            try:
                summary = run_one(run, on_round=lambda row: progress.update(task, completed=row["round"] + 1),
                                  active=active, runner=spec.runner)
                line = f"done {label}: {spec.sweep_runner.headline(summary)}"
            except Exception as exc:  # one failed run must not cost the others
                if stopping.is_set():
                    return
                with lock:
                    errors[run.run_dir] = f"{exc.__class__.__name__}: {exc}"
                line = f"FAILED {label}: {str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__}"
            progress.remove_task(task)
            progress.update(overall, advance=1)
            progress.console.print(f"{line} ({time.monotonic() - t0:.1f}s)", markup=False)

        pool = ThreadPoolExecutor(max_workers=jobs)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            if ray is not None:  # every run a Ray task on some node (hfl/cluster.py); the directories come back here
                placement = cluster_mod.execute(spec, todo, out_dir, spec.cluster, cluster, ray, console, progress,
                                                overall, errors)
            for future in [pool.submit(execute, run) for run in todo if ray is None]:
                while not future.done():
                    time.sleep(0.2)  # a timed wait: Ctrl-C reaches the main thread between waits
        except KeyboardInterrupt:
            stopping.set()
            for bed in list(active.values()):
                bed.close()
            pool.shutdown(wait=True, cancel_futures=True)
            console.print("interrupted: finished runs are kept; run the same command again to resume", markup=False)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
            pool.shutdown(wait=True)
    if spec.report.get("audit") is not None:  # runner testbed only (parse_spec)
        audit_cells(spec, runs, console)
    prov = provenance(spec, started, command(spec_path, out, jobs, False, cluster, max_seeds))
    write_results(spec, runs, out_dir, errors, {**prov, "cluster": placement} if ray is not None else prov)
    console.print(f"results: {out_dir / 'results.md'}, results.json and plots", markup=False)
    if not quiet:
        print((out_dir / "results.md").read_text())
    return 1 if errors else 0
