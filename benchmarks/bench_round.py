"""Benchmarks (not timed tests). Run: python benchmarks/bench_round.py [a|b|startup|all] [--repeats N] [--layouts ...]

(a) round time: emulated HierFAVG (100 devices in 10 edges, small MNIST CNN, 1 local epoch, real
    processes and sockets) for each device-host layout (per_core: one host per core; per_edge: one per
    edge), against (i) the 2-core limit, a 2-process plain torch reference that splits the same training
    over both cores (one torch thread each, weights averaged every round through pipes), and (ii) the
    1-process plain loop (1 torch thread; --loop-threads 1 2 takes the best of both). Also start-up (launch to the start of round 0)
    and the peak summed PSS of every process of the testbed. Medians over repeats; every ratio is taken
    against references measured in the same repeat. Targets: <= 1.10x the 2-process reference, start-up
    <= 10 s, peak PSS <= 1.5 GB.
(b) scale: 1,000 emulated devices in 20 edges: HierFAVG round time and memory per device
    (sum of the RSS / PSS of every process of the testbed / devices). Target < 20 MB per device.
(startup) `hfl run`'s start-up at 100 devices in 10 edges (per_core), on the default data (mnist-embedded) and on
    (a)'s synthetic data (`--data default synthetic`): each repeat runs benchmarks/startup_profile.py in a fresh
    process (the launcher as `hfl run` starts it, no torch imported before it) and reports the command's start to
    round 0, the cloud's `startup_seconds` (the nodes' launch to round 0) and the CPU time of every process to round
    0; `--profile` prints each run's phase timeline. Target: `startup_seconds` <= 3 s on the default data.
See also benchmarks/bench_rpc.py (CPU per exchange) and benchmarks/bench_scale.py (10,000 devices).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import torch
from torch.nn import functional as F

from hfl import families  # noqa: F401
from hfl.common import config as config_mod
from hfl.common.data import load_dataset
from hfl.common.models import build, init_parameters
from hfl.common.partition import partition
from hfl.common.seeding import numpy_rng, torch_generator
from hfl import node_spawn
from hfl.testbed import Testbed

# the cloud evaluates rounds 0 and the last only (the references evaluate nothing): rounds from 2 on are timed, so
# no timed round shares the cores with an evaluation (round 0's overlaps round 1's training)
A_OVERRIDES = [
    "run.name=bench-a", "run.algorithm=hierfavg", "run.rounds=5", "run.eval_every=5",
    "topology.edges=10", "topology.devices_per_edge=10",
    "data.dataset=synthetic", "data.synthetic_samples=75000", "data.max_test_samples=1000",
    "model.name=mnist-cnn", "train.tau=1", "train.gamma=1", "train.local_unit=epochs", "train.batch_size=32",
]
B_OVERRIDES = [
    "run.name=bench-b", "run.algorithm=hierfavg", "run.rounds=3",
    "topology.edges=20", "topology.devices_per_edge=50",
    "data.dataset=synthetic", "data.synthetic_samples=75000", "data.max_test_samples=1000",
    "model.name=mnist-cnn", "train.tau=2", "train.gamma=1", "train.local_unit=epochs", "train.batch_size=32",
    "net.join_timeout_s=900",
]


def _setup(cfg, share: int = 0, shares: int = 1):
    data = load_dataset(cfg.data)
    parts = partition(data.y_train, cfg.num_devices, numpy_rng(cfg.run.seed, "data", "partition"), cfg.data)
    parts = parts[share * len(parts) // shares:(share + 1) * len(parts) // shares]
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    shards = [(torch.from_numpy(data.x_train[p]), torch.from_numpy(data.y_train[p])) for p in parts]
    model = build(cfg.model.name, data.input_shape, data.num_classes)
    init_parameters(model, torch_generator(cfg.run.seed, "cloud", 0, 0, "init"))
    return shards, model, mean, std


def _train(cfg, shards, model, mean, std, global_state, gen) -> tuple[dict, int]:
    """One round of the plain loop over `shards`: each starts from `global_state`, one epoch of SGD;
    returns the sample-weighted sum of the final states and the sample count."""
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    total = 0
    for x_u8, y in shards:
        model.load_state_dict(global_state)
        for idx in torch.randperm(len(y), generator=gen).split(cfg.train.batch_size):
            x = x_u8[idx].float().div_(255).sub_(mean).div_(std)
            opt.zero_grad()
            F.cross_entropy(model(x), y[idx]).backward()
            opt.step()
        for k, v in model.state_dict().items():
            acc[k] += len(y) * v
        total += len(y)
    return acc, total


def reference_round_seconds(cfg, threads: int, rounds: int) -> list[float]:
    """The same HierFAVG training (tau=1, one epoch per device, sample-weighted means) as a plain torch loop."""
    torch.set_num_threads(threads)
    shards, model, mean, std = _setup(cfg)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        acc, total = _train(cfg, shards, model, mean, std, global_state, gen)
        global_state = {k: v / total for k, v in acc.items()}
        times.append(time.perf_counter() - start)
    return times


def _worker(cfg, share: int, shares: int, conn) -> None:
    torch.set_num_threads(1)
    shards, model, mean, std = _setup(cfg, share, shares)
    gen = torch.Generator().manual_seed(share)
    conn.send("ready")
    while (state := conn.recv()) is not None:
        conn.send(_train(cfg, shards, model, mean, std, state, gen))


def two_process_round_seconds(cfg, rounds: int, processes: int = 2) -> list[float]:
    """The 2-core limit: the plain loop split over `processes` processes (one torch thread each, half the
    devices each); every round the parent sends the global state, each returns its weighted sum."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for i in range(processes):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(cfg, i, processes, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    for conn in pipes:
        assert conn.recv() == "ready"
    _, model, _, _ = _setup(cfg, 0, 1 << 30)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            for conn in pipes:
                conn.send(global_state)
            results = [conn.recv() for conn in pipes]
            total = sum(n for _, n in results)
            global_state = {k: sum(acc[k] for acc, _ in results) / total for k in global_state}
            times.append(time.perf_counter() - start)
    finally:
        for conn in pipes:
            conn.send(None)
        for proc in procs:
            proc.join(30)
    return times


class MemorySampler(threading.Thread):
    """Peak of the summed RSS (and PSS, which counts shared pages once) of a testbed's processes.

    RSS is cheap to read (/proc/PID/statm); PSS is not: smaps_rollup walks the page tables, ~5 ms of this process' CPU
    per torch process. Read every 0.5 s for 14 processes, that took ~8% of a 2-core machine away from the emulator
    and from no reference, so PSS is read only when the summed RSS reaches a new high (0.5% over the last) or 5 s
    after the last reading, which catches the peak and the slow copy-on-write drift that RSS does not show.
    `cpu_seconds` is what the sampling itself cost."""

    PSS_EVERY = 5.0

    def __init__(self, bed: Testbed):
        super().__init__(daemon=True)
        self.bed = bed
        self.peak_rss = 0
        self.peak_pss = 0
        self.pss_at_peak: dict[str, int] = {}  # node -> its PSS in the sample of the peak sum
        self.first_checkpoint: float | None = None  # wall-clock mtime of the first checkpoint (end of round 0)
        self.cpu_seconds = 0.0
        self._pss_rss, self._pss_time = 0, float("-inf")
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(0.5)

    def poll(self) -> None:
        """One sample: the summed memory of the processes; the first checkpoint's time once it exists."""
        cpu = time.thread_time()
        nodes = list(self.bed.nodes.values())
        forked = any(isinstance(node.proc, node_spawn.ForkedNode) for node in nodes)
        server = node_spawn.server_pid() if forked else None  # forked nodes share its pages: its share counts too
        procs = []
        for name, pid in [(node.name, node.proc.pid) for node in nodes] + ([("forkserver", server)] if server else []):
            try:
                procs.append((name, psutil.Process(pid)))
            except psutil.Error:
                pass
        rss = 0
        for _, proc in procs:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)
        now = time.monotonic()
        if rss > self._pss_rss * 1.005 or now - self._pss_time >= self.PSS_EVERY:
            self._pss_rss, self._pss_time = max(rss, self._pss_rss), now
            each, pss = {}, 0
            for name, proc in procs:
                try:
                    each[name] = getattr(proc.memory_full_info(), "pss", 0) or proc.memory_info().rss
                    pss += each[name]
                except (psutil.Error, AttributeError):
                    pass
            if pss > self.peak_pss:
                self.peak_pss, self.pss_at_peak = pss, each
        if self.first_checkpoint is None:
            try:
                self.first_checkpoint = (self.bed.run_dir / "checkpoint.npz").stat().st_mtime
            except OSError:
                pass
        self.cpu_seconds += time.thread_time() - cpu


def emulated(overrides: list[str], sample_memory: bool = False, certs: str | None = None, skip: int = 1) -> dict:
    """One testbed run (under mutual TLS with `certs`, a CA directory): round time (median of the rounds after the
    first `skip`), start-up, memory."""
    with tempfile.TemporaryDirectory() as tmp, Testbed(None, overrides, run_dir=pathlib.Path(tmp) / "run",
                                                     start_timeout=900, certs=certs) as bed:
        launched = time.time()
        started = time.monotonic()
        sampler = MemorySampler(bed) if sample_memory else None
        if sampler:
            sampler.start()
        summary = bed.wait(timeout=3600)
        if sampler:
            sampler.stop.set()
            sampler.join()
        rows = bed.metrics()
        first_checkpoint = sampler.first_checkpoint if sampler else None
        hosts = len(bed.device_hosts())
        processes = len(bed.nodes)
    steady = rows[skip:] if len(rows) > skip else rows  # round 0 pays for lazy start-up (first batches, allocators)
    out = {
        "round_seconds": statistics.median(r["round_seconds"] for r in steady),
        "startup_and_run_seconds": time.monotonic() - started,
        "final_accuracy": summary["final_accuracy"],
        "device_hosts": hosts,
        "processes": processes,
        "summary_startup_seconds": summary.get("startup_seconds"),  # the cloud's: launch to round 0
        "refused": summary.get("refused"),
    }
    if first_checkpoint is not None:  # the checkpoint of round 0 is written when round 0 ends
        out["startup_seconds"] = first_checkpoint - launched - rows[0]["round_seconds"]
    if sampler:
        out["peak_rss_bytes"] = sampler.peak_rss
        out["peak_pss_bytes"] = sampler.peak_pss
        out["pss_at_peak_by_role"] = by_role(sampler.pss_at_peak)
        out["sampler_cpu_seconds"] = sampler.cpu_seconds
    return out


def by_role(pss: dict[str, int]) -> dict[str, dict]:
    """Per role (cloud, edge, devices): processes, summed and largest PSS in MiB."""
    out: dict[str, dict] = {}
    for name, value in pss.items():
        role = out.setdefault(name.split("-")[0], {"processes": 0, "pss_mib": 0.0, "largest_mib": 0.0})
        role["processes"] += 1
        role["pss_mib"] = round(role["pss_mib"] + value / 2 ** 20, 1)
        role["largest_mib"] = round(max(role["largest_mib"], value / 2 ** 20), 1)
    return out


def layout_overrides(overrides: list[str], layout: str) -> list[str]:
    return overrides + [f"topology.host_layout={layout}"]


def bench_a(repeats: int, layouts: list[str], loop_threads: tuple[int, ...] = (1,)) -> dict:
    cfg = config_mod.load(None, A_OVERRIDES)
    results = []
    for i in range(repeats):
        rep = {"emulated": {}}
        for layout in layouts:
            rep["emulated"][layout] = emulated(layout_overrides(A_OVERRIDES, layout), sample_memory=True, skip=2)
        rep["two_process"] = statistics.median(two_process_round_seconds(cfg, 3))
        rep["one_process"] = {t: statistics.median(reference_round_seconds(cfg, t, 2)) for t in loop_threads}
        loop = min(rep["one_process"].values())
        for layout, emu in rep["emulated"].items():
            emu["vs_two_process"] = emu["round_seconds"] / rep["two_process"]
            emu["vs_one_process"] = emu["round_seconds"] / loop
            print(f"[a] repeat {i + 1}/{repeats} {layout} ({emu['device_hosts']} device hosts): round "
                  f"{emu['round_seconds']:.2f}s = {emu['vs_two_process']:.3f}x the 2-process reference "
                  f"({rep['two_process']:.2f}s), {emu['vs_one_process']:.3f}x the 1-process loop ({loop:.2f}s; "
                  f"threads: {rep['one_process']}); start-up "
                  f"{emu.get('startup_seconds', float('nan')):.1f}s; peak PSS {emu['peak_pss_bytes'] / 2 ** 30:.2f} GiB "
                  f"(RSS {emu['peak_rss_bytes'] / 2 ** 30:.2f})", flush=True)
        results.append(rep)
    summary = {}
    for layout in layouts:
        runs = [r["emulated"][layout] for r in results]
        summary[layout] = {k: statistics.median(e[k] for e in runs)
                           for k in ("round_seconds", "vs_two_process", "vs_one_process", "startup_seconds",
                                     "peak_pss_bytes", "peak_rss_bytes") if all(k in e for e in runs)}
    summary["two_process_seconds"] = statistics.median(r["two_process"] for r in results)
    summary["one_process_seconds"] = statistics.median(min(r["one_process"].values()) for r in results)
    return {"repeats": results, "median": summary}


def bench_b(repeats: int, layouts: list[str]) -> dict:
    cfg = config_mod.load(None, B_OVERRIDES)
    out = {}
    for layout in layouts:
        results = []
        for i in range(repeats):
            emu = emulated(layout_overrides(B_OVERRIDES, layout), sample_memory=True)
            emu["rss_mb_per_device"] = emu["peak_rss_bytes"] / cfg.num_devices / 2 ** 20
            emu["pss_mb_per_device"] = emu["peak_pss_bytes"] / cfg.num_devices / 2 ** 20
            results.append(emu)
            print(f"[b] {layout} repeat {i + 1}/{repeats}: round {emu['round_seconds']:.1f}s, "
                  f"RSS {emu['rss_mb_per_device']:.2f} MB/device (PSS {emu['pss_mb_per_device']:.2f}), "
                  f"{emu['processes']} processes, whole run {emu['startup_and_run_seconds']:.0f}s", flush=True)
        out[layout] = {"repeats": results, "median_round_seconds": statistics.median(r["round_seconds"] for r in results),
                       "median_rss_mb_per_device": statistics.median(r["rss_mb_per_device"] for r in results),
                       "median_pss_mb_per_device": statistics.median(r["pss_mb_per_device"] for r in results)}
    return out


STARTUP_FIGURES = ("command_to_round0_seconds", "startup_seconds", "cpu_to_round0_total")


def bench_startup(repeats: int, datas: list[str], profile: bool = False) -> dict:
    script = pathlib.Path(__file__).with_name("startup_profile.py")
    out: dict = {}
    for i in range(repeats):
        for data in datas:  # the data sets take turns
            with tempfile.TemporaryDirectory() as tmp:
                path = pathlib.Path(tmp) / "profile.json"
                run = subprocess.run([sys.executable, str(script), "--data", data, "--json", str(path)],
                                     capture_output=True, text=True, timeout=1800)
                if run.returncode != 0:
                    raise RuntimeError(f"startup_profile.py --data {data} failed:\n{run.stderr[-3000:]}")
                rep = json.loads(path.read_text())
            out.setdefault(data, {"repeats": []})["repeats"].append(rep)
            if profile:
                from startup_profile import render  # beside this script

                print(render(rep), flush=True)
            print(f"[startup] repeat {i + 1}/{repeats} {data}: command to round 0 {rep['command_to_round0_seconds']:.2f}s, "
                  f"startup_seconds {rep['startup_seconds']:.2f}s, CPU to round 0 {rep['cpu_to_round0_total']:.2f}s "
                  f"({', '.join(f'{k} {v:.2f}' for k, v in rep['cpu_to_round0'].items())}); load average "
                  f"{rep['load_average'][0]:.1f}", flush=True)
    for data, res in out.items():
        res["median"] = {k: statistics.median(r[k] for r in res["repeats"]) for k in STARTUP_FIGURES}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="all", choices=("a", "b", "startup", "all"))
    parser.add_argument("--data", nargs="+", default=["default", "synthetic"], choices=("default", "synthetic"),
                        help="startup: the data sets (default: mnist-embedded; synthetic: (a)'s)")
    parser.add_argument("--profile", action="store_true", help="startup: print each run's phase timeline")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layouts", nargs="+", default=["per_core", "per_edge"], choices=("per_core", "per_edge"))
    parser.add_argument("--loop-threads", type=int, nargs="+", default=[1],
                        help="torch threads of the 1-process loop (best of them is taken; 2 threads on a loaded 2-core "
                             "machine can be 10x slower)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    report = {"machine": {"cpus": psutil.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2 ** 30, 1)}}
    if args.which in ("a", "all"):
        report["a"] = bench_a(args.repeats, args.layouts, tuple(args.loop_threads))
        m = report["a"]["median"]
        for layout in args.layouts:
            print(f"(a) {layout}: median round {m[layout]['round_seconds']:.2f}s = {m[layout]['vs_two_process']:.3f}x the "
                  f"2-process reference (target <= 1.10), {m[layout]['vs_one_process']:.3f}x the 1-process loop; "
                  f"start-up {m[layout].get('startup_seconds', float('nan')):.1f}s (target <= 10); peak PSS "
                  f"{m[layout]['peak_pss_bytes'] / 2 ** 30:.2f} GiB (target <= 1.5 GB)")
    if args.which in ("b", "all"):
        report["b"] = bench_b(args.repeats, args.layouts)
        for layout, b in report["b"].items():
            print(f"(b) 1,000 devices / 20 edges, {layout}: median round {b['median_round_seconds']:.1f}s, "
                  f"{b['median_rss_mb_per_device']:.2f} MB RSS per device "
                  f"({b['median_pss_mb_per_device']:.2f} MB PSS); target < 20 MB")
    if args.which in ("startup", "all"):
        report["startup"] = bench_startup(args.repeats, args.data, args.profile)
        for data, res in report["startup"].items():
            m = res["median"]
            print(f"(startup) {data} data, 100 devices, per_core: median startup_seconds {m['startup_seconds']:.2f}s "
                  f"(target <= 3), command to round 0 {m['command_to_round0_seconds']:.2f}s, CPU to round 0 "
                  f"{m['cpu_to_round0_total']:.2f}s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
