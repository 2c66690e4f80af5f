"""One way for every Frenzy service to serve Prometheus ``/metrics``: a listener of its own.

Each service (scheduler, predictor, agent, API, worker) keeps its metrics in a
``CollectorRegistry`` of its own and hands it to ``serve_metrics`` with the address from its
``--metrics-address`` option: ``HOST:PORT``, ``[::1]:PORT`` or a bare ``PORT`` (loopback);
port 0 takes a free port (tests, ``frenzy up``). The endpoint has no authentication, so it
listens on loopback unless the operator names another address, and then it says so in the
log. No series carries a job id or a user (see each service's metrics module).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only; imported where it runs
    from prometheus_client import CollectorRegistry


if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)

METRICS_ADDRESS_HELP = ("Serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT: 127.0.0.1; port 0: a "
                        "free one). Without authentication: keep it on loopback or a private network. Empty: no "
                        "metrics endpoint.")


@dataclass
class MetricsServer:
    """The /metrics endpoint; ``stop()`` closes it."""

    httpd: WSGIServer
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def parse_metrics_address(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"`` or a bare port (loopback) -> (host, port); ValueError naming it."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text.strip()
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"metrics address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"metrics address {text!r}: port must be 0-65535")
    return host, number


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_metrics(registry: CollectorRegistry, address: str, service: str = "frenzy") -> MetricsServer:
    """Serve ``registry`` at http://``address``/metrics from a daemon thread (port 0: a free one).
    ``service`` names it in the warning logged when the address is not loopback."""
    from prometheus_client.exposition import start_http_server

    host, port = parse_metrics_address(address)
    httpd, _thread = start_http_server(port, addr=host, registry=registry)
    bound = httpd.server_port
    if not is_loopback(host):
        log.warning("%s metrics served on %s:%d without authentication: anyone who reaches it reads them "
                    "(node names and counts; no job ids or users)", service, host, bound)
    return MetricsServer(httpd, host, bound)
