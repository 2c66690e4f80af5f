"""`frenzy`'s command table: every module registers what main.py says it does, under a known panel.

A client-only install replaces the server side's commands by placeholders named in
``frenzy.cli.main.SERVER_COMMANDS`` without importing their modules; this checks that table
against what those modules really register, so a renamed or added command cannot silently drop
out of a client's `frenzy --help` (tests/packaging runs the client install itself)."""

from __future__ import annotations

import importlib

import typer

from frenzy.cli import main


def _registered(module_name: str) -> dict[str, str]:
    app = typer.Typer()
    importlib.import_module(module_name).register(app)
    names = {c.name or (c.callback.__name__ if c.callback else ""): c.rich_help_panel or ""
             for c in app.registered_commands}
    names.update({g.name or "": g.rich_help_panel or "" for g in app.registered_groups})
    return names


def test_server_commands_table_matches_what_the_modules_register() -> None:
    for module_name, commands in main.SERVER_COMMANDS.items():
        assert _registered(module_name) == dict(commands), module_name


def test_every_command_module_has_a_known_panel_and_registers_something() -> None:
    seen: set[str] = set()
    for module_name in main.command_modules():
        module = importlib.import_module(module_name)
        assert module.PANEL in main.PANELS, module_name
        names = _registered(module_name)
        assert names, f"{module_name} registers no command"
        assert not seen & names.keys(), f"{module_name} registers a name twice: {seen & names.keys()}"
        seen |= names.keys()
    for must in ("up", "demo", "predict", "submit", "jobs", "logs", "batch", "scheduler", "agent", "token"):
        assert must in seen


def test_the_full_install_lacks_no_server_package() -> None:
    # The test environment is the full one (`make` installs the server extra): nothing is a placeholder.
    assert main.missing_server_package() is None


def test_predict_help_names_marps_own_default() -> None:
    # cmd_predict keeps MARP (numpy) out of `frenzy --help` by naming the default itself.
    import marp.plans
    from frenzy.cli import cmd_predict

    assert cmd_predict.DEFAULT_MIN_SCALING_EFF == marp.plans.DEFAULT_MIN_SCALING_EFF


def test_importing_the_cli_loads_no_heavy_module() -> None:
    # `frenzy --help` and every command's option parsing import only the CLI: the server side,
    # MARP's model (numpy) and pydantic load inside the commands that need them
    # (bench/cli_startup.py times it). A fresh interpreter, since this one has them all.
    import subprocess
    import sys

    heavy = ("redis", "celery", "fastapi", "uvicorn", "prometheus_client", "cryptography", "numpy", "pydantic",
             "marp.memory", "marp.recipe", "frenzy.state.store", "frenzy.agent.daemon", "frenzy.scheduler")
    probe = ("import sys, frenzy.cli.main; "
             f"print(sorted({{w for m in sys.modules for w in {heavy!r} if m == w or m.startswith(w + '.')}}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"importing frenzy.cli.main loads {out}"
