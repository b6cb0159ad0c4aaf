"""`hfl sweep SPEC.toml`: run a grid of whole testbeds (variants x grid x seeds) and tabulate them. The spec's format
is in hfl/sweep_spec.py, the tables, plots and verdicts in hfl/sweep_results.py; this module runs the runs (locally on
threads, or on a Ray cluster through hfl/cluster.py) and keeps the names of both for its callers."""
from __future__ import annotations

import pathlib
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hfl import claims as claims_mod
from hfl import cluster as cluster_mod  # imports Ray only when a sweep runs on a cluster
from hfl import node_spawn
from hfl import runners as runners_mod
from hfl.common import config as config_mod
from hfl.preflight import devices_elsewhere
from hfl.sweep_spec import (  # noqa: F401  (the spec's names, for the sweep's callers)
    SPEC_KEYS, REPORT_KEYS, DEFAULT_REPORT, TARGET_COLUMNS, TARGET_BOUNDS, VARIANT, TIMING, SweepError, Run, Spec,
    flatten, ABSENT, _default_flat, changed_keys, config_changes, _check_keys, parse_spec, load_spec, _slug,
    cell_name, _nest, expand)
from hfl.sweep_results import (  # noqa: F401  (the results' names, for the sweep's callers)
    _numbers, to_target, volatility, epsilon_fields, AUDIT_FILE, out_dir_of, epsilon_label, mean_std, aggregate,
    _fmt, markdown, _shown, curve_points, plot, provenance, provenance_markdown, round_curves, write_results,
    report_only)


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
        call = node_spawn.caller()  # the model check in a fork of the nodes' forkserver: this process imports no torch
        if cluster is not None and not dry_run:  # the nodes' workers start while the runs are checked here
            todo = [r for r in runs if not r.done]
            if cluster_mod.warm_up(cluster, todo, spec.cluster, spec.runner):
                call = cluster_mod.node_call(cluster, todo, spec.cluster)  # ... on a node, in a warmed forkserver
        for run in runs:  # data present, devices against samples, model against data: before any run starts
            try:
                with devices_elsewhere(cluster is not None):  # train.device = "cuda": the cluster's GPUs, not ours
                    spec.sweep_runner.preflight(run, call)
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
