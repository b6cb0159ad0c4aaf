"""Benchmark (not a test): 10,000 emulated devices, each with its own gRPC connection to its edge, in one
testbed on this machine. Run: python benchmarks/bench_scale.py [--edges 20] [--devices-per-edge 500]
[--rounds 3] [--layout per_core] [--json FILE]

HierFAVG, 20 edges x 500 devices, synthetic 1x8x8 images (about 5 training samples per device), the
784-200-10 perceptron's shape on 64 inputs (15,010 parameters, 60 KB per message), one local epoch per
round. Reports start-up (launch to the start of round 0), the median round time, and the peak summed
PSS (and RSS) of every process / devices. Target: the rounds complete, < 2 MB per device.

Limits met on the way and what this script does about them: each device holds one TCP connection (one
descriptor in its host and one in its edge): the Testbed lifts every child's soft RLIMIT_NOFILE to the
hard limit (20,000 here; a per-core host of 5,000 devices needs about 5,100); the cloud waits
`net.join_timeout_s` for all 10,000 registrations, raised here, as is `net.phase_timeout_s`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import resource
import statistics
import sys

import psutil

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("bench_round", HERE / "bench_round.py")
bench_round = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_round)


def overrides(edges: int, per_edge: int, rounds: int, layout: str) -> list[str]:
    return [
        "run.name=bench-scale", "run.algorithm=hierfavg", f"run.rounds={rounds}",
        f"topology.edges={edges}", f"topology.devices_per_edge={per_edge}", f"topology.host_layout={layout}",
        "data.dataset=synthetic", f"data.synthetic_samples={6 * edges * per_edge}", "data.synthetic_shape=[1,8,8]",
        "data.max_test_samples=1000", "model.name=mlp",
        "train.tau=1", "train.gamma=1", "train.local_unit=epochs", "train.batch_size=32",
        "net.join_timeout_s=1800", "net.phase_timeout_s=1800",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, default=20)
    ap.add_argument("--devices-per-edge", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layout", default="per_core", choices=("per_core", "per_edge"))
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    devices = args.edges * args.devices_per_edge
    need = args.devices_per_edge + 200  # per edge process; a per-core host needs devices / cores + ~100
    if hard != resource.RLIM_INFINITY and hard < need:
        print(f"the hard descriptor limit ({hard}) is below what an edge of {args.devices_per_edge} devices needs "
              f"({need}): raise it (ulimit -Hn, or limits.conf) first", file=sys.stderr)
        return 2
    out = bench_round.emulated(overrides(args.edges, args.devices_per_edge, args.rounds, args.layout), sample_memory=True)
    out.update(devices=devices, layout=args.layout, descriptor_limit=[soft, hard],
               pss_mb_per_device=out["peak_pss_bytes"] / devices / 2 ** 20,
               rss_mb_per_device=out["peak_rss_bytes"] / devices / 2 ** 20,
               machine={"cpus": psutil.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2 ** 30, 1)})
    print(json.dumps(out, indent=2))
    print(f"{devices:,} devices ({args.edges} edges x {args.devices_per_edge}, {out['device_hosts']} device hosts, "
          f"{out['processes']} processes): {args.rounds} rounds done, median round {out['round_seconds']:.1f}s, start-up "
          f"{out.get('startup_seconds', float('nan')):.0f}s, peak PSS {out['pss_mb_per_device']:.2f} MB per device "
          f"(RSS {out['rss_mb_per_device']:.2f}); target < 2 MB")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
