"""Where a run's CPU goes, per process and per thread name, between two rounds. Run:

    python benchmarks/cpu_by_thread.py [--from-row 3] [--to-row 9] [--dir DIR] -- hfl run CONFIG --set ...

Launches the command in DIR (a temporary directory by default), waits until its runs/*/metrics.jsonl has
--from-row rows, reads every thread's CPU time (user + system, psutil) of every process whose command line names
hfl, waits for --to-row rows, reads them again, and prints the CPU per round of each process and thread name (threads
of one name summed: gRPC's event_engine threads, the node's own) and the wall time per round. Give the run enough
rounds (and run.eval_every = its rounds, as bench_workloads.py times no evaluation) that it is still going at
--to-row. benchmarks/reports/issue25-status-2026-11-28.md quotes its figures.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

import psutil


def _comm(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _snapshot(me: int) -> dict:
    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] == me or "hfl" not in cmdline:
            continue
        try:
            for t in p.threads():
                out[(p.pid, t.id)] = (cmdline, _comm(p.pid, t.id), t.user_time + t.system_time)
        except psutil.Error:
            pass
    return out


def _rows(run_dir: str) -> int:
    files = glob.glob(os.path.join(run_dir, "runs", "*", "metrics.jsonl"))
    if not files:
        return 0
    with open(files[0]) as f:
        return sum(1 for _ in f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-row", type=int, default=3)
    parser.add_argument("--to-row", type=int, default=9)
    parser.add_argument("--dir", help="where the command runs (default: a temporary directory)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.to_row <= args.from_row:
        parser.error("give a command after --, and --to-row > --from-row")
    run_dir = args.dir or tempfile.mkdtemp(prefix="cpu-by-thread-")
    with open(os.path.join(run_dir, "run.log"), "w") as log:
        proc = subprocess.Popen(command, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT)
    snaps = []
    for row in (args.from_row, args.to_row):
        while _rows(run_dir) < row:
            if proc.poll() is not None:
                print(f"the run ended before row {row} (its log: {run_dir}/run.log)", file=sys.stderr)
                return 1
            time.sleep(0.01)
        snaps.append((time.perf_counter(), _snapshot(os.getpid())))
    proc.wait()
    (t0, before), (t1, after) = snaps
    rounds = args.to_row - args.from_row
    per: dict = {}
    for key, (cmdline, name, cpu) in after.items():
        group = (key[0], cmdline[:100], name.split("-")[0][:16])
        per[group] = per.get(group, 0.0) + cpu - before.get(key, (cmdline, name, 0.0))[2]
    print(f"wall a round: {(t1 - t0) / rounds:.3f} s over rows {args.from_row}-{args.to_row}")
    for (pid, cmdline, name), cpu in sorted(per.items()):
        if cpu / rounds >= 0.002:
            print(f"{pid:>8} {cpu / rounds:7.3f} s a round  {name:16s} {cmdline}")
    print(f"all: {sum(per.values()) / rounds:.3f} s of CPU a round")
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
