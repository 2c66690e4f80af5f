"""``frenzy agent`` option handling: bad input and NVML failure exit 2 with a message that says what to do."""

from __future__ import annotations

import typer
from typer.testing import CliRunner
from unit.agent.agent_fake_nvml import FakeNvml

from frenzy.agent import cli, gpus
from frenzy.agent.gpus import NvmlBackend

app = typer.Typer()
app.command()(cli.agent_command)
runner = CliRunner()


def test_help_teaches_with_examples() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "--fake-gpus" in result.output and "A100-80GB:4,L4:2" in result.output
    assert "Examples:" in result.output


def test_unknown_fake_gpu_type_exits_2_naming_it() -> None:
    result = runner.invoke(app, ["--node", "n1", "--fake-gpus", "A100-80GB:2,Z9000:1"])
    assert result.exit_code == 2
    assert "Z9000" in result.output


def test_both_fake_options_is_an_error(tmp_path) -> None:
    f = tmp_path / "g.yaml"
    f.write_text("gpus: [{type: L4, count: 1}]")
    result = runner.invoke(app, ["--fake-gpus", "L4:1", "--fake-gpus-file", str(f)])
    assert result.exit_code == 2


def test_nvml_failure_prints_the_reason_and_exits_2(monkeypatch) -> None:
    # The command imports its backends when it runs (a fast `frenzy --help`): patched where they live.
    monkeypatch.setattr(gpus, "NvmlBackend", lambda: NvmlBackend(FakeNvml(init_error=9)))
    result = runner.invoke(app, ["--node", "n1", "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 2
    assert "driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED)" in result.output
    assert "--fake-gpus" in result.output


def test_drain_and_undrain_together_is_an_error() -> None:
    result = runner.invoke(app, ["--node", "n1", "--drain", "--undrain"])
    assert result.exit_code == 2 and "--drain or --undrain, not both" in result.output


def test_a_malformed_env_option_exits_2_naming_it() -> None:
    result = runner.invoke(app, ["--node", "n1", "--fake-gpus", "L4:1", "--env", "NOVALUE"])
    assert result.exit_code == 2 and "--env 'NOVALUE': expected KEY=VALUE" in result.output


def test_help_mentions_drain_and_the_restart_behaviour() -> None:
    result = runner.invoke(app, ["--help"])
    assert "--drain" in result.output and "adopts" in result.output


def test_a_relative_checkpoint_root_exits_2_asking_for_an_absolute_path() -> None:
    result = runner.invoke(app, ["--node", "n1", "--fake-gpus", "L4:1", "--checkpoint-root", "ckpt"])
    assert result.exit_code == 2 and "--checkpoint-root 'ckpt': give an absolute path" in result.output
    result = runner.invoke(app, ["--node", "n1", "--fake-gpus", "L4:1"], env={"FRENZY_CHECKPOINT_ROOT": "rel"})
    assert result.exit_code == 2 and "--checkpoint-root 'rel'" in result.output
