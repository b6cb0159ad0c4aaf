"""`docker compose up` of the root docker-compose.yml on a real engine: the default experiment's
topology (three edges, one of them lowering its own trust so that its devices add the DP noise, one device
host for all their devices, each device with its own certificate, mutual TLS, health-gated start) runs to the end, the cloud exits 0,
every container exits cleanly and the results are on the host. A few rounds keep it short."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from .conftest import ROOT, container_logs, project_containers, record, sh

pytestmark = pytest.mark.docker

ROUNDS = 2
DEVICES_PER_EDGE = 2
SERVICES = {"certs", "cloud", "edge-000", "edge-001", "edge-002", "devices"}


def started_at(container: dict) -> str:
    return container["State"]["StartedAt"]  # RFC 3339 with nanoseconds, UTC: sorts as text


def test_image_is_one_non_root_image_without_keys(image):
    config = json.loads(sh(["docker", "image", "inspect", image]).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["hfl"]
    assert config["User"] not in ("", "0", "root") and not config["User"].startswith("0:")
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONUNBUFFERED"] == "1" and env["HFL_TLS"] == "required"
    found = sh(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                "id -u; ls -A /certs; grep -rlIE '^-----BEGIN ([A-Z]+ )?PRIVATE KEY-----' /home /certs /runs /opt/hfl; true"])
    uid, *rest = found.stdout.split()
    assert uid != "0"
    assert rest == [], f"keys or certificates inside the image: {rest}"
    # the image refuses to run a node without certificates unless told to go plaintext
    refused = sh(["docker", "run", "--rm", "--network", "none", image, "health", "127.0.0.1:1"], check=False)
    assert refused.returncode != 0 and "HFL_TLS=required" in refused.stderr


def watch_published(compose: list, env: dict, pki, up: subprocess.Popen, timeout: float = 900) -> dict:
    """While `up` runs: the cloud's live page, its /metrics and every edge's /metrics through the ports compose
    publishes on the host, over TLS with a node certificate of the run's CA (the page asks for one)."""
    import ssl
    import urllib.request

    seen: dict[str, bytes] = {}
    targets = {"page": ("cloud", 8780, ""), "state": ("cloud", 8780, "api/state"), "metrics": ("cloud", 8780, "metrics"),
               **{f"edge-{e}": (f"edge-{e}", 9100, "metrics") for e in ("000", "001", "002")}}
    deadline = time.monotonic() + timeout
    ctx = None
    while up.poll() is None and len(seen) < len(targets) and time.monotonic() < deadline:
        if ctx is None and (pki / "nodes" / "devices" / f"edges-3x{DEVICES_PER_EDGE}.json").exists():
            ctx = ssl.create_default_context(cafile=str(pki / "nodes" / "ca.pem"))
            ctx.load_cert_chain(str(pki / "nodes" / "edge-001.pem"), str(pki / "nodes" / "edge-001.key"))
        for name, (service, port, path) in targets.items():
            if name in seen or ctx is None:
                continue
            published = sh([*compose, "port", service, str(port)], env=env, check=False, timeout=30).stdout.strip()
            if not published or published.endswith(":0"):
                continue
            try:
                with urllib.request.urlopen(f"https://{published.replace('0.0.0.0', '127.0.0.1')}/{path}",
                                            context=ctx, timeout=5) as res:
                    seen[name] = res.read()
            except OSError:
                pass
        time.sleep(0.3)
    return seen


def test_compose_up_runs_to_the_end_with_results_on_the_host(compose_cmd, image, tmp_path):
    runs, pki = tmp_path / "runs", tmp_path / "pki"
    project = f"hfle2e{os.getpid()}"
    env = dict(os.environ, HFL_IMAGE=image, HFL_RUNS=str(runs), HFL_PKI=str(pki), ROUNDS=str(ROUNDS),
               DEVICES_PER_EDGE=str(DEVICES_PER_EDGE), HFL_LIVE_PUBLISH="127.0.0.1::8780")
    compose = [*compose_cmd, "-f", ROOT / "docker-compose.yml", "-p", project]
    try:
        started = time.monotonic()
        with open(tmp_path / "up.out", "w+") as out, open(tmp_path / "up.err", "w+") as err:
            proc = subprocess.Popen([str(c) for c in (*compose, "up", "--no-build", "--no-color")], env=env,
                                    stdout=out, stderr=err, text=True)
            try:
                published = watch_published(compose, env, pki, proc)
                proc.wait(timeout=900)
            finally:
                if proc.poll() is None:
                    proc.kill()
            out.seek(0)
            err.seek(0)
            up = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
        record("compose_up_s", round(time.monotonic() - started, 1))
        containers = project_containers(project)
        assert set(containers) == SERVICES, up.stdout[-3000:] + up.stderr[-3000:]
        logs = {name: container_logs(c["Id"]) for name, c in containers.items()}
        failed = {n: c["State"]["ExitCode"] for n, c in containers.items() if c["State"]["ExitCode"] != 0}
        assert not failed, "\n".join(f"--- {n} exited {code}\n{logs[n][-2500:]}" for n, code in failed.items())
        assert up.returncode == 0, up.stderr[-3000:]
        assert all(c["State"]["Status"] == "exited" and not c["State"]["OOMKilled"] for c in containers.values())

        # the results are on the host, in the bind-mounted run directory
        out = runs / "compose"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds"] == ROUNDS
        assert summary["edges"] == 3 and summary["devices"] == 3 * DEVICES_PER_EDGE
        assert summary["dropped_edges"] == [] and summary["refused"] == 0
        assert summary["final_accuracy"] > 0.3
        # the default experiment is private (deploy/configs/compose-h2fdp.toml): the policy trusts every edge,
        # edge-002's site lowered its own trust (HFL_TRUST=untrusted), so its devices added the noise
        privacy = summary["privacy"]
        assert privacy["trust_assigned"] == {"edge-000": "trusted", "edge-001": "trusted", "edge-002": "trusted"}
        assert privacy["trust"] == {"edge-000": "trusted", "edge-001": "trusted", "edge-002": "untrusted"}
        assert {e: privacy["noise"][e]["global"]["tier"] for e in privacy["trust"]} == {
            "edge-000": "edge", "edge-001": "edge", "edge-002": "device"}
        assert summary["stop_reason"] is None and 0 < summary["epsilon"] <= privacy["epsilon_budget"]
        assert len((out / "metrics.jsonl").read_text().splitlines()) == ROUNDS
        assert (out / "accuracy.png").stat().st_size > 1000 and (out / "config.toml").exists()

        # the live page and every /metrics were reachable on the host during the run (HFL_LIVE_PUBLISH and
        # HFL_EDGE_METRICS_PUBLISH), over TLS with a certificate of the run's CA
        assert set(published) == {"page", "state", "metrics", "edge-000", "edge-001", "edge-002"}, sorted(published)
        assert b"/static/uPlot.iife.min.js" in published["page"]
        page_state = json.loads(published["state"])
        assert page_state["run"]["rounds"] == ROUNDS and page_state["run"]["run_id"] == summary["run_id"]
        assert [n["id"] for n in page_state["nodes"]] == ["edge-000", "edge-001", "edge-002"]
        assert b"hfl_rounds_completed_total" in published["metrics"] and b"hfl_members{" in published["metrics"]
        assert all(b"hfl_link_bytes_total{" in published[f"edge-{e}"] for e in ("000", "001", "002"))

        # health-gated start: cloud before edges before the device host, each after its upstreams were SERVING
        cloud, devices = containers["cloud"], containers["devices"]
        for e in ("000", "001", "002"):
            edge = containers[f"edge-{e}"]
            assert started_at(cloud) < started_at(edge) < started_at(devices)
            assert f"edge-{e} joined run" in logs[f"edge-{e}"]
            assert f"edge-{e}: {DEVICES_PER_EDGE} of {DEVICES_PER_EDGE} devices joined" in logs[f"edge-{e}"]
        probes = cloud["State"]["Health"]["Log"]
        assert any(p["ExitCode"] == 0 and "SERVING" in p["Output"] for p in probes), probes
        # mutual TLS was on: every node ran with its own certificate, every device with its own, and nothing was refused
        assert all("HFL_CERT=/certs/" in " ".join(c["Config"]["Env"]) for n, c in containers.items()
                   if n not in ("certs", "devices"))
        assert f"HFL_DEVICE_CERTS=/certs/devices/edges-3x{DEVICES_PER_EDGE}.json" in devices["Config"]["Env"]
        assert "transport: mutual TLS, a certificate per device" in logs["devices"]
        assert f"{3 * DEVICES_PER_EDGE} devices (dev-00000..dev-{3 * DEVICES_PER_EDGE - 1:05d}) of 3 edge(s)" in logs["devices"]
        assert sorted(p.name for p in (pki / "nodes" / "devices").glob("dev-*.pem")) == [
            f"dev-{g:05d}.pem" for g in range(3 * DEVICES_PER_EDGE)]
        assert "HFL_TRUST=untrusted" in containers["edge-002"]["Config"]["Env"]
        assert (pki / "ca.pem").exists() and (pki / "nodes" / "edge-002.key").exists()
    finally:
        sh([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "30"], env=env, check=False, timeout=300)
    assert project_containers(project) == {}
    networks = sh(["docker", "network", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"]).stdout
    assert networks.strip() == ""
