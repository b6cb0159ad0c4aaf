"""Mutual TLS for the three roles: credentials from --ca/--cert/--key, and the admission check servers run.

Two layers refuse a peer:

1. The TLS handshake (grpc, require_client_auth): a plaintext client, a client without a certificate and
   a client whose certificate another CA signed never get a connection. The client's RPC fails with
   UNAVAILABLE; the server's grpc core logs "Handshake failed ... WRONG_VERSION_NUMBER" (plaintext),
   "PEER_DID_NOT_RETURN_A_CERTIFICATE" or "CERTIFICATE_VERIFY_FAILED" (foreign CA). No handler runs, so
   these are not in the services' refusal counts.
2. `Admission` (the services' `admit` hook, in every RPC handler): the certificate must be of the right
   role (the cloud admits edges, an edge admits devices) and must name the id the peer claims, and that
   id must be one the server admits (an edge: its own cluster). The RPC is aborted with
   PERMISSION_DENIED; the service logs and counts the refusal by reason.

Without certificates everything is plaintext, as for `hfl run`. The environment supplies defaults, for
containers: HFL_CA, HFL_CERT, HFL_KEY (paths), HFL_TLS=required (refuse to start without them; the image
sets it) or HFL_TLS=off (plaintext even if the variables are set), HFL_TLS_SERVER_NAME (name a probe or
client expects in the server's certificate; default cloud.hfl / edge.hfl by role). A device host may take
--device-certs MANIFEST (or HFL_DEVICE_CERTS) instead of --cert/--key: a certificate per device
(common/device_certs.py, common/host_credentials.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from . import certs, topology

ENV = {"ca": "HFL_CA", "cert": "HFL_CERT", "key": "HFL_KEY"}
DEVICE_CERTS_ENV = "HFL_DEVICE_CERTS"
MODE_ENV = "HFL_TLS"
SERVER_NAME_ENV = "HFL_TLS_SERVER_NAME"


@dataclass(frozen=True)
class TlsOptions:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    role: str | None = None  # the process: cloud, edge, devices, probe
    device_certs: str | None = None  # a device host: a manifest of a certificate per device, instead of cert/key

    @classmethod
    def from_args(cls, args, role: str | None = None) -> "TlsOptions":
        given = [getattr(args, k, None) for k in ("ca", "cert", "key")]
        manifest = getattr(args, "device_certs", None)
        mode = os.environ.get(MODE_ENV, "").strip().lower()
        if mode not in ("", "off", "required", "optional"):
            raise ValueError(f"{MODE_ENV}={mode!r}: expected required, optional or off")
        if not any(given) and not manifest and mode != "off":
            given = [os.environ.get(ENV[k]) or None for k in ("ca", "cert", "key")]
            manifest = os.environ.get(DEVICE_CERTS_ENV) or None if role == "devices" else None
        if manifest:
            if given[1] or given[2]:
                raise ValueError(f"--device-certs (or {DEVICE_CERTS_ENV}) replaces --cert and --key: give one or the other")
            if not given[0]:
                raise ValueError(f"--device-certs needs --ca (or {ENV['ca']}), the CA that signs every node")
            return cls(given[0], role=role, device_certs=manifest)
        if any(given) and not all(given):
            missing = [f"--{k} (or {ENV[k]})" for k, v in zip(("ca", "cert", "key"), given) if not v]
            raise ValueError(f"mutual TLS needs --ca, --cert and --key together; missing {', '.join(missing)}")
        if mode == "required" and not all(given):
            raise ValueError(f"{MODE_ENV}=required: mutual TLS is on in this environment; mount the certificates and "
                             f"give --ca/--cert/--key or {ENV['ca']}/{ENV['cert']}/{ENV['key']} "
                             f"(or set {MODE_ENV}=off for plaintext)")
        return cls(*given, role=role)

    @property
    def enabled(self) -> bool:
        return self.ca is not None

    def for_node(self, node_id: str) -> "TlsOptions":
        """These options with `{id}` in the certificate and key paths standing for `node_id` (a process that
        serves several edges: each presents its own certificate)."""
        import dataclasses

        return dataclasses.replace(self, **{k: getattr(self, k).replace("{id}", node_id)
                                            for k in ("cert", "key") if getattr(self, k)})

    # ---- material -----------------------------------------------------------------------------
    def _material(self) -> tuple[bytes, bytes, bytes, certs.Identity]:
        ca, cert, key = (certs.read_bytes(self.ca, "CA certificate"), certs.read_bytes(self.cert, "certificate"),
                         certs.read_bytes(self.key, "private key"))
        try:
            from cryptography import x509

            ca_cert = x509.load_pem_x509_certificate(ca)
            own = x509.load_pem_x509_certificate(cert)
        except ValueError as exc:
            raise ValueError(f"{self.ca} or {self.cert} is not a PEM certificate: {exc}") from None
        certs.check_signed_by(own, ca_cert, f"certificate {self.cert}")
        return ca, cert, key, certs.identity_of(own)

    def _expect_role(self, ident: certs.Identity, role: str) -> None:
        if ident.role != role:
            raise ValueError(f"{self.cert} is a {ident.role} certificate ({ident.name}); this process needs a {role} certificate")

    # ---- per role -----------------------------------------------------------------------------
    def server_kwargs(self) -> dict:
        """Cloud: TLS server that admits edges."""
        if not self.enabled:
            return {}
        import grpc

        ca, cert, key, ident = self._material()
        self._expect_role(ident, "cloud")
        return {"server_credentials": grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                                                  require_client_auth=True),
                "admit": Admission("edge")}

    def edge_kwargs(self, node_id: str) -> dict:
        """Edge: TLS server that admits its cluster's devices, and a TLS client of the cloud."""
        if not self.enabled:
            return {}
        import grpc

        ca, cert, key, ident = self._material()
        self._expect_role(ident, "edge")
        wanted = topology.edge_id(topology.edge_index(node_id))
        if ident.name != wanted:
            raise ValueError(f"{self.cert} names {ident.name}, but this edge is {wanted}")
        return {"server_credentials": grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                                                  require_client_auth=True),
                "admit": Admission("device"),
                "cloud_credentials": grpc.ssl_channel_credentials(ca, key, cert),
                "cloud_override_host": os.environ.get(SERVER_NAME_ENV) or certs.SERVER_NAMES["cloud"]}

    @property
    def described(self) -> str:
        if not self.enabled:
            return "plaintext"
        return f"mutual TLS with {self.cert}" if self.cert else f"mutual TLS, a certificate per device ({self.device_certs})"

    def client_kwargs(self) -> dict:
        """Device host: a TLS client of its edges, presenting one device certificate (a range of devices) for all
        its devices, or each device its own (a manifest)."""
        if not self.enabled:
            return {}
        import grpc

        from . import device_certs, host_credentials

        server_name = os.environ.get(SERVER_NAME_ENV) or certs.SERVER_NAMES["edge"]
        if self.device_certs:
            return {"identity": host_credentials.DeviceCredentials(
                certs.read_bytes(self.ca, "CA certificate"), device_certs.load_manifest(self.device_certs), server_name,
                self.device_certs)}
        ca, cert, key, ident = self._material()
        self._expect_role(ident, "device")
        return {"identity": host_credentials.SharedCredentials(grpc.ssl_channel_credentials(ca, key, cert), server_name)}

    def probe_kwargs(self) -> dict:
        """Health probe: any node certificate. The server name it expects: HFL_TLS_SERVER_NAME, else its own
        role's (a container probes its own server; a device certificate probes an edge)."""
        if not self.enabled:
            return {}
        import grpc

        ca, cert, key, ident = self._material()
        name = os.environ.get(SERVER_NAME_ENV) or certs.SERVER_NAMES.get(ident.role, certs.SERVER_NAMES["edge"])
        return {"credentials": grpc.ssl_channel_credentials(ca, key, cert), "override_host": name}


class Admission:
    """The `admit(context, claimed_id, allowed_ids)` hook: the verified peer certificate must be of `role`,
    name `claimed_id` and `claimed_id` must be allowed; for a discovery call (claimed_id == "") the
    certificate must name at least one allowed id. Raises WireError (PERMISSION_DENIED / UNAUTHENTICATED)."""

    def __init__(self, role: str):
        self.role = role

    def identity(self, context) -> certs.Identity:
        from .wire import WireError
        import grpc

        pem = context.auth_context().get("x509_pem_cert")
        if not pem:
            raise WireError(grpc.StatusCode.UNAUTHENTICATED, "no verified client certificate on this connection",
                            "no_certificate")
        try:
            return certs.identity_from_pem(pem[0])
        except ValueError as exc:
            raise WireError(grpc.StatusCode.PERMISSION_DENIED, f"unusable client certificate: {exc}", "bad_certificate") from None

    def __call__(self, context, claimed_id: str, allowed_ids) -> None:
        from .wire import WireError
        import grpc

        ident = self.identity(context)
        if ident.role != self.role:
            raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                            f"{self.role} certificate required; got the certificate of {ident}", "wrong_role")
        if claimed_id:
            if not ident.covers(claimed_id):
                raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                                f"certificate of {ident} does not name {claimed_id}", "identity_mismatch")
            if claimed_id not in allowed_ids:
                raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                                f"{claimed_id} ({ident}) is not admitted here: {_span(allowed_ids)}", "foreign_cluster")
        elif not any(ident.covers(node) for node in allowed_ids):
            raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                            f"certificate of {ident} names none of {_span(allowed_ids)}", "foreign_cluster")


def _span(ids) -> str:
    ids = list(ids)
    if not ids:
        return "no ids"
    return ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]} ({len(ids)} ids)"
