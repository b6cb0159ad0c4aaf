"""A certificate per device: the manifest, a host's share and routes, the credentials each device presents, and the
cache of issued certificates (common/device_certs.py, common/host_credentials.py)."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from hfl.common import certs, device_certs, host_credentials, topology
from hfl.common.tls import TlsOptions


def reply(cluster: str, members: list[str]) -> SimpleNamespace:
    return SimpleNamespace(cluster_id=cluster, members=members)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA and the 2 x 3 topology's device certificates with their manifest."""
    root = tmp_path_factory.mktemp("pki")
    certs.init_ca(root)
    manifest, issued = device_certs.issue_topology(root, 2, 3, root / "devices")
    return SimpleNamespace(root=root, manifest=manifest, issued=issued)


def test_manifest_folds_ranges_and_reads_back(tmp_path):
    edges = {"edge-000": ["dev-00000", "dev-00001", "dev-00002", "dev-00007"], "edge-001": ["dev-00003"]}
    path = device_certs.write_manifest(tmp_path / "m.json", edges, "certs")
    assert json.loads(path.read_text())["edges"] == {"edge-000": ["dev-00000..dev-00002", "dev-00007"],
                                                     "edge-001": ["dev-00003"]}
    manifest = device_certs.load_manifest(path)
    assert {e: list(ids) for e, ids in manifest.edges.items()} == edges
    assert manifest.files("dev-00003") == (tmp_path / "certs" / "dev-00003.pem", tmp_path / "certs" / "dev-00003.key")


@pytest.mark.parametrize("body, message", [
    ({"edges": {"edge-000": ["dev-00000..dev-00002"], "edge-001": ["dev-00002"]}}, "dev-00002 is listed under edge-000 and edge-001"),
    ({"edges": {"dev-00000": ["dev-00001"]}}, "bad edge id"),
    ({"edges": {"edge-000": ["dev-00003..dev-00001"]}}, "bad device id"),
    ({"devices": []}, '"edges"'),
])
def test_a_bad_manifest_is_refused(tmp_path, body, message):
    (tmp_path / "m.json").write_text(json.dumps(body))
    with pytest.raises(certs.CertError, match=message):
        device_certs.load_manifest(tmp_path / "m.json")


def test_a_hosts_share_is_the_plaintext_per_core_cut_grouped_by_edge():
    edges = device_certs.topology_edges(2, 3)
    manifest = device_certs.Manifest({e: tuple(ids) for e, ids in edges.items()}, None)
    for hosts in (1, 2, 3, 4, 6):
        for h in range(hosts):
            share = manifest.share(h, hosts)
            flat = [d for ids in share.values() for d in ids]
            assert flat == topology.union_slice(list(edges.values()), h, hosts)
            assert all(set(ids) <= set(edges[e]) for e, ids in share.items())
    assert manifest.share(1, 3) == {"edge-000": ["dev-00002"], "edge-001": ["dev-00003"]}


def test_addresses_are_routed_by_edge_id():
    assert host_credentials.split_address("edge-001=10.0.0.1:50061") == ("edge-001", "10.0.0.1:50061")
    assert host_credentials.split_address("[::1]:50061") == (None, "[::1]:50061")
    given = ["edge-000=a:1", "edge-001=b:2", "edge-002=c:3"]
    assert host_credentials.route(["edge-002", "edge-000"], given) == {"edge-002": "c:3", "edge-000": "a:1"}
    assert host_credentials.route(["edge-004"], ["site:50061"]) == {"edge-004": "site:50061"}
    with pytest.raises(certs.CertError, match="no address for edge-000, edge-001: .* \\(--edge edge-000=HOST:PORT\\)"):
        host_credentials.route(["edge-000", "edge-001"], ["a:1", "b:2"])
    with pytest.raises(certs.CertError, match="no address for edge-003"):
        host_credentials.route(["edge-003"], given)
    with pytest.raises(certs.CertError, match="bad edge id"):
        host_credentials.split_address("dev-00001=a:1")


def test_issued_once_then_kept_and_reissued_when_no_longer_usable(pki, tmp_path):
    assert pki.issued == 6
    for g in range(6):
        device = topology.device_id(g)
        ident = certs.identity_of(certs.load_cert(pki.root / "devices" / f"{device}.pem"))
        assert (ident.role, ident.name) == ("device", device)
        assert oct((pki.root / "devices" / f"{device}.key").stat().st_mode & 0o777) == "0o600"
    assert device_certs.issue_topology(pki.root, 2, 3, pki.root / "devices")[1] == 0  # cached
    # a copy whose key does not fit one certificate, then a new CA: reissued
    shutil.copytree(pki.root, tmp_path / "copy")
    folder = tmp_path / "copy" / "devices"
    (folder / "dev-00004.key").write_bytes((folder / "dev-00005.key").read_bytes())
    assert device_certs.issue_devices(tmp_path / "copy", ["dev-00004", "dev-00005"], folder) == 1
    certs.init_ca(tmp_path / "copy", force=True)
    assert device_certs.issue_topology(tmp_path / "copy", 2, 3, folder)[1] == 6
    with pytest.raises(certs.CertError, match="one device per certificate"):
        device_certs.issue_devices(pki.root, ["dev-00000..dev-00002"], tmp_path)


def test_each_device_presents_its_own_certificate(pki, tmp_path):
    ca = (pki.root / "ca.pem").read_bytes()
    creds = host_credentials.DeviceCredentials(ca, device_certs.load_manifest(pki.manifest), "edge.hfl")
    # host 1 of 3 holds dev-00002 (edge-000) and dev-00003 (edge-001): it dials those two edges only, each with a
    # certificate of one of its devices there, whatever other edges it is given
    dials = creds.dials(["edge-001=b:2", "edge-000=a:1", "edge-009=z:9"], 1, 3)
    assert [(d.edge, d.address) for d in dials] == [("edge-000", "a:1"), ("edge-001", "b:2")]
    assert dials[0].credentials is not None and dials[0].credentials is not dials[1].credentials
    found = [(dials[0], reply("edge-000", ["dev-00000", "dev-00001", "dev-00002"])),
             (dials[1], reply("edge-001", ["dev-00003", "dev-00004", "dev-00005"]))]
    assert creds.devices(found, 1, 3) == ["dev-00002", "dev-00003"]
    with pytest.raises(certs.CertError, match="puts dev-00003 under edge-001, which does not count it"):
        creds.devices([found[0], (dials[1], reply("edge-001", ["dev-00006"]))], 1, 3)
    # a certificate file that names another device than its name says
    shutil.copytree(pki.root / "devices", tmp_path / "devices")
    for ext in ("pem", "key"):
        shutil.copy(tmp_path / "devices" / f"dev-00001.{ext}", tmp_path / "devices" / f"dev-00000.{ext}")
    swapped = host_credentials.DeviceCredentials(ca, device_certs.load_manifest(tmp_path / "devices" / pki.manifest.name))
    with pytest.raises(certs.CertError, match="is the certificate of device dev-00001, not of device dev-00000"):
        swapped.for_device("dev-00000")
    other = tmp_path / "other"
    certs.init_ca(other)
    foreign = host_credentials.DeviceCredentials((other / "ca.pem").read_bytes(), device_certs.load_manifest(pki.manifest))
    with pytest.raises(certs.CertError, match="was not signed by the CA"):
        foreign.for_device("dev-00002")


def test_shared_credentials_discover_every_edge_and_cut_the_union():
    shared = host_credentials.SharedCredentials()
    dials = shared.dials(["edge-000=a:1", "b:2"], 0, 2)
    assert [(d.edge, d.address, d.credentials) for d in dials] == [("edge-000", "a:1", None), (None, "b:2", None)]
    found = [(dials[0], reply("edge-000", ["dev-00000", "dev-00001"])), (dials[1], reply("edge-001", ["dev-00002", "dev-00003"]))]
    assert shared.devices(found, 1, 2) == ["dev-00002", "dev-00003"]
    assert shared.for_device("dev-00002") is None


def test_tls_options_take_a_manifest_instead_of_cert_and_key(pki, monkeypatch):
    for var in ("HFL_CA", "HFL_CERT", "HFL_KEY", "HFL_TLS", "HFL_DEVICE_CERTS", "HFL_TLS_SERVER_NAME"):
        monkeypatch.delenv(var, raising=False)
    ca = str(pki.root / "ca.pem")
    tls = TlsOptions.from_args(SimpleNamespace(ca=ca, cert=None, key=None, device_certs=str(pki.manifest)), "devices")
    assert tls.enabled and tls.described == f"mutual TLS, a certificate per device ({pki.manifest})"
    identity = tls.client_kwargs()["identity"]
    assert isinstance(identity, host_credentials.DeviceCredentials) and identity.override_host == "edge.hfl"
    with pytest.raises(ValueError, match="replaces --cert and --key"):
        TlsOptions.from_args(SimpleNamespace(ca=ca, cert="x.pem", key=None, device_certs=str(pki.manifest)), "devices")
    with pytest.raises(ValueError, match="needs --ca"):
        TlsOptions.from_args(SimpleNamespace(ca=None, cert=None, key=None, device_certs=str(pki.manifest)), "devices")
    monkeypatch.setenv("HFL_TLS", "required")
    monkeypatch.setenv("HFL_CA", ca)
    monkeypatch.setenv("HFL_DEVICE_CERTS", str(pki.manifest))
    none = SimpleNamespace(ca=None, cert=None, key=None)
    assert TlsOptions.from_args(none, "devices").device_certs == str(pki.manifest)
    with pytest.raises(ValueError, match="missing --cert"):  # the variable is a device host's only
        TlsOptions.from_args(none, "edge")
