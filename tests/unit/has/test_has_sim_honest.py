"""Issue 18: the simulator's truth apart from the prediction, baselines at their best, every job counted."""

from __future__ import annotations

import pytest

from has.cluster_spec import parse_cluster
from has.sim.baselines import GavelPolicy, SiaPolicy, make_policy
from has.sim.engine import ProfileBook, Simulator, SimView
from has.sim.traces import TraceJob

V100_A100 = parse_cluster({"nodes": [
    {"gpu": "V100-32GB", "count": 2, "gpus_per_node": 8},
    {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8},
]})  # fmt: skip


def _jobs(n: int, model: str = "qwen2.5-0.5b", steps: int = 200, gpus: int = 2) -> list[TraceJob]:
    return [TraceJob(f"j{i}", 60.0 * i, model, 2048, 64, 64 * 2048 * steps, gpus) for i in range(n)]


def test_a_gpu_without_the_precision_is_infeasible_not_zero_speed() -> None:
    # MARP gives a V100 0 bf16 TFLOPS; Sia's score for a V100 column was 0/0 = NaN and the ILP
    # picked it, so shipped Sia finished 0 jobs on a cluster with V100s.
    book = ProfileBook(V100_A100)
    job = _jobs(1)[0]
    prof = book.get(job)
    assert prof.runnable_types == frozenset({"A100-80GB"})
    sia = SiaPolicy()
    sim = Simulator(V100_A100, [job], sia, profiles=book, runtime_noise=0.0)
    info = sim.info[job.job_id]
    assert sia.believed_step_time(info, "V100-32GB", 8) is None
    assert all(t == "A100-80GB" for t, _ in sia.configs(SimView(sim, 0.0), info, {"V100-32GB": (8, 2), "A100-80GB": (8, 1)}))


@pytest.mark.parametrize("name", ["sia", "sia-memaware", "gavel", "opportunistic", "frenzy"])
def test_every_policy_finishes_on_a_cluster_with_v100s(name: str) -> None:
    jobs = _jobs(6)
    sim = Simulator(V100_A100, jobs, make_policy(name), runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == len(jobs)
    assert all(t == "A100-80GB" for _, _, t, _ in sim.placements)  # never a V100: bf16 cannot run there


def test_gavel_restarts_are_its_round_by_round_time_sharing() -> None:
    """Why Gavel restarts so often: each round (360 s) it re-derives who runs, and a job whose
    max-min share X is below 1 is stopped in the rounds it is not given (each stop = a restart
    that pays the restart cost). Two 4-GPU jobs on one 4-GPU node (X = 0.5 each) alternate
    every round, so restarts grow with the rounds the jobs overlap: doubling the round length
    halves them, and every restart is a Stop Gavel issued (no hidden ones)."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob(f"j{i}", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 20_000, 4) for i in range(2)]
    counts = {}
    for round_s in (360.0, 720.0):
        sim = Simulator(spec, jobs, GavelPolicy(round_s=round_s), runtime_noise=0.0, restart_s=0.0)
        res = sim.run()
        assert res.metrics()["jobs_finished"] == 2
        overlap = min(o.finish_s or 0.0 for o in res.jobs)  # both jobs active until the first ends
        # one restart per round boundary while both are active (the one stopped gives way), not more
        assert res.restarts == pytest.approx(overlap / round_s, abs=2)
        counts[round_s] = res.restarts
    assert counts[720.0] == pytest.approx(counts[360.0] / 2, abs=2)
