"""bench/load.py at a toy size (3 agents x 2 GPUs, 3 more held ones, 8 jobs per phase, a backlog
of 20): the one command runs every phase on the real stack (burst, idle, saturation, latency at
most half the saturation rate, backlog), prints one JSON line last on stdout with CPU ms per job
per kind of process, every measured job succeeds once, and the new job behind the backlog runs on
a free GPU; bench/load_runs.py quotes the median and spread of two such runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[3] / "bench" / "load.py"
KEYS = ("placements_per_s", "placements_per_s_overall", "first_wave", "submit_to_running_p50_s",
        "submit_to_running_p99_s", "submit_p50_ms", "submit_p99_ms", "backlog_new_job_to_running_s", "submitted",
        "succeeded", "failed", "lost", "ran_twice", "refused", "cpu_s", "cpus", "python", "sizes", "phases",
        "saturation_rate_per_s", "latency_rate_per_s", "cpu_ms_per_job", "control_plane_cpu_ms_per_job",
        "idle_cpu_ms_per_s")
KINDS = {"scheduler", "api", "redis", "predictor", "agents", "load_generator"}


def test_load_at_toy_size_prints_one_json_line_and_every_job_succeeds_once(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--agents", "3", "--gpus-per-agent", "2", "--jobs", "8",
                           "--job-s", "0.2", "--rate", "20", "--backlog", "20", "--seed", "7", "--timeout-s", "120", "--json"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "load"
    for key in KEYS:
        assert key in out, key
    assert out["problems"] == [] and out["complete"] is True
    # 8 burst + 8 saturation + 8 latency + the probe behind the backlog; blockers and the backlog are not counted
    assert (out["submitted"], out["succeeded"], out["lost"], out["ran_twice"], out["refused"]) == (25, 25, 0, 0, 0)
    sizes = out["sizes"]
    assert (sizes["agents"], sizes["gpus"], sizes["k"], sizes["backlog"]) == (3, 6, [1, 6], 20)
    burst, latency, backlog = out["phases"]["burst"], out["phases"]["latency"], out["phases"]["backlog"]
    assert burst["placements"] == 8 and burst["first_wave_gpus"] <= 6  # the wave fits the free GPUs
    assert out["placements_per_s_overall"] > 0
    assert out["submit_to_running_p50_s"] <= out["submit_to_running_p99_s"]
    assert 0 < out["submit_p50_ms"] <= out["submit_p99_ms"]
    # the latency phase ran at the lower of --rate and half the saturation rate, and kept up with it
    sat = out["phases"]["saturation"]
    assert sat["jobs"] == 8 and sat["succeeded"] == 8 and out["saturation_rate_per_s"] > 0
    assert out["latency_rate_per_s"] == pytest.approx(min(20.0, out["saturation_rate_per_s"] / 2))
    assert latency["rate_per_s"] == out["latency_rate_per_s"]
    assert latency["offered_rate_per_s"] > 0.5 * out["latency_rate_per_s"]
    # CPU per job per kind, the latency phase's at the top; the API's threads told apart in one process
    assert set(out["cpu_ms_per_job"]) == KINDS and out["cpu_ms_per_job"] == latency["cpu_ms_per_job"]
    assert all(v >= 0 for v in out["cpu_ms_per_job"].values())
    assert out["cpu_ms_per_job"]["agents"] > 0 and out["cpu_ms_per_job"]["api"] > 0
    assert out["cpu_ms_per_job"]["scheduler"] > 0
    per_job = out["cpu_ms_per_job"]
    assert out["control_plane_cpu_ms_per_job"] == pytest.approx(per_job["scheduler"] + per_job["api"] + per_job["redis"],
                                                                abs=0.01)
    threads = latency["scheduler_threads_cpu_s"]
    assert {"scheduler-loop", "events", "grpc_N"} <= set(threads), threads  # the threads named themselves
    for phase in ("burst", "saturation", "latency"):
        assert set(out["phases"][phase]["cpu_ms_per_job"]) == KINDS, phase
    assert set(out["idle_cpu_ms_per_s"]) == KINDS
    redis_calls = latency["redis_commands_per_job"]  # Redis's own count: the scripts are there
    assert redis_calls["calls"] > 1 and "evalsha" in redis_calls["top"]
    # GPUs are held at least the jobs' 0.2 s, and never more than the 6 the cluster has
    assert 0.2 <= latency["running_to_ended_p50_s"] <= latency["running_to_ended_p99_s"] < 30
    assert latency["placed_to_ended_p50_s"] >= latency["running_to_ended_p50_s"] - 0.05
    assert 0 < latency["gpus_busy_mean"] <= 6
    # the probe ran on the free A100s while none of the H100-only backlog could start
    assert backlog["queued"] == 20 and backlog["backlog_started"] == 0
    assert backlog["probe_gpu_type"] == "A100-80GB" and backlog["probe_state"] == "SUCCEEDED"
    assert 0 <= out["backlog_new_job_to_running_s"] <= backlog["probe_call_to_running_s"] < 30
    assert {"scheduler", "predictor", "agents", "redis", "load_generator"} <= set(out["cpu_s"])
    assert out["scheduler_metrics"]["frenzy_agent_events_total_refused"] == 0
    assert "burst submitted 8/8" in proc.stderr and "backlog queued 20/20" in proc.stderr  # progress on stderr
    assert "://***@" in proc.stderr and ":" + "//frenzy:" not in proc.stderr  # no admin password printed


def test_load_refuses_bad_flags_naming_them(tmp_path: Path) -> None:
    for flags, named in ((["--rate", "0"], "--rate"), (["--gpu-type", "A200"], "--gpu-type"),
                         (["--backlog", "5", "--backlog-gpu-type", "A100-80GB"], "--backlog-gpu-type"),
                         (["--saturation-jobs", "-1"], "--saturation-jobs")):
        proc = subprocess.run([sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert proc.returncode == 2, flags
        assert named in proc.stderr, proc.stderr


def test_load_with_the_scheduler_split_in_two_processes(tmp_path: Path) -> None:
    """--split-scheduler: the API (--serve api) and the loop (--serve loop) as two processes; every
    job still runs once, and the placements are counted by the loop's /metrics."""
    proc = subprocess.run([sys.executable, str(BENCH), "--agents", "2", "--gpus-per-agent", "2", "--jobs", "6",
                           "--job-s", "0.2", "--rate", "20", "--seed", "3", "--timeout-s", "120", "--split-scheduler",
                           "--saturation-jobs", "0", "--idle-s", "0", "--redis-profile", "--json"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["split_scheduler"] is True and out["problems"] == []
    assert (out["submitted"], out["succeeded"], out["lost"], out["ran_twice"]) == (12, 12, 0, 0)
    assert {"scheduler", "scheduler-loop", "agents"} <= set(out["cpu_s"])
    assert out["scheduler_metrics"]["frenzy_placements_total"] >= 12
    # no saturation phase (--saturation-jobs 0): the latency phase at --rate; the API is its own process
    assert out["saturation_rate_per_s"] is None and out["latency_rate_per_s"] == 20.0
    assert "saturation" not in out["phases"] and out["idle_cpu_ms_per_s"] is None
    latency = out["phases"]["latency"]
    assert latency["cpu_ms_per_job"]["api"] == pytest.approx(latency["cpu_s"]["scheduler"] * 1000 / 6, abs=2)
    assert latency["cpu_ms_per_job"]["scheduler"] == pytest.approx(latency["cpu_s"]["scheduler-loop"] * 1000 / 6, abs=2)
    assert "scheduler_threads_cpu_s" not in latency
    # --redis-profile: every Redis command of the latency phase, the scripts by name
    profile = latency["redis_profile"]
    assert profile["complete"] and {"evalsha submit_job", "evalsha place_jobs"} <= set(profile["top"]), profile
    assert profile["calls_in_scripts_per_job"] > 0


def test_load_runs_quotes_median_and_spread_of_two_toy_runs(tmp_path: Path) -> None:
    runs = BENCH.with_name("load_runs.py")
    saved = tmp_path / "runs.jsonl"
    proc = subprocess.run([sys.executable, str(runs), "--runs", "2", "--pause-s", "0", "--save", str(saved), "--",
                           "--agents", "2", "--gpus-per-agent", "2", "--jobs", "4", "--job-s", "0.1", "--rate", "20",
                           "--idle-s", "0.5", "--timeout-s", "120"],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "load_runs" and out["runs"] == 2 and out["complete"] is True
    assert out["counts"]["submitted"] == out["counts"]["succeeded"] == 24  # 2 x (4 burst + 4 saturation + 4 latency)
    sat = out["figures"]["saturation_rate_per_s"]
    assert sat["n"] == 2 and sat["min"] <= sat["median"] <= sat["max"]
    assert out["figures"]["cpu_ms_per_job.agents"]["n"] == 2
    assert len(saved.read_text().splitlines()) == 2


def test_agent_cost_at_toy_size_counts_cpu_per_job(tmp_path: Path) -> None:
    bench = BENCH.with_name("agent_cost.py")
    proc = subprocess.run([sys.executable, str(bench), "--agents", "1", "--jobs", "6", "--job-s", "0.1",
                           "--idle-s", "1", "--json", "--quiet"], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["submitted"], out["succeeded"]) == (6, 6)
    # the shims and their commands are counted (in the spawner, the agent's live child)
    assert out["children_ms_per_job"] > 0 and out["idle_cpu_ms_per_agent_s"] >= 0
