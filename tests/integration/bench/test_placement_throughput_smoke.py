"""bench/placement_throughput.py at a toy size: the one command runs the whole stack (auth, signed
launches and events, a Redis user per service), prints one JSON document, and every job succeeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[3] / "bench" / "placement_throughput.py"
NUMBERS = ("placements_per_s", "placement_span_s", "submit_to_running_p50_s", "submit_to_running_p99_s",
           "submit_p50_ms", "submit_p99_ms", "startup_s", "run_s")


def test_bench_at_toy_size_prints_json_and_every_job_succeeds(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--agents", "2", "--gpus", "4", "--jobs", "5", "--rate", "0",
                           "--job-s", "0", "--timeout-s", "30"],
                          capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["bench"] == "placement_throughput"
    assert (out["agents"], out["gpus"], out["jobs"]) == (2, 4, 5)
    assert (out["submitted"], out["succeeded"], out["refused"], out["lost"], out["ran_twice"]) == (5, 5, 0, 0, 0)
    assert out["placements"] == 5
    for key in NUMBERS:
        assert isinstance(out[key], float) and out[key] >= 0, key
    assert out["submit_p50_ms"] <= out["submit_p99_ms"]
    assert out["submit_to_running_p50_s"] <= out["submit_to_running_p99_s"]
    assert {"scheduler", "predictor", "agents"} <= set(out["cpu_s"])
    # the scheduler's own /metrics (LocalStack serves it on loopback) agrees
    assert out["scheduler_metrics"]["frenzy_placements_total"] == 5
    assert out["scheduler_metrics"]["frenzy_job_submit_to_running_seconds_count"] == 5
    assert out["scheduler_metrics"]["frenzy_agent_events_total_refused"] == 0
    assert "submitted 5/5" in proc.stderr  # progress goes to stderr
    assert "://***@" in proc.stderr and ":" + "//frenzy:" not in proc.stderr  # no admin password printed
