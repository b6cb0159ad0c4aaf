"""Benchmark (not a test): the same run with and without mutual TLS, in turn. Run:
python benchmarks/bench_tls.py [--edges 20] [--devices-per-edge 50] [--rounds 3] [--repeats 1] [--certs DIR]
[--layout per_core] [--edge-processes N]

The README's 1,000-device mutual-TLS load run (HierFAVG, 20 edges x 50 devices, mnist-cnn on 75,000 synthetic
images, tau 2, gamma 1, one local epoch) once over plaintext and once with `--certs DIR` (every device of a
per-core host presents its own certificate on its own channel; the certificates are issued into DIR once, before
the timed runs, and kept). Reports for each: start-up (summary.json `startup_seconds`, launch to round 0), the
median round, the peak summed PSS of every process per device, refusals, and the TLS/plaintext start-up ratio.
Targets (issue 25): <= 1.5 MB PSS per device under TLS, start-up within 2x of plaintext, 0 refused.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("bench_round", HERE / "bench_round.py")
bench_round = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_round)


def overrides(edges: int, per_edge: int, rounds: int, layout: str, edge_processes: int = 0) -> list[str]:
    return [f"topology.edge_processes={edge_processes}",
        "run.name=bench-tls", "run.algorithm=hierfavg", f"run.rounds={rounds}", f"topology.edges={edges}",
        f"topology.devices_per_edge={per_edge}", f"topology.host_layout={layout}", "data.dataset=synthetic",
        f"data.synthetic_samples={75 * edges * per_edge}", "model.name=mnist-cnn", "train.tau=2", "train.gamma=1",
        "train.local_unit=epochs", "net.join_timeout_s=900",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, default=20)
    ap.add_argument("--devices-per-edge", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1, help="pairs of runs (plaintext, then TLS)")
    ap.add_argument("--layout", default="per_core", choices=("per_core", "per_edge"))
    ap.add_argument("--edge-processes", type=int, default=0,
                    help="topology.edge_processes: 0 = one process per edge; N = the edges in N processes")
    ap.add_argument("--certs", default="/tmp/hfl-bench-certs", help="CA directory (created if missing)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    from hfl.common import config as config_mod
    from hfl.testbed_certs import testbed_tls_args

    sets = overrides(args.edges, args.devices_per_edge, args.rounds, args.layout, args.edge_processes)
    devices = args.edges * args.devices_per_edge
    started = time.monotonic()
    testbed_tls_args(args.certs, config_mod.load(None, sets))  # issue (or find) every certificate once, untimed
    issue_seconds = time.monotonic() - started
    runs = []
    for i in range(args.repeats):
        for transport, certs in (("plaintext", None), ("mutual TLS", args.certs)):
            out = bench_round.emulated(sets, sample_memory=True, certs=certs)
            out.update(transport=transport, pss_mb_per_device=out["peak_pss_bytes"] / devices / 2 ** 20,
                       load_average=os.getloadavg())
            runs.append(out)
            print(f"[{i + 1}/{args.repeats}] {transport}: start-up {out['summary_startup_seconds']:.1f}s, median round "
                  f"{out['round_seconds']:.1f}s, peak PSS {out['pss_mb_per_device']:.2f} MB per device "
                  f"({out['processes']} processes), refused {out['refused']}, load {os.getloadavg()[0]:.1f}; at the peak, MiB: "
                  + ", ".join(f"{role} {v['pss_mib']:.0f} ({v['processes']} x <= {v['largest_mib']:.0f})"
                              for role, v in out["pss_at_peak_by_role"].items()), flush=True)
    pairs = [(runs[k]["summary_startup_seconds"], runs[k + 1]["summary_startup_seconds"]) for k in range(0, len(runs), 2)]
    result = {"devices": devices, "layout": args.layout, "edge_processes": args.edge_processes, "certificates_seconds": round(issue_seconds, 2), "runs": runs,
              "startup_ratio_median": statistics.median(tls / plain for plain, tls in pairs)}
    print(json.dumps(result, indent=2, default=str))
    print(f"{devices:,} devices, {args.layout}, edge processes {args.edge_processes or args.edges}: TLS start-up {result['startup_ratio_median']:.2f}x plaintext (target <= 2x); "
          f"PSS per device under TLS {statistics.median(r['pss_mb_per_device'] for r in runs[1::2]):.2f} MB "
          f"(target <= 1.5); plaintext {statistics.median(r['pss_mb_per_device'] for r in runs[0::2]):.2f} MB")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
