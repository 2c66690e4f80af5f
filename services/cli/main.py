"""`frenzy`: the command line for users, operators and the local stack.

Users: `predict` (which plans would my job get?), `submit`, `jobs`, `job`,
`watch`, `cancel`, `nodes`, `models`, `gpus`, `batch`. Operators: `agent`,
`scheduler`, `predictor`, `worker`, `api`. Local: `up` (the whole stack on
this machine) and `demo` (up, one job end to end, down).

Exit codes: 0 ok; 1 failure; 2 bad input (INVALID_ARGUMENT); 3 the cluster
cannot do it (FAILED_PRECONDITION); 4 not found.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer


def _redis_url_from_file() -> None:
    """REDIS_URL from the first line of the file REDIS_URL_FILE names, when REDIS_URL is unset.

    Containers get the Redis password as a file in a volume (compose.yaml), never in their
    environment's definition; done here, before any option is parsed, so every command's
    ``--redis-url`` (envvar REDIS_URL) and the worker's Celery app see it alike."""
    path = os.environ.get("REDIS_URL_FILE")
    if not path or os.environ.get("REDIS_URL"):
        return
    try:
        with open(path, encoding="utf-8") as fh:
            url = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        sys.exit(f"error: REDIS_URL_FILE={path}: cannot read it ({getattr(exc, 'strerror', None) or exc}). "
                 "To fix: point REDIS_URL_FILE at a readable file holding redis://USER:PASSWORD@HOST:PORT/DB")
    if not url:
        sys.exit(f"error: REDIS_URL_FILE={path}: the file's first line is empty; it should hold a redis:// URL")
    os.environ["REDIS_URL"] = url


_redis_url_from_file()

app = typer.Typer(
    name="frenzy",
    help="Frenzy: train LLMs on a heterogeneous GPU cluster without choosing GPUs.\n\n"
    "Describe the model and the recipe; Frenzy predicts the memory each GPU needs under every parallel "
    "layout, ranks the plans, reserves the best plan the cluster can hold and launches it.\n\n"
    "Start here:  frenzy demo        (whole stack on this machine, one job end to end)\n\n"
    "             frenzy predict --model llama-2-7b --seq-len 4096 --global-batch 64",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

# The panels of `frenzy --help`, in the order a new user meets them.
PANELS = ("Local stack", "Plan a job", "Run jobs", "Operate a cluster")


def _version(value: bool) -> None:
    if value:
        from frenzy import __version__

        typer.echo(f"frenzy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print Frenzy's version and exit.")] = False,
) -> None:
    """Frenzy: train LLMs on a heterogeneous GPU cluster without choosing GPUs."""


def _register_commands() -> None:
    """Every ``frenzy/cli/cmd_*.py`` module registers its own commands (``register(app)``) under
    its ``PANEL``; the services' own command modules (agent, worker and batch, api) the same.

    New commands live in their own module next to what they drive, so adding one never means
    editing this file. Registration order is the order of ``--help``: by panel, then module."""
    import importlib
    import pkgutil

    import frenzy.cli as pkg

    names = [f"frenzy.cli.{i.name}" for i in pkgutil.iter_modules(pkg.__path__) if i.name.startswith("cmd_")]
    names += ["frenzy.agent.cli", "frenzy.worker.cli", "frenzy.api.cli"]
    modules = [importlib.import_module(name) for name in names]
    for module in sorted(modules, key=lambda m: (PANELS.index(m.PANEL), getattr(m, "ORDER", 50), m.__name__)):
        module.register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
