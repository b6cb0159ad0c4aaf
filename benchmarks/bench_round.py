"""Benchmarks (not timed tests). Run: python benchmarks/bench_round.py [a|b|all] [--repeats N]

(a) overhead: emulated HierFAVG round time (100 devices in 10 edges, small MNIST CNN, 1 local epoch,
    real processes and sockets) divided by the same training in one process with a plain torch loop,
    best of 1 and 2 torch threads. Target <= 1.10. Reported as the median over repeats, each ratio
    taken against a reference measured in the same repeat.
(b) scale: 1,000 emulated devices in 20 edges: HierFAVG round time and resident memory per device
    (sum of the RSS of every process of the testbed / devices). Target < 20 MB per device.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import psutil
import torch
from torch.nn import functional as F

from hfl.common import config as config_mod
from hfl.common.data import load_dataset
from hfl.common.models import build, init_parameters
from hfl.common.partition import partition
from hfl.common.seeding import numpy_rng, torch_generator
from hfl.testbed import Testbed

A_OVERRIDES = [
    "run.name=bench-a", "run.algorithm=hierfavg", "run.rounds=4",
    "topology.edges=10", "topology.devices_per_edge=10", "topology.hosts_per_edge=1",
    "data.dataset=synthetic", "data.synthetic_samples=75000", "data.max_test_samples=1000",
    "model.name=mnist-cnn", "train.tau=1", "train.gamma=1", "train.local_unit=epochs", "train.batch_size=32",
]
B_OVERRIDES = [
    "run.name=bench-b", "run.algorithm=hierfavg", "run.rounds=3",
    "topology.edges=20", "topology.devices_per_edge=50", "topology.hosts_per_edge=1",
    "data.dataset=synthetic", "data.synthetic_samples=75000", "data.max_test_samples=1000",
    "model.name=mnist-cnn", "train.tau=2", "train.gamma=1", "train.local_unit=epochs", "train.batch_size=32",
    "net.join_timeout_s=900",
]


def reference_round_seconds(cfg, threads: int, rounds: int) -> list[float]:
    """The same HierFAVG training (tau=1, one epoch per device, sample-weighted means) as a plain torch loop."""
    torch.set_num_threads(threads)
    data = load_dataset(cfg.data)
    parts = partition(data.y_train, cfg.num_devices, numpy_rng(cfg.run.seed, "data", "partition"), cfg.data)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    shards = [(torch.from_numpy(data.x_train[p]), torch.from_numpy(data.y_train[p])) for p in parts]
    model = build(cfg.model.name, data.input_shape, data.num_classes)
    init_parameters(model, torch_generator(cfg.run.seed, "cloud", 0, 0, "init"))
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
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
        global_state = {k: v / total for k, v in acc.items()}
        times.append(time.perf_counter() - start)
    return times


class MemorySampler(threading.Thread):
    """Peak of the summed RSS (and PSS, which counts shared pages once) of a testbed's processes."""

    def __init__(self, bed: Testbed):
        super().__init__(daemon=True)
        self.bed = bed
        self.peak_rss = 0
        self.peak_pss = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            rss = pss = 0
            for node in list(self.bed.nodes.values()):
                try:
                    info = psutil.Process(node.proc.pid).memory_full_info()
                    rss += info.rss
                    pss += getattr(info, "pss", info.rss)
                except (psutil.Error, AttributeError):
                    pass
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.stop.wait(1.0)


def emulated(overrides: list[str], sample_memory: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Testbed(None, overrides, run_dir=pathlib.Path(tmp) / "run",
                                                     start_timeout=900) as bed:
        started = time.monotonic()
        sampler = MemorySampler(bed) if sample_memory else None
        if sampler:
            sampler.start()
        summary = bed.wait(timeout=3600)
        if sampler:
            sampler.stop.set()
            sampler.join()
        rows = bed.metrics()
    steady = rows[1:] if len(rows) > 1 else rows  # round 0 pays for lazy start-up (first batches, allocators)
    out = {
        "round_seconds": statistics.median(r["round_seconds"] for r in steady),
        "round_seconds_without_eval": statistics.median(r["round_seconds"] - r["eval_seconds"] for r in steady),
        "startup_and_run_seconds": time.monotonic() - started,
        "final_accuracy": summary["final_accuracy"],
    }
    if sampler:
        out["peak_rss_bytes"] = sampler.peak_rss
        out["peak_pss_bytes"] = sampler.peak_pss
    return out


def bench_a(repeats: int) -> dict:
    cfg = config_mod.load(None, A_OVERRIDES)
    results = []
    for i in range(repeats):
        emu = emulated(A_OVERRIDES)
        refs = {t: statistics.median(reference_round_seconds(cfg, t, 3)) for t in (1, 2)}
        best = min(refs.values())
        results.append({"emulated": emu, "reference": refs, "ratio": emu["round_seconds"] / best,
                        "ratio_without_eval": emu["round_seconds_without_eval"] / best})
        print(f"[a] repeat {i + 1}/{repeats}: emulated {emu['round_seconds']:.2f}s "
              f"(without eval {emu['round_seconds_without_eval']:.2f}s), reference 1 thread {refs[1]:.2f}s, "
              f"2 threads {refs[2]:.2f}s -> ratio {results[-1]['ratio']:.3f}", flush=True)
    return {"repeats": results, "median_ratio": statistics.median(r["ratio"] for r in results),
            "median_ratio_without_eval": statistics.median(r["ratio_without_eval"] for r in results)}


def bench_b(repeats: int) -> dict:
    cfg = config_mod.load(None, B_OVERRIDES)
    results = []
    for i in range(repeats):
        emu = emulated(B_OVERRIDES, sample_memory=True)
        emu["rss_mb_per_device"] = emu["peak_rss_bytes"] / cfg.num_devices / 2 ** 20
        emu["pss_mb_per_device"] = emu["peak_pss_bytes"] / cfg.num_devices / 2 ** 20
        results.append(emu)
        print(f"[b] repeat {i + 1}/{repeats}: round {emu['round_seconds']:.1f}s, "
              f"RSS {emu['rss_mb_per_device']:.2f} MB/device (PSS {emu['pss_mb_per_device']:.2f}), "
              f"whole run {emu['startup_and_run_seconds']:.0f}s", flush=True)
    return {"repeats": results, "median_round_seconds": statistics.median(r["round_seconds"] for r in results),
            "median_rss_mb_per_device": statistics.median(r["rss_mb_per_device"] for r in results),
            "median_pss_mb_per_device": statistics.median(r["pss_mb_per_device"] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="all", choices=("a", "b", "all"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    report = {"machine": {"cpus": psutil.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2 ** 30, 1)}}
    if args.which in ("a", "all"):
        report["a"] = bench_a(args.repeats)
        print(f"(a) median ratio emulated/reference: {report['a']['median_ratio']:.3f} "
              f"(without cloud evaluation: {report['a']['median_ratio_without_eval']:.3f}); target <= 1.10")
    if args.which in ("b", "all"):
        report["b"] = bench_b(args.repeats)
        print(f"(b) 1,000 devices / 20 edges: median round {report['b']['median_round_seconds']:.1f}s, "
              f"{report['b']['median_rss_mb_per_device']:.2f} MB RSS per device "
              f"({report['b']['median_pss_mb_per_device']:.2f} MB PSS); target < 20 MB")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
