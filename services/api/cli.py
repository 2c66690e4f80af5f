"""`frenzy api`: the HTTP gateway and dashboard. ``api_command`` is a plain function with typer
options; the main CLI registers it."""

from __future__ import annotations

from typing import Annotated

import typer

from frenzy.api.guard import DEFAULT_MAX_BODY_BYTES
from frenzy.cli.service_opts import LogFormatOpt, MetricsAddressOpt
from frenzy.rpc.client import DEFAULT_SCHEDULER


def api_command(
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port.")] = 8080,
    scheduler: Annotated[str, typer.Option(
        "--scheduler", envvar="FRENZY_SCHEDULER", help="Scheduler gRPC address (host:port).")] = DEFAULT_SCHEDULER,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="A name clients may use in the Host header, besides localhost, 127.0.0.1, [::1] "
                               "and --host (repeatable; '*' allows any, only behind a proxy that checks Host). "
                               "Other names are refused (421): this stops DNS rebinding.")] = None,
    max_body_bytes: Annotated[int, typer.Option(
        min=1024, help="Largest request body accepted (413 above it).")] = DEFAULT_MAX_BODY_BYTES,
    tls_cert: Annotated[str | None, typer.Option(
        "--tls-cert", envvar="FRENZY_TLS_SERVER_CERT", help="Serve HTTPS with this certificate (PEM).")] = None,
    tls_key: Annotated[str | None, typer.Option(
        "--tls-key", envvar="FRENZY_TLS_SERVER_KEY", help="The certificate's private key (PEM).")] = None,
    metrics_address: MetricsAddressOpt = "",
    log_format: LogFormatOpt = "text",
) -> None:
    """Serve the REST API and the dashboard in front of the scheduler.

    \b
    Open http://HOST:PORT/ for the live cluster view (GPUs coloured by the job
    holding them, the job queue with pending reasons), /docs for the API.
    \b
    Writes take only Content-Type: application/json (a cross-site form or
    text/plain POST is refused), and the Host header must be an allowed name.
    \b
    Examples:
      frenzy api --host 0.0.0.0 --port 8080 --allowed-host gpu-head.example.com
      curl -s localhost:8080/api/nodes
      curl -s localhost:8080/api/jobs -H 'Content-Type: application/json' -d @job.json   (400 names a bad field)
    \b
    with job.json:
      {"name": "demo", "model": "gpt2-124m", "seq_len": 1024,
       "global_batch": 32, "command": "python train.py"}
    """
    import logging

    import uvicorn

    from frenzy.api.app import create_app
    from frenzy.cli.output import fail
    from frenzy.cli.service_opts import check_metrics_address, setup_logging, start_metrics
    from frenzy.rpc.client import client_tls
    from frenzy.rpc.tls import ServerTls, TlsConfigError

    # Our handler on the root logger; uvicorn's own loggers propagate to it (log_config=None below),
    # so its access and error lines come out in the same format. uvicorn's "trace" is DEBUG here.
    setup_logging("DEBUG" if log_level.lower() == "trace" else log_level, log_format)
    check_metrics_address(metrics_address)
    try:
        ServerTls.from_files(tls_cert, tls_key)  # both or neither, readable PEM files
        scheduler_tls = client_tls()  # the scheduler over TLS when FRENZY_TLS_CA is set
    except TlsConfigError as exc:
        fail(str(exc), 2)
    app = create_app(scheduler, bind_host=host, allowed_hosts=allowed_host or (), max_body_bytes=max_body_bytes,
                     scheduler_tls=scheduler_tls)
    endpoint = start_metrics(app.state.metrics.registry, metrics_address, "api")
    if endpoint is not None:
        logging.getLogger("frenzy.api").info("metrics on %s", endpoint.url)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), ssl_certfile=tls_cert,
                    ssl_keyfile=tls_key, log_config=None)
    finally:
        if endpoint is not None:
            endpoint.stop()


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.command("api", rich_help_panel=PANEL)(api_command)
