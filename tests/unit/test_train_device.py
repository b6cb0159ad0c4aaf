"""train.device (CPU, or a GPU where there is one) and the GPUs a cluster run reserves (hfl/cluster.py gpus_per_host).

This machine has no GPU: the CUDA path itself is not run here (docs/cluster.md says so); what is checked is the key,
`auto` resolving to the CPU, `cuda` refused before a run starts, the CPU path unchanged, and the reservations."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import pathlib

import numpy as np
import pytest
import torch

from hfl import cluster as cluster_mod
from hfl import cluster_spread
from hfl import families  # noqa: F401  (the config's family sections)
from hfl.common import config as config_mod
from hfl.common.config import ConfigError
from hfl.common.models import build, get_flat, init_parameters, torch_device
from hfl.common.seeding import torch_generator
from hfl.device_client.trainer import Trainer
from hfl.device_client.training import local_sgd, make_shard, minibatch_gradient, smoothness
from hfl.preflight import devices_elsewhere, preflight

ROOT = pathlib.Path(__file__).resolve().parents[2]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def test_the_key_takes_cpu_auto_cuda_and_defaults_to_cpu():
    assert config_mod.load(None).train.device == "cpu"
    for value in ("cpu", "auto", "cuda"):
        assert config_mod.load(None, [f"train.device={value}"]).train.device == value
    with pytest.raises(ConfigError, match="train.device: 'gpu'; allowed: cpu, auto, cuda"):
        config_mod.load(None, ["train.device=gpu"])


@no_cuda
def test_auto_is_the_cpu_here_and_cuda_is_refused_naming_the_key():
    assert torch_device("auto", 3) == torch_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match='^train.device = "cuda" but torch sees no CUDA GPU on this machine'):
        torch_device("cuda")
    cfg = config_mod.load(None, ["train.device=cuda", "topology.devices_per_edge=2"])
    with pytest.raises(ConfigError, match='^train.device = "cuda"'):
        preflight(cfg)
    with devices_elsewhere():  # a --cluster run: the nodes' GPUs are checked there, not here
        preflight(cfg)
    with pytest.raises(ConfigError, match='^train.device = "cuda"'):  # and only within
        preflight(cfg)
    with pytest.raises(ConfigError, match='^train.device = "cuda"'):  # a host started without CUDA
        Trainer.placed(build("linear", (1, 8, 8), 10), None, cfg, 0)


def _shard(n=48):
    rng = np.random.default_rng(0)
    return make_shard(rng.integers(0, 256, (n, 1, 8, 8)).astype(np.uint8), rng.integers(0, 10, n), (0.5,), (0.25,))


def _train(cfg) -> list[np.ndarray]:
    """A host's trainer placed by `cfg`: local SGD, a gradient and a smoothness estimate, as the phases call them."""
    model = build("mlp", (1, 8, 8), 10)
    init_parameters(model, torch_generator(0, "cloud", 0))
    trainer = Trainer.placed(model, concurrent.futures.ThreadPoolExecutor(1), cfg, 0)
    assert next(trainer.model.parameters()).device.type == "cpu" and trainer.model is model  # not moved
    w0, s = get_flat(model), _shard()
    w1, loss, _ = local_sgd(trainer.model, w0, s, 0.1, 16, torch_generator(1, "device", 0), steps=4)
    grad, gloss = minibatch_gradient(trainer.model, w1, s, 16, torch_generator(1, "device", 1))
    beta = smoothness(trainer.model, w0, w1, s, 16, torch_generator(1, "device", 2))
    return [w1, np.float64(loss), grad, np.float64(gloss), np.float64(beta)]


def test_the_cpu_path_is_the_same_floats_with_the_key_explicit_or_auto_here():
    default = _train(config_mod.load(None))
    for value in ("cpu",) + (() if torch.cuda.is_available() else ("auto",)):
        got = _train(config_mod.load(None, [f"train.device={value}"]))
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, default))


def test_a_run_with_the_key_explicit_has_the_default_runs_metrics(hfl_testbed):
    sets = ["run.rounds=2", "topology.edges=1", "topology.devices_per_edge=2", "topology.device_hosts=1",
            "model.name=mlp", "data.max_test_samples=200"]
    rows = []
    for extra in ([], ["train.device=cpu"]):
        bed = hfl_testbed(overrides=sets + extra)
        bed.wait(timeout=300)
        rows.append([{k: v for k, v in json.loads(line).items() if "seconds" not in k}
                     for line in (bed.run_dir / "metrics.jsonl").read_text().splitlines()])
    assert len(rows[0]) == 2 and rows[0] == rows[1]


# ---- what a cluster run reserves -----------------------------------------------------------------------
def test_gpus_per_host_is_a_fraction_of_one_gpu_or_whole_gpus():
    assert cluster_mod.check_table({"gpus_per_host": 0.25}, "[cluster]") == {"gpus_per_host": 0.25}
    assert cluster_mod.check_table({"cpus": 4, "gpus_per_host": 2}, "[cluster]")["gpus_per_host"] == 2
    for bad in (1.5, 0, -0.5, True, "1"):
        with pytest.raises(cluster_mod.ClusterError, match="gpus_per_host"):
            cluster_mod.check_table({"gpus_per_host": bad}, "[cluster]")
    with pytest.raises(cluster_mod.ClusterError, match="a fraction in \\(0, 1\\] .* or a whole number of GPUs, got 1.5"):
        cluster_mod.check_gpus(1.5, "--gpus-per-host")
    with pytest.raises(cluster_mod.ClusterError, match="unknown key 'gpus' in \\[cluster\\]; allowed keys: cpus, memory_gb, gpus_per_host"):
        cluster_mod.check_table({"gpus": 1}, "[cluster]")


def test_a_runs_gpus_are_its_hosts_times_gpus_per_host_whole_above_one():
    assert cluster_mod.gpus_needed(4, 0.25) == 1.0  # four hosts share one GPU
    assert cluster_mod.gpus_needed(1, 0.25) == 0.25
    assert cluster_mod.gpus_needed(6, 0.25) == 2.0  # 1.5 GPUs: Ray takes whole ones above one
    assert cluster_mod.gpus_needed(2, 2) == 4.0
    assert cluster_mod.gpus_needed(3, 0.0) == 0.0


SPEC = """\
name = "gpu"
config = "{root}/deploy/configs/default.toml"
seeds = [0]
[base]
"topology.edges" = 2
"topology.devices_per_edge" = 2
"topology.device_hosts" = 4
[variants.cpu]
"train.device" = "cpu"
[variants.cuda]
"train.device" = "cuda"
"cluster.gpus_per_host" = 0.5
[cluster]
gpus_per_host = 0.25
"""


def test_the_reservations_of_a_spec_and_what_the_nodes_must_have(tmp_path):
    from hfl import sweep

    parsed = sweep.parse_spec(SPEC.format(root=ROOT), tmp_path / "s.toml")
    runs = {r.cell: r for r in sweep.expand(parsed, tmp_path / "out")}
    reserved = {cell: cluster_mod.resources(r, parsed.cluster) for cell, r in runs.items()}
    assert reserved == {"cpu": {"cpus": 7.0, "memory_gb": 3.5, "gpus": 1.0},  # 4 hosts x 0.25
                        "cuda": {"cpus": 7.0, "memory_gb": 3.5, "gpus": 2.0}}  # its variant: 4 hosts x 0.5
    node = {"name": "a", "cpus": 8.0, "memory_gb": 16.0}
    cluster_mod.check_fits(list(runs.values()), parsed.cluster, {"a": {**node, "gpus": 2.0}})
    with pytest.raises(cluster_mod.ClusterError, match="cell cuda: a run reserves 2 GPUs \\(gpus_per_host = 0.5 for "
                                                       "each device host\\), more than any node has \\(at most 1\\)"):
        cluster_mod.check_fits(list(runs.values()), parsed.cluster, {"a": {**node, "gpus": 1.0}, "b": node})
    with pytest.raises(cluster_mod.ClusterError, match='cell cuda: train.device = "cuda" needs GPUs reserved'):
        bare = dataclasses.replace(runs["cuda"], resources=None)  # no gpus_per_host anywhere
        cluster_mod.check_fits([bare], {}, {"a": {**node, "gpus": 2.0}})
    with pytest.raises(cluster_mod.ClusterError, match="4 device hosts need 2 GPUs, 0.5 on one node; the cluster has 1"):
        cluster_spread.check_gpu_fit({"a": {**node, "gpus": 1.0}}, 4, 0.5)  # a spread run (hfl run --cluster)
    cluster_spread.check_gpu_fit({"a": {**node, "gpus": 1.0}, "b": {**node, "gpus": 1.0}}, 4, 0.5)
