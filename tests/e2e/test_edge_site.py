"""deploy/edge/ on a real engine: an edge container and its device host, started as the operator page says
(env file + compose file, or the same file as a Swarm stack), join a cloud given by address.

The cloud runs outside Docker, on this host's docker0 address: the edge site's containers reach it the
way a remote site reaches a cloud, through the host's network, and no traffic leaves this machine. Mutual
TLS is on with certificates issued by `hfl certs` into a site directory, owned by the image's user as
the page tells operators."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from hfl.common import certs

from .conftest import ROOT, docker0_address, project_containers, record, sh

pytestmark = pytest.mark.docker

EDGE = ROOT / "deploy" / "edge"
DEVICES = 3
IMAGE_UID = 10001


@pytest.fixture
def site(tmp_path):
    """A CA, the cloud's certificate, and the site directory an operator copies to the edge machine."""
    pki, bundle = tmp_path / "pki", tmp_path / "site-certs"
    certs.init_ca(pki)
    certs.issue(pki, "cloud", "cloud")
    certs.issue(pki, "edge", "edge-000", out_dir=bundle)
    certs.issue(pki, "device", certs.device_range(0, DEVICES), name="devices", out_dir=bundle)
    (bundle / "ca.pem").write_bytes((pki / "ca.pem").read_bytes())
    for path in [bundle, *bundle.iterdir()]:
        os.chown(path, IMAGE_UID, IMAGE_UID)
    return pki, bundle


@pytest.fixture
def cloud(site, tmp_path):
    """`hfl cloud` outside Docker for one edge, listening on the docker0 address; yields (address, process, run dir)."""
    pki, _ = site
    run_dir = tmp_path / "run"
    port_file = run_dir / "port"
    log = open(tmp_path / "cloud.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hfl.cli", "cloud", "--set", "topology.edges=1", "--set", f"topology.devices_per_edge={DEVICES}",
         "--set", "run.rounds=2", "--set", "train.tau=1", "--set", "net.join_timeout_s=240",
         "--listen", f"{docker0_address()}:0", "--run-dir", str(run_dir), "--port-file", str(port_file),
         "--ca", str(pki / "ca.pem"), "--cert", str(pki / "cloud.pem"), "--key", str(pki / "cloud.key")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "cloud.log").read_text()
        time.sleep(0.1)
    try:
        yield f"{docker0_address()}:{port_file.read_text().strip()}", proc, run_dir
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        log.close()


def site_env(cloud_address: str, bundle: pathlib.Path, image: str) -> dict:
    """The operator's edge.env with the three values they fill in; compose reads the rest from the file."""
    return dict(os.environ, HFL_CLOUD=cloud_address, HFL_EDGE_ID="edge-000", HFL_CERTS=str(bundle), HFL_IMAGE=image)


def stack_env(cloud_address: str, bundle: pathlib.Path, image: str) -> dict:
    """`set -a; . ./edge.env; set +a` with the same three values overridden."""
    env = dict(os.environ)
    for line in (EDGE / "edge.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
    env.update(HFL_CLOUD=cloud_address, HFL_EDGE_ID="edge-000", HFL_CERTS=str(bundle), HFL_IMAGE=image)
    return env


def assert_run_finished(proc, run_dir) -> dict:
    assert proc.wait(timeout=240) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["edges"] == 1 and summary["devices"] == DEVICES
    assert summary["dropped_edges"] == [] and summary["refused"] == 0
    return summary


def test_edge_site_with_compose_joins_a_cloud_by_address(compose_cmd, image, site, cloud):
    address, proc, run_dir = cloud
    _, bundle = site
    project = f"hfledge{os.getpid()}"
    env = site_env(address, bundle, image)
    compose = [*compose_cmd, "--env-file", EDGE / "edge.env", "-f", EDGE / "docker-compose.yml", "-p", project]
    try:
        started = time.monotonic()
        up = sh([*compose, "up", "--no-color"], env=env, timeout=600, check=False)
        record("edge_site_compose_s", round(time.monotonic() - started, 1))
        containers = project_containers(project)
        assert set(containers) == {"edge", "devices"}, up.stdout[-3000:] + up.stderr[-3000:]
        codes = {n: c["State"]["ExitCode"] for n, c in containers.items()}
        assert codes == {"edge": 0, "devices": 0}, up.stdout[-4000:]
        assert up.returncode == 0
        assert "edge-000 joined run" in up.stdout
        assert_run_finished(proc, run_dir)
    finally:
        sh([*compose, "down", "--volumes", "--remove-orphans"], env=env, check=False, timeout=300)
    assert project_containers(project) == {}


@pytest.fixture
def swarm(docker_engine):
    """A single-node swarm on the loopback address (left again if this test created it); skips if the engine
    does not allow one."""
    state = sh(["docker", "info", "-f", "{{.Swarm.LocalNodeState}}"]).stdout.strip()
    had_gwbridge = sh(["docker", "network", "ls", "-q", "--filter", "name=^docker_gwbridge$"]).stdout.strip() != ""
    ours = False
    if state != "active":
        init = sh(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377"], check=False)
        if init.returncode != 0:
            pytest.skip(f"this engine does not allow a swarm: {init.stderr.strip()}")
        ours = True
    yield
    if ours:
        sh(["docker", "swarm", "leave", "--force"], check=False)
        if not had_gwbridge:  # swarm init made it; leaving does not remove it
            sh(["docker", "network", "rm", "docker_gwbridge"], check=False)


def stack_tasks(stack: str) -> list[tuple[str, str, str]]:
    out = sh(["docker", "stack", "ps", stack, "--no-trunc", "--format", "{{.Name}}|{{.CurrentState}}|{{.Error}}"],
             check=False).stdout
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]


def test_edge_site_deploys_as_a_swarm_stack(image, site, cloud, swarm):
    address, proc, run_dir = cloud
    _, bundle = site
    stack = f"hfledge{os.getpid()}"
    env = stack_env(address, bundle, image)
    try:
        started = time.monotonic()
        sh(["docker", "stack", "deploy", "-c", EDGE / "docker-compose.yml", stack], env=env, cwd=EDGE)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            tasks = stack_tasks(stack)
            if len(tasks) >= 2 and all(state.startswith("Complete") for _, state, _ in tasks):
                break
            if proc.poll() not in (None, 0):
                break
            time.sleep(2)
        record("edge_site_swarm_s", round(time.monotonic() - started, 1))
        logs = sh(["docker", "service", "logs", f"{stack}_edge"], check=False)
        tasks = stack_tasks(stack)
        assert sorted(name.split(".")[0] for name, _, _ in tasks) == [f"{stack}_devices", f"{stack}_edge"], tasks
        assert all(state.startswith("Complete") for _, state, _ in tasks), f"{tasks}\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}"
        assert "edge-000 joined run" in logs.stdout + logs.stderr
        assert_run_finished(proc, run_dir)
    finally:
        sh(["docker", "stack", "rm", stack], check=False)
        deadline = time.monotonic() + 60  # the stack's network and secrets go asynchronously
        while time.monotonic() < deadline and sh(["docker", "network", "ls", "-q", "--filter",
                                                  f"label=com.docker.stack.namespace={stack}"]).stdout.strip():
            time.sleep(1)
    assert sh(["docker", "secret", "ls", "-q", "--filter", f"label=com.docker.stack.namespace={stack}"]).stdout.strip() == ""
