"""Benchmark (not a test). Run: python benchmarks/bench_cluster_ab.py BEFORE_TREE [--repeats 6] [--report FILE.md]

bench_cluster.py's 8-run sweep three ways in turn, in each repeat (the order rotated): locally with `--jobs 2` (this
tree), on a two-node loopback Ray cluster running this tree, and on a second such cluster running BEFORE_TREE (a
checkout of an earlier commit, e.g. `git archive COMMIT | tar -x -C DIR`; its Ray nodes and its sweep driver import
the project from there through PYTHONPATH). Both clusters stay up for the whole benchmark, so the two trees'
cluster sweeps share the machine's load in each repeat: on a loaded machine an A/B in turn, not two benchmarks at
different times. Medians over the repeats; needs the cluster extra and `unshare -n` (root).
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
sys.path.insert(0, str(ROOT))

from benchmarks.bench_cluster import SPEC  # noqa: E402
from hfl import cluster_loopback as cluster  # noqa: E402

KINDS = ("local", "cluster", "cluster-before")


def sweep(tree: pathlib.Path, spec: pathlib.Path, out: pathlib.Path, *args: str, ns: int | None = None) -> float:
    env = dict(os.environ, **({"PYTHONPATH": str(tree)} if tree != ROOT else {}))
    argv = [sys.executable, "-m", "hfl.cli", "sweep", str(spec), "--out", str(out), "--quiet", *args]
    t0 = time.perf_counter()
    done = subprocess.run((["nsenter", "-t", str(ns), "-n"] if ns else []) + argv, cwd=tree, capture_output=True,
                          text=True, timeout=1800, stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0:
        raise SystemExit(f"sweep {' '.join(args)} ({tree}) failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="a checkout of the tree to compare with")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--report", help="also write the figures as markdown here")
    args = parser.parse_args()
    before = pathlib.Path(args.before).resolve()
    reason = cluster.loopback_unavailable()
    if reason:
        raise SystemExit(reason)
    wall: dict[str, list[float]] = {k: [] for k in KINDS}
    load = []
    with tempfile.TemporaryDirectory(prefix="bench-cluster-ab-") as tmp, cluster.two_node_cluster(cpus=1) as here:
        spec = pathlib.Path(tmp) / "spec.toml"
        spec.write_text(SPEC.format(root=ROOT, seeds=list(range(4))))
        os.environ["PYTHONPATH"] = str(before)  # the second cluster's Ray processes import the earlier tree
        try:
            other = cluster.two_node_cluster(cpus=1)
            there = other.__enter__()
        finally:
            os.environ.pop("PYTHONPATH")
        try:
            for r in range(args.repeats):
                for kind in KINDS[r % 3:] + KINDS[:r % 3]:
                    out = pathlib.Path(tmp) / f"{kind}-{r}"
                    if kind == "local":
                        wall[kind].append(sweep(ROOT, spec, out, "--jobs", "2"))
                    else:
                        tree, ns = (ROOT, here["ns"]) if kind == "cluster" else (before, there["ns"])
                        wall[kind].append(sweep(tree, spec, out, "--cluster", cluster.LOOPBACK_HEAD, ns=ns))
                    load.append(os.getloadavg()[0])
                    print(f"repeat {r} {kind}: {wall[kind][-1]:.1f} s (load {load[-1]:.1f})", flush=True)
        finally:
            other.__exit__(None, None, None)
    med = {k: statistics.median(v) for k, v in wall.items()}
    report = {"wall_seconds": wall, "median_wall_seconds": med, "ratio_cluster_to_local": med["cluster"] / med["local"],
              "ratio_before_to_local": med["cluster-before"] / med["local"], "load_average_1min": load}
    print(json.dumps(report, indent=1))
    if args.report:
        rows = [f"| {k} | " + ", ".join(f"{x:.1f}" for x in wall[k]) + f" | {med[k]:.2f} |" for k in KINDS]
        pathlib.Path(args.report).write_text("\n".join([
            f"# Cluster sweep A/B in turn ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
            f"`python benchmarks/bench_cluster_ab.py {args.before} --repeats {args.repeats}`; {os.cpu_count()} cores "
            f"shared with other work, 1-minute load average {min(load):.1f}-{max(load):.1f}.", "",
            "| sweep | wall, s (each repeat) | median |", "|---|---|---|", *rows, "",
            f"cluster / local **{report['ratio_cluster_to_local']:.2f}x**, before / local "
            f"**{report['ratio_before_to_local']:.2f}x**.", ""]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
