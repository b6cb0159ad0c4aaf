"""A certificate per device, for device hosts that emulate devices of several edges under mutual TLS.

Each device D has its own key and certificate (O=hfl, OU=device, CN=D), CERTS/D.pem and CERTS/D.key, and
presents them on its own channel to its edge, so an edge's admission check sees exactly the device that
speaks. A device host finds them through a manifest (`hfl devices --device-certs FILE`), JSON written by
`hfl certs devices` or by the launcher:

    {"certs": ".", "edges": {"edge-000": ["dev-00000..dev-00049"], "edge-001": ["dev-00050..dev-00099"]}}

"certs" is relative to the manifest's folder; each edge lists its devices as ids or ranges dev-A..dev-B.
A host takes its share of the union of the edges' devices (`topology.union_slice`, the cut a plaintext
per-core host makes), and dials only the edges of its share, each address named by its edge id
(`--edge edge-001=HOST:PORT`).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization

from . import certs, topology

MIN_LEFT = datetime.timedelta(days=30)  # a cached certificate closer than this to its end is issued again


def manifest_name(edges: int, devices_per_edge: int) -> str:
    """The launcher's manifest of a topology (one folder of certificates serves every topology)."""
    return f"edges-{edges}x{devices_per_edge}.json"


def topology_edges(edges: int, devices_per_edge: int) -> dict[str, list[str]]:
    """Every edge of a run with its devices, as topology.edge_members assigns them."""
    return {topology.edge_id(e): topology.members_of(e, devices_per_edge) for e in range(edges)}


def _ranges(ids: list[str]) -> list[str]:
    """Consecutive ids folded into ranges: [dev-00000..dev-00002, dev-00007]."""
    out: list[str] = []
    indices = [topology.device_index(d) for d in ids]
    start = 0
    for i in range(1, len(indices) + 1):
        if i == len(indices) or indices[i] != indices[i - 1] + 1:
            out.append(certs.device_range(indices[start], i - start))
            start = i
    return out


def _expand(entry: str) -> list[str]:
    ident = certs.parse_identity("device", entry)
    return [topology.device_id(g) for g in range(ident.lo, ident.hi + 1)]


@dataclass(frozen=True)
class Manifest:
    edges: dict[str, tuple[str, ...]]  # edge id -> its devices, in index order
    cert_dir: pathlib.Path

    def files(self, device: str) -> tuple[pathlib.Path, pathlib.Path]:
        """The certificate and key of one device."""
        return self.cert_dir / f"{device}.pem", self.cert_dir / f"{device}.key"

    def share(self, host_index: int, hosts: int) -> dict[str, list[str]]:
        """One of `hosts` hosts' devices, by edge (only the edges it has devices of)."""
        edge_of = {d: e for e, ids in self.edges.items() for d in ids}
        out: dict[str, list[str]] = {}
        for device in topology.union_slice([list(ids) for ids in self.edges.values()], host_index, hosts):
            out.setdefault(edge_of[device], []).append(device)
        return out


def parse_manifest(data: dict, cert_dir: pathlib.Path) -> Manifest:
    if not isinstance(data, dict) or not isinstance(data.get("edges"), dict) or not data["edges"]:
        raise certs.CertError('a device manifest needs "edges": {EDGE_ID: [DEVICE_ID or RANGE, ...]}')
    edges: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for edge, entries in data["edges"].items():
        certs.parse_identity("edge", edge)
        entries = [entries] if isinstance(entries, str) else entries
        if not isinstance(entries, list):
            raise certs.CertError(f"{edge}: expected a list of device ids or ranges")
        ids = sorted({d for entry in entries for d in _expand(str(entry))}, key=topology.device_index)
        for d in ids:
            if d in seen:
                raise certs.CertError(f"{d} is listed under {seen[d]} and {edge}")
            seen[d] = edge
        edges[edge] = tuple(ids)
    return Manifest(edges, cert_dir / str(data.get("certs", ".")))


def load_manifest(path: str | os.PathLike) -> Manifest:
    path = pathlib.Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise certs.CertError(f"cannot read the device manifest {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise certs.CertError(f"{path} is not JSON: {exc}") from None
    return parse_manifest(data, path.parent)


def write_manifest(path: str | os.PathLike, edges: dict[str, list[str]], certs_rel: str = ".") -> pathlib.Path:
    path = pathlib.Path(path)
    body = {"certs": certs_rel, "edges": {e: _ranges(list(ids)) for e, ids in edges.items()}}
    certs.write_public(path, (json.dumps(body, indent=1) + "\n").encode())
    return path


# ---- issuing ------------------------------------------------------------------------------------

def _usable(cert_path: pathlib.Path, key_path: pathlib.Path, device: str, ca_cert, now: datetime.datetime) -> bool:
    """A cached pair still serves: it names `device`, the CA signed it, it is valid a while longer, the key fits."""
    try:
        cert = certs.load_cert(cert_path)
        ident = certs.identity_of(cert)
        certs.check_signed_by(cert, ca_cert, str(cert_path))
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (certs.CertError, OSError, ValueError, TypeError):
        return False
    return (ident.role == "device" and ident.name == device and cert.not_valid_after_utc - now > MIN_LEFT
            and key.public_key() == cert.public_key())


@contextlib.contextmanager
def _locked(folder: pathlib.Path):
    """One issuer at a time per folder (two launchers sharing a certificate folder would otherwise interleave
    the key of one with the certificate of the other)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def issue_devices(ca_dir: str | os.PathLike, devices: list[str], out_dir: str | os.PathLike,
                  days: int = certs.NODE_DAYS) -> int:
    """OUT/D.pem and OUT/D.key for every device D, signed by the CA in `ca_dir`; a pair already there that
    still serves is kept. Returns how many were issued."""
    ca_cert, ca_key = certs.load_ca(ca_dir)
    out = pathlib.Path(out_dir)
    now = datetime.datetime.now(datetime.timezone.utc)
    issued = 0
    with _locked(out):
        for device in devices:
            ident = certs.parse_identity("device", device)
            if ident.lo != ident.hi:
                raise certs.CertError(f"{device}: one device per certificate here, not a range")
            if _usable(out / f"{device}.pem", out / f"{device}.key", device, ca_cert, now):
                continue
            certs.write_pair(out, device, *certs.sign(ca_cert, ca_key, ident, days=days))
            issued += 1
    return issued


def issue_topology(ca_dir: str | os.PathLike, edges: int, devices_per_edge: int,
                   out_dir: str | os.PathLike) -> tuple[pathlib.Path, int]:
    """A certificate per device of an `edges` x `devices_per_edge` run and its manifest OUT/edges-ExM.json
    (`hfl certs devices`, the launcher). Returns (manifest, certificates issued)."""
    members = topology_edges(edges, devices_per_edge)
    issued = issue_devices(ca_dir, [d for ids in members.values() for d in ids], out_dir)
    return write_manifest(pathlib.Path(out_dir) / manifest_name(edges, devices_per_edge), members), issued
