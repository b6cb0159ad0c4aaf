"""Full Fashion-MNIST from the Debian package (issue 19): `hfl run --set data.dataset=fashion-mnist` with no
data.root learns, and leaves data.json and data.png; without the files the run stops before launch naming the
package and data.root. The package is installed in the set-up when this machine can (root and apt-get), as the
e2e tests install Docker; otherwise the learning test skips and says why."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from .conftest import SMALL

PACKAGE = "dataset-fashion-mnist"
FOLDER = pathlib.Path("/usr/share/datasets/fashion-mnist")


def hfl(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "hfl.cli", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


@pytest.fixture(scope="module")
def fashion_mnist():
    if os.environ.get("HFL_DATASETS"):
        pytest.skip("HFL_DATASETS is set: this test checks the Debian package's folder")
    if not (FOLDER / "train-images-idx3-ubyte.gz").exists():
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.skip(f"{PACKAGE} is not installed and cannot be installed here (needs root and apt-get)")
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", PACKAGE]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(install, capture_output=True, env=env, timeout=600).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=600)
            result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
            if result.returncode != 0:
                pytest.skip(f"apt-get install {PACKAGE} failed: {result.stderr.strip().splitlines()[-1:]}")
    return FOLDER


def test_fashion_mnist_without_root_learns_and_reports_its_data(fashion_mnist, tmp_path):
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["data.dataset=fashion-mnist", "data.partition=edge-classes", "data.classes_per_edge=6",
                                "data.classes_per_device=3", "data.max_test_samples=2000"] for a in ("--set", s)]
    result = hfl("run", *sets, "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "fashion-mnist"
    assert summary["final_accuracy"] > 0.45, summary["final_accuracy"]  # chance 0.10; 0.56-0.57 seen (seed 0, 3 rounds)
    report = json.loads((out / "data.json").read_text())
    assert sum(d["samples"] for d in report["devices"]) == sum(e["samples"] for e in report["edges"]) <= 60_000
    assert [e["classes_held"] for e in report["edges"]] == [6, 6]  # cluster-level skew as configured
    assert all(sum(1 for n in d["labels"] if n) == 3 for d in report["devices"])
    assert (out / "data.png").read_bytes()[:4] == b"\x89PNG"


def test_missing_files_name_the_package_and_data_root(tmp_path):
    out = tmp_path / "broken"
    env = dict(os.environ, HFL_DATASETS=str(tmp_path / "empty"))
    result = hfl("run", "--set", "data.dataset=fashion-mnist", "--set", "net.join_timeout_s=30", "--out", str(out),
                 env=env, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    text = " ".join(result.stderr.split())
    assert f"apt-get install {PACKAGE}" in text and "data.root" in text and "Traceback" not in text
    assert not (out / "logs").exists()
