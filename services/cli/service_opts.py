"""The options every long-running service shares (scheduler, predictor, agent, API, worker):
``--log-format`` and ``--metrics-address``, and what each does at start-up, in one place.

Not a ``cmd_*`` module: it registers no command (``frenzy.cli.main`` imports those by name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from frenzy import logs
from frenzy.metrics_http import METRICS_ADDRESS_HELP, MetricsServer, parse_metrics_address, serve_metrics

if TYPE_CHECKING:  # annotations only; imported where it runs
    from prometheus_client import CollectorRegistry

LogFormatOpt = Annotated[str, typer.Option("--log-format", envvar="FRENZY_LOG_FORMAT", help=logs.LOG_FORMAT_HELP)]
MetricsAddressOpt = Annotated[str, typer.Option("--metrics-address", envvar="FRENZY_METRICS_ADDRESS",
                                                help=METRICS_ADDRESS_HELP)]


def _bad(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def setup_logging(level: str, fmt: str) -> None:
    """The service's log in ``fmt`` at ``level``; exit 2 naming the option when either is bad."""
    try:
        logs.configure(level, fmt)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def check_metrics_address(address: str) -> None:
    """Exit 2 naming the option when ``address`` is not HOST:PORT (before anything starts)."""
    if address:
        try:
            parse_metrics_address(address)
        except ValueError as exc:
            raise _bad(f"--metrics-address: {exc}") from None


def start_metrics(registry: CollectorRegistry, address: str, service: str) -> MetricsServer | None:
    """Serve ``registry`` at ``address`` (None when empty); exit 2 when the address is bad or taken."""
    if not address:
        return None
    check_metrics_address(address)
    try:
        return serve_metrics(registry, address, service)
    except OSError as exc:
        raise _bad(f"--metrics-address {address}: cannot listen there ({exc.strerror or exc}). To fix: pick a "
                   "free port, or 0 for any free one") from None
