"""`frenzy simulate`: the JSON shape automation reads, outputs, and exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from frenzy.cli.main import app

REPO = Path(__file__).resolve().parents[3]
KEYS = {"avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "utilization", "oom_failures",
        "restarts", "jobs_finished", "decision_ms_mean", "decision_ms_p99"}  # fmt: skip
CLUSTER = str(REPO / "examples/clusters/paper-64.yaml")


@pytest.mark.slow
def test_simulate_json_table_and_outputs(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--cluster", CLUSTER, "--trace",
                              str(REPO / "data/traces/pollux/workloads/workload-1.csv"), "--max-jobs", "25",
                              "--policies", "frenzy,frenzy-paper,opportunistic,sia", "--json",
                              "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data["policies"]) == ["frenzy", "frenzy-paper", "opportunistic", "sia"]
    for m in data["policies"].values():
        assert set(m) == KEYS and m["jobs_finished"] == 25
    for name in ("results.json", "summary.md", "jct_cdf.png", "utilization.png", "decision_ms.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| frenzy |" in (tmp_path / "summary.md").read_text()
    table = runner.invoke(app, ["simulate", "--cluster", CLUSTER, "--synthetic", "8", "--policies", "frenzy"])
    assert table.exit_code == 0 and "avg JCT" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--synthetic", "3", "--policies", "frenzy,nope"], "unknown policy 'nope'"),
        (["--trace", "TRACE_BAD"], "field model: unknown model 'not-a-model'"),
        (["--trace", "/no/such/trace.csv"], "cannot read trace"),
        (["--synthetic", "3", "--trace", "TRACE_BAD"], "exactly one of"),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path: Path, args: list[str], needle: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "job_id,submit_s,model,seq_len,global_batch,tokens,gpu_type,gpus\na,0,not-a-model,1024,64,9,,1\n"
    )
    args = [str(bad) if a == "TRACE_BAD" else a for a in args]
    res = CliRunner().invoke(app, ["simulate", "--cluster", CLUSTER, *args])
    assert res.exit_code == 2
    assert needle in " ".join(res.output.split())


def test_bad_cluster_exits_2(tmp_path: Path) -> None:
    c = tmp_path / "c.yaml"
    c.write_text("nodes:\n  - {gpu: Z80, count: 1}\n")
    res = CliRunner().invoke(app, ["simulate", "--cluster", str(c), "--synthetic", "2"])
    assert res.exit_code == 2 and "unknown GPU type 'Z80'" in " ".join(res.output.split())
