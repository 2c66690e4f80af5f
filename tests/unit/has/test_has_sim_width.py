"""Equal width and the baselines at their best (issue 32): ``max_width_factor`` K holds every
policy, frenzy included, to K x the trace's requested GPUs; opportunistic takes the fastest free
type; ``hadar`` is ``hadar-approx`` with a warning; the solvers stop on counts, not the clock."""

from __future__ import annotations

import random

import pytest

from has.cluster_spec import parse_cluster
from has.sim.baselines import _solve, make_policy
from has.sim.engine import ProfileBook, SimError, Simulator, Start, width_cap
from has.sim.traces import MAPPING_MODELS, TraceJob

SPEC = parse_cluster({"nodes": [
    {"gpu": "L4", "count": 2, "gpus_per_node": 4, "name_prefix": "l4", "inter_node_gbps": 1.5625},
    {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8, "name_prefix": "h100", "inter_node_gbps": 50},
    {"gpu": "A100-80GB", "count": 3, "gpus_per_node": 8, "name_prefix": "a100", "inter_node_gbps": 25},
]})  # fmt: skip
POLICIES = ["frenzy", "frenzy-blind", "frenzy-paper", "opportunistic", "sia-memaware", "gavel-memaware", "hadar-approx"]


def _trace(n: int = 24, seed: int = 1) -> list[TraceJob]:
    rng = random.Random(seed)
    models = [m for m in MAPPING_MODELS if not m.startswith(("qwen2.5-72", "llama-2-70", "qwen2.5-32"))]
    jobs = []
    for k in range(n):
        m = rng.choice(models)
        jobs.append(TraceJob(f"j{k:02d}", 300.0 * k, m, 1024 if m.startswith("gpt2") else 2048, 64,
                             rng.choice([2, 5, 20]) * 10**8, rng.choice([1, 1, 2, 4])))  # fmt: skip
    return jobs


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("k", [1.0, 2.0])
def test_every_policy_respects_the_width_bound(policy: str, k: float) -> None:
    jobs = _trace()
    book = ProfileBook(SPEC)
    sim = Simulator(SPEC, jobs, make_policy(policy, max_width_factor=k), profiles=book, runtime_noise=0.0,
                    truth="independent", max_width_factor=k)  # fmt: skip
    res = sim.run()
    assert res.metrics()["jobs_finished"] == len(jobs), res.unfinished
    by_id = {j.job_id: j for j in jobs}
    for _, job_id, _, gpus in res.placements:
        cap = width_cap(by_id[job_id].gpus, book.get(by_id[job_id]), k)
        assert len(gpus) <= cap, (policy, job_id, len(gpus), cap)
    unbounded = Simulator(SPEC, jobs, make_policy(policy), profiles=book, runtime_noise=0.0, truth="independent").run()
    if policy == "frenzy":  # unbounded, frenzy does go wider than 1x the request
        assert any(len(g) > by_id[j].gpus for _, j, _, g in unbounded.placements)


def test_the_engine_refuses_a_start_above_the_bound() -> None:
    job = TraceJob("wide", 0.0, "llama-3.2-1b", 2048, 64, 10**8, 1)

    class Greedy:
        name, round_s = "greedy", None

        def decide(self, view):  # type: ignore[no-untyped-def]
            return [Start("wide", "A100-80GB", tuple(("a100-0", i) for i in range(8)))] if view.queue else []

    with pytest.raises(SimError, match="width bound of 2"):
        Simulator(SPEC, [job], Greedy(), max_width_factor=2.0).run()
    assert width_cap(1, ProfileBook(SPEC).get(job), None) > 10**6  # no factor: no bound


def test_width_cap_is_raised_to_the_smallest_plan() -> None:
    book = ProfileBook(SPEC)
    big = TraceJob("big", 0.0, "llama-2-13b", 2048, 64, 10**8, 1)  # 1 GPU requested, no 1-GPU plan
    smallest = min(p.num_gpus for p in book.get(big).plans)
    smallest = 1 << (smallest - 1).bit_length()  # (a count every policy's rounds can place)
    assert smallest > 1 and width_cap(1, book.get(big), 1.0) == smallest
    assert width_cap(8, book.get(big), 1.5) == max(12, smallest)


def test_opportunistic_takes_the_fastest_free_type_not_the_file_order() -> None:
    # L4 is first in the cluster file; a 1-GPU job goes to the H100 while one is free
    job = TraceJob("small", 0.0, "qwen2.5-0.5b", 2048, 64, 10**8, 1)
    res = Simulator(SPEC, [job], make_policy("opportunistic"), runtime_noise=0.0).run()
    assert res.placements[0][2] == "H100-80GB"


def test_hadar_is_hadar_approx_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="hadar-approx"):
        old = make_policy("hadar")
    assert old.name == "hadar" and type(old) is type(make_policy("hadar-approx"))
    assert make_policy("hadar-approx", max_width_factor=3.0).max_scale == 3.0  # type: ignore[union-attr]
    assert make_policy("sia", max_width_factor=1.0).max_scale == 1.0  # type: ignore[union-attr]
    assert make_policy("sia").max_scale == 2.0  # type: ignore[union-attr]


def test_solves_stop_on_counts_and_are_counted() -> None:
    """A Sia round on a small state: solved to optimality under the node and iteration limits,
    the same allocation twice (no wall clock in it), and its counts recorded."""
    jobs = _trace(12)
    runs = []
    for _ in range(2):
        policy = make_policy("sia-memaware")
        res = Simulator(SPEC, jobs, policy, runtime_noise=0.0).run()
        runs.append([(j, t, g) for _, j, t, g in res.placements])
        assert policy.stats.solves > 0 and policy.stats.stopped == 0  # type: ignore[union-attr]
    assert runs[0] == runs[1]
    highspy = pytest.importorskip("highspy")
    lp = highspy.HighsLp()  # max x + y, x + y <= 1.5, binary: one of them
    lp.num_col_, lp.num_row_ = 2, 1
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = [-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]
    lp.row_lower_, lp.row_upper_ = [-highspy.kHighsInf], [1.5]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = [0, 1, 2], [0, 0], [1.0, 1.0]
    lp.integrality_ = [highspy.HighsVarType.kInteger] * 2
    assert sorted(_solve(lp)) == [0.0, 1.0]
