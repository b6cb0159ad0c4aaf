"""Several edges in one process (topology.edge_processes): the same metrics as one process per edge; under mutual
TLS each edge presents its own certificate on its own port, and an edge that shares its process still refuses a
device whose certificate names another edge's device."""
import socket
import ssl
import time

import grpc
import pytest

from hfl.common import certs
from hfl.testbed import TestbedError
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .conftest import SMALL
from .rawclient import wait_serving
from .test_layouts import LAYOUT, key


def test_edges_sharing_a_process_give_the_same_metrics(hfl_testbed):
    alone = hfl_testbed(overrides=LAYOUT)
    alone.wait(timeout=300)
    shared = hfl_testbed(overrides=LAYOUT + ["topology.edge_processes=1"])
    shared.wait(timeout=300)
    assert [n for n in shared.nodes if n.startswith("edge-")] == ["edge-c0"]
    assert sorted(shared.edge_address) == ["edge-000", "edge-001"]
    assert len(set(shared.edge_address.values())) == 2  # a port each
    rows = shared.metrics()
    assert len(rows) == 3 and all(r["devices"] == 6 and r["refused"] == 0 for r in rows)
    assert key(rows) == key(alone.metrics())


def _server_certificate_name(address: str, ca, cert, key) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    ctx.load_cert_chain(str(cert), str(key))
    ctx.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    return certs.identity_of(x509.load_der_x509_certificate(der)).name


def test_edges_sharing_a_process_under_mutual_tls(hfl_testbed, tmp_path):
    ca = tmp_path / "ca"
    bed = hfl_testbed(overrides=SMALL + ["topology.edge_processes=1", "run.rounds=4"], certs=ca)
    device = [ca / "devices" / f"dev-00000.{ext}" for ext in ("pem", "key")]  # a device of edge-000
    for edge, address in bed.edge_address.items():
        assert _server_certificate_name(address, ca / "ca.pem", *device) == edge
    creds = grpc.ssl_channel_credentials((ca / "ca.pem").read_bytes(), device[1].read_bytes(), device[0].read_bytes())
    statuses = {}
    with grpc.secure_channel(bed.edge_address["edge-001"], creds,
                             options=[("grpc.ssl_target_name_override", "edge.hfl")]) as chan:
        # its port file says only that it listens: until it has joined its cloud it answers UNAVAILABLE ("not yet")
        # whatever it is sent, before it can judge a certificate; SERVING says it has
        wait_serving(chan, what="edge-001")
        stub = pbg.EdgeServiceStub(chan)
        for claimed in ("dev-00000", "dev-00003"):  # its own id at another edge; another edge's device
            try:
                stub.Register(pb.RegisterRequest(node_id=claimed, num_samples=10), timeout=10)
                statuses[claimed] = (grpc.StatusCode.OK, "")
            except grpc.RpcError as exc:
                statuses[claimed] = (exc.code(), exc.details())
    assert statuses["dev-00000"][0] == grpc.StatusCode.PERMISSION_DENIED
    assert "'dev-00000' is not a device of edge-001" in statuses["dev-00000"][1], statuses
    assert statuses["dev-00003"][0] == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate of device dev-00000 does not name dev-00003" in statuses["dev-00003"][1], statuses
    summary = bed.wait(timeout=300)
    assert summary["rounds"] == 4 and summary["devices"] == 6 and summary["dropped_edges"] == []
    assert summary["refused"] >= 2
    log = (bed.run_dir / "logs" / "edge-c0.log").read_text()
    assert "refused unknown_device from ipv4:127.0.0.1" in log and "refused identity_mismatch" in log, log[-2000:]


def test_one_edge_of_a_shared_process_cannot_be_given_its_own_arguments(hfl_testbed):
    """`--trust untrusted` (or a proxy) for edge-000 alone cannot apply to a process serving edge-000 and edge-001:
    refused, not silently dropped."""
    for extra in ({"extra_args": {"edge-000": ["--trust", "untrusted"]}}, {"via": {"edge-001": "127.0.0.1:9"}}):
        with pytest.raises(TestbedError, match="share a process"):
            hfl_testbed(overrides=SMALL + ["topology.edge_processes=1"], **extra)


def test_a_crash_of_a_shared_edge_process_loses_its_edges_and_the_run_goes_on(hfl_testbed):
    """kill -9 of the process serving edge-002 and edge-003 after round 0: the cloud notices both edges lost, goes
    on with the other process's edges and their devices, and the run ends; the group cannot be restarted (its
    edges' ports would change), which the testbed says. The device host left with only those edges' devices is
    stopped once everything else has ended."""
    bed = hfl_testbed(overrides=SMALL + ["topology.edges=4", "topology.edge_processes=2", "run.rounds=4",
                                         "net.rejoin_grace_s=2"])
    assert sorted(n for n in bed.nodes if n.startswith("edge-")) == ["edge-c0", "edge-c1"]
    rows = []
    for row in bed.iter_metrics(timeout=300):
        rows.append(row)
        if len(rows) == 1:
            bed.kill("edge-c1")
            with pytest.raises(TestbedError, match="serves several edges"):
                bed.restart("edge-c1")
    started = time.monotonic()
    summary = bed.wait(timeout=300)
    assert time.monotonic() - started < 60
    assert summary["rounds"] == 4
    # the host of edge-002's and edge-003's devices never hears that the run ended: stopped, named, not a failure
    assert summary["stopped_device_hosts"] == ["devices-c1"] and bed.failures() == []
    assert rows[0]["edges"] == 4 and rows[0]["devices"] == 12
    assert rows[-1]["edges"] == 2 and rows[-1]["devices"] == 6
    cloud = (bed.run_dir / "logs" / "cloud.log").read_text()
    assert "lost edge-002" in cloud and "lost edge-003" in cloud, cloud[-2000:]
    assert all(r["edges"] == 2 for r in rows[2:])  # the other process's edges stayed (their streams close at the end)
