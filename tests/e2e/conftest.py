"""Fixtures for tests against a real Docker Engine (marker `docker`).

The engine, the registry-free base image and the wheelhouse come from scripts/ (a person can run the
same steps): scripts/docker_engine.sh installs Debian's docker.io and starts dockerd when no engine
answers, and stops it at the end of the session; scripts/docker_image.sh builds the project image from
the wheelhouse on a debootstrap'd base (BASE_IMAGE=local), because no container registry is reachable.
Set HFL_E2E_BASE_IMAGE=python:3.11-slim where a registry is. Tests skip only when this machine cannot run
an engine (not root, no apt-get, dockerd refuses to start containers).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
IMAGE = os.environ.get("HFL_E2E_IMAGE", "hfl:e2e")
MEASUREMENTS = ROOT / ".cache" / "e2e-measurements.json"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.docker)
            # the first test also sets up engine, base image, wheelhouse and image (minutes when cold)
            item.add_marker(pytest.mark.timeout(1800))


def sh(cmd, timeout: float = 600, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a command, capturing text output; on failure the assertion shows its output."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
                             f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")
    return result


def record(key: str, value) -> None:
    """Keep a measurement (image size, build and run times) in .cache/e2e-measurements.json."""
    MEASUREMENTS.parent.mkdir(exist_ok=True)
    data = json.loads(MEASUREMENTS.read_text()) if MEASUREMENTS.exists() else {}
    data[key] = value
    MEASUREMENTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"[e2e] {key}: {value}")


ENGINE_STATE = pathlib.Path(os.environ.get("HFL_ENGINE_STATE", "/run/hfl-dockerd"))


@contextlib.contextmanager
def engine_users():
    """The live pytest processes using the engine (one file each), under a lock: pytest-xdist workers that do not
    share a group (`-n 2` without `--dist loadgroup`) each hold the session fixture, and the engine a test session
    started must outlive every one of them, not just the worker that started it."""
    users = ENGINE_STATE / "users"
    users.mkdir(parents=True, exist_ok=True)
    with open(ENGINE_STATE / "users.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for f in users.iterdir():  # a worker killed before its teardown
            if not pathlib.Path(f"/proc/{f.name}").exists():
                f.unlink(missing_ok=True)
        yield users


@pytest.fixture(scope="session")
def docker_engine():
    started = time.monotonic()
    with engine_users() as users:
        result = subprocess.run([str(SCRIPTS / "docker_engine.sh"), "start"], capture_output=True, text=True,
                                timeout=900)
        if result.returncode == 3:
            pytest.skip(result.stderr.strip().splitlines()[-1])
        assert result.returncode == 0, f"docker engine: {result.stdout}\n{result.stderr}"
        if "dockerd started" in result.stdout:
            (ENGINE_STATE / "started-by-tests").touch()
        elif not any(users.iterdir()):  # an engine that answered before any test session used it
            (ENGINE_STATE / "started-by-tests").unlink(missing_ok=True)
        (users / str(os.getpid())).touch()
    record("engine_ready_s", round(time.monotonic() - started, 1))
    yield
    with engine_users() as users:
        (users / str(os.getpid())).unlink(missing_ok=True)
        ours = ENGINE_STATE / "started-by-tests"
        if ours.exists() and not any(users.iterdir()):
            # the last user of an engine the tests started; its images stay in /var/lib/docker as the cache
            subprocess.run([str(SCRIPTS / "docker_engine.sh"), "stop"], timeout=120)
            ours.unlink()


@pytest.fixture(scope="session")
def compose_cmd(docker_engine) -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor docker-compose is installed")


@pytest.fixture(scope="session")
def image(docker_engine) -> str:
    """The project image, built from the wheelhouse (cached layers, base and wheelhouse are reused)."""
    started = time.monotonic()
    env = dict(os.environ, BASE_IMAGE=os.environ.get("HFL_E2E_BASE_IMAGE", "local"))
    result = sh([SCRIPTS / "docker_image.sh", IMAGE], timeout=1800, env=env)
    record("image_ready_s", round(time.monotonic() - started, 1))
    record("image_build_line", result.stdout.strip().splitlines()[-1])
    size = int(sh(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE]).stdout.strip())
    record("image_size_mb", round(size / 1e6))
    return IMAGE


def project_containers(project: str) -> dict[str, dict]:
    """service name -> docker inspect of its container, for one compose project."""
    ids = sh(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"]).stdout.split()
    if not ids:
        return {}
    info = json.loads(sh(["docker", "inspect", *ids]).stdout)
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in info}


def container_logs(container_id: str) -> str:
    r = sh(["docker", "logs", container_id], check=False)
    return r.stdout + r.stderr


def docker0_address() -> str:
    """The host's address on the default bridge: reachable from every container, traffic stays on this host."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"docker0"))  # SIOCGIFADDR
        except OSError as exc:
            pytest.fail(f"no docker0 bridge address: {exc}")
    return socket.inet_ntoa(packed[20:24])
