"""`hfl run`: a Testbed on 127.0.0.1 with a live progress display; non-zero exit if any process fails."""
from __future__ import annotations

import json
import signal
import sys
import time

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from hfl.common import metrics
from hfl.testbed import RunFinished, Testbed, TestbedError, error_line


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def run_info(cfg) -> dict:
    """What the progress table's title needs (the live page's /api/state gives the same under "run")."""
    return {"algorithm": cfg.run.algorithm, "edges": cfg.topology.edges, "devices_per_edge": cfg.topology.devices_per_edge,
            "dataset": cfg.data.dataset, "model": cfg.model.name, "rounds": cfg.run.rounds}


def _table(bed: Testbed, rows: list[dict], started: float, phase: str) -> Table:
    return progress_table(run_info(bed.cfg), rows, time.monotonic() - started, phase, live_url(bed.run_dir))


def live_url(run_dir) -> str | None:
    from hfl.common.observe.live import URL_FILE

    try:
        return (run_dir / URL_FILE).read_text().strip() or None
    except OSError:
        return None


def live_snapshot(run_dir) -> str | None:
    """RUN_DIR/live.html, the live page's final state, once the cloud has written it."""
    from hfl.common.observe.live import SNAPSHOT_FILE

    path = run_dir / SNAPSHOT_FILE
    return str(path) if path.is_file() else None


def round_line(row: dict, rounds: int) -> str:
    acc = "-" if row["accuracy"] is None else f"{100 * row['accuracy']:.2f}%"
    eps = f"  epsilon {row['epsilon_max']:.3g}" if row.get("epsilon_max") is not None else ""
    return (f"round {metrics.round_cell(row['round'], rounds)}  accuracy {acc}  up {_fmt_bytes(row['bytes_up'])}  "
            f"down {_fmt_bytes(row['bytes_down'])}  {row['wall_seconds']:.1f}s{eps}")


def progress_table(info: dict, rows: list[dict], elapsed: float, phase: str, url: str | None = None,
                   prefix: str = "hfl run") -> Table | Group:
    """The live table of `hfl run` and `hfl watch`: the last rounds, and the live page's URL."""
    rounds = info["rounds"]
    table = Table(title=f"{prefix}: {info['algorithm']}, {info['edges']} edges x {info['devices_per_edge']} devices, "
                        f"{info['dataset']} / {info['model']}", caption=phase, title_justify="left",
                  caption_justify="left", box=box.SIMPLE_HEAD)
    private = any(r.get("epsilon_max") is not None for r in rows)
    # fits 80 columns (a pipe's width) with the privacy column: progress goes in the caption, the training loss
    # stays in metrics.jsonl and on the live page
    columns = ("round", "accuracy", "loss", "up", "down", "refused", "time")
    for col in columns + (("eps max",) if private else ()):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows[-12:]:
        acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f}%"
        loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
        eps = (("-" if r.get("epsilon_max") is None else f"{r['epsilon_max']:.3g}"),) if private else ()
        table.add_row(str(r["round"]), acc, loss, _fmt_bytes(r["bytes_up"]),
                      _fmt_bytes(r["bytes_down"]), str(r["refused"]), f"{r['round_seconds']:.1f}s", *eps)
    if len(rows) < rounds and not phase.startswith("done"):
        table.add_row(str(rows[-1]["round"] + 1 if rows else 0), "...", *[""] * (len(columns) - 2 + private))
    table.caption = f"{len(rows)}/{rounds} rounds done, {phase}, {elapsed:.1f}s since launch"
    if not url:
        return table
    # below the table, not in its caption: a caption wraps at the table's width, and a URL or path cut across lines
    # can be neither clicked nor copied
    label = "live page snapshot" if url.endswith(".html") else "live page"
    return Group(table, Text(f"{label} {url}", no_wrap=True, overflow="ignore"))


def _interrupt(*_) -> None:
    # Ctrl-C and SIGTERM stop the whole testbed; the handler swaps itself out before raising, so a second signal,
    # however soon, finds _still_stopping (handlers run between bytecodes in the main thread: no gap to race)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _still_stopping)
    raise KeyboardInterrupt


def _still_stopping(*_) -> None:
    print("still stopping the processes ...", file=sys.stderr, flush=True)


def resume_command(run_dir) -> str:
    import shlex

    return f"hfl run --resume {shlex.quote(str(run_dir))}"


class _DeathNotices:
    """One line per node death, printed as soon as the launcher sees it (the run goes on without the node)."""

    def __init__(self, bed: Testbed, console: Console):
        self.bed, self.console, self.seen = bed, console, set()

    def __call__(self) -> None:
        for node in self.bed.failures():
            key = (node.name, node.started_at)
            if key not in self.seen:
                self.seen.add(key)
                self.console.print(f"[yellow]{node.name} died (exit {node.returncode()})[/yellow]: "
                                   + escape(f"{error_line(node.log_path)}; the run goes on without it "
                                            f"(log {node.log_path})"), highlight=False)


def run_with_progress(config, overrides, out=None, quiet: bool = False, certs: str | None = None, resume: bool = False,
                      force: bool = False, allow_deaths: bool = False, t0: float | None = None) -> int:
    """Run a whole testbed. A dead edge or device host (after start-up) is a fault the run goes on without: every
    death is recorded in summary.json, and the exit status is 1 at the end unless `allow_deaths`. A node that dies
    during start-up stops the run at once, naming the node, its exit code and its error line."""
    console = Console(stderr=True)
    launched = t0 if t0 is not None else time.monotonic()
    bed = Testbed(config, overrides, run_dir=out, certs=certs, resume=resume, force=force, tolerate_failures=True)
    started = launched
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    rows: list[dict] = []
    notices = _DeathNotices(bed, console)
    try:
        console.print(f"run directory: {bed.run_dir}")
        from hfl.explain import explain

        for line in explain(bed.cfg):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        bed.start()
        if bed.rounds_extended:
            console.print(f"resume: run.rounds {bed.rounds_extended[0]} -> {bed.rounds_extended[1]} (config.toml "
                          f"updated; nothing else of the run changes)", highlight=False)
        noise_said = []

        def say_noise() -> None:  # a private run's noise, as the cloud set it (privacy.json), once
            path = bed.run_dir / "privacy.json"
            if noise_said or not path.is_file():
                return
            noise_said.append(True)
            from hfl.explain import noise_lines

            try:
                for line in noise_lines(json.loads(path.read_text())):
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
            except (OSError, ValueError):
                pass

        if quiet or not console.is_terminal:
            url = None
            for row in bed.iter_metrics(timeout=24 * 3600, on_poll=notices):
                if url is None and (url := live_url(bed.run_dir)):
                    console.print(f"live page: {url}")
                say_noise()
                rows.append(row)
                console.print(round_line(row, bed.cfg.run.rounds))
        else:
            with Live(_table(bed, rows, started, "starting"), console=console, refresh_per_second=4) as live:
                while not bed.finished():
                    bed.check()
                    notices()
                    say_noise()
                    rows = bed.metrics()
                    dead = len(bed.deaths())
                    phase = (f"{len(bed.running())} processes running" + (f", {dead} died" if dead else "")
                             if rows else "starting processes")
                    live.update(_table(bed, rows, started, phase))
                    time.sleep(0.25)
                rows = bed.metrics()
                live.update(_table(bed, rows, started, "done"))
        summary = bed.wait(timeout=120)
        deaths = bed.deaths()
        if deaths:
            summary["node_deaths"] = deaths
        if bed.rounds_extended:
            summary["rounds_extended"] = {"from": bed.rounds_extended[0], "to": bed.rounds_extended[1]}
        summary["total_seconds"] = round(time.monotonic() - launched, 2)  # from the command's start
        # the command's start to the nodes' launch (imports, config, preflight, the forkserver's preload); the
        # cloud's startup_seconds runs from there to round 0
        summary["prelaunch_seconds"] = round(bed.launched - launched, 2)
        metrics.write_json(bed.run_dir / "summary.json", summary)
    except RunFinished as exc:
        console.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        return 0
    except KeyboardInterrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C while the processes stop: a line, not a traceback
            signal.signal(sig, _still_stopping)
        bed.close()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stopped: a late one has nothing left to stop (and Python's
            signal.signal(sig, signal.SIG_IGN)       # shutdown would otherwise die of it, exit -2)
        if (bed.run_dir / "checkpoint.npz").exists():
            console.print(f"[yellow]interrupted: stopping every process[/yellow]; continue this run with:\n  "
                          f"{resume_command(bed.run_dir)}", highlight=False, soft_wrap=True)
        else:
            console.print("[yellow]interrupted: stopping every process[/yellow] (no round finished, nothing to "
                          "resume: run the same command again)", highlight=False)
        return 130
    except TestbedError as exc:
        head, _, detail = str(exc).partition("\n")
        console.print("[red]run failed[/red]: " + escape(head), highlight=False)
        if detail:
            console.print(detail, markup=False, highlight=False)
        console.print(f"logs: {bed.logs}")
        if (bed.run_dir / "checkpoint.npz").exists() and not (bed.run_dir / "summary.json").exists():
            console.print(f"continue this run with:\n  {resume_command(bed.run_dir)}", highlight=False, soft_wrap=True)
        return 1
    finally:
        bed.close()
    final = "-" if summary["final_accuracy"] is None else f"{100 * summary['final_accuracy']:.2f}%"
    total = summary["total_seconds"]
    startup = summary.get("startup_seconds")
    console.print(f"final accuracy {final} after {summary['rounds']} rounds in {total:.1f}s "
                  + (f"(start-up {startup:.1f}s, rounds {summary['wall_seconds']:.1f}s) " if startup is not None else "")
                  + f"({summary['algorithm']}, seed {summary['seed']})")
    if summary.get("not_learning"):
        console.print(f"[yellow]not learning[/yellow]: {summary['not_learning']}", highlight=False)
    if summary.get("privacy"):
        claimed = f", paper's claim {summary['epsilon_claimed']:.3g} (not measured)" if "epsilon_claimed" in summary else ""
        console.print(f"privacy: epsilon {summary['epsilon']:.3g} by the accountant (budget "
                      f"{summary['privacy']['epsilon_budget']:g}, delta {summary['privacy']['delta']:g}){claimed}"
                      + (f"; stopped: {summary['stop_reason']}" if summary.get("stop_reason") else ""))
    console.print(f"results: {bed.run_dir}/metrics.jsonl, summary.json, accuracy.png; logs in {bed.logs}")
    snapshot = live_snapshot(bed.run_dir)
    if snapshot:
        console.print(f"live page snapshot: {snapshot} (the page's final state; opens in a browser without a server)",
                      highlight=False, soft_wrap=True)
    if quiet:
        print(metrics.dumps(summary))
    if deaths:
        console.print(f"[yellow]{len(deaths)} node death(s) during the run[/yellow]: "
                      + ", ".join(f"{d['node']} (exit {d['exit_status']} at {d['seconds_after_launch']}s)" for d in deaths))
        return 0 if allow_deaths else 1
    return 0
