"""Importing Frenzy turns gRPC's fork handlers off (services/__init__.py says why), before grpc
is imported, and leaves a user's own setting alone."""

from __future__ import annotations

from support.python_proc import run_python


def _probe(env_extra: dict[str, str]) -> str:
    code = (
        "import frenzy.state.keys\n"
        "import os, grpc\n"
        "print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
    )
    return run_python(code, env_extra, unset="GRPC_ENABLE_FORK_SUPPORT").strip()


def test_importing_frenzy_disables_grpc_fork_handlers() -> None:
    assert _probe({}) == "false"


def test_a_users_setting_wins() -> None:
    assert _probe({"GRPC_ENABLE_FORK_SUPPORT": "1"}) == "1"
