"""`frenzy simulate` step by step: the checked settings, the inputs read, the run, the JSON.

The command-line behaviour (messages, exit codes, files) is tested through the CLI in
tests/unit/has/test_has_cli_simulate.py; these call the steps the command is made of.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import typer

from frenzy.cli.cmd_simulate import SimSettings, check_settings, load_inputs, run
from frenzy.cli.simulate_output import payload, title

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "examples/clusters/paper-64.yaml"


def _settings(**changes: object) -> SimSettings:
    options: dict[str, object] = dict(
        cluster=CLUSTER, trace=None, policies=" frenzy, sia ,", max_jobs=0, synthetic=4, jobs_per_hour=20.0,
        seed=3, runtime_noise=0.1, restart_s=120.0, out=None, save_trace=None, fail_node=[],
        decision_sizes=None, decision_queue=1000, as_json=True,
    )  # fmt: skip
    options.update(changes)
    return check_settings(**options)  # type: ignore[arg-type]


def test_settings_are_the_options_checked_and_tidied() -> None:
    s = _settings(decision_sizes="1_000,64,64", fail_node=["a100-0@10"])
    assert s.policies == ("frenzy", "sia")
    assert s.decision_sizes == (64, 1000)
    assert s.fail_node == ("a100-0@10",)
    with pytest.raises(AttributeError):
        s.seed = 4  # type: ignore[misc]  # frozen: the steps after the check cannot change it


@pytest.mark.parametrize(
    "changes",
    [{"policies": "nope"}, {"synthetic": 0}, {"decision_queue": -1}, {"restart_s": math.inf}],
)
def test_bad_settings_exit_2(changes: dict[str, object]) -> None:
    with pytest.raises(typer.Exit) as exc:
        _settings(**changes)
    assert exc.value.exit_code == 2


def test_inputs_run_and_payload() -> None:
    settings = _settings(fail_node=["a100-0@100:50"])
    inputs = load_inputs(settings)
    assert len(inputs.jobs) == 4
    assert inputs.failures == [(100.0, "a100-0", 50.0)]
    outcome = run(settings, inputs)
    assert list(outcome.metrics) == ["frenzy", "sia"] and len(outcome.results) == 2
    assert outcome.scale == []
    data = payload(settings, inputs, outcome)
    assert data["trace"] == {"file": "synthetic:4:seed=3", "jobs": 4}
    assert data["node_failures"] == [{"node": "a100-0", "at_s": 100.0, "down_s": 50.0}]
    assert "decision_vs_size" not in data
    assert (
        title(settings, inputs)
        == f"4 jobs from synthetic (seed 3) on {CLUSTER} ({inputs.spec.total_gpus} GPUs)"
    )
