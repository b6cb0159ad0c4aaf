"""What a device host's devices present to their edges, and so which edges it dials and which devices it emulates.

- `SharedCredentials`: every device of the host presents the same credentials: none (plaintext) or one
  certificate naming a range of devices (a per-edge host, an edge site). The host discovers every edge it is
  given and takes its share of the union of their members.
- `DeviceCredentials`: each device presents its own certificate on its own channel (a manifest, see
  common/device_certs.py). The host's share comes from the manifest; it dials only the edges of its share,
  each discovery with the certificate of one of that edge's devices in the share (an edge refuses the
  discovery call of a certificate that names none of its members).

An edge address may carry the edge's id, `edge-001=HOST:PORT`: discovery then checks that the edge there is
that one, and per-device credentials need it to know which address serves which of their devices.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import certs, device_certs, topology


@dataclass(frozen=True)
class Dial:
    """One discovery call: the edge expected at `address` (None: any), with these credentials."""

    edge: str | None
    address: str
    credentials: object = None


def split_address(text: str) -> tuple[str | None, str]:
    """`edge-001=HOST:PORT` -> ("edge-001", "HOST:PORT"); a bare address has no edge."""
    edge, sep, address = text.partition("=")
    if not sep:
        return None, text
    certs.parse_identity("edge", edge)
    if not address:
        raise certs.CertError(f"{text!r}: no address after {edge}=")
    return edge, address


def route(edges: list[str], addresses: list[str]) -> dict[str, str]:
    """The address of each of `edges`: the one named by its id; a single bare address serves a single edge."""
    named: dict[str, str] = {}
    bare: list[str] = []
    for text in addresses:
        edge, address = split_address(text)
        if edge is None:
            bare.append(address)
        else:
            named[edge] = address
    if len(edges) == 1 and edges[0] not in named and not named and len(bare) == 1:
        return {edges[0]: bare[0]}
    missing = [e for e in edges if e not in named]
    if missing:
        raise certs.CertError(f"no address for {', '.join(missing)}: with a certificate per device, name each edge's "
                              f"address by its id (--edge {missing[0]}=HOST:PORT)")
    return {e: named[e] for e in edges}


class SharedCredentials:
    shared = True  # one call's credentials cover every device of the host: one fetch may speak for several

    def __init__(self, credentials=None, override_host: str | None = None):
        self.credentials = credentials
        self.override_host = override_host

    def dials(self, addresses: list[str], host_index: int, hosts: int) -> list[Dial]:
        return [Dial(*split_address(a), self.credentials) for a in addresses]

    def devices(self, discovered: list[tuple[Dial, object]], host_index: int, hosts: int) -> list[str]:
        return topology.union_slice([reply.members for _, reply in discovered], host_index, hosts)

    def for_device(self, device: str):
        return self.credentials


class DeviceCredentials:
    shared = False  # a call covers only the device whose certificate it presents

    def __init__(self, ca_pem: bytes, manifest: device_certs.Manifest, override_host: str | None = None,
                 source: str = "the manifest"):
        self.ca_pem = ca_pem
        self.manifest = manifest
        self.override_host = override_host
        self.source = source
        self._ca = None

    def dials(self, addresses: list[str], host_index: int, hosts: int) -> list[Dial]:
        share = self.manifest.share(host_index, hosts)
        return [Dial(edge, address, self.for_device(share[edge][0])) for edge, address in route(list(share), addresses).items()]

    def devices(self, discovered: list[tuple[Dial, object]], host_index: int, hosts: int) -> list[str]:
        share = self.manifest.share(host_index, hosts)
        for dial, reply in discovered:
            strangers = sorted(set(share[dial.edge]) - set(reply.members), key=topology.device_index)
            if strangers:
                raise certs.CertError(f"{self.source} puts {strangers[0]} under {dial.edge}, which does not count it among "
                                      f"its members: a manifest for another topology?")
        return sorted((d for ids in share.values() for d in ids), key=topology.device_index)

    def for_device(self, device: str):
        """The device's own channel credentials; its certificate must name it and come from the CA (checked here,
        before any connection)."""
        import grpc
        from cryptography import x509

        cert_path, key_path = self.manifest.files(device)
        cert_pem, key_pem = certs.read_bytes(cert_path, "certificate"), certs.read_bytes(key_path, "private key")
        if self._ca is None:
            self._ca = x509.load_pem_x509_certificate(self.ca_pem)
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as exc:
            raise certs.CertError(f"{cert_path}: not a PEM certificate ({exc})") from None
        certs.check_signed_by(cert, self._ca, f"certificate {cert_path}")
        ident = certs.identity_of(cert)
        if ident.role != "device" or ident.name != device:
            raise certs.CertError(f"{cert_path} is the certificate of {ident}, not of device {device}")
        return grpc.ssl_channel_credentials(self.ca_pem, key_pem, cert_pem)
