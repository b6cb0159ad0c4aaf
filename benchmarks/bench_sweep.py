"""Benchmark (not a test). Run: python benchmarks/bench_sweep.py [--repeats 3] [--runs 20] [--jobs 2]

A run's fixed cost in a sweep: `hfl sweep` of RUNS runs of the built-in default config (2 edges x 5 devices,
mnist-embedded) at one round each (seeds 0..RUNS-1), locally with `--jobs JOBS`, each repeat into a fresh --out.
Per repeat: the sweep's wall time, the runs' own round time (the sum over runs of metrics.jsonl's `round_seconds`)
and the fixed cost per run = (JOBS x wall - round time) / RUNS: the seconds of a job slot each run spends outside
its rounds (launch, start-up, evaluation of round 0 aside, teardown, the sweep's own bookkeeping). Medians over the
repeats; target <= 2 s. The sweep's first interpreter start and imports are inside the wall time (a user pays them).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

SPEC = """\
name = "bench-sweep"
seeds = {seeds}
[base]
"run.rounds" = 1
[report]
fields = ["final_accuracy", "startup_seconds", "total_seconds"]
curves = ["accuracy"]
x = ["round"]
"""


def one(spec: pathlib.Path, out: pathlib.Path, jobs: int) -> dict:
    argv = [sys.executable, "-m", "hfl.cli", "sweep", str(spec), "--out", str(out), "--quiet", "--jobs", str(jobs)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"sweep failed:\n{done.stderr[-3000:]}")
    rounds, totals, starts = 0.0, [], []
    for run in sorted(out.glob("*/seed-*")):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rounds += sum(r["round_seconds"] for r in rows)
        summary = json.loads((run / "summary.json").read_text())
        totals.append(summary["total_seconds"])
        starts.append(summary["startup_seconds"])
    n = len(totals)
    return {"wall_seconds": wall, "round_seconds": rounds, "runs": n, "fixed_per_run": (jobs * wall - rounds) / n,
            "median_total_seconds": statistics.median(totals), "median_startup_seconds": statistics.median(starts),
            "load_1min": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        spec = pathlib.Path(tmp) / "spec.toml"
        spec.write_text(SPEC.format(seeds=list(range(args.runs))))
        repeats = []
        for r in range(args.repeats):
            repeats.append(one(spec, pathlib.Path(tmp) / f"out-{r}", args.jobs))
            print(f"repeat {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in repeats[-1].items()), flush=True)
    report = {"runs": args.runs, "jobs": args.jobs, "repeats": repeats,
              "median": {k: statistics.median(rep[k] for rep in repeats) for k in repeats[0]}}
    print(json.dumps(report["median"], indent=1))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
