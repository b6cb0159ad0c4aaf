"""Transport security options for the three roles (plaintext when no certificates are given)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TlsOptions:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_args(cls, args, role: str) -> "TlsOptions":
        given = [getattr(args, k, None) for k in ("ca", "cert", "key")]
        if any(given) and not all(given):
            raise ValueError("mutual TLS needs --ca, --cert and --key together")
        return cls(*given)

    @property
    def enabled(self) -> bool:
        return self.ca is not None

    def server_kwargs(self) -> dict:
        return {}

    def edge_kwargs(self, node_id: str) -> dict:
        return {}

    def client_kwargs(self) -> dict:
        return {}

    def probe_kwargs(self) -> dict:
        return {}
