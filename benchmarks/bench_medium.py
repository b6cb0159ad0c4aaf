"""Benchmark (not a test). Run: python benchmarks/bench_medium.py [--repeats N] [--d D] [--testbed ROUNDS]

--testbed: a real run (multiairfed over the air, 6 edges x 10 devices, mnist-cnn: d = 28,938, the plane's
interferer clusters, one host process per core): the medium's compute time per slot and its share of the
round's wall time (the cloud's `medium_seconds` column against `round_seconds`), median over the rounds after
the first.

Without it: time per OTA slot of the medium's pure functions for 60 devices in 6 collaborating clusters (M = 10)
plus the non-collaborating interferer clusters of a 1 km plane at 20 edges per km^2 (M_n = 15), model
size d = 30,000: the uplink superposition (medium_slot) and the simultaneous downlink to the 60 devices
(medium_broadcast), for each interferer mode. Median over repeats, one slot index per repeat.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from hfl.common.channel import ota
from hfl.common.channel.geometry import matern_cluster
from hfl.common.channel.ota import OtaParams
from hfl.common.channel.power import normalise


def bench(d: int, repeats: int, mode: str, seed: int = 0) -> dict:
    top = matern_cluster(20e-6, 10, 4.0, 30.0, 1000.0, 6, np.random.default_rng(seed), interferer_devices=15)
    params = OtaParams(interferers=mode)
    rng = np.random.default_rng(1)
    payload_all = normalise(rng.normal(size=(top.collaborating_devices.size, d)).astype(np.float32))[0]
    rho = ota.rho_for(top, params)
    psi = ota.psi_corrected(20e-6, 10, 1.0, 4.0, 4.0)
    up, down, interferers = [], [], []
    for slot in range(repeats):
        active = ota.slot_activity(top, slot, seed, params)
        tx = np.flatnonzero(active & (top.device_edge < top.collaborating))
        t0 = time.perf_counter()
        rec = ota.medium_slot(payload_all[tx], tx, top, slot, seed, params, rng)
        t1 = time.perf_counter()
        signals = ota.edge_transmit(rec.received, params.P_d, ota.edge_power(rho, rec.n_active, psi))
        ota.medium_broadcast(signals, rec.receivers, top.collaborating_devices, top, slot, seed, params, rng)
        t2 = time.perf_counter()
        up.append(t1 - t0)
        down.append(t2 - t1)
        interferers.append(rec.interferers_active)
    return {"mode": mode, "d": d, "edges_in_plane": top.n_edges, "devices_in_plane": top.n_devices,
            "collaborating_devices": int(top.collaborating_devices.size),
            "active_interferers_median": statistics.median(interferers),
            "uplink_slot_s_median": statistics.median(up), "downlink_slot_s_median": statistics.median(down),
            "emulated_slot_s": d / 1e6}


def testbed(rounds: int) -> dict:
    import pathlib
    import tempfile

    from hfl.testbed import Testbed

    overrides = ["run.algorithm=multiairfed", "channel.model=ota", "topology.edges=6", "topology.devices_per_edge=10",
                 f"run.rounds={rounds}", "train.tau=2", "train.gamma=2", "model.name=mnist-cnn",
                 "data.max_test_samples=500", "net.phase_timeout_s=300"]
    with tempfile.TemporaryDirectory() as tmp, Testbed(None, overrides, run_dir=pathlib.Path(tmp) / "run",
                                                     start_timeout=900) as bed:
        bed.wait(timeout=3600)
        rows = bed.metrics()
    steady = rows[1:] if len(rows) > 1 else rows
    share = [r["medium_seconds"] / r["round_seconds"] for r in steady]
    return {"rounds": len(rows), "air_slots_per_round": rows[0]["air_slots"],
            "medium_s_per_slot_median": statistics.median(r["medium_seconds"] / r["air_slots"] for r in steady),
            "round_s_median": statistics.median(r["round_seconds"] for r in steady),
            "medium_share_of_round_median": statistics.median(share), "medium_share_max": max(share)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--d", type=int, default=30_000)
    ap.add_argument("--testbed", type=int, default=0, metavar="ROUNDS", help="measure a real run of ROUNDS rounds")
    args = ap.parse_args()
    if args.testbed:
        print(json.dumps(testbed(args.testbed)))
        return
    for mode in ("explicit", "aggregate", "independent"):
        print(json.dumps(bench(args.d, args.repeats, mode)))


if __name__ == "__main__":
    main()
