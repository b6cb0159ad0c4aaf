"""`hfl run`: a Testbed on 127.0.0.1 with a live progress display; non-zero exit if any process fails."""
from __future__ import annotations

import signal
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from hfl.common import metrics
from hfl.testbed import Testbed, TestbedError


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _table(bed: Testbed, rows: list[dict], started: float, phase: str) -> Table:
    cfg = bed.cfg
    table = Table(title=f"hfl run: {cfg.run.algorithm}, {cfg.topology.edges} edges x {cfg.topology.devices_per_edge} devices, "
                        f"{cfg.data.dataset} / {cfg.model.name}", caption=phase, title_justify="left",
                  caption_justify="left")
    private = any("epsilon_max" in r for r in rows)
    columns = ("round", "accuracy", "loss", "train loss", "bytes up", "bytes down", "refused", "round time")
    for col in columns + (("epsilon (max)",) if private else ()):
        table.add_column(col, justify="right")
    for r in rows[-12:]:
        acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f}%"
        loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
        train = "-" if r.get("train_loss") is None else f"{r['train_loss']:.4f}"
        eps = (f"{r['epsilon_max']:.3g}",) if private else ()
        table.add_row(f"{r['round'] + 1}/{cfg.run.rounds}", acc, loss, train, _fmt_bytes(r["bytes_up"]),
                      _fmt_bytes(r["bytes_down"]), str(r["refused"]), f"{r['round_seconds']:.1f}s", *eps)
    if len(rows) < cfg.run.rounds and phase != "done":
        table.add_row(f"{len(rows) + 1}/{cfg.run.rounds}", "...", *[""] * (len(columns) - 2 + private))
    table.caption = f"{phase}, {time.monotonic() - started:.1f}s since launch"
    return table


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the whole testbed like Ctrl-C


def run_with_progress(config, overrides, out=None, quiet: bool = False, certs: str | None = None, resume: bool = False,
                      force: bool = False, allow_deaths: bool = False) -> int:
    """Run a whole testbed. A dead edge or device host is a fault the run goes on without: every death is
    recorded in summary.json, and the exit status is 1 at the end unless `allow_deaths`."""
    console = Console(stderr=True)
    bed = Testbed(config, overrides, run_dir=out, certs=certs, resume=resume, force=force, tolerate_failures=True)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    rows: list[dict] = []
    try:
        console.print(f"run directory: {bed.run_dir}")
        bed.start()
        if quiet or not console.is_terminal:
            for row in bed.iter_metrics(timeout=24 * 3600):
                rows.append(row)
                acc = "-" if row["accuracy"] is None else f"{100 * row['accuracy']:.2f}%"
                eps = f"  epsilon {row['epsilon_max']:.3g}" if "epsilon_max" in row else ""
                console.print(f"round {row['round'] + 1}/{bed.cfg.run.rounds}  accuracy {acc}  "
                              f"up {_fmt_bytes(row['bytes_up'])}  down {_fmt_bytes(row['bytes_down'])}  "
                              f"{row['wall_seconds']:.1f}s{eps}")
        else:
            with Live(_table(bed, rows, started, "starting"), console=console, refresh_per_second=4) as live:
                while not bed.finished():
                    bed.check()
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
            metrics.write_json(bed.run_dir / "summary.json", summary)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process[/yellow]")
        bed.close()
        return 130
    except TestbedError as exc:
        console.print(f"[red]run failed[/red]: {exc}")
        console.print(f"logs: {bed.logs}")
        return 1
    finally:
        bed.close()
    final = "-" if summary["final_accuracy"] is None else f"{100 * summary['final_accuracy']:.2f}%"
    console.print(f"final accuracy {final} after {summary['rounds']} rounds "
                  f"in {summary['wall_seconds']:.1f}s ({summary['algorithm']}, seed {summary['seed']})")
    if summary.get("privacy"):
        claimed = f", paper's claim {summary['epsilon_claimed']:.3g} (not measured)" if "epsilon_claimed" in summary else ""
        console.print(f"privacy: epsilon {summary['epsilon']:.3g} by the accountant (budget "
                      f"{summary['privacy']['epsilon_budget']:g}, delta {summary['privacy']['delta']:g}){claimed}"
                      + (f"; stopped: {summary['stop_reason']}" if summary.get("stop_reason") else ""))
    console.print(f"results: {bed.run_dir}/metrics.jsonl, summary.json, accuracy.png; logs in {bed.logs}")
    if quiet:
        print(metrics.dumps(summary))
    if deaths:
        console.print(f"[yellow]{len(deaths)} node death(s) during the run[/yellow]: "
                      + ", ".join(f"{d['node']} (exit {d['exit_status']} at {d['seconds_after_launch']}s)" for d in deaths))
        return 0 if allow_deaths else 1
    return 0
