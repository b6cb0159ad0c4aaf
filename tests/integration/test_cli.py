"""`hfl run` as a user runs it: exit codes, clean-up, and the one-role commands."""
import json
import os
import time
import subprocess
import sys

import psutil

from .conftest import SMALL


def hfl(*args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, "-m", "hfl.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, stdin=subprocess.DEVNULL)


def leftovers(marker: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if marker in cmd and proc.pid != os.getpid():
            found.append(cmd)
    return found


def test_hfl_run_writes_the_run_directory(tmp_path):
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["run.rounds=2"] for a in ("--set", s)]
    result = hfl("run", *sets, "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final accuracy" in result.stderr
    for name in ("config.toml", "metrics.jsonl", "summary.json", "accuracy.png", "logs/cloud.log"):
        assert (out / name).exists(), name
    assert leftovers(str(out)) == []


def test_hfl_run_fails_loudly_and_leaves_no_process(tmp_path):
    out = tmp_path / "broken"
    # mnist needs data.root: the cloud fails while loading its test set
    result = hfl("run", "--set", "data.dataset=mnist", "--set", "net.join_timeout_s=30", "--out", str(out))
    assert result.returncode == 1
    assert "cloud" in result.stderr and "needs data.root" in result.stderr
    assert leftovers(str(out)) == []


def test_config_errors_exit_2_with_the_key(tmp_path):
    result = hfl("run", "--set", "train.lr=fast", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "train.lr must be a number" in result.stderr
    result = hfl("cloud", "--set", "train.unknown=1", "--run-dir", str(tmp_path / "y"))
    assert result.returncode == 2 and "unknown key 'train.unknown'" in result.stderr


def test_health_probe_of_a_dead_address():
    result = hfl("health", "127.0.0.1:1", "--timeout", "1")
    assert result.returncode == 1 and "127.0.0.1:1" in result.stderr


def test_edge_is_not_serving_until_it_joined_a_cloud(tmp_path):
    port_file = tmp_path / "edge.port"
    edge = subprocess.Popen([sys.executable, "-m", "hfl.cli", "edge", "--id", "edge-000", "--listen", "127.0.0.1:0",
                             "--cloud", "127.0.0.1:1", "--port-file", str(port_file), "--wait", "60"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        result = hfl("health", f"127.0.0.1:{port_file.read_text().strip()}")
        assert result.returncode == 1 and "NOT_SERVING" in result.stdout
    finally:
        edge.kill()
        edge.wait()


def test_servers_report_serving_during_a_run(hfl_testbed):
    from hfl.common.rpc import check_health_sync

    tb = hfl_testbed(overrides=SMALL + ["run.rounds=8"])
    next(tb.iter_metrics(timeout=300))
    assert [check_health_sync(a) for a in [tb.cloud_address, *tb.edge_addresses]] == ["SERVING"] * 3
    tb.wait(timeout=300)


def test_hfl_run_over_mutual_tls(tmp_path):
    out, pki = tmp_path / "run", tmp_path / "pki"
    sets = [a for s in SMALL + ["run.rounds=2"] for a in ("--set", s)]
    result = hfl("run", *sets, "--out", str(out), "--certs", str(pki), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (pki / "ca.pem").exists() and (pki / "nodes" / "devices-001-0.pem").exists()
    assert json.loads((out / "summary.json").read_text())["final_accuracy"] > 0.5
    for name in ("cloud", "edge-001", "devices-001-0"):
        assert f"transport: mutual TLS with {pki / 'nodes' / name}.pem" in (out / "logs" / f"{name}.log").read_text()


def test_sigterm_stops_every_process(tmp_path):
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["run.rounds=50"] for a in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "run", *sets, "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(str(out)), "the testbed should be running"
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopping every process" in err
    assert leftovers(str(out)) == []


def test_nodes_die_with_a_killed_launcher(tmp_path):
    """Nodes arm PR_SET_PDEATHSIG themselves (hfl.testbed.die_with_parent; no preexec_fn, see its docstring):
    kill -9 of `hfl run` must not leave a cloud, edge or device host behind."""
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "run", "--quiet", "--set", "run.rounds=50",
                             "--out", str(tmp_path / "r")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(psutil.Process(proc.pid).children()) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        nodes = psutil.Process(proc.pid).children()
        assert len(nodes) >= 4, "the launcher did not start its nodes"
    finally:
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs(nodes, timeout=30)
    assert not alive, f"nodes outlived the launcher: {[p.pid for p in alive]}"
