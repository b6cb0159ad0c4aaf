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
import pathlib
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from hfl import claims as claims_mod
from hfl import cluster as cluster_mod  # imports Ray only when a sweep runs on a cluster
from hfl import runners as runners_mod
from hfl import families  # noqa: F401  (a spec's configs name their sections and algorithms)
from hfl.common import config as config_mod


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
