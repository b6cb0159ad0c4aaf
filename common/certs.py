"""Certificates for mutual TLS: one CA (`hfl certs init`) signs every node (`hfl certs issue ROLE ID`).

A node certificate's subject is O=hfl, OU=<role>, CN=<id>. The roles are cloud, edge and device. A device
certificate names one device (each device presents its own: common/device_certs.py) or a contiguous range,
CN=dev-00000..dev-00009, that a device host of one edge presents for all its devices (an edge site).

Server certificates (cloud, edge) carry their role's fixed name (cloud.hfl, edge.hfl) as a DNS name:
clients check that name through grpc.ssl_target_name_override, so a server can be reached at any address
(container name, IP, NAT) without reissuing its certificate. localhost and 127.0.0.1 are always included.
"""
from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from . import topology

ROLES = ("cloud", "edge", "device")
SERVER_NAMES = {"cloud": "cloud.hfl", "edge": "edge.hfl"}
ORGANIZATION = "hfl"
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CA_DAYS = 3650
NODE_DAYS = 825


class CertError(ValueError):
    pass


@dataclass(frozen=True)
class Identity:
    """Who a certificate speaks for: a role and an id, or for devices an inclusive index range."""

    role: str
    name: str                 # the subject CN as written
    lo: int | None = None     # device index range (devices only)
    hi: int | None = None

    def covers(self, node_id: str) -> bool:
        if self.role != "device":
            return node_id == self.name
        index = topology.parse_index(node_id, topology.DEVICE_RE)
        return index is not None and self.lo <= index <= self.hi

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


def parse_identity(role: str, name: str) -> Identity:
    """Validate an id for `role`: cloud: any short name; edge: edge-NNN; device: dev-NNNNN or dev-A..dev-B."""
    if role not in ROLES:
        raise CertError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if not name or len(name) > 64:
        raise CertError(f"id {name!r}: 1 to 64 characters")
    if role == "edge":
        if topology.parse_index(name, topology.EDGE_RE) is None:
            raise CertError(f"bad edge id {name!r}: expected edge-NNN")
    elif role == "device":
        first, sep, last = name.partition("..")
        lo = topology.parse_index(first, topology.DEVICE_RE)
        hi = topology.parse_index(last, topology.DEVICE_RE) if sep else lo
        if lo is None or hi is None or hi < lo:
            raise CertError(f"bad device id {name!r}: expected dev-NNNNN or a range dev-NNNNN..dev-MMMMM")
        return Identity(role, name, lo, hi)
    return Identity(role, name)


def device_range(first_index: int, count: int) -> str:
    """The CN for `count` consecutive devices from `first_index`."""
    first = topology.device_id(first_index)
    return first if count == 1 else f"{first}..{topology.device_id(first_index + count - 1)}"


def identity_of(cert: x509.Certificate) -> Identity:
    subject = cert.subject
    roles = subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(roles) != 1 or len(names) != 1:
        raise CertError(f"certificate {subject.rfc4514_string()} is not an hfl node certificate (needs one OU and one CN)")
    return parse_identity(str(roles[0].value), str(names[0].value))


@functools.lru_cache(maxsize=4096)
def identity_from_pem(pem: bytes) -> Identity:
    """Parse a peer certificate (cached: every RPC of a connection carries the same one)."""
    return identity_of(x509.load_pem_x509_certificate(pem))


def read_bytes(path: str | os.PathLike, what: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the {what} {path}: {exc.strerror}") from None


def load_cert(path: str | os.PathLike) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pathlib.Path(path).read_bytes())
    except FileNotFoundError:
        raise CertError(f"{path}: no such certificate file") from None
    except ValueError as exc:
        raise CertError(f"{path}: not a PEM certificate ({exc})") from None


def check_signed_by(cert: x509.Certificate, ca: x509.Certificate, what: str) -> None:
    """Fail fast (before any connection) when a node's certificate is not from the CA it was given, or expired."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError) as exc:
        raise CertError(f"{what} was not issued by the CA {ca.subject.rfc4514_string()} ({exc})") from None
    except Exception as exc:  # InvalidSignature carries no message
        raise CertError(f"{what} was not signed by the CA {ca.subject.rfc4514_string()} ({exc.__class__.__name__})") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise CertError(f"{what} is not valid now (valid {cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d})")


# ---- issuing ------------------------------------------------------------------------------------

def _write_private(path: pathlib.Path, data: bytes) -> None:
    """Write a key readable by its owner only (created 0600, never world-readable even for a moment)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # per process: two launchers may share a folder
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def write_public(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # per process: two launchers may share a folder
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)  # 5 min: clock skew between sites


def init_ca(directory: str | os.PathLike, force: bool = False, days: int = CA_DAYS,
            name: str = "hfl testbed CA") -> tuple[pathlib.Path, bool]:
    """Create DIR/ca.pem and DIR/ca.key; keep an existing CA unless `force`. Returns (ca.pem, created)."""
    d = pathlib.Path(directory)
    cert_path, key_path = d / CA_CERT, d / CA_KEY
    if cert_path.exists() and key_path.exists() and not force:
        load_cert(cert_path)
        return cert_path, False
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start, end = _validity(days)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, _key_pem(key))
    write_public(cert_path, _cert_pem(cert))
    return cert_path, True


def _san_entry(text: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        return x509.DNSName(text)


def load_ca(directory: str | os.PathLike):
    """The CA certificate and key in `directory` (a CertError when there is none)."""
    d = pathlib.Path(directory)
    if not (d / CA_KEY).exists():
        raise CertError(f"no CA in {d} (run `hfl certs init --dir {d}` first)")
    return load_cert(d / CA_CERT), serialization.load_pem_private_key((d / CA_KEY).read_bytes(), password=None)


def sign(ca_cert: x509.Certificate, ca_key, ident: Identity, sans: tuple[str, ...] | list[str] = (),
         days: int = NODE_DAYS) -> tuple[bytes, bytes]:
    """A new P-256 key and the node certificate naming `ident`, signed by the CA: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ident.role),
                         x509.NameAttribute(NameOID.COMMON_NAME, ident.name)])
    start, end = _validity(days)
    builder = (x509.CertificateBuilder()
               .subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               # every node is a TLS client (edges of the cloud, devices of edges, health probes of their own server)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]),
                              critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False))
    names: list[str] = []
    if ident.role in SERVER_NAMES:
        names = [SERVER_NAMES[ident.role], f"{ident.name}.hfl", "localhost", "127.0.0.1", "::1"]
    names = list(dict.fromkeys(names + [s for s in sans if s]))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san_entry(s) for s in names]), critical=False)
    return _cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key)


def write_pair(out: pathlib.Path, base: str, cert_pem: bytes, key_pem: bytes) -> tuple[pathlib.Path, pathlib.Path]:
    """OUT/BASE.pem and OUT/BASE.key (the key first: a certificate on disk always has its key)."""
    if "/" in base or base.startswith("."):
        raise CertError(f"bad file name {base!r}")
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{base}.pem", out / f"{base}.key"
    _write_private(key_path, key_pem)
    write_public(cert_path, cert_pem)
    return cert_path, key_path


def issue(directory: str | os.PathLike, role: str, node_id: str, sans: tuple[str, ...] | list[str] = (),
          name: str | None = None, days: int = NODE_DAYS, out_dir: str | os.PathLike | None = None
          ) -> tuple[pathlib.Path, pathlib.Path]:
    """Issue a node certificate signed by the CA in `directory`; writes OUT/NAME.pem and OUT/NAME.key.

    NAME defaults to the id (for a device range, the range text); OUT defaults to `directory`.
    """
    ident = parse_identity(role, node_id)
    ca_cert, ca_key = load_ca(directory)
    cert_pem, key_pem = sign(ca_cert, ca_key, ident, sans, days)
    out = pathlib.Path(out_dir) if out_dir is not None else pathlib.Path(directory)
    return write_pair(out, name or ident.name, cert_pem, key_pem)


def describe(path: str | os.PathLike) -> str:
    cert = load_cert(path)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        alt = ", ".join(str(getattr(n, "value", n)) for n in sans)
    except x509.ExtensionNotFound:
        alt = "-"
    return (f"{path}: {cert.subject.rfc4514_string()}; issuer {cert.issuer.rfc4514_string()}; "
            f"valid to {cert.not_valid_after_utc:%Y-%m-%d}; names: {alt}")
