"""Whole runs with real processes (cloud, 2 edges, device hosts) on 127.0.0.1."""
import time

import numpy as np
import pytest

from .conftest import SMALL


@pytest.mark.parametrize("algorithm, extra", [
    ("hierfavg", []),
    ("qhetfed", ["train.tau=3", "train.gamma=3", "data.partition=classes", "data.classes_per_device=4"]),
])
def test_algorithm_learns(hfl_testbed, algorithm, extra):
    tb = hfl_testbed(overrides=SMALL + [f"run.algorithm={algorithm}", "run.rounds=4"] + extra)
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    accuracy = [r["accuracy"] for r in rows]
    assert summary["algorithm"] == algorithm and summary["rounds"] == 4
    assert accuracy[-1] > 0.6, accuracy  # chance is 0.1
    assert accuracy[-1] > accuracy[0], accuracy
    assert all(r["devices"] == 6 and r["edges"] == 2 and r["refused"] == 0 for r in rows)
    assert all(r["bytes_up"] > 0 and r["bytes_down"] > 0 for r in rows)
    for key in ("round", "accuracy", "loss", "bytes_up", "bytes_down", "wall_seconds", "train_loss"):
        assert key in rows[0]
    for key in ("final_accuracy", "rounds", "wall_seconds", "algorithm", "seed"):
        assert key in summary
    assert 0 < summary["startup_seconds"] < time.monotonic() - tb.launched  # launch to the first round published
    run = tb.run_dir
    checkpoint = np.load(run / "checkpoint.npz")
    assert int(checkpoint["round"]) == 3 and checkpoint["weights"].shape == (summary["model_parameters"],)
    assert (run / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert "algorithm = \"%s\"" % algorithm in (run / "config.toml").read_text()
    logs = sorted(p.name for p in (run / "logs").glob("*.log"))
    hosts = sorted(f"{name}.log" for name in tb.device_hosts())
    assert hosts and all(h.startswith("devices-") for h in hosts)
    assert logs == sorted(["cloud.log", "edge-000.log", "edge-001.log"] + hosts)


@pytest.mark.fast
def test_same_seed_same_metrics(hfl_testbed):
    runs = []
    for _ in range(2):
        tb = hfl_testbed(overrides=SMALL + ["topology.hosts_per_edge=2", "data.partition=dirichlet"])
        tb.wait(timeout=300)
        runs.append([(r["round"], r["accuracy"], r["loss"], r["train_loss"]) for r in tb.metrics()])
    assert runs[0] == runs[1]
    other = hfl_testbed(overrides=SMALL + ["topology.hosts_per_edge=2", "data.partition=dirichlet", "run.seed=1"])
    other.wait(timeout=300)
    assert [(r["accuracy"], r["loss"]) for r in other.metrics()] != [(a, b) for _, a, b, _ in runs[0]]


def test_payloads_over_grpc_message_cap_are_streamed(hfl_testbed):
    # an MLP on 3x64x64 inputs has 2.46M parameters: 9.8 MB per message, over gRPC's 4 MiB default
    tb = hfl_testbed(overrides=["topology.edges=1", "topology.devices_per_edge=2", "run.rounds=1", "train.tau=1",
                                "train.gamma=2", "model.name=mlp", "data.dataset=synthetic", "data.synthetic_samples=200",
                                "data.synthetic_shape=[3, 64, 64]", "net.chunk_kib=1024"])
    summary = tb.wait(timeout=300)
    assert summary["model_parameters"] == 3 * 64 * 64 * 200 + 200 + 2010
    assert summary["bytes_up"] > 2 * 9.8e6
