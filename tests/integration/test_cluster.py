"""`hfl sweep --cluster` and `hfl run --cluster` on a real two-node Ray cluster on this machine (hfl/cluster.py,
hfl/cluster_spread.py; docs/cluster.md).

The cluster lives in a network namespace of the test's own with only `lo` (`unshare -n`), so every Ray address is
127.0.0.1 (Ray otherwise binds the host's interface address): a head and a second node started by `ray start
--address`, each with its own temp dir and a custom resource (hfl_node_a, hfl_node_b), so that where a run ran is
observable in its node.json. The sweep's driver runs in the namespace too (nsenter). Every process the tests start
is in that namespace, and the teardown stops each one by its PID (never `ray stop`, which stops every Ray process of
the machine by name) and checks that none is left. Skipped where Ray (the `cluster` extra) is not installed or
`unshare -n` is not allowed.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from hfl import cluster as cluster_mod
from hfl import cluster_loopback as loopback
from hfl.cluster_spread import STOP_BUDGET_S

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAD = loopback.LOOPBACK_HEAD

TINY = """\
name = "tiny"
config = "{root}/deploy/configs/default.toml"
seeds = [0, 1]
[base]
"run.rounds" = {rounds}
"topology.edges" = 1
"topology.devices_per_edge" = 2
"topology.device_hosts" = 1
"model.name" = "mlp"
"data.max_test_samples" = 200
"net.phase_timeout_s" = 60
"net.join_timeout_s" = 120
[grid]
"train.lr" = [0.05, 0.1]
[cluster]
cpus = {cpus}
memory_gb = 0.5
[report]
fields = ["final_accuracy", "best_accuracy", "bytes_up"]
curves = ["accuracy"]
x = ["round"]
"""


def spec(tmp_path, rounds=1, cpus=1, name="tiny.toml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(TINY.format(root=ROOT, rounds=rounds, cpus=cpus))
    return path


def hfl_sweep(*args, ns: int | None = None, timeout=600, env=None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hfl.cli", "sweep", *map(str, args), "--quiet"]
    return subprocess.run((["nsenter", "-t", str(ns), "-n"] if ns else []) + argv, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


# ---- without a cluster -----------------------------------------------------------------------------
def test_ray_is_imported_by_the_cluster_modules_only():
    importers = [p.relative_to(ROOT).as_posix() for folder in ("hfl", "common", "cloud_server", "edge_server",
                                                                  "device_client")
                 for p in (ROOT / folder).rglob("*.py")
                 if any(line.strip().startswith(("import ray", "from ray")) for line in p.read_text().splitlines())]
    assert sorted(importers) == ["hfl/cluster.py", "hfl/cluster_spread.py"]
    code = ("import sys, hfl.sweep, hfl.cli, hfl.cluster, hfl.cluster_spread, hfl.cluster_loopback; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"  # a local sweep, `hfl run` and the CLI never load Ray


def test_bad_input_is_one_line_before_anything_starts(tmp_path):
    good = spec(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace("cpus = 1", "cpu = 1"))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cases = {(bad, "127.0.0.1:1"): "sweep spec error: unknown key 'cpu' in [cluster]; allowed keys: cpus, memory_gb",
             (good, "127.0.0.1:1"): "cluster error: --cluster 127.0.0.1:1: cannot reach a Ray head there",
             (good, "auto"): "cluster error: --cluster auto: RAY_ADDRESS is not set"}
    for (path, address), message in cases.items():
        done = hfl_sweep(path, "--out", out, "--cluster", address, env=env, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    no_ray = ("import sys; sys.modules['ray'] = None; from hfl.cli import main; "
              f"sys.argv = ['hfl', 'sweep', {str(good)!r}, '--out', {str(out)!r}, '--cluster', '127.0.0.1:1']; "
              "sys.exit(main())")
    done = subprocess.run([sys.executable, "-c", no_ray], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == ('cluster error: --cluster needs Ray, which is not installed: pip install -e '
                                   '".[cluster]" (the `cluster` extra)')
    assert not out.exists()
    runs = {("--resume", str(tmp_path), "--cluster", "127.0.0.1:1"):
            f"cluster error: --resume {tmp_path}: no config.toml there (not a run directory)",
            ("--set", "train.device=cuda", "--cluster", "127.0.0.1:1"): 'cluster error: --cluster: train.device = '
            '"cuda" needs GPUs reserved on the cluster: set gpus_per_host',
            ("--gpus-per-host", "1"): "config error: --gpus-per-host reserves GPUs on a Ray cluster: give --cluster too"}
    for args, message in runs.items():
        done = subprocess.run([sys.executable, "-m", "hfl.cli", "run", *args, "--certs", str(tmp_path / "ca")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "ca").exists()  # nothing issued before the cluster is reached
    over = tmp_path / "over.toml"
    over.write_text(good.read_text().replace('[grid]', '[variants.big]\n"cluster.cpus" = 0\n[grid]'))
    done = hfl_sweep(over, "--out", out, "--dry-run", timeout=120)
    assert done.returncode == 2 and "(variants.big): cluster.* cpus must be a positive number" in done.stderr, done.stderr


def test_what_a_run_reserves_spec_table_per_run_override_or_topology(tmp_path):
    from hfl import sweep

    text = spec(tmp_path).read_text().replace('[grid]', '[variants.big]\n"cluster.cpus" = 3\n[variants.small]\n'
                                                          '"run.rounds" = 1\n[grid]')
    parsed = sweep.parse_spec(text, tmp_path / "s.toml")
    runs = sweep.expand(parsed, tmp_path / "out")
    reserved = {r.cell: cluster_mod.resources(r, parsed.cluster) for r in runs}
    assert reserved["big,train.lr=0.05"] == {"cpus": 3.0, "memory_gb": 0.5, "gpus": 0.0}  # the variant's override
    assert reserved["small,train.lr=0.05"] == {"cpus": 1.0, "memory_gb": 0.5, "gpus": 0.0}  # the spec's [cluster]
    assert all("cluster" not in r.config.__dict__ for r in runs)  # never a config key
    bare = sweep.parse_spec(text.split("[cluster]")[0] + "[report]" + text.split("[report]")[1], tmp_path / "s.toml")
    derived = cluster_mod.resources(sweep.expand(bare, tmp_path / "out2")[0], bare.cluster)
    assert derived == {"cpus": 3.0, "memory_gb": 1.5, "gpus": 0.0}  # cloud + one edge + one device host, 0.5 GiB each


# ---- a two-node cluster on 127.0.0.1 -------------------------------------------------------------------
def _raylet_of(holder: int, temp_dir: pathlib.Path) -> int:
    for pid in loopback.namespace_pids(holder):
        try:
            argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"/raylet") and any(str(temp_dir).encode() in a for a in argv):
            return pid
    raise AssertionError(f"no raylet with temp dir {temp_dir}")


def _need_loopback() -> None:
    """Skip where Ray or a loopback-only namespace (`unshare -n`) is missing."""
    pytest.importorskip("ray", reason='Ray is not installed: pip install -e ".[cluster]"')
    reason = loopback.loopback_unavailable()
    if reason:
        pytest.skip(reason)


@contextlib.contextmanager
def netns():
    """A loopback-only network namespace (hfl.cluster_loopback.loopback_namespace: every process in it stopped by PID on
    leaving, none left)."""
    _need_loopback()
    with loopback.loopback_namespace() as ns:
        yield ns


@pytest.fixture(scope="module")
def cluster():
    _need_loopback()
    with loopback.two_node_cluster() as started:
        yield started


def _without_timing(result: dict) -> dict:
    """results.json less what differs between any two sweeps of a spec: the provenance, the run times, the paths."""
    out = {k: v for k, v in result.items() if k not in ("provenance", "spec")}
    out["cells"] = [{**{k: v for k, v in c.items() if k not in ("timing", "runs")},
                     "runs": [{k: v for k, v in r.items() if k != "run_dir"} for r in c["runs"]]} for c in result["cells"]]
    return out


def _nodes_used(out: pathlib.Path) -> dict[str, dict]:
    return {p.parent.relative_to(out).as_posix(): json.loads(p.read_text()) for p in sorted(out.glob("*/seed-*/node.json"))}


def test_a_sweep_runs_on_both_nodes_and_equals_a_local_sweep(cluster, tmp_path):
    path = spec(tmp_path)
    over = tmp_path / "over.toml"
    over.write_text(path.read_text().replace("cpus = 1", "cpus = 3"))
    done = hfl_sweep(over, "--out", tmp_path / "x", "--cluster", HEAD, ns=cluster["ns"], timeout=180)
    assert done.returncode == 2 and "a run reserves 3 CPUs, more than any node has (at most 1)" in done.stderr
    dry = hfl_sweep(path, "--out", tmp_path / "remote", "--cluster", HEAD, "--dry-run", ns=cluster["ns"], timeout=180)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "2 nodes" in dry.stderr and dry.stderr.count("1 CPU, 0.5 GiB") == 4 and "estimate:" in dry.stderr

    t0 = time.monotonic()
    remote = hfl_sweep(path, "--out", tmp_path / "remote", "--cluster", HEAD, ns=cluster["ns"])
    remote_s = time.monotonic() - t0
    assert remote.returncode == 0, remote.stderr[-3000:]
    t0 = time.monotonic()
    local = hfl_sweep(path, "--out", tmp_path / "local", "--jobs", "2")
    local_s = time.monotonic() - t0
    assert local.returncode == 0, local.stderr[-3000:]
    nodes = _nodes_used(tmp_path / "remote")
    assert len(nodes) == 4
    print(f"two-node sweep {remote_s:.1f} s, local --jobs 2 {local_s:.1f} s; nodes: "
          + ", ".join(f"{run} {n['custom_resources']}" for run, n in nodes.items()))
    assert {tuple(n["custom_resources"]) for n in nodes.values()} == {("hfl_node_a",), ("hfl_node_b",)}
    assert all(n["attempt"] == 1 and n["ip"] == "127.0.0.1" for n in nodes.values())
    got = json.loads((tmp_path / "remote" / "results.json").read_text())
    want = json.loads((tmp_path / "local" / "results.json").read_text())
    assert _without_timing(got) == _without_timing(want)
    placed = got["provenance"]["cluster"]
    assert placed["address"] == HEAD and sum(placed["runs_per_node"].values()) == 4 and len(placed["runs_per_node"]) == 2
    assert "Ray cluster 127.0.0.1:6379: runs per node" in (tmp_path / "remote" / "results.md").read_text()

    again = hfl_sweep(path, "--out", tmp_path / "remote", "--cluster", HEAD, ns=cluster["ns"])
    assert again.returncode == 0 and "0 to run, 4 already finished" in again.stderr, again.stderr[-3000:]


RUN = ["run.rounds=2", "topology.edges=2", "topology.devices_per_edge=2", "topology.device_hosts=2", "model.name=mlp",
       "data.max_test_samples=200"]
TIMES = ("wall_seconds", "round_seconds", "eval_seconds")  # wall-clock figures: never equal between two runs


def hfl_run(out, *args, ns: int | None = None, rounds: int = 2) -> subprocess.CompletedProcess:
    sets = [a for s in RUN for a in ("--set", s)] + ["--set", f"run.rounds={rounds}"]
    argv = [sys.executable, "-m", "hfl.cli", "run", str(ROOT / "deploy/configs/default.toml"), *sets, "--out", str(out),
            "--quiet", *args]
    return subprocess.run((["nsenter", "-t", str(ns), "-n"] if ns else []) + argv, cwd=ROOT, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def _rows(out: pathlib.Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMES}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_one_testbed_spread_over_both_nodes_under_mutual_tls_equals_a_local_run(cluster, tmp_path):
    ca = tmp_path / "ca"
    spread = hfl_run(tmp_path / "spread", "--cluster", HEAD, "--certs", ca, ns=cluster["ns"])
    assert spread.returncode == 0, spread.stderr[-3000:]
    local = hfl_run(tmp_path / "local")
    assert local.returncode == 0, local.stderr[-3000:]
    placed = json.loads((tmp_path / "spread" / "placement.json").read_text())
    assert sorted(placed) == ["cloud", "devices-c0", "devices-c1", "edge-000", "edge-001"]
    assert {placed[e]["node_id"] for e in ("edge-000", "edge-001")} - {placed["cloud"]["node_id"]}  # an edge elsewhere
    assert len({p["node_id"] for p in placed.values()}) == 2
    assert sorted(p.name for p in (tmp_path / "spread" / "logs").glob("*.log")) == [f"{n}.log" for n in sorted(placed)]
    rows = [_rows(tmp_path / d) for d in ("spread", "local")]
    assert len(rows[0]) == 2 and rows[0] == rows[1]
    assert json.loads((tmp_path / "spread" / "summary.json").read_text())["final_accuracy"] == \
        json.loads((tmp_path / "local" / "summary.json").read_text())["final_accuracy"]
    # mutual TLS as a local --certs run's: the CA and every node's certificate in DIR, each shipped to its role's node
    assert (ca / "ca.pem").is_file() and (ca / "nodes" / "cloud.pem").is_file() and (ca / "devices").is_dir()
    assert not list((tmp_path / "spread").rglob("*.key"))  # no private key comes back


def test_a_spread_run_interrupted_with_ctrl_c_resumes_over_the_cluster(cluster, tmp_path):
    ca = tmp_path / "ca"
    # interrupted once its first round is in (the cloud held with SIGSTOP, then Ctrl-C to the driver), resumed
    # over the cluster: every round once, the same model as the uninterrupted local run (what a resume keeps, as
    # tests/integration/test_faults.py checks it: the traffic the restarted cloud counts in its first round may not)
    # three rounds: a round's row is written once the next round is done, so with two the first and the last row
    # land together and the cloud cannot be held between them
    out = tmp_path / "resumed"
    local3 = hfl_run(tmp_path / "local3", rounds=3)
    assert local3.returncode == 0, local3.stderr[-3000:]
    sets = [a for x in RUN for a in ("--set", x)] + ["--set", "run.rounds=3"]
    argv = ["nsenter", "-t", str(cluster["ns"]), "-n", sys.executable, "-m", "hfl.cli", "run",
            str(ROOT / "deploy/configs/default.toml"), *sets, "--out", str(out), "--quiet", "--cluster", HEAD, "--certs",
            str(ca)]
    driver = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        cloud, argv = _cloud_of(cluster["ns"], driver)
        run_dir = pathlib.Path(argv[argv.index("--run-dir") + 1])
        assert {"--ca", "--cert", "--key"} <= set(argv)  # the cloud serves under mutual TLS, its files on its node
        deadline = time.monotonic() + 300
        while not ((run_dir / "checkpoint.npz").is_file() and (run_dir / "metrics.jsonl").is_file()
                   and (run_dir / "metrics.jsonl").read_text().count("\n") >= 1):
            assert driver.poll() is None and time.monotonic() < deadline, "the spread run wrote no first round"
            time.sleep(0.02)
        os.kill(cloud, signal.SIGSTOP)
        assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1
        driver.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        try:
            _, err = driver.communicate(timeout=STOP_BUDGET_S + 120)
        except subprocess.TimeoutExpired:  # where it hangs, for the report
            spy = shutil.which("py-spy")
            where = subprocess.run([spy, "dump", "--pid", str(driver.pid)], capture_output=True, text=True) if spy \
                else None
            raise AssertionError("the driver did not exit after Ctrl-C" + (
                f":\n{where.stdout[-4000:]}{where.stderr[-500:]}" if where else " (no py-spy here to say where)"))
        stopped_in = time.monotonic() - t0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 130 and f"hfl run --resume {out} --cluster {HEAD} --certs {ca}" in err, err[-3000:]
    assert "Traceback" not in err and not (out / "summary.json").exists() and len(_rows(out)) == 1, err[-3000:]
    assert stopped_in < STOP_BUDGET_S + 30, stopped_in  # the stopped cloud's SIGKILL after its grace, the rest at once
    resumed = subprocess.run(["nsenter", "-t", str(cluster["ns"]), "-n", sys.executable, "-m", "hfl.cli", "run",
                              "--resume", str(out), "--cluster", HEAD, "--certs", str(ca), "--quiet"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    key = ("round", "accuracy", "loss", "train_loss")
    uninterrupted = [[r[k] for k in key] for r in _rows(tmp_path / "local3")]
    assert summary["resumed"] is True and [[r[k] for k in key] for r in _rows(out)] == uninterrupted


def _cloud_of(holder: int, driver: subprocess.Popen, timeout: float = 300) -> tuple[int, list[str]]:
    """The spread run's cloud process in the namespace (`hfl.cli cloud ... --run-dir DIR`): its PID and argv."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and driver.poll() is None:
        for pid in loopback.namespace_pids(holder):
            try:
                argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "hfl.cli" in argv and "cloud" in argv and "--run-dir" in argv:
                return pid, argv
        time.sleep(0.05)
    raise AssertionError("no cloud process of the spread run")


def test_a_run_lost_with_its_node_is_retried_and_the_sweep_finishes(cluster, tmp_path):
    """The second node's raylet killed (SIGKILL, by its PID) while a run is under way there: that run is lost with
    the node, submitted once more, and lands on the head; every run ends done. Runs last here until last."""
    path = spec(tmp_path, rounds=3)
    out = tmp_path / "lost"
    argv = ["nsenter", "-t", str(cluster["ns"]), "-n", sys.executable, "-m", "hfl.cli", "sweep", str(path), "--out",
            str(out), "--quiet", "--cluster", HEAD]
    driver = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        raylet = _raylet_of(cluster["ns"], cluster["dirs"]["b"])
        deadline = time.monotonic() + 300
        while not _runs_a_task(raylet):  # a run under way on node b: its worker is the raylet's child
            assert driver.poll() is None and time.monotonic() < deadline, "no run started on the second node"
            time.sleep(0.2)
        time.sleep(2.0)  # its testbed started
        os.kill(raylet, signal.SIGKILL)
        stdout, stderr = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, stderr[-3000:]
    assert "LOST " in stderr and "retrying once on another node" in stderr, stderr[-3000:]
    nodes = _nodes_used(out)
    assert len(nodes) == 4 and all((out / run / "summary.json").is_file() for run in nodes)
    retried = [n for n in nodes.values() if n["attempt"] == 2]
    assert len(retried) == 1 and retried[0]["custom_resources"] == ["hfl_node_a"] and "lost_first" in retried[0]
    result = json.loads((out / "results.json").read_text())
    assert all(len(c["finished"]) == 2 for c in result["cells"])
    assert len(result["provenance"]["cluster"]["retried"]) == 1


def _runs_a_task(raylet: int) -> bool:
    """Whether one of the raylet's workers runs a run of the `tiny` spec (a busy worker is titled ray::TASK_NAME:
    hfl-SPEC-CELL-seed-S)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            title = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        # a run's task is titled hfl-SPEC-..., not hfl-warm-up (a worker made ready) or hfl-preflight (a model check)
        if int(stat.rsplit(")", 1)[1].split()[1]) == raylet and title.startswith(b"ray::hfl-tiny-"):
            return True
    return False


# ---- deployment recipes (docs/cluster.md) -------------------------------------------------------------------------
def test_the_kuberay_manifest_runs_the_projects_image_with_the_pinned_ray():
    import tomllib

    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs, the test extra)")
    manifest = yaml.safe_load((ROOT / "deploy/k8s/raycluster.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = project["optional-dependencies"]["cluster"]
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    assert pin == f"ray[default]=={manifest['spec']['rayVersion']}"
    dockerfile = (ROOT / "deploy/k8s/Dockerfile").read_text()
    assert f'"{pin}"' in dockerfile and "FROM ${HFL_IMAGE}" in dockerfile and "ARG HFL_IMAGE=hfl:latest" in dockerfile
    assert "ENTRYPOINT" not in dockerfile  # KubeRay's command replaces the project image's `hfl` entry point
    groups = [manifest["spec"]["headGroupSpec"]] + manifest["spec"]["workerGroupSpecs"]
    for group in groups:
        assert set(group["rayStartParams"]) <= {"num-cpus", "dashboard-host", "resources", "num-gpus"}
        for container in group["template"]["spec"]["containers"]:
            assert container["image"] == "hfl-ray:latest"
            limits = container["resources"]["limits"]
            assert float(limits["cpu"]) == float(group["rayStartParams"]["num-cpus"])  # Ray's CPUs are the pod's
            assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"]
    for line in manifest_commands(ROOT / "deploy/k8s/raycluster.yaml"):  # the commands it tells a user to run
        assert line.split()[0] in ("kubectl", "HEAD=$(kubectl")
        if " -- hfl " in line:
            sub = line.split(" -- hfl ", 1)[1].split()[0]
            assert sub in ("sweep", "run") and "hfl" in project["scripts"]
            assert (ROOT / line.split(" -- hfl sweep /tmp/", 1)[1].split()[0]).is_file()


def manifest_commands(path: pathlib.Path) -> list[str]:
    return [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#   ")]


def test_the_sbatch_script_starts_a_cluster_and_sweeps_under_slurm_variables(tmp_path):
    """deploy/slurm/hfl-ray.sbatch under bash as Slurm would run it: SLURM_* set, `scontrol` and `srun` stand-ins
    (a two-node allocation whose steps run on this machine, in a loopback-only namespace), real Ray, a real sweep."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text('#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && tr , "\\n" <<< "$3"\n')
    (stubs / "srun").write_text('#!/bin/bash\nwhile [ $# -gt 0 ]; do case "$1" in -w) shift 2;; -*) shift;; *) break;; '
                                'esac; done\necho "step: $*" >> "$SRUN_LOG"\nexec "$@"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    one = tmp_path / "one.toml"
    one.write_text(spec(tmp_path).read_text().replace("seeds = [0, 1]", "seeds = [0]"))
    ray_tmp = pathlib.Path(tempfile.mkdtemp(prefix="hfl-ray-", dir="/tmp"))  # Ray's socket paths: 107 bytes at most
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="n1,n2",
               SLURM_CPUS_PER_TASK="1", SLURM_NNODES="2", HEAD_IP="127.0.0.1", RAY_TMP=str(ray_tmp),
               SRUN_LOG=str(tmp_path / "srun.log"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, ray_tmp, ignore_errors=True)
        ns = stack.enter_context(netns())
        done = subprocess.run(["nsenter", "-t", str(ns), "-n", "bash", str(ROOT / "deploy/slurm/hfl-ray.sbatch"),
                               str(one), str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hfl-ray: 2 nodes (n1 n2), head n1 at 127.0.0.1:6379" in done.stdout and "2 nodes joined" in done.stdout
    steps = (tmp_path / "srun.log").read_text().splitlines()
    assert steps[0].startswith("step: ray start --head --block --node-ip-address=127.0.0.1 --port=6379 --num-cpus=1")
    assert steps[1].startswith("step: ray start --block --address=127.0.0.1:6379 --num-cpus=1")
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [len(c["finished"]) for c in result["cells"]] == [1, 1]
    assert result["provenance"]["cluster"]["address"] == "127.0.0.1:6379"
