"""The [observe] config section of hfl.common.config.Config: the cloud's live page and /metrics."""
from __future__ import annotations

from dataclasses import dataclass

from hfl.common.config import ConfigError, doc


@dataclass(frozen=True)
class ObserveSection:
    listen: str = doc("127.0.0.1:8780", "HOST:PORT of the cloud's live page and Prometheus /metrics (\"\" = off); "
                      "0.0.0.0 to reach it from other machines (compose does); under mutual TLS it is served over TLS "
                      "with the cloud's certificate (see client_certs). When the port is in use (another run's page) "
                      "the cloud takes a free one and logs it; the URL is in RUN_DIR/live_url")
    client_certs: bool = doc(True, "under mutual TLS, the live page and /metrics ask for a client certificate signed by "
                             "the run's CA (any node's will do: curl --cert, Prometheus tls_config); false serves them "
                             "over TLS to any client, e.g. a browser without a certificate")
    refresh_s: float = doc(2.0, "how often the live page polls the cloud for new figures", min=0.2)


def validate_observe(cfg) -> None:
    """observe.listen is HOST:PORT with a port in 0..65535 (or "" = off): checked with the config, not at the cloud's
    start."""
    listen = cfg.observe.listen
    if not listen:
        return
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host.strip("[]"):
        raise ConfigError(f"observe.listen = {listen!r}: expected HOST:PORT with a port 0..65535 (127.0.0.1:8780; "
                          f"0.0.0.0:8780 for other machines; \"\" = off)")
