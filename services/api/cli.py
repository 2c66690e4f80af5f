"""`frenzy api`: the HTTP gateway and dashboard. ``api_command`` is a plain function with typer
options; the main CLI registers it."""

from __future__ import annotations

from typing import Annotated

import typer

from frenzy.rpc.client import DEFAULT_SCHEDULER


def api_command(
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port.")] = 8080,
    scheduler: Annotated[str, typer.Option(
        "--scheduler", envvar="FRENZY_SCHEDULER", help="Scheduler gRPC address (host:port).")] = DEFAULT_SCHEDULER,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the REST API and the dashboard in front of the scheduler.

    \b
    Open http://HOST:PORT/ for the live cluster view (GPUs coloured by the job
    holding them, the job queue with pending reasons), /docs for the API.
    \b
    Examples:
      frenzy api --host 0.0.0.0 --port 8080
      curl -s localhost:8080/api/nodes
      curl -s localhost:8080/api/jobs -d @job.json     (400 names a bad field)
    \b
    with job.json:
      {"name": "demo", "model": "gpt2-124m", "seq_len": 1024,
       "global_batch": 32, "command": "python train.py"}
    """
    import uvicorn

    from frenzy.api.app import create_app

    uvicorn.run(create_app(scheduler), host=host, port=port, log_level=log_level.lower())
