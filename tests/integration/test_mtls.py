"""Mutual TLS and enrollment with real processes on 127.0.0.1 (no Docker).

One run, cloud + edge-000 + edge-001 (2 x 3 devices), every node with its own certificate, every device too:
the devices are played by three per-core device hosts (the default layout), each device presenting its own
certificate on its own channel; devices-c1 holds dev-00002 of edge-000 and dev-00003 of edge-001. While
edge-001 still waits for its last devices (those of devices-c2), rogue clients try their luck; then
devices-c2 starts and the run must finish as if nothing happened. Each refusal is asserted where the client
sees it (status code) and where the server logs it:

- a device host of cluster edge-000 dialing edge-001: PERMISSION_DENIED from the admission check, whether
  it holds one certificate naming its devices or a certificate per device; a raw client claiming an id its
  certificate does not name (another device of the same edge, or of another edge);
- a device whose certificate another CA signed: refused in the TLS handshake (UNAVAILABLE), grpc logs
  CERTIFICATE_VERIFY_FAILED on the edge;
- a plaintext client: refused in the handshake (UNAVAILABLE), grpc logs WRONG_VERSION_NUMBER;
- at the cloud: a device certificate posing as an edge, an edge posing as another edge, an edge of
  another CA.
Each assertion fails if its check is removed: without `admit` the foreign host and the impostors are
served; without require_client_auth (or with a plaintext port) the foreign-CA and plaintext clients get
through the handshake.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hfl.common import certs, device_certs, wire
from hfl import testbed_certs
from hfl.common.tls import Admission, TlsOptions
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

DEVICES = 3
OVERRIDES = ["topology.edges=2", f"topology.devices_per_edge={DEVICES}", "run.rounds=2", "train.tau=1", "train.gamma=3",
             "net.phase_timeout_s=60", "net.join_timeout_s=120"]


# ---- certificates ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("pki")
    ours, other = root / "ca", root / "other-ca"
    certs.init_ca(ours)
    certs.init_ca(other, name="someone else's CA")
    certs.issue(ours, "cloud", "cloud")
    for e in range(2):
        certs.issue(ours, "edge", f"edge-{e:03d}")
        certs.issue(ours, "device", certs.device_range(e * DEVICES, DEVICES), name=f"devices-{e:03d}")
    manifest, _ = device_certs.issue_topology(ours, 2, DEVICES, ours / "devices")  # a certificate per device
    certs.issue(other, "device", certs.device_range(0, DEVICES), name="devices-000")
    certs.issue(other, "edge", "edge-000")
    bundle = root / "both-cas.pem"  # a rogue trusts our CA (to reach the server) but holds another CA's certificate
    bundle.write_bytes((other / "ca.pem").read_bytes() + (ours / "ca.pem").read_bytes())
    return SimpleNamespace(ca=ours, other=other, bundle=bundle, manifest=manifest, devices=ours / "devices")


def tls_args(ca_dir: pathlib.Path, name: str, ca: pathlib.Path | None = None) -> list[str]:
    return ["--ca", str(ca or ca_dir / "ca.pem"), "--cert", str(ca_dir / f"{name}.pem"), "--key", str(ca_dir / f"{name}.key")]


def channel_credentials(ca_dir: pathlib.Path, name: str, trust: pathlib.Path) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(trust.read_bytes(), (ca_dir / f"{name}.key").read_bytes(),
                                        (ca_dir / f"{name}.pem").read_bytes())


def secure(address: str, creds: grpc.ChannelCredentials, server_name: str) -> grpc.Channel:
    return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", server_name)])


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


# ---- processes ------------------------------------------------------------------------------------

class Procs:
    """Real `hfl` processes with logs and port files; every one is stopped at the end."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}
        (root / "logs").mkdir(parents=True, exist_ok=True)
        (root / "ports").mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HFL_", "GRPC_VERBOSITY", "GRPC_TRACE"))}
        self.env = dict(env, PYTHONUNBUFFERED="1")  # grpc's default verbosity logs TLS handshake failures

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        log = open(self.root / "logs" / f"{name}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(self.env, **(env or {})), start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def port_file(self, name: str) -> str:
        return str(self.root / "ports" / name)

    def address(self, name: str, timeout: float = 90) -> str:
        path = pathlib.Path(self.port_file(name))
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert self.procs[name].poll() is None, f"{name} exited {self.procs[name].returncode}:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name} did not listen:\n{self.log(name)}"
            time.sleep(0.05)
        return f"127.0.0.1:{path.read_text().strip()}"

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")

    def wait_log(self, name: str, text: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            assert self.procs[name].poll() is None, f"{name} exited {self.procs[name].returncode}:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name} never logged {text!r}:\n{self.log(name)}"
            time.sleep(0.1)

    def wait(self, name: str, timeout: float = 120) -> int | None:
        """Its exit code, or None (and it is killed) if it still runs after `timeout`: the tests judge."""
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.procs[name].pid, signal.SIGKILL)
            self.procs[name].wait()
            return None

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def scenario(pki, tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("mtls-run")
    procs = Procs(root)
    sets = [a for o in OVERRIDES for a in ("--set", o)]
    out = SimpleNamespace(procs=procs, run_dir=root / "run", statuses={})
    try:
        procs.start("cloud", "cloud", *sets, "--listen", "127.0.0.1:0", "--run-dir", str(out.run_dir),
                    "--port-file", procs.port_file("cloud"), *tls_args(pki.ca, "cloud"))
        cloud = procs.address("cloud")
        edges = []
        for e in range(2):
            name = f"edge-{e:03d}"
            procs.start(name, "edge", "--id", name, "--listen", "127.0.0.1:0", "--cloud", cloud, "--wait", "90",
                        "--port-file", procs.port_file(name), *tls_args(pki.ca, name))
        for e in range(2):
            edges.append(procs.address(f"edge-{e:03d}"))
            procs.wait_log(f"edge-{e:03d}", "joined run")
        out.cloud, out.edges = cloud, edges
        named = [a for e, address in enumerate(edges) for a in ("--edge", f"edge-{e:03d}={address}")]
        per_device = ["--ca", str(pki.ca / "ca.pem"), "--device-certs", str(pki.manifest)]

        def core_host(h: int, hosts: int = 3) -> tuple[str, ...]:
            return ("devices", *named, "--host-index", str(h), "--hosts", str(hosts), *per_device)

        procs.start("devices-c0", *core_host(0))  # dev-00000, dev-00001 (edge-000)
        procs.start("devices-c1", *core_host(1))  # dev-00002 (edge-000) and dev-00003 (edge-001)
        procs.wait_log("edge-000", f"{DEVICES} of {DEVICES} devices joined")

        # -- rogues, while edge-001 waits for its devices (nothing can progress before they join) --------
        s = out.statuses
        ours = pki.ca / "ca.pem"
        # a whole device host of cluster edge-000 pointed at edge-001: with one certificate naming its devices, and
        # with a certificate per device (the manifest's edge-000 devices, their edge's address given as edge-001's)
        procs.start("rogue-other-cluster", "devices", "--edge", edges[1], "--wait", "20", *tls_args(pki.ca, "devices-000"))
        procs.start("rogue-per-device-other-cluster", "devices", "--edge", f"edge-000={edges[1]}", "--host-index", "0",
                    "--hosts", "2", "--wait", "20", *per_device)
        # a raw client with cluster edge-000's certificate claiming a device of edge-001
        with secure(edges[1], channel_credentials(pki.ca, "devices-000", ours), "edge.hfl") as chan:
            stub = pbg.EdgeServiceStub(chan)
            s["claim other id"] = status_of(lambda: stub.Register(
                pb.RegisterRequest(node_id="dev-00003", num_samples=10), timeout=10))
        # a device's own certificate claiming another device of its edge, and one of another edge
        with secure(edges[0], channel_credentials(pki.devices, "dev-00000", ours), "edge.hfl") as chan:
            s["device claims its neighbour"] = status_of(lambda: pbg.EdgeServiceStub(chan).Register(
                pb.RegisterRequest(node_id="dev-00001", num_samples=10), timeout=10))
        with secure(edges[1], channel_credentials(pki.devices, "dev-00000", ours), "edge.hfl") as chan:
            s["device claims another edge's"] = status_of(lambda: pbg.EdgeServiceStub(chan).Register(
                pb.RegisterRequest(node_id="dev-00004", num_samples=10), timeout=10))
        # a device whose certificate another CA signed (it trusts our CA to reach the edge)
        with secure(edges[0], channel_credentials(pki.other, "devices-000", ours), "edge.hfl") as chan:
            s["other CA register"] = status_of(lambda: pbg.EdgeServiceStub(chan).Register(
                pb.RegisterRequest(node_id="dev-00000", num_samples=10), timeout=10))
            s["other CA health"] = status_of(lambda: health_pb2_grpc.HealthStub(chan).Check(
                health_pb2.HealthCheckRequest(), timeout=10))
        procs.start("rogue-other-ca", "devices", "--edge", edges[0], "--wait", "6",
                    *tls_args(pki.other, "devices-000", ca=pki.bundle))
        # plaintext clients
        with grpc.insecure_channel(edges[0]) as chan:
            s["plaintext register"] = status_of(lambda: pbg.EdgeServiceStub(chan).Register(
                pb.RegisterRequest(node_id="dev-00000", num_samples=10), timeout=10))
        with grpc.insecure_channel(cloud) as chan:
            s["plaintext cloud health"] = status_of(lambda: health_pb2_grpc.HealthStub(chan).Check(
                health_pb2.HealthCheckRequest(), timeout=10))
        procs.start("rogue-plaintext", "devices", "--edge", edges[0], "--wait", "6")
        # at the cloud: a device certificate posing as an edge, an edge posing as another, another CA's edge
        with secure(cloud, channel_credentials(pki.ca, "devices-001", ours), "cloud.hfl") as chan:
            s["device as edge"] = status_of(lambda: pbg.CloudServiceStub(chan).Register(
                pb.RegisterRequest(node_id="edge-001"), timeout=10))
        with secure(cloud, channel_credentials(pki.ca, "edge-000", ours), "cloud.hfl") as chan:
            s["edge as other edge"] = status_of(lambda: pbg.CloudServiceStub(chan).Register(
                pb.RegisterRequest(node_id="edge-001"), timeout=10))
        with secure(cloud, channel_credentials(pki.other, "edge-000", ours), "cloud.hfl") as chan:
            s["other CA edge"] = status_of(lambda: pbg.CloudServiceStub(chan).Register(
                pb.RegisterRequest(node_id="edge-000"), timeout=10))
        out.rogue_codes = {rogue: procs.wait(rogue, timeout=30) for rogue in (
            "rogue-other-cluster", "rogue-per-device-other-cluster", "rogue-other-ca", "rogue-plaintext")}
        # a plaintext health probe (the CLI the containers use) with TLS switched off
        out.plain_probe = subprocess.run([sys.executable, "-m", "hfl.cli", "health", cloud, "--timeout", "5"],
                                         capture_output=True, text=True, env=dict(procs.env, HFL_TLS="off"), timeout=60)
        out.tls_probe = subprocess.run([sys.executable, "-m", "hfl.cli", "health", cloud, *tls_args(pki.ca, "cloud")],
                                       capture_output=True, text=True, env=procs.env, timeout=60)

        # -- the last legitimate device host (dev-00004, dev-00005 of edge-001): the run goes on --------------
        procs.start("devices-c2", *core_host(2))
        out.codes = {name: procs.wait(name, timeout=150) for name in ("cloud", "edge-000", "edge-001", "devices-c0",
                                                                        "devices-c1", "devices-c2")}
        out.logs = {name: procs.log(name) for name in procs.procs}
        yield out
    finally:
        procs.close()


# ---- the run goes on --------------------------------------------------------------------------------

def test_the_run_finishes_despite_the_rogues(scenario):
    assert scenario.codes == {name: 0 for name in scenario.codes}, {n: scenario.logs[n][-2000:] for n in scenario.codes}
    summary = json.loads((scenario.run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["devices"] == 2 * DEVICES and summary["dropped_edges"] == []
    assert summary["final_accuracy"] > 0.2
    # refusals inside handlers are counted: at the cloud, and the edges' counts reach the cloud's metrics
    assert summary["refused_by_reason_at_cloud"] == {"wrong_role": 1, "identity_mismatch": 1}
    assert summary["refused"] >= 2 + 2
    assert all("devices done: {'finished': 2}" in scenario.logs[f"devices-c{h}"] for h in range(3))
    assert "2 devices (dev-00002..dev-00003) of 2 edge(s)" in scenario.logs["devices-c1"]
    assert "transport: mutual TLS, a certificate per device" in scenario.logs["devices-c1"]


def test_health_probe_speaks_mutual_tls(scenario):
    assert scenario.tls_probe.returncode == 0 and "SERVING" in scenario.tls_probe.stdout, scenario.tls_probe.stderr
    assert scenario.plain_probe.returncode == 1 and "UNAVAILABLE" in scenario.plain_probe.stderr


# ---- each refusal ---------------------------------------------------------------------------------------

def test_device_host_of_another_cluster_is_refused(scenario):
    for rogue, cert in [("rogue-other-cluster", "dev-00000..dev-00002"), ("rogue-per-device-other-cluster", "dev-00000")]:
        log = scenario.logs[rogue]
        assert scenario.rogue_codes[rogue] not in (0, None)
        assert "PERMISSION_DENIED" in log and f"device {cert} names none of dev-00003..dev-00005" in log, log[-2000:]
    assert scenario.logs["edge-001"].count("refused foreign_cluster from ipv4:127.0.0.1") >= 2


def test_device_claiming_an_id_its_certificate_does_not_name_is_refused(scenario):
    for key, named, claimed in [("claim other id", "dev-00000..dev-00002", "dev-00003"),
                                ("device claims its neighbour", "dev-00000", "dev-00001"),
                                ("device claims another edge's", "dev-00000", "dev-00004")]:
        code, details = scenario.statuses[key]
        assert code == grpc.StatusCode.PERMISSION_DENIED, (key, details)
        assert f"certificate of device {named} does not name {claimed}" in details, (key, details)
    assert "refused identity_mismatch from ipv4:127.0.0.1" in scenario.logs["edge-000"]
    assert scenario.logs["edge-001"].count("refused identity_mismatch from ipv4:127.0.0.1") >= 2


def test_device_with_a_certificate_of_another_ca_is_refused(scenario):
    for key in ("other CA register", "other CA health"):
        code, details = scenario.statuses[key]
        assert code == grpc.StatusCode.UNAVAILABLE, (key, details)
    assert scenario.rogue_codes["rogue-other-ca"] not in (0, None)
    assert "not SERVING" in scenario.logs["rogue-other-ca"]
    edge_log = scenario.logs["edge-000"]
    assert "Handshake failed" in edge_log and "CERTIFICATE_VERIFY_FAILED" in edge_log, edge_log[-3000:]


def test_plaintext_client_is_refused(scenario):
    for key in ("plaintext register", "plaintext cloud health"):
        code, details = scenario.statuses[key]
        assert code == grpc.StatusCode.UNAVAILABLE, (key, details)
    assert scenario.rogue_codes["rogue-plaintext"] not in (0, None)
    assert "WRONG_VERSION_NUMBER" in scenario.logs["edge-000"]
    assert "WRONG_VERSION_NUMBER" in scenario.logs["cloud"]


def test_cloud_admits_only_edges_named_by_a_certificate_of_its_ca(scenario):
    code, details = scenario.statuses["device as edge"]
    assert code == grpc.StatusCode.PERMISSION_DENIED and "edge certificate required" in details, details
    code, details = scenario.statuses["edge as other edge"]
    assert code == grpc.StatusCode.PERMISSION_DENIED and "does not name edge-001" in details, details
    code, details = scenario.statuses["other CA edge"]
    assert code == grpc.StatusCode.UNAVAILABLE, details
    cloud_log = scenario.logs["cloud"]
    assert "refused wrong_role" in cloud_log and "refused identity_mismatch" in cloud_log
    assert "CERTIFICATE_VERIFY_FAILED" in cloud_log


# ---- the pieces, without processes ------------------------------------------------------------------------

def test_certificates_name_role_and_ids(tmp_path):
    certs.init_ca(tmp_path)
    cert, key = certs.issue(tmp_path, "device", "dev-00004..dev-00007", name="host")
    ident = certs.identity_of(certs.load_cert(cert))
    assert (ident.role, ident.name, ident.lo, ident.hi) == ("device", "dev-00004..dev-00007", 4, 7)
    assert ident.covers("dev-00004") and ident.covers("dev-00007")
    assert not ident.covers("dev-00003") and not ident.covers("dev-00008") and not ident.covers("edge-000")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    server, _ = certs.issue(tmp_path, "edge", "edge-002", sans=["10.1.2.3", "edge.example.org"])
    assert "edge.hfl" in certs.describe(server) and "10.1.2.3" in certs.describe(server)
    with pytest.raises(certs.CertError):
        certs.parse_identity("edge", "dev-00001")
    with pytest.raises(certs.CertError):
        certs.parse_identity("device", "dev-00009..dev-00001")
    assert certs.init_ca(tmp_path) == (tmp_path / "ca.pem", False)  # an existing CA is kept


def test_tls_options_from_environment(tmp_path, monkeypatch):
    certs.init_ca(tmp_path)
    certs.issue(tmp_path, "edge", "edge-001")
    none = SimpleNamespace(ca=None, cert=None, key=None)
    for var in ("HFL_CA", "HFL_CERT", "HFL_KEY", "HFL_TLS", "HFL_TLS_SERVER_NAME"):
        monkeypatch.delenv(var, raising=False)
    assert not TlsOptions.from_args(none, "edge").enabled
    monkeypatch.setenv("HFL_TLS", "required")
    with pytest.raises(ValueError, match="HFL_TLS=required"):
        TlsOptions.from_args(none, "edge")
    monkeypatch.setenv("HFL_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("HFL_CERT", str(tmp_path / "edge-001.pem"))
    monkeypatch.setenv("HFL_KEY", str(tmp_path / "edge-001.key"))
    tls = TlsOptions.from_args(none, "edge")
    kwargs = tls.edge_kwargs("edge-001")
    assert kwargs["cloud_override_host"] == "cloud.hfl" and isinstance(kwargs["admit"], Admission)
    with pytest.raises(ValueError, match="names edge-001, but this edge is edge-000"):
        tls.edge_kwargs("edge-000")
    with pytest.raises(ValueError, match="needs a cloud certificate"):
        tls.server_kwargs()
    monkeypatch.setenv("HFL_TLS", "off")
    assert not TlsOptions.from_args(none, "edge").enabled


def test_admission_checks_role_ids_and_cluster(tmp_path):
    certs.init_ca(tmp_path)
    cert, _ = certs.issue(tmp_path, "device", "dev-00000..dev-00002", name="a")

    class Context:
        def __init__(self, pem):
            self.pem = pem

        def auth_context(self):
            return {"x509_pem_cert": [self.pem]} if self.pem else {}

    ctx, admit = Context(cert.read_bytes()), Admission("device")
    cluster_a, cluster_b = ["dev-00000", "dev-00001", "dev-00002"], ["dev-00003", "dev-00004", "dev-00005"]
    admit(ctx, "dev-00001", cluster_a)
    admit(ctx, "", cluster_a)
    for claimed, allowed, reason in [("dev-00003", cluster_b, "identity_mismatch"), ("", cluster_b, "foreign_cluster"),
                                     ("dev-00001", cluster_b, "foreign_cluster")]:
        with pytest.raises(wire.WireError) as refused:
            admit(ctx, claimed, allowed)
        assert refused.value.reason == reason and refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(wire.WireError) as refused:
        Admission("edge")(ctx, "edge-000", ["edge-000"])
    assert refused.value.reason == "wrong_role"
    with pytest.raises(wire.WireError) as refused:
        admit(Context(None), "dev-00001", cluster_a)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_testbed_certificates_match_the_topology(tmp_path):
    from hfl.common import config

    cfg = config.load(None, ["topology.edges=2", "topology.devices_per_edge=5", "topology.hosts_per_edge=2",
                             "topology.host_layout=per_edge"])
    args = testbed_certs.testbed_tls_args(tmp_path, cfg)
    assert sorted(args) == ["cloud", "devices-000-0", "devices-000-1", "devices-001-0", "devices-001-1", "edge",
                            "edge-000", "edge-001"]
    # a process of several edges: each edge's own certificate, {id} standing for it
    assert args["edge"][3] == str(tmp_path / "nodes" / "{id}.pem")
    names = {name: certs.identity_of(certs.load_cert(flags[3])).name for name, flags in args.items() if name != "edge"}
    assert names["edge-001"] == "edge-001" and names["cloud"] == "cloud"
    assert names["devices-000-0"] == "dev-00000..dev-00001" and names["devices-001-1"] == "dev-00007..dev-00009"
    assert all(flags[1] == str(tmp_path / "ca.pem") for flags in args.values())
    # per core (the default): one set of arguments for every per-core host, a manifest of a certificate per device
    per_core = testbed_certs.testbed_tls_args(tmp_path, config.load(None, ["topology.edges=2", "topology.devices_per_edge=5"]))
    assert sorted(per_core) == ["cloud", "devices", "edge", "edge-000", "edge-001"]
    assert per_core["devices"] == ["--ca", str(tmp_path / "ca.pem"), "--device-certs", str(tmp_path / "devices" / "edges-2x5.json")]
    manifest = device_certs.load_manifest(per_core["devices"][3])
    assert manifest.edges["edge-001"] == tuple(f"dev-{g:05d}" for g in range(5, 10))
    assert certs.identity_of(certs.load_cert(manifest.files("dev-00007")[0])).name == "dev-00007"
