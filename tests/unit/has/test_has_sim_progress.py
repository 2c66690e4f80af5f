"""The simulator's progress callback (what `frenzy simulate`'s bars are drawn from): finished jobs
counted once each, out of the trace's, with a simulated clock that only moves forward and ends at
the run's end; the clock heard between finishes; and `frenzy simulate`'s run() passing every
policy's and seed's calls along. No terminal needed: the callbacks record plain numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy.cli.cmd_simulate import check_settings, load_inputs, run
from has.cluster_spec import parse_cluster
from has.sim.baselines import make_policy
from has.sim.engine import ProfileBook, simulate
from has.sim.traces import TraceJob, synthetic

REPO = Path(__file__).resolve().parents[3]
SMALL = parse_cluster({"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8},
                                 {"gpu": "L4", "count": 1, "gpus_per_node": 4}]})  # fmt: skip
Call = tuple[int, int, float]


def _run(jobs: list[TraceJob], policy: str = "frenzy") -> tuple[list[Call], dict[str, float | int], float]:
    calls: list[Call] = []
    res = simulate(SMALL, jobs, make_policy(policy), seed=1, profiles=ProfileBook(SMALL),
                   progress=lambda finished, total, now: calls.append((finished, total, now)))  # fmt: skip
    return calls, res.metrics(), res.end_s


@pytest.mark.parametrize("policy", ["frenzy", "sia"])  # event-driven and round-based
def test_counts_are_the_finished_jobs_out_of_the_trace(policy: str) -> None:
    jobs = synthetic(25, seed=4, jobs_per_hour=20, median_gpu_hours=1.0)
    calls, metrics, end_s = _run(jobs, policy)
    assert metrics["jobs_finished"] == 25  # so the last call must say 25 of 25
    assert calls[-1] == (25, 25, end_s)
    assert {total for _, total, _ in calls} == {25}
    finished = [f for f, _, _ in calls]
    clock = [t for _, _, t in calls]
    assert finished == sorted(finished) and clock == sorted(clock)  # never backwards
    # Heard at each finish: every count up to 25 shows (simultaneous finishes may skip one).
    assert len(set(finished)) >= 20, finished


def test_a_job_that_never_runs_leaves_the_bar_short() -> None:
    ok = synthetic(3, seed=2, jobs_per_hour=20, median_gpu_hours=0.5)
    # 400 A100s' worth of one job: no layout fits this cluster, so it never finishes.
    huge = TraceJob("huge", 10.0, "llama-3-70b", 4096, 4096, 10**13, 400)
    calls, metrics, end_s = _run([*ok, huge])
    assert metrics["jobs_finished"] == 3
    assert calls[-1] == (3, 4, end_s)


def test_the_clock_is_heard_between_finishes() -> None:
    # 400 arrivals a minute apart while the first long job holds the cluster's only fitting GPUs:
    # hundreds of event times without a finish, and the callback still hears the clock move.
    jobs = [TraceJob(f"j{i}", 60.0 * i, "llama-3-8b", 4096, 256, 4096 * 256 * 20_000, 8) for i in range(400)]
    calls, _, _ = _run(jobs)
    before_first = [t for f, _, t in calls if f == 0]
    assert before_first and before_first[-1] >= 255 * 60.0, calls[:5]  # the 256th arrival, at minute 255


def test_simulate_run_passes_each_policy_and_seed_along() -> None:
    settings = check_settings(
        cluster=REPO / "examples/clusters/paper-64.yaml", trace=None, policies="frenzy,opportunistic", max_jobs=0,
        synthetic=6, jobs_per_hour=20.0, seed=5, seeds=2, runtime_noise=0.1, restart_s=120.0, out=None,
        save_trace=None, fail_node=[], decision_sizes=None, decision_queue=0, as_json=True,
    )  # fmt: skip
    inputs = load_inputs(settings)
    heard: dict[tuple[str, int], list[Call]] = {}

    def on_progress(policy: str, seed: int, finished: int, total: int, now_s: float) -> None:
        heard.setdefault((policy, seed), []).append((finished, total, now_s))

    outcome = run(settings, inputs, on_progress=on_progress)
    # Seed-major, as run() goes: every policy at seed 5, then at seed 6.
    assert list(heard) == [("frenzy", 5), ("opportunistic", 5), ("frenzy", 6), ("opportunistic", 6)]
    for (policy, seed), calls in heard.items():
        done = outcome.per_seed[seed - 5][policy]["jobs_finished"]
        assert calls[-1][:2] == (done, 6), (policy, seed, calls)
