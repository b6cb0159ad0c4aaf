"""`hfl run` as a user runs it: exit codes, clean-up, and the one-role commands."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

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


def nodes_of(pid: int) -> list[psutil.Process]:
    """A launcher's nodes: its children (HFL_SPAWN=exec) or its forkserver's (fork), named by their argv."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "hfl.cli" in child.cmdline():
                found.append(child)
        except psutil.Error:
            pass
    return found


def described(procs: list[psutil.Process]) -> list[str]:
    """pid, state, parent and argv of each process still there (what a failure needs to say)."""
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.status()} ppid {p.ppid()} {' '.join(p.cmdline())[:200]}")
        except psutil.Error as exc:
            out.append(f"{p.pid} ({exc.__class__.__name__})")
    return out


def test_hfl_run_writes_the_run_directory(tmp_path):
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["run.rounds=2"] for a in ("--set", s)]
    result = hfl("run", *sets, "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final accuracy" in result.stderr
    for name in ("config.toml", "metrics.jsonl", "summary.json", "accuracy.png", "data.json", "data.png", "logs/cloud.log"):
        assert (out / name).exists(), name
    assert leftovers(str(out)) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_learning"] is None
    assert summary["total_seconds"] > summary["startup_seconds"] + summary["wall_seconds"] - 1
    assert f"in {summary['total_seconds']:.1f}s (start-up" in " ".join(result.stderr.split())
    url = (out / "live_url").read_text().strip()  # the live page's URL, printed beside the progress
    assert url.startswith("http://127.0.0.1:") and f"live page: {url}" in result.stderr
    assert (out / "live.html").is_file() and f"live page snapshot: {out / 'live.html'}" in result.stderr

    # --resume of a finished run: says so within seconds and changes nothing
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    t0 = time.monotonic()
    again = hfl("run", "--resume", str(out), timeout=120)
    said = " ".join(again.stderr.split())
    assert again.returncode == 0 and "is a finished run (2 of 2 rounds" in said and "nothing to resume" in said
    assert time.monotonic() - t0 < 30
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_hfl_run_fails_before_launch_when_the_data_is_missing(tmp_path):
    out = tmp_path / "broken"
    # mnist needs data.root: found before any process starts, not by the cloud while loading its test set
    t0 = time.monotonic()
    result = hfl("run", "--set", "data.dataset=mnist", "--set", "net.join_timeout_s=30", "--out", str(out))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "config error: data.dataset = 'mnist'" in result.stderr and "needs data.root" in result.stderr
    assert "Traceback" not in result.stderr and time.monotonic() - t0 < 60
    assert not (out / "logs").exists() and leftovers(str(out)) == []


def test_dpsq_without_epsilon1_fails_in_seconds_naming_it(tmp_path):
    """Issue 22: both edges used to die with the cause only in their logs, and the cloud waited out its join
    timeout (300 s) to say "no edge joined"."""
    out = tmp_path / "dpsq"
    t0 = time.monotonic()
    result = hfl("run", "--set", "run.algorithm=qhetfed", "--set", "pipeline.uplink_encoding=dpsq", "--out", str(out),
                 timeout=120)
    assert result.returncode == 2 and "epsilon1 is required" in result.stderr, result.stderr[-2000:]
    assert time.monotonic() - t0 < 60 and "Traceback" not in result.stderr
    assert leftovers(str(out)) == []


def test_config_and_sweep_dry_run_check_codec_parameters(tmp_path):
    result = hfl("config", "--set", "pipeline.uplink_encoding=qsgd", "--set", "pipeline.params.qsgd.s=4")
    assert result.returncode == 2 and "unknown parameter(s) ['s']; allowed: levels" in result.stderr
    assert "Traceback" not in result.stderr
    result = hfl("config", "--set", "topology.devices_per_edge=3000")
    assert result.returncode == 2 and "training samples: use fewer devices" in result.stderr
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "bad"\nseeds = [0]\n[base]\n"pipeline.uplink_encoding" = "qsgd"\n'
                    '"pipeline.params.qsgd.s" = 4\n')
    result = hfl("sweep", str(spec), "--dry-run", "--out", str(tmp_path / "sw"))
    assert result.returncode == 2 and "allowed: levels" in result.stderr, result.stderr[-2000:]
    spec.write_text('name = "big"\nseeds = [0]\n[base]\n"topology.devices_per_edge" = 3000\n')
    result = hfl("sweep", str(spec), "--dry-run", "--out", str(tmp_path / "sw2"))
    assert result.returncode == 2 and "use fewer devices" in " ".join(result.stderr.split())


def test_a_node_that_dies_during_start_up_stops_the_run_at_once(tmp_path):
    """A device host that cannot start (here: a bad argument) is named with its exit code and error line, and the
    others are stopped, instead of the cloud waiting out its join timeout."""
    from hfl.testbed import Testbed, TestbedError

    bed = Testbed(None, SMALL + ["net.join_timeout_s=300"], run_dir=tmp_path / "r", tolerate_failures=True,
                  extra_args={"devices-c0": ["--wait", "soon"]})
    t0 = time.monotonic()
    try:
        bed.start()
        with pytest.raises(TestbedError) as err:
            bed.wait(timeout=120)
    finally:
        bed.close()
    first = str(err.value).splitlines()[0]
    assert first.startswith("devices-c0 exited with 2 during start-up: ") and "invalid float value: 'soon'" in first
    assert "stopped the other processes" in first and time.monotonic() - t0 < 60
    assert bed.running() == [] and leftovers(str(tmp_path / "r")) == []


def test_config_errors_exit_2_with_the_key(tmp_path):
    result = hfl("run", "--set", "train.lr=fast", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "train.lr must be a number" in result.stderr
    result = hfl("cloud", "--set", "train.unknown=1", "--run-dir", str(tmp_path / "y"))
    assert result.returncode == 2 and "unknown key 'train.unknown'" in result.stderr


def test_an_edge_process_of_several_edges_refuses_what_they_cannot_share():
    base = ["edge", "--id", "0", "--id", "edge-001", "--cloud", "127.0.0.1:1", "--wait", "1"]
    for extra, says in [(["--listen", "127.0.0.1:50061"], "--listen 127.0.0.1:50061: with several --id each edge binds "
                                                          "its own port; give port 0"),
                        (["--listen", "127.0.0.1:0", "--port-file", "p"], "--port-file needs {id}"),
                        (["--id", "1", "--listen", "127.0.0.1:0"], "an edge id given twice in edge-000, edge-001, edge-001")]:
        result = hfl(*base, *extra, timeout=60)
        assert result.returncode != 0 and says in result.stderr, (extra, result.stderr[-500:])


def test_version_and_help():
    assert hfl("--version").stdout.startswith("hfl ")
    usage = hfl("--help").stdout
    for command in ("run", "sweep", "cloud", "edge", "devices", "config", "certs", "health", "attack", "audit", "plan"):
        assert f"hfl {command}" in usage, command


def test_an_upstream_not_there_yet_is_one_line_and_a_retry(tmp_path):
    result = hfl("edge", "--id", "edge-000", "--listen", "127.0.0.1:0", "--cloud", "127.0.0.1:1", "--wait", "2")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "cloud 127.0.0.1:1 not there yet (UNAVAILABLE): retrying for up to 2s" in result.stderr
    assert "ERROR cloud 127.0.0.1:1 not SERVING after 2s" in result.stderr
    result = hfl("devices", "--edge", "127.0.0.1:1", "--wait", "2")
    assert result.returncode == 1 and "Traceback" not in result.stderr and "not there yet" in result.stderr


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

    from hfl.testbed import TestbedError

    tb = hfl_testbed(overrides=SMALL + ["run.rounds=8"])
    next(tb.iter_metrics(timeout=300))
    with pytest.raises(TestbedError, match="no node 'devices-001-0' in this testbed; nodes: cloud, edge-000, edge-001, "
                                           "devices-c"):
        tb.kill("devices-001-0")
    assert [check_health_sync(a) for a in [tb.cloud_address, *tb.edge_addresses]] == ["SERVING"] * 3
    tb.wait(timeout=300)


def test_hfl_certs_devices_issues_a_certificate_per_device_once(tmp_path):
    assert hfl("certs", "init", "--dir", str(tmp_path)).returncode == 0
    first = hfl("certs", "devices", "--edges", "2", "--devices-per-edge", "3", "--dir", str(tmp_path))
    manifest = tmp_path / "devices" / "edges-2x3.json"
    assert first.returncode == 0 and f"{manifest}: 6 devices of 2 edges, a certificate each (6 issued, 0 kept)" in first.stdout
    again = hfl("certs", "devices", "--edges", "2", "--devices-per-edge", "3", "--dir", str(tmp_path))
    assert "(0 issued, 6 kept)" in again.stdout
    assert json.loads(manifest.read_text())["edges"] == {"edge-000": ["dev-00000..dev-00002"], "edge-001": ["dev-00003..dev-00005"]}
    shown = hfl("certs", "show", str(tmp_path / "devices" / "dev-00004.pem"))
    assert "CN=dev-00004,OU=device,O=hfl" in shown.stdout


@pytest.mark.parametrize("layout", ["per_core", "per_edge"])
def test_hfl_run_over_mutual_tls(tmp_path, layout):
    out, pki = tmp_path / "run", tmp_path / "pki"
    sets = [a for s in SMALL + ["run.rounds=2", f"topology.host_layout={layout}", "topology.device_hosts=3"]
            for a in ("--set", s)]
    result = hfl("run", *sets, "--out", str(out), "--certs", str(pki), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] > 0.5 and summary["refused"] == 0
    for name in ("cloud", "edge-001"):
        assert f"transport: mutual TLS with {pki / 'nodes' / name}.pem" in (out / "logs" / f"{name}.log").read_text()
    if layout == "per_edge":  # one certificate naming the host's devices
        assert (pki / "nodes" / "devices-001-0.pem").exists()
        assert f"transport: mutual TLS with {pki / 'nodes' / 'devices-001-0'}.pem" in (out / "logs" / "devices-001-0.log").read_text()
        return
    # per core: every device its own certificate, issued once into DIR/devices, and hosts holding devices of both edges
    manifest = pki / "devices" / "edges-2x3.json"
    assert sorted(p.name for p in (pki / "devices").glob("*.pem")) == [f"dev-{g:05d}.pem" for g in range(6)]
    logs = [(out / "logs" / f"devices-c{h}.log").read_text() for h in range(3)]
    assert all(f"transport: mutual TLS, a certificate per device ({manifest})" in log for log in logs)
    assert "2 devices (dev-00002..dev-00003) of 2 edge(s)" in logs[1]


def test_sigterm_stops_every_process(tmp_path):
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["run.rounds=50"] for a in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "run", *sets, "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(str(out)), "the testbed should be running"
    while not (out / "checkpoint.npz").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopping every process" in err
    assert f"hfl run --resume {out}" in " ".join(err.split())  # the exact command that continues the run
    assert leftovers(str(out)) == []


def test_nodes_die_with_a_killed_launcher(tmp_path):
    """Nodes arm PR_SET_PDEATHSIG themselves (hfl.testbed.die_with_parent; no preexec_fn, see its docstring):
    kill -9 of `hfl run` must not leave a cloud, edge or device host behind."""
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "run", "--quiet", "--set", "run.rounds=50",
                             "--out", str(tmp_path / "r")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(nodes_of(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        nodes = nodes_of(proc.pid)
        assert len(nodes) >= 4, "the launcher did not start its nodes"
    finally:
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs(nodes, timeout=30)
    assert not alive, f"nodes outlived the launcher: {described(alive)}"


def test_interrupt_then_resume_without_refusals(tmp_path):
    """Ctrl-C (SIGTERM) prints the resume command; the resumed run's edges register with rejoin, so its first round
    shows no refusals of its own nodes, and it ends with every round."""
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["run.rounds=5"] for a in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "run", *sets, "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        rows = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        if len(rows) >= 2 and (out / "checkpoint.npz").exists():
            break
        time.sleep(0.1)
    proc.terminate()
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # a second Ctrl-C while it stops: a line, not a traceback
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and f"hfl run --resume {out}" in " ".join(err.split()), err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    result = hfl("run", "--resume", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["resumed"] is True and summary["rounds"] == 5 and [r["round"] for r in rows] == list(range(5))
    assert [r["refused"] for r in rows] == [0] * 5 and summary["refused"] == 0
    assert leftovers(str(out)) == []
