"""bench/load.py's figures that do not depend on the box (issue 38), without a stack: the
saturation rate over the middle of the RUNNING transitions, the latency phase's rate (at most half
of it), CPU per job per kind of process with the API's threads told apart from the loop's in a
one-process scheduler, and bench/load_runs.py's median and spread over runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import load  # noqa: E402
import load_runs  # noqa: E402


def test_sustained_rate_leaves_out_the_ramp_and_the_drain() -> None:
    # 30 jobs RUNNING at once (the empty cluster's first wave), then 10 a second, then a straggler
    times = [0.0] * 30 + [5.0 + i / 10.0 for i in range(160)] + [60.0]
    rate, span, counted = load.sustained_rate(times)
    assert rate == pytest.approx(10.0, rel=0.02)
    assert counted == int(0.9 * 191) - 1 - int(0.2 * 191) and span == pytest.approx(counted / 10.0, rel=0.02)


def test_sustained_rate_starts_after_the_first_job_ended_when_the_first_wave_is_big() -> None:
    # a first wave of 60 % of the jobs: the 20 % quantile is inside it; the first end (t = 4) is not
    times = [0.0] * 120 + [5.0 + i / 10.0 for i in range(80)]
    assert load.sustained_rate(times)[0] > 12  # counting from inside the wave inflates the rate
    rate, _span, counted = load.sustained_rate(times, not_before=4.0)
    assert rate == pytest.approx(10.0, rel=0.02) and counted == int(0.9 * 200) - 1 - 120
    # a first end after the 90 % quantile leaves nothing: the quantiles alone
    assert load.sustained_rate(times, not_before=100.0) == load.sustained_rate(times)


def test_sustained_rate_small_and_degenerate_inputs() -> None:
    assert load.sustained_rate([]) == (None, None, 0)
    assert load.sustained_rate([1.0]) == (None, None, 0)
    assert load.sustained_rate([1.0, 1.0, 1.0])[0] is None  # no time between: no rate
    rate, span, counted = load.sustained_rate([0.0, 1.0, 2.0, 3.0])  # under 10: all of them
    assert (rate, span, counted) == (1.0, 3.0, 3)


def test_latency_rate_is_rate_at_most_half_the_saturation() -> None:
    assert load.latency_rate(100.0, 150.0) == 75.0
    assert load.latency_rate(100.0, 400.0) == 100.0
    assert load.latency_rate(100.0, None) == 100.0  # not measured: --rate as asked


def _snap(procs: dict[str, float], threads: dict[int, tuple[str, float]]) -> load.CpuSnap:
    return load.CpuSnap(procs, threads)


def test_one_process_scheduler_splits_api_threads_from_the_loop() -> None:
    before = _snap({"scheduler": 10.0, "agents": 5.0, "redis": 1.0, "predictor": 0.5, "load_generator": 2.0},
                   {1: ("python", 1.0), 2: ("scheduler-loop", 3.0), 3: ("events", 2.0), 4: ("grpc_0", 1.0),
                    5: ("event_engine", 0.5)})
    after = _snap({"scheduler": 16.0, "agents": 9.0, "redis": 2.0, "predictor": 0.5, "load_generator": 2.5},
                  {1: ("python", 1.0), 2: ("scheduler-loop", 5.0), 3: ("events", 3.0), 4: ("grpc_0", 2.0),
                   5: ("event_engine", 0.7), 6: ("grpc_1", 0.3), 7: ("pools-refresh", 0.2)})
    kinds, threads = load.kind_cpu(before, after, split=False)
    assert kinds["api"] == pytest.approx(1.0 + 0.2 + 0.3 + 0.2)  # grpc_0, event_engine, grpc_1 (new), pools
    assert kinds["scheduler"] == pytest.approx(6.0 - 1.7)  # the rest of the process, ended threads included
    assert threads["grpc_N"] == pytest.approx(1.3) and threads["scheduler-loop"] == pytest.approx(2.0)
    assert threads["(ended threads)"] == pytest.approx(6.0 - 4.7)
    assert (kinds["agents"], kinds["redis"], kinds["predictor"], kinds["load_generator"]) == (4.0, 1.0, 0.0, 0.5)
    per_job = load.per_job_ms(kinds, 100)
    assert set(per_job) == set(load.KINDS) and per_job["agents"] == 40.0
    assert load.control_plane_ms(per_job) == pytest.approx(per_job["scheduler"] + per_job["api"] + 10.0)
    assert load.per_job_ms(kinds, 0)["api"] is None and load.control_plane_ms(load.per_job_ms(kinds, 0)) is None


def test_split_scheduler_api_is_its_own_process() -> None:
    before = _snap({"scheduler": 1.0, "scheduler-loop": 2.0}, {})
    after = _snap({"scheduler": 3.0, "scheduler-loop": 7.0}, {})
    kinds, threads = load.kind_cpu(before, after, split=True)
    assert (kinds["api"], kinds["scheduler"], threads) == (2.0, 5.0, {})


def test_the_thread_name_hook_names_os_threads(tmp_path: Path) -> None:
    import subprocess

    code = ("import threading, time, os\n"
            "t = threading.Thread(target=time.sleep, args=(0.5,), name='scheduler-loop'); t.start()\n"
            "print(open(f'/proc/self/task/{t.native_id}/comm').read().strip())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": str(load.THREAD_NAMES), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.strip() == "scheduler-loop", proc.stderr
    assert load.API_THREADS.match("grpc_12") and load.API_THREADS.match("_serve")
    assert not load.API_THREADS.match("scheduler-loop") and not load.API_THREADS.match("events")


def test_load_runs_reports_median_and_spread() -> None:
    outs = [{"placements_per_s": 900.0, "cpu_ms_per_job": {"api": 1.0, "agents": 9.0}, "submitted": 10,
             "succeeded": 10, "complete": True, "problems": []},
            {"placements_per_s": 1100.0, "cpu_ms_per_job": {"api": 3.0, "agents": 7.0}, "submitted": 10,
             "succeeded": 9, "lost": 1, "complete": False, "problems": ["latency: 1 of 10 jobs not ended"]},
            {"placements_per_s": None, "cpu_ms_per_job": {"api": 2.0, "agents": 8.0}, "submitted": 10,
             "succeeded": 10, "complete": True}]
    agg = load_runs.aggregate(outs, ["bench/load.py", "--json"])
    f = agg["figures"]
    assert f["placements_per_s"] == {"median": 1000.0, "min": 900.0, "max": 1100.0, "n": 2,
                                     "values": [900.0, 1100.0, None]}
    assert (f["cpu_ms_per_job.api"]["median"], f["cpu_ms_per_job.agents"]["max"]) == (2.0, 9.0)
    assert f["saturation_rate_per_s"]["median"] is None and f["saturation_rate_per_s"]["n"] == 0
    assert agg["counts"]["submitted"] == 30 and agg["counts"]["succeeded"] == 29 and agg["counts"]["lost"] == 1
    assert agg["complete"] is False and agg["problems"] == ["run 2: latency: 1 of 10 jobs not ended"]


def test_load_runs_passes_what_follows_the_double_dash_to_load() -> None:
    args, rest = load_runs.parse_args(["--runs", "3", "--", "--agents", "10", "--json"])
    assert args.runs == 3 and rest == ["--agents", "10"]
    with pytest.raises(SystemExit):
        load_runs.parse_args(["--runs", "0"])


def test_redis_commands_per_job_from_commandstats_deltas() -> None:
    before = load.CpuSnap({}, {}, {"evalsha": (10, 1000), "hget": (5, 10)})
    after = load.CpuSnap({}, {}, {"evalsha": (30, 5000), "hget": (45, 90), "xadd": (10, 200), "info": (1, 50)})
    out = load.redis_per_job(before, after, jobs=10, top=2)
    assert out["calls"] == (20 + 40 + 10 + 1) / 10 and out["usec"] == (4000 + 80 + 200 + 50) / 10
    assert out["top"] == {"evalsha": {"calls": 2.0, "usec": 400.0}, "xadd": {"calls": 1.0, "usec": 20.0}}
    assert load.redis_per_job(before, after, jobs=0) == {} and load.redis_per_job(before, before, jobs=5) == {}


class _FakeAdmin:
    def __init__(self, entries: list) -> None:
        self.entries, self.config = entries, {}

    def execute_command(self, *args: object) -> list:
        assert args[:2] == ("SLOWLOG", "GET")
        return self.entries

    def config_set(self, name: str, value: object) -> None:
        self.config[name] = value


def test_slowlog_profile_names_scripts_and_counts_what_they_run() -> None:
    from frenzy.state import scripts

    sha = scripts.sha1("record_exit")
    admin = _FakeAdmin([[3, 0, 500, ["EVALSHA", sha, "2", "k1", "k2"], "127.0.0.1:5000", ""],
                        [2, 0, 20, ["HSET", "k1", "a", "1"], "?:0", ""],
                        [1, 0, 4, ["HGET", "k1", "a"], "127.0.0.1:5001", ""]])
    out = load.slowlog_profile(admin, jobs=2)
    assert out["top"]["evalsha record_exit"] == {"calls": 0.5, "usec": 250.0}
    assert out["top"]["hset (in a script)"] == {"calls": 0.5, "usec": 10.0}
    assert out["top"]["hget"] == {"calls": 0.5, "usec": 2.0}
    assert out["calls_in_scripts_per_job"] == 0.5 and out["complete"] is True
    assert admin.config["slowlog-log-slower-than"] == 10_000  # logging every command stopped
