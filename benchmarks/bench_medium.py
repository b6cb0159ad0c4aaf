"""Benchmark (not a test). Run: python benchmarks/bench_medium.py [--repeats N] [--d D] [--testbed ROUNDS] [--paper003]
[--wire]

--paper003: the medium at paper 003's scale (deploy/configs/scale-ota-fmnist.toml: 3 collaborating clusters x
M = 15 devices, the plane's interferer clusters, ota-cnn, d = 225,034, tau 6, gamma 2, batch 60), in one process:
one round of the medium's pure computation (channel.medium.air_slot for the round's tau + 1 air slots, every
device listening), the devices' own over-the-air work (normalise before sending, device_estimates on what they
receive) and one round of the devices' local training (45 devices x (tau + gamma) SGD steps of batch 60), taking
turns in every repeat; CPU time of this process (torch and BLAS on one thread), medians over the repeats. The
share of a round is medium / (medium + training / 2): the training splits over the 2 cores (per-core hosts) while
every device waits on the medium's slot barrier. To time the code of another commit, point PYTHONPATH at it.

Measured 2026-11-25 (2 shared cores, load average 4-10), before (6f793b5) and after issue 25's second medium pass
(branch i25med), four runs each in turn, `PYTHONPATH=<tree> python benchmarks/bench_medium.py --paper003 --repeats 3`:
    medium a round   2.45 s -> 1.83 s (0.35 -> 0.26 s a slot; medians)    share of a round 27.0% -> 21.7%
(benchmarks/reports/medium-paper003.md: the profile, every run, what is left). Target < 10%: not met.

Since 2026-11-28 (in-phase downlink rows, column blocks on `channel.medium_threads` threads) the medium's figure is
its wall time with --medium-threads (default 2) threads, since every device waits at the slot's barrier while it
runs; `medium_1_thread_*` is the same code on one thread. `PYTHONPATH=. python benchmarks/bench_medium.py --paper003
--repeats 5`, three runs against fd79423 in turn, load 1-5: share of a round 29.1% -> 9.7% (medium 1.80 s CPU ->
0.50 s wall a round); --downlink complex 17.1% (benchmarks/reports/medium-inphase.md).
Since the CNNs' channels-last max-pooling (benchmarks/reports/pooling.md) the round's training is ~1.5x faster, so
the same medium is a larger share: three runs on 86d4e49, 2026-11-28 14:53-14:56 UTC, 11.6%, 11.0%, 11.3% (medium
0.37-0.40 s wall a round, training 6.0 s CPU): over the target again (benchmarks/reports/issue25-status-2026-11-28.md
says where a slot's 51 ms go and what would close it).
The lanes' normals from numpy's SFC64 through Box-Muller (lanes._LaneNormals) and the exact mean on the medium's threads:
in turn with the commit before, three runs each, 11.2, 10.5, 12.0% -> 10.1, 10.2, 9.9% (medium 0.37-0.42 -> 0.33-0.35 s
wall a round).

--testbed: a real run (multiairfed over the air, 6 edges x 10 devices, mnist-cnn: d = 28,938, the plane's
interferer clusters, one host process per core): the medium's compute time per slot and its share of the
round's wall time (the cloud's `medium_seconds` column against `round_seconds`), median over the rounds after
the first.

--wire: one air slot's messages at paper 003's scale (3 edges x 15 devices, d = 225,034, 29 transmitters): each
device's AirRow upload as its edge receives it, the edge's checks and its emission (the rows forwarded as received,
common/batches.py), the medium's parse of the 3 emissions and the slot's payload matrix; CPU time, medians. Typed
rows against the scalar keys before them (6982bd4; the same path timed by a script for each tree, three runs of 7
repeats in turn, 2026-11-29 06:32 UTC, load 9-10): the edge 13.2 / 13.8 / 13.6 ms -> 7.3 / 7.2 / 7.5 ms an emission;
the medium 37.3 / 38.4 / 38.4 ms -> 36.3 / 37.7 / 45.4 ms a slot (the copies saved, ~3.5 ms, are within the noise:
the protobuf parse and the float64 normalisation check dominate). `--wire --repeats 7` itself, three runs after,
load 9-13: edge 9.5-10.2 ms, medium 46-49 ms.

Without it: time per OTA slot of the medium's pure functions for 60 devices in 6 collaborating clusters (M = 10)
plus the non-collaborating interferer clusters of a 1 km plane at 20 edges per km^2 (M_n = 15), model
size d = 30,000: the uplink superposition (medium_slot) and the simultaneous downlink to the 60 devices
(medium_broadcast), for each interferer mode. Median over repeats, one slot index per repeat.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # BLAS on one thread, as measured (before numpy loads it)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from hfl.common.channel import lanes, ota  # noqa: E402
from hfl.common.channel.geometry import matern_cluster  # noqa: E402
from hfl.common.channel.ota import OtaParams  # noqa: E402
from hfl.common.channel.power import normalise  # noqa: E402


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


def paper003(repeats: int, medium_threads: int, downlink: str) -> dict:
    import torch

    from hfl import families
    from hfl.common import config, plans
    from hfl.common.channel import medium
    from hfl.common.channel import plane as air
    from hfl.common.models import build, get_flat, init_parameters
    from hfl.common.seeding import numpy_rng
    from hfl.device_client.training import local_sgd, make_shard

    torch.set_num_threads(1)
    assert families  # [channel] and the air algorithms register on its import
    cfg = config.load("deploy/configs/scale-ota-fmnist.toml", [f"channel.downlink={downlink}"])
    pl = air.plane_for(cfg)
    phases = plans.build_plan(cfg)
    steps = air.air_steps(phases)
    collab = pl.collaborating()
    model = build(cfg.model.name, (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    w = get_flat(model)
    d = w.size
    rng = np.random.default_rng(0)
    payload = (w[None, :] + 0.01 * rng.standard_normal((collab.size, d), dtype=np.float32)).astype(np.float32)
    x = rng.integers(0, 256, size=(cfg.train.batch_size * 10, 1, 28, 28), dtype=np.uint8)
    shard = make_shard(x, rng.integers(0, 10, size=x.shape[0]), [0.5], [0.25])
    gen = torch.Generator().manual_seed(1)
    prepared = {}

    def devices_send(step):
        active = air.activity(pl, phases, 0, step)
        tx = np.flatnonzero(active[collab])
        bar, mu, sigma = air.normalise(payload[tx])
        return collab[tx], bar.astype(np.float32), mu, sigma

    for step in steps:
        prepared[step] = devices_send(step)

    def medium_round():
        for step in steps:
            tx, bar, mu, sigma = prepared[step]
            group = phases[step].params.get("group", 0.0) == 1.0
            prepared[step, "out"] = medium.air_slot(pl, 0, step, group, bar, tx, mu, sigma, collab,
                                                    air.alive(pl, phases, 0, step),
                                                    numpy_rng(cfg.run.seed, "cloud", 0, 0, step, "medium"))

    def devices_air():
        for step in steps:
            devices_send(step)
            res = prepared[step, "out"]
            group = phases[step].params.get("group", 0.0) == 1.0
            for i, dev in enumerate(res.listeners):  # each device estimates from its own row (device_client/modes.py)
                air.device_estimates(pl, res.rows[i:i + 1], [dev], 0, step, res.n_active[i], res.E[i],
                                     res.sigma_sum[i], res.mu_mean[i], pl.C if group else 1, pl.psi,
                                     phases[step].kind == plans.AIR_GRADIENT_STEP)

    def training():
        for _ in collab:
            local_sgd(model, w, shard, cfg.train.lr, cfg.train.batch_size, gen, steps=cfg.train.tau + cfg.train.gamma)

    def medium_one_thread():
        lanes.medium_threads(1)
        try:
            medium_round()
        finally:
            lanes.medium_threads(threads)

    threads = lanes.medium_threads(medium_threads)
    fns = {"medium": medium_round, "medium_1_thread": medium_one_thread, "devices_air": devices_air,
           "training": training}
    medium_round()  # warm-up (and the rows devices_air reads)
    times = {k: [] for k in fns}
    walls = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t, t_wall = time.process_time(), time.perf_counter()
            fn()
            times[k].append(time.process_time() - t)
            walls[k].append(time.perf_counter() - t_wall)
    med = {k: statistics.median(v) for k, v in times.items()}
    wall = {k: statistics.median(v) for k, v in walls.items()}
    share = [m / (m + t / 2) for m, t in zip(walls["medium"], times["training"])]
    share_cpu = [m / (m + t / 2) for m, t in zip(times["medium_1_thread"], times["training"])]
    return {"d": d, "devices": int(collab.size), "plane_devices": pl.topology.n_devices,
            "plane_edges": pl.topology.n_edges, "air_slots_per_round": len(steps), "downlink": pl.downlink,
            "medium_threads": threads,
            "medium_wall_s_per_round": wall["medium"], "medium_cpu_s_per_round": med["medium"],
            "medium_1_thread_cpu_s_per_round": med["medium_1_thread"],
            "medium_wall_s_per_slot": wall["medium"] / len(steps),
            "devices_air_cpu_s_per_round": med["devices_air"], "training_cpu_s_per_round": med["training"],
            "medium_share_of_round": statistics.median(share),
            "medium_share_of_round_1_thread": statistics.median(share_cpu), "repeats": repeats}


def wire_path(repeats: int) -> dict:
    """One air slot's messages at paper 003's scale (3 edges x M = 15, d = 225,034): each device's upload as its
    edge receives it (the ExchangeOne bytes) -> the edge's checks and its emission's bytes (the rows forwarded as
    received) -> the medium's parse of the 3 emissions and the slot's payload matrix. CPU time of this process (one thread), medians."""
    import pathlib
    import tempfile

    from hfl import families
    from hfl.cloud_server.medium import Medium
    from hfl.common import batches, config, plans, topology, wire
    from hfl.common.channel import plane as air
    from hfl.proto import hfl_v1_pb2 as pb

    assert families  # [channel] and the air algorithms register on its import
    d, m, edges = 225_034, 15, 3
    cfg = config.load(None, [f"topology.edges={edges}", f"topology.devices_per_edge={m}", "channel.model=ota",
                             "run.algorithm=multiairfed", "train.tau=6", "train.gamma=2"])
    phases = plans.build_plan(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        medium = Medium(cfg, pathlib.Path(tmp), d)
    active = air.activity(medium.plane, phases, 0, 0)
    rng = np.random.default_rng(0)
    received = {}
    for i in range(edges * m):
        node = topology.device_id(i)
        env = pb.Envelope(meta=pb.Meta(run_id="r", phase=phases[0].kind, sender_id=node, num_devices=1))
        row = env.air.rows.add(node=node, model_sum=1.0)
        if active[i]:
            bar, mu, sigma = air.normalise(rng.standard_normal((1, d)))
            row.mu, row.sigma = float(mu[0]), float(sigma[0])
            wire.CODECS.get("float32").fill(row.tensor, bar[0].astype(np.float32), "air")
        received[node] = pb.Chunk(data=env.SerializeToString()).SerializeToString()

    def edge(e: int) -> bytes:
        held = []
        for node in topology.edge_members(cfg, e):
            upload, _ = wire.read_raw_chunk(received[node], 1 << 30)
            row = batches.air_rows(upload, {node}, node, bounded=True)[0]
            vec = wire.decode_array(row.tensor, [d]) if row.HasField("tensor") else None
            held.append(batches.received_row(received[node], vec)[0])
        meta = pb.Meta(run_id="r", phase=phases[0].kind, sender_id=topology.edge_id(e), num_devices=m)
        return batches.with_batch(pb.Envelope(meta=meta), batches.AIR, held)

    t_edge, t_medium = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        emissions = [edge(e) for e in range(edges)]
        t1 = time.process_time()
        np.stack([v for b in emissions for v in medium.parse(wire.parse_envelope(b), 0, phases).payloads])
        t_edge.append((t1 - t0) / edges)
        t_medium.append(time.process_time() - t1)
    return {"d": d, "transmitters": int(active[:edges * m].sum()), "devices": edges * m,
            "emission_mib": len(emissions[0]) / 2 ** 20, "edge_cpu_s_per_emission": statistics.median(t_edge),
            "medium_in_cpu_s_per_slot": statistics.median(t_medium), "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--d", type=int, default=30_000)
    ap.add_argument("--testbed", type=int, default=0, metavar="ROUNDS", help="measure a real run of ROUNDS rounds")
    ap.add_argument("--paper003", action="store_true", help="the medium at paper 003's scale against a round's training")
    ap.add_argument("--medium-threads", type=int, default=2, help="--paper003: threads of the medium's column blocks")
    ap.add_argument("--downlink", default="in-phase", choices=("in-phase", "complex"), help="--paper003: the rows")
    ap.add_argument("--wire", action="store_true", help="one air slot's messages at paper 003's scale, edge and medium")
    args = ap.parse_args()
    if args.wire:
        print(json.dumps(wire_path(args.repeats)))
        return
    if args.paper003:
        print(json.dumps(paper003(args.repeats, args.medium_threads, args.downlink)))
        return
    if args.testbed:
        print(json.dumps(testbed(args.testbed)))
        return
    for mode in ("explicit", "aggregate", "independent"):
        print(json.dumps(bench(args.d, args.repeats, mode)))


if __name__ == "__main__":
    main()
