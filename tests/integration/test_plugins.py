"""Plugins on real processes: a model, a dataset and a stage registered by examples/tiny_plugin.py are valid names in
`hfl run`'s children, in a Testbed, for roles given only HFL_PLUGINS, and fedavg runs like any algorithm."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from .conftest import SMALL

ROOT = pathlib.Path(__file__).parents[2]
CONFIG = "examples/tiny_plugin.toml"


def hfl(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "hfl.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def test_a_plugin_model_dataset_and_stage_run_end_to_end(tmp_path):
    out = tmp_path / "run"
    result = hfl("run", CONFIG, "--set", "run.rounds=2", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "tiny-mlp" and summary["dataset"] == "blobs" and summary["rounds"] == 2
    assert summary["final_accuracy"] > 0.5 and summary["not_learning"] is None  # four blobs: chance is 25%
    assert 'plugins = ["examples/tiny_plugin.py"]' in (out / "config.toml").read_text()
    hosts = sorted((out / "logs").glob("devices-*.log"))
    assert hosts and all("clip_linf: clipping uploads to [-0.5, 0.5]" in h.read_text() for h in hosts)


def test_a_plugin_in_a_testbed(hfl_testbed):
    cwd = os.getcwd()
    os.chdir(ROOT)  # the config names the plugin file relative to the working directory
    try:
        tb = hfl_testbed(CONFIG, overrides=["run.rounds=2", "run.algorithm=fedavg", "train.local_unit=epochs",
                                            "train.gamma=1"])
        summary = tb.wait(timeout=300)
    finally:
        os.chdir(cwd)
    assert summary["algorithm"] == "fedavg" and summary["model"] == "tiny-mlp" and summary["final_accuracy"] > 0.5


def test_plugin_names_without_the_plugin_are_config_errors_and_hfl_plugins_loads_it():
    bad = hfl("config", "--set", "model.name=tiny-mlp", "--no-data-check")
    assert bad.returncode == 2 and "bad value for model.name: 'tiny-mlp'" in bad.stderr
    good = hfl("config", "--set", "model.name=tiny-mlp", "--set", "data.dataset=blobs",
               "--set", "data.synthetic_samples=500", env={"HFL_PLUGINS": "examples/tiny_plugin.py"})
    assert good.returncode == 0, good.stderr
    shape = hfl("config", "--set", "data.dataset=synthetic", "--set", "data.synthetic_shape=[1, 2, 2]",
                "--set", "data.synthetic_samples=200")
    assert shape.returncode == 2 and "model.name = 'mnist-cnn' does not run on synthetic" in shape.stderr


@pytest.mark.parametrize("algorithm", ["fedavg"])
def test_fedavg_learns(hfl_testbed, algorithm):
    tb = hfl_testbed(overrides=SMALL + [f"run.algorithm={algorithm}", "run.rounds=2"])
    summary = tb.wait(timeout=300)
    assert summary["weights"] == {"edge": "samples", "cloud": "samples"} and summary["final_accuracy"] > 0.5


@pytest.mark.fast
def test_a_plugin_round_mode_runs_on_real_processes(hfl_testbed):
    """examples/sign_vote_mode.py adds a fourth round mode with registrations only: edges settle by sign vote."""
    cwd = os.getcwd()
    os.chdir(ROOT)  # the plugin is named relative to the working directory
    try:
        tb = hfl_testbed(overrides=SMALL + ['run.plugins=["examples/sign_vote_mode.py"]',
                                            "run.algorithm=hierfavg-signvote", "run.rounds=2"])
        summary = tb.wait(timeout=300)
    finally:
        os.chdir(cwd)
    assert summary["algorithm"] == "hierfavg-signvote" and summary["rounds"] == 2
    assert summary["final_accuracy"] > 0.5  # ten classes: chance is 10%
