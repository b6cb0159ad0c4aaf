"""A round of each paper's own workload against the 2-core limit. Run:

    python benchmarks/bench_workloads.py [000 001 002 003 004] [--rounds 4] [--repeats 1] [--json FILE]
        [--emulator-only] [--eval] [--bracket] [--mechanism-reference] [--report FILE.md]

--emulator-only skips the reference (the per-round wall times the README quotes); --report writes a markdown
report with the command, the commit, the seeds and the load average beside every figure (benchmarks/reports/).

Each workload is the paper's model, data shape, topology and mechanism (the deploy/ configs, fewer rounds):

    000  H2FDP, device noise at untrusted edges, linear model, Fashion-MNIST, 10 edges x 5 (h2fdp-p05-fmnist)
    001  QHetFed, QSGD on both hops, paper 001's CNN on Fashion-MNIST, 3 sets x 20 (scale-qhetfed-fmnist)
    002  DP-SGD-WAV at 100 clients, 10 edges x 10, Fashion-MNIST, mnist-cnn (dp-sgd-wav with the paper's clients)
    003  MultiAirFed on the over-the-air medium, M = 15 per cluster, 3 clusters, ota-cnn (scale-ota-fmnist)
    004  DP-SQ with fusion (dpsq-fl), 100 devices / 10 per round, the 784-200-10 MLP (deploy/experiments/dpsq)

The reference is the same local training with no RPC and no mechanism: every device that trains in a round takes
the same number of plain SGD steps of the same batch size on its own shard from the round's model, split over 2
processes (one torch thread each, half the devices each, weights averaged through pipes), timed in the same repeat.
The count of steps per device per round comes from the round plan (plans.build_plan: local_sgd steps or epochs,
local_dp_sgd steps of lots of q n, one minibatch per edge/air gradient step). The reference evaluates nothing, so
by default neither does a timed round of the emulator: the cloud evaluates rounds 0 and the last only
(run.eval_every = rounds) and rounds from 2 on are timed (round 0's evaluation overlaps round 1); --eval keeps the
config's evaluation and times rounds from 1 on. Reported: wall time and the testbed's summed process CPU per timed
round, between the checkpoints that bound the timed rounds (the work between rounds counts; start-up and shutdown
do not) / the reference's median round (rounds after the first); start-up (launch to round 0, from the first
checkpoint) and the peak summed PSS of every process of the testbed.

--mechanism-reference (000, 002, 004) makes the reference run the workload's mechanism with the functions its nodes
run, instead of plain SGD, so the ratio measures the emulator alone (its messages, sessions, checks, emulated clock
and channel), not the mechanism's own cost: 002 each device's DP-SGD(-WAV) phases (privacy.dpsgd.dp_sgd with the
phase's lots, clip and scope; bench_dpsgd.py measures it against plain SGD); 000 each device's clipped local SGD
phases and, behind the untrusted half of the edges, its Gaussian noise at every model sync; 004 each drawn device's
update through the uplink (l1 clip, DP-SQ encode at its group's bits) and the fusion center's decode and AWGN.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import pathlib
import statistics
import sys
import threading
import time

import psutil
import torch
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from hfl import families  # noqa: E402,F401
from hfl.common import config as config_mod  # noqa: E402
from hfl.common import plans  # noqa: E402
from hfl.common.data import load_dataset  # noqa: E402
from hfl.common.models import build, init_parameters  # noqa: E402
from hfl.common.partition import partition  # noqa: E402
from hfl.common.seeding import numpy_rng, torch_generator  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DPSQ = ["topology.edges=2", "topology.devices_per_edge=50", "model.name=mlp", "data.partition=iid",
        "train.gamma=10", "train.batch_size=10", "train.lr=0.05", "pipeline.clip=clip_l1",
        "pipeline.params.clip_l1.clip=10.0", "precision.group_sizes=[50, 50]", "precision.bits=[2, 4]",
        "precision.epsilon1=[1e-6, 1e-6]", "precision.link_std=[6.25e-4, 0.125]", "precision.participants=10",
        "precision.bit_budget=30", "run.algorithm=dpsq-fl", "pipeline.uplink_encoding=dpsq",
        "data.dataset=fashion-mnist", "data.max_test_samples=2000"]
WORKLOADS = {
    "000": ("deploy/configs/h2fdp-p05-fmnist.toml", []),
    "001": ("deploy/configs/scale-qhetfed-fmnist.toml", []),
    "002": ("deploy/configs/dp-sgd-wav.toml", ["topology.edges=10", "topology.devices_per_edge=10",
                                               "data.dataset=fashion-mnist", "data.max_test_samples=2000",
                                               "net.phase_timeout_s=600"]),
    "003": ("deploy/configs/scale-ota-fmnist.toml", []),
    "004": (None, DPSQ),
}


def workload_config(name: str, rounds: int, extra: list[str] = ()):
    path, overrides = WORKLOADS[name]
    overrides = overrides + [f"run.rounds={rounds}", f"run.name=bench-{name}"] + list(extra)
    return (str(ROOT / path) if path else None), overrides


def local_work(cfg, shard_sizes: list[int]) -> list[tuple[int, int]]:
    """(steps, batch) per device per round of the plain reference, from the round plan."""
    out = []
    for n in shard_sizes:
        steps, batch = 0, cfg.train.batch_size
        for phase in plans.build_plan(cfg):
            p = phase.params
            if phase.kind == plans.LOCAL_DP_SGD:
                steps += int(p["steps"])
                batch = max(1, round(float(p["q"]) * n))
            elif phase.kind == "local_sgd":
                steps += int(p["steps"]) if "steps" in p else int(p.get("epochs", 1)) * math.ceil(n / batch)
            elif phase.kind.endswith("gradient_step"):
                steps += 1
        out.append((steps, batch))
    return out


def _setup(cfg, share: int, shares: int, active: int):
    data = load_dataset(cfg.data)
    parts = partition(data.y_train, cfg.num_devices, numpy_rng(cfg.run.seed, "data", "partition"), cfg.data)
    parts = parts[:active]  # the devices that train in a round
    mine = parts[share * len(parts) // shares:(share + 1) * len(parts) // shares]
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    shards = [(torch.from_numpy(data.x_train[p]), torch.from_numpy(data.y_train[p])) for p in mine]
    model = build(cfg.model.name, data.input_shape, data.num_classes)
    init_parameters(model, torch_generator(cfg.run.seed, "cloud", 0, 0, "init"))
    return shards, local_work(cfg, [len(y) for _, y in shards]), model, mean, std


def _dp_phases(cfg) -> list[dict]:
    """The parameters of the round plan's local_dp_sgd phases (002's DP-SGD-WAV: tau of them a round)."""
    return [dict(phase.params) for phase in plans.build_plan(cfg) if phase.kind == plans.LOCAL_DP_SGD]


def _mechanism_setup(cfg, shards, mean, std) -> tuple[str, list[dict], list]:
    """What the DP-SGD reference needs, made once before the timed rounds: the mechanism's name, the round plan's
    local_dp_sgd phases and each device's Shard (as its host holds them)."""
    from hfl.common.privacy.algorithms import ALGORITHMS

    mechanism = ALGORITHMS.get(cfg.run.algorithm).noise or cfg.privacy.mechanism
    return mechanism, _dp_phases(cfg), _device_shards(shards, mean, std)


def _device_shards(shards, mean, std) -> list:
    from hfl.device_client.training import make_shard

    mean, std = mean.reshape(-1).tolist(), std.reshape(-1).tolist()
    return [make_shard(x.numpy(), y.numpy(), mean, std) for x, y in shards]


def _dp_sgd_round(cfg, shards, mean, std, work):
    """002: each device's DP-SGD(-WAV) phases as its host runs them (privacy.dpsgd.dp_sgd on the phase's lots, clip
    and wavelet scope, the lots and noise from the AES-CTR keystream). The noise multiplier is 1: the cloud calibrates
    it, and its value does not change the cost."""
    from hfl.common.models import get_flat, set_flat
    from hfl.common.privacy import optimizers
    from hfl.common.privacy.dpsgd import dp_sgd
    from hfl.common.secret_random import dp_draws

    mechanism, phases, dev_shards = _mechanism_setup(cfg, shards, mean, std)

    def one(model, state: dict, i: int, device: int, rnd: int) -> None:
        model.load_state_dict(state)
        w = get_flat(model)
        for step, p in enumerate(phases):
            clips = [p[f"clip_{j}"] for j in range(len(p)) if f"clip_{j}" in p]
            w, _, _ = dp_sgd(model, w, dev_shards[i], float(p["lr"]), int(p["steps"]), float(p["q"]), float(p["clip"]),
                             1.0, mechanism, dp_draws("seeded", cfg.run.seed, "device", device, rnd, step, "dp_sgd", 0),
                             lot="fixed" if p.get("fixed") else "poisson", calibration=cfg.privacy.calibration,
                             layer_bounds=clips or None, wavelet_scope="per_layer" if p.get("per_layer") else "flat",
                             optimizer=optimizers.from_code(p.get("optimizer", optimizers.code("sgd"))))
        set_flat(model, w)
    return one


def _clipped_noised_round(cfg, shards, mean, std, work):
    """000: each device's local_sgd phases as its host runs them (every minibatch gradient clipped to the phase's
    clip), and at each model sync the Gaussian noise of a device behind an untrusted edge (every other edge here, the
    trusted fraction 0.5) from a fresh AES-CTR keystream, as its release draws it."""
    from hfl.common.models import get_flat, set_flat
    from hfl.common.secret_random import dp_numpy_rng
    from hfl.device_client.training import local_sgd

    dev_shards = _device_shards(shards, mean, std)
    plan = plans.build_plan(cfg)

    def one(model, state: dict, i: int, device: int, rnd: int) -> None:
        model.load_state_dict(state)
        w = get_flat(model)
        noisy = (device // cfg.topology.devices_per_edge) % 2 == 1
        for step, phase in enumerate(plan):
            p = phase.params
            if phase.kind == plans.LOCAL_SGD:
                w, _, _ = local_sgd(model, w, dev_shards[i], float(p["lr"]), cfg.train.batch_size,
                                    torch_generator(cfg.run.seed, "device", device, rnd, step, "batches"),
                                    steps=int(p["steps"]), clip=float(p.get("clip", 0.0)))
            elif phase.kind == plans.EDGE_MODEL_SYNC and noisy:
                rng = dp_numpy_rng("seeded", cfg.run.seed, "device", device, rnd, step, "dp_noise", 0)
                w = w + rng.normal(0.0, cfg.privacy.clip, len(w)).astype("float32")
        set_flat(model, w)
    return one


def _dpsq_round(cfg, shards, mean, std, work):
    """004: each drawn device's plain SGD steps, then its update through the device's uplink as its host sends it
    (the l1 clip, the DP-SQ encode at its group's bits and epsilon1 on the AES-CTR keystream, the packing) and the
    fusion center's receive (the decode, the AWGN of the device's group)."""
    from hfl.common.models import get_flat, set_flat
    from hfl.common.pipeline import Link, StageRef
    from hfl.device_client.training import local_sgd

    dev_shards = _device_shards(shards, mean, std)
    link = Link.device_uplink(cfg)
    p = cfg.precision
    bounds = [sum(p.group_sizes[:g + 1]) for g in range(len(p.group_sizes))]

    def one(model, state: dict, i: int, device: int, rnd: int) -> None:
        model.load_state_dict(state)
        w0 = get_flat(model)
        steps, batch = work[i]
        w, _, _ = local_sgd(model, w0, dev_shards[i], cfg.train.lr, batch,
                            torch_generator(cfg.run.seed, "device", device, rnd, 0, "batches"), steps=steps)
        spread = device * cfg.num_devices // max(1, p.participants or cfg.num_devices)  # the drawn span all groups
        g = next(k for k, b in enumerate(bounds) if spread < b)
        tensor, _ = link.send(w - w0, "delta", cfg.run.seed, device, rnd, 0,
                              {"encode": {"bits": p.bits[g], "epsilon1": p.epsilon1[g]}})
        y, _ = link.receive(tensor, len(w0), cfg.run.seed, device, rnd, 0,
                            StageRef("channel", "awgn", {"std": p.link_std[g]}))
        set_flat(model, w0 + y)
    return one


MECHANISMS = {"002": _dp_sgd_round, "000": _clipped_noised_round, "004": _dpsq_round}


def _worker(cfg, share: int, shares: int, active: int, conn, mechanism: str | None = None) -> None:
    torch.set_num_threads(1)
    shards, work, model, mean, std = _setup(cfg, share, shares, active)
    device_round = MECHANISMS[mechanism](cfg, shards, mean, std, work) if mechanism else None
    first = share * active // shares  # the index of this share's first device
    gen = torch.Generator().manual_seed(share)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    conn.send("ready")
    rnd = 0
    while (state := conn.recv()) is not None:
        cpu = time.process_time()
        acc = {k: torch.zeros_like(v) for k, v in state.items()}
        total = 0
        for i, ((x_u8, y), (steps, batch)) in enumerate(zip(shards, work)):
            if device_round:
                device_round(model, state, i, first + i, rnd)
            else:
                model.load_state_dict(state)
                for _ in range(steps):
                    idx = torch.randperm(len(y), generator=gen)[:batch]
                    x = x_u8[idx].float().div_(255).sub_(mean).div_(std)
                    opt.zero_grad()
                    F.cross_entropy(model(x), y[idx]).backward()
                    opt.step()
            for k, v in model.state_dict().items():
                acc[k] += len(y) * v
            total += len(y)
        rnd += 1
        conn.send((acc, total, time.process_time() - cpu))


def reference_round_seconds(cfg, rounds: int, active: int, processes: int = 2, mechanism: str | None = None
                            ) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds summed over the processes) of each round of the plain reference (with `mechanism`,
    the workload's mechanism as its nodes run it instead of plain SGD: MECHANISMS)."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for i in range(processes):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(cfg, i, processes, active, child, mechanism), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    for conn in pipes:
        assert conn.recv() == "ready"
    data = load_dataset(cfg.data)
    model = build(cfg.model.name, data.input_shape, data.num_classes)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    times, cpus = [], []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            for conn in pipes:
                conn.send(state)
            results = [conn.recv() for conn in pipes]
            total = sum(r[1] for r in results)
            state = {k: sum(r[0][k] for r in results) / total for k in state}
            times.append(time.perf_counter() - start)
            cpus.append(sum(r[2] for r in results))
    finally:
        for conn in pipes:
            conn.send(None)
        for proc in procs:
            proc.join(30)
    return times, cpus


def bench(name: str, rounds: int, repeats: int, extra: list[str], reference: bool = True,
          evaluate: bool = False, bracket: bool = False, mechanism: bool = False) -> dict:
    """Without `evaluate`, the cloud evaluates only rounds 0 and the last (run.eval_every = rounds), and only rounds
    from 2 on are timed (round 0's evaluation overlaps round 1): the reference evaluates nothing. With `bracket`
    the reference runs before and after the emulator in each repeat and the ratio takes the mean of the two."""
    if not evaluate:
        extra = [f"run.eval_every={rounds}", *extra]
    timed_from = 1 if evaluate else 2
    if rounds <= timed_from:
        raise SystemExit(f"--rounds {rounds}: at least {timed_from + 1} rounds, the first {timed_from} not timed")
    path, overrides = workload_config(name, rounds, extra)
    cfg = config_mod.load(path, overrides)
    active = cfg.precision.participants if name == "004" and cfg.precision.participants else cfg.num_devices
    if mechanism and name not in MECHANISMS:
        raise SystemExit(f"--mechanism-reference: workload {name} has none (only {', '.join(sorted(MECHANISMS))})")
    reps = []

    def plain() -> tuple[float, float]:
        walls, cpus = reference_round_seconds(cfg, max(2, rounds), active, mechanism=name if mechanism else None)
        return statistics.median(walls[1:]), statistics.median(cpus[1:])

    for i in range(repeats):
        before = plain() if reference and bracket else None
        emu = _emulated_file(path, overrides, timed_from)
        if not reference:
            reps.append(emu)
            print(f"[{name}] repeat {i + 1}/{repeats}: rounds {', '.join(f'{t:.2f}s' for t in emu['rounds_seconds'])}; "
                  f"start-up {emu.get('startup_seconds', float('nan')):.1f}s; accuracy {emu['final_accuracy']:.3f}",
                  flush=True)
            continue
        after = plain()
        if before:  # the machine's speed drifts over a long run: the mean of the reference before and after it
            emu["reference_before_after"] = [before, after]
            ref, ref_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        else:
            ref, ref_cpu = after
        emu["reference_round_seconds"], emu["reference_round_cpu_seconds"] = ref, ref_cpu
        emu["ratio"] = emu["round_seconds"] / ref
        emu["cpu_ratio"] = emu["round_cpu_seconds"] / ref_cpu
        reps.append(emu)
        print(f"[{name}] repeat {i + 1}/{repeats}: round {emu['round_seconds']:.2f}s = {emu['ratio']:.2f}x the "
              f"2-process reference ({ref:.2f}s"
              + (f": {before[0]:.2f}s before, {after[0]:.2f}s after" if before else "") + f"); CPU per round {emu['round_cpu_seconds']:.2f}s = "
              f"{emu['cpu_ratio']:.2f}x the reference's ({ref_cpu:.2f}s); start-up "
              f"{emu.get('startup_seconds', float('nan')):.1f}s; peak PSS "
              f"{emu['peak_pss_bytes'] / 2 ** 30:.2f} GiB; {emu['processes']} processes; accuracy "
              f"{emu['final_accuracy']:.3f}", flush=True)
    keys = ("round_seconds", "reference_round_seconds", "ratio", "round_cpu_seconds", "reference_round_cpu_seconds",
            "cpu_ratio", "startup_seconds", "peak_pss_bytes")
    return {"repeats": reps, "median": {k: statistics.median(r[k] for r in reps) for k in keys
                                        if all(k in r for r in reps)}, "devices": cfg.num_devices,
            "model": cfg.model.name, "algorithm": cfg.run.algorithm, "seed": cfg.run.seed,
            "edges": cfg.topology.edges, "devices_per_edge": cfg.topology.devices_per_edge,
            "dataset": cfg.data.dataset, "config": path and str(pathlib.Path(path).relative_to(ROOT)),
            "overrides": overrides}


def _emulated_file(path: str | None, overrides: list[str], timed_from: int = 1) -> dict:
    """bench_round.emulated with a config file: round time, CPU per round, start-up, peak summed PSS of the testbed.

    Rounds from `timed_from` on are timed, between the checkpoint of round timed_from - 1 and the last round's
    checkpoint: wall time and the testbed's summed process CPU per round, so the work between two rounds (the
    checkpoint, the metrics row) counts and neither the start-up nor the shutdown (summary, plots) does. (A round's
    own round_seconds, in rounds_seconds, runs from its task to its aggregate.)"""
    import tempfile

    from bench_round import MemorySampler

    from hfl.testbed import Testbed

    class CheckpointCpu(threading.Thread):
        """(wall time, summed CPU seconds of the testbed's processes) at each new checkpoint (the end of each round),
        polled every 20 ms; a process that has exited keeps its last reading."""

        def __init__(self, bed: Testbed):
            super().__init__(daemon=True)
            self.bed, self.stop, self.seen, self.at_checkpoint = bed, threading.Event(), {}, []

        def cpu(self) -> float:
            for node in list(self.bed.nodes.values()):
                try:
                    proc = psutil.Process(node.proc.pid)
                    for p in [proc] + proc.children(recursive=True):
                        t = p.cpu_times()
                        self.seen[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
            return sum(self.seen.values())

        def run(self) -> None:
            last = None
            while not self.stop.wait(0.02):
                try:
                    mtime = (self.bed.run_dir / "checkpoint.npz").stat().st_mtime_ns
                except OSError:
                    continue
                if mtime != last:
                    last = mtime
                    self.at_checkpoint.append((time.perf_counter(), self.cpu()))

    with tempfile.TemporaryDirectory() as tmp, Testbed(path, overrides, run_dir=pathlib.Path(tmp) / "run",
                                                     start_timeout=900) as bed:
        launched = time.time()
        sampler, cpu = MemorySampler(bed), CheckpointCpu(bed)
        sampler.start()
        cpu.start()
        bed.wait(timeout=3600)
        for thread in (sampler, cpu):
            thread.stop.set()
            thread.join()
        rows = bed.metrics()
        summary = json.loads((bed.run_dir / "summary.json").read_text())
        processes = len(bed.nodes)
    timed = rows[timed_from:] or rows[-1:]
    marks = cpu.at_checkpoint
    ok = len(marks) == len(rows) and len(marks) > timed_from
    span = [b - a for a, b in zip(marks[timed_from - 1], marks[-1])] if ok else [float("nan")] * 2
    out = {"round_seconds": span[0] / len(timed),
           "rounds_seconds": [r["round_seconds"] for r in rows], "total_seconds": summary.get("total_seconds"),
           "final_accuracy": summary.get("final_accuracy", float("nan")), "processes": processes,
           "peak_pss_bytes": sampler.peak_pss, "peak_rss_bytes": sampler.peak_rss, "timed_rounds": len(timed),
           "sampler_cpu_seconds": sampler.cpu_seconds,
           "round_cpu_seconds": span[1] / len(timed)}
    if not ok:
        print(f"  (saw {len(marks)} checkpoints for {len(rows)} rounds: no time per round)", flush=True)
    if "startup_seconds" in summary:
        out["startup_seconds"] = summary["startup_seconds"]
    elif sampler.first_checkpoint is not None:
        out["startup_seconds"] = sampler.first_checkpoint - launched - rows[0]["round_seconds"]
    return out


def write_report(path: pathlib.Path, report: dict, args) -> None:
    """The figures with what produced them: command line, commit (and whether the tree was clean), seeds, load."""
    import os
    import platform
    import shlex
    import subprocess

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout

    command = "python benchmarks/bench_workloads.py " + shlex.join(sys.argv[1:])
    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line.strip()]
    dirty = f" (uncommitted changes to {', '.join(changed)})" if changed else ""
    lines = [f"# Paper workloads: wall time per round ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"- command: `{command}`", f"- commit: `{git('rev-parse', 'HEAD').strip()}`{dirty}",
             f"- machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2 ** 30:.0f} GiB, "
             f"{platform.platform()}; niceness {os.nice(0)}; load average at the end "
             f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (a shared machine: other work ran beside it)",
             f"- rounds per run: {args.rounds}; timed: "
             + ("rounds 1 on, the config's evaluation kept (--eval)" if args.eval else
                "rounds 2 on, evaluation only of rounds 0 and the last (the reference evaluates nothing)")
             + "; wall time and CPU per round between the checkpoints that bound the timed rounds (every round's "
             f"own task-to-aggregate time is listed apart); repeats: {args.repeats}",
             "- reference: " + ("the workload's mechanism with the functions its nodes run (--mechanism-reference: "
                                "bench_workloads.py's MECHANISMS): the ratio is the emulator's own cost" if args.mechanism_reference else
                                "plain SGD, no mechanism"), "",
             "| workload | config (+ overrides) | seed | topology | model | round (s) | reference (s) | wall ratio | "
             "CPU a round (s) | reference CPU (s) | CPU ratio | every round's own (s) | start-up (s) | peak PSS (GiB) | "
             "final accuracy |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(reps: list, key: str, fmt: str = "{:.2f}") -> str:
        return "; ".join(fmt.format(x[key]) if key in x else "-" for x in reps)

    for name, r in report.items():
        reps = r["repeats"]
        extra = " ".join(f"`{o}`" for o in r["overrides"] if not o.startswith(("run.rounds=", "run.name=")))
        each = "; ".join(", ".join(f"{t:.2f}" for t in x["rounds_seconds"]) for x in reps)
        lines.append(f"| {name} {r['algorithm']} | `{r['config'] or '(built-in defaults)'}` {extra} | {r['seed']} | "
                     f"{r['edges']} x {r['devices_per_edge']} ({r['dataset']}) | {r['model']} | "
                     f"{cell(reps, 'round_seconds')} | {cell(reps, 'reference_round_seconds')}"
                     + "".join(f" ({x['reference_before_after'][0][0]:.2f} before, {x['reference_before_after'][1][0]:.2f} "
                               "after)" for x in reps if "reference_before_after" in x) + " | "
                     f"{cell(reps, 'ratio', '**{:.2f}x**')} | {cell(reps, 'round_cpu_seconds')} | "
                     f"{cell(reps, 'reference_round_cpu_seconds')} | {cell(reps, 'cpu_ratio', '**{:.2f}x**')} | {each} | "
                     f"{cell(reps, 'startup_seconds', '{:.1f}')} | "
                     f"{'; '.join(format(x['peak_pss_bytes'] / 2 ** 30, '.2f') for x in reps)} | "
                     f"{cell(reps, 'final_accuracy', '{:.3f}')} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", default=sorted(WORKLOADS), choices=sorted(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of the emulated run (the first two are not timed, the first with --eval)")
    parser.add_argument("--bracket", action="store_true",
                        help="time the reference before and after the emulator in each repeat (their mean): for long "
                             "workloads, over which the machine's speed drifts")
    parser.add_argument("--eval", action="store_true",
                        help="keep the config's evaluation every round (the reference evaluates nothing)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], help="extra override for every workload")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--emulator-only", action="store_true", help="no reference: the emulator's round times only")
    parser.add_argument("--report", help="write a markdown report (command, commit, seeds, load) here")
    parser.add_argument("--mechanism-reference", action="store_true",
                        help="the reference runs the workload's mechanism as its nodes do (000, 002, 004), instead of "
                             "plain SGD: the ratio is then the emulator's own cost, the mechanism's excluded")
    args = parser.parse_args()
    report = {}
    for name in args.workloads:
        report[name] = bench(name, args.rounds, args.repeats, args.set, reference=not args.emulator_only,
                               evaluate=args.eval, bracket=args.bracket, mechanism=args.mechanism_reference)
        if args.report:
            write_report(pathlib.Path(args.report), report, args)  # after each workload: a long one may not end
        m = report[name]["median"]
        if args.emulator_only:
            continue
        print(f"({name}) {report[name]['algorithm']}, {report[name]['devices']} devices, {report[name]['model']}: "
              f"round {m['round_seconds']:.2f}s = {m['ratio']:.2f}x the 2-process reference (target <= 1.15); "
              f"start-up {m.get('startup_seconds', float('nan')):.1f}s; peak PSS {m['peak_pss_bytes'] / 2 ** 30:.2f} "
              f"GiB", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
