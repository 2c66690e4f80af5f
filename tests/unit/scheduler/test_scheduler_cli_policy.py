"""`frenzy scheduler --policy`: the operator's choice of queue policy, checked before anything starts."""

from __future__ import annotations

from typer.testing import CliRunner

from frenzy.cli.main import app


def test_an_unknown_policy_is_refused_naming_the_choices() -> None:
    res = CliRunner().invoke(app, ["scheduler", "--policy", "fastest", "--redis-url", "redis://127.0.0.1:1/0"])
    assert res.exit_code == 2
    out = res.output + (str(res.stderr) if res.stderr_bytes else "")
    assert "fastest" in out and "frenzy-nopreempt" in out and "frenzy-ranked" in out and "frenzy-paper" in out


def test_help_explains_each_policy() -> None:
    res = CliRunner().invoke(app, ["scheduler", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.output.replace("│", " ").split())  # rich wraps the help in a box
    assert "'frenzy-nopreempt'" in text and "much shorter one" in text and "'frenzy-completion'" in text
    assert "the default" in text
