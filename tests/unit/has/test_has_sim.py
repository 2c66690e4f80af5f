"""The simulator and its policies: conservation, causality, OOM rule, determinism, one code path."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

import has.sim.baselines as baselines
from has import PlanChoice, QueuePolicy, schedule
from has.cluster_spec import parse_cluster
from has.sim.baselines import (
    FrenzyPolicy,
    GavelPolicy,
    OpportunisticPolicy,
    SiaPolicy,
    UnknownPolicyError,
    make_policy,
)
from has.sim.engine import ProfileBook, SimError, Simulator, SimView, Start, simulate
from has.sim.traces import TraceJob, synthetic

SMALL = parse_cluster({"nodes": [
    {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8},
    {"gpu": "A100-80GB", "count": 2, "gpus_per_node": 8},
    {"gpu": "L4", "count": 2, "gpus_per_node": 4},
]})  # fmt: skip
POLICIES = ("frenzy", "frenzy-paper", "opportunistic", "sia", "gavel")


@pytest.fixture(scope="module")
def book() -> ProfileBook:
    return ProfileBook(SMALL)


@pytest.fixture(scope="module")
def jobs() -> list[TraceJob]:
    return synthetic(40, seed=7, jobs_per_hour=30, median_gpu_hours=2.0)


def _check_timeline(sim: Simulator) -> None:
    """Replay placements and finishes: never more GPUs than exist, never a GPU held twice."""
    res_jobs = {j.job_id: j for j in sim.outcomes.values()}
    for t, job_id, _gpu_type, gpus in sim.placements:
        assert t >= sim.trace[job_id].submit_s, f"{job_id} started before it arrived"
        assert len(set(gpus)) == len(gpus)
    assert all(0 <= busy <= sim.total_gpus for _, busy in sim.busy)
    for rec in res_jobs.values():
        if rec.finish_s is not None:
            assert rec.first_start_s is not None and rec.submit_s <= rec.first_start_s <= rec.finish_s


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_finishes_and_conserves_gpus(name: str, jobs: list[TraceJob], book: ProfileBook) -> None:
    sim = Simulator(SMALL, jobs, make_policy(name), profiles=book)
    res = sim.run()
    _check_timeline(sim)
    m = res.metrics()
    # A job MARP (5 % margin) finds no plan for is never started by HAS; the memory-blind
    # policies may still run it where it fits the GPUs' full memory.
    plannable = [j for j in jobs if sim.info[j.job_id].profile.plans]
    expected = len(plannable) if name.startswith("frenzy") else len(jobs)
    assert m["jobs_finished"] == expected
    assert not sim.owner and not sim.running  # everything released at the end
    assert len(sim.queue) == len(jobs) - expected
    assert 0.0 < m["utilization"] <= 1.0
    assert m["avg_jct_s"] >= m["avg_queue_s"] >= 0.0
    assert set(m) == {
        "avg_jct_s",
        "p50_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "makespan_s",
        "utilization",
        "oom_failures",
        "restarts",
        "jobs_finished",
        "jobs_total",
        "avg_jct_censored_s",
        "rho_mean",
        "rho_max",
        "decision_ms_mean",
        "decision_ms_p99",
        "deadline_jobs",
        "deadline_misses",
        "deadline_miss_rate",
        "gpu_hours",
        "cost_usd",
        "jobs_mixed",
        "avg_jct_mixed_s",
    }
    # every job counted: the unfinished ones are named with why, and count in the censored mean
    assert m["jobs_total"] == len(jobs) and len(res.unfinished) == len(jobs) - expected
    assert all(res.unfinished.values())
    # (a relative 1e-12: with every job finished the two means differ only in summation order)
    assert m["avg_jct_censored_s"] >= m["avg_jct_s"] * m["jobs_finished"] / len(jobs) * (1 - 1e-12)


@pytest.mark.parametrize("name", ("frenzy", "frenzy-paper"))
def test_memory_aware_policies_never_oom(name: str, jobs: list[TraceJob], book: ProfileBook) -> None:
    res = simulate(SMALL, jobs, make_policy(name), profiles=book)
    assert res.oom_failures == 0


def test_same_seed_same_result(jobs: list[TraceJob], book: ProfileBook) -> None:
    a = simulate(SMALL, jobs, make_policy("frenzy"), seed=3, profiles=book)
    b = simulate(SMALL, jobs, make_policy("frenzy"), seed=3, profiles=book)
    c = simulate(SMALL, jobs, make_policy("frenzy"), seed=4, profiles=book)
    key = lambda r: [(j.job_id, j.first_start_s, j.finish_s) for j in r.jobs]  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(c)  # the seed drives the per-job truth/estimate factor


def test_oom_rule_for_memory_blind_opportunistic() -> None:
    # llama-2-7b cannot train on one 24 GB L4; the user asks for 1 GPU on an L4-only cluster.
    spec = parse_cluster({"nodes": [{"gpu": "L4", "count": 4, "gpus_per_node": 4}]})
    job = TraceJob("big", 0.0, "llama-2-7b", 2048, 64, 64 * 2048 * 3, 1)
    sim = Simulator(spec, [job], OpportunisticPolicy(), oom_delay_s=100.0, runtime_noise=0.0)
    res = sim.run()
    counts = [len(g) for _, _, _, g in sim.placements]
    assert counts[0] == 1 and counts == sorted(counts)  # retried with 2n after each OOM
    assert res.oom_failures == len(counts) - 1 >= 1
    assert (res.jobs[0].finish_s or 0) >= 100.0 * res.oom_failures  # each OOM cost its delay
    assert res.jobs[0].finish_s is not None
    assert ("L4", 1) in sim.info["big"].failed_configs


def test_sia_learns_from_oom_and_respects_capacity() -> None:
    spec = parse_cluster({"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 4}]})
    jobs = [TraceJob(f"j{i}", 0.0, "llama-2-7b", 2048, 64, 64 * 2048 * 5, 1) for i in range(3)]
    sim = Simulator(spec, jobs, SiaPolicy(), runtime_noise=0.0)
    res = sim.run()
    _check_timeline(sim)
    assert res.metrics()["jobs_finished"] == 3
    assert res.oom_failures >= 1  # memory-blind: it had to learn
    # never the same failed configuration twice for a job
    for info in sim.info.values():
        tried = [(t, len(g)) for _, j, t, g in sim.placements if j == info.job_id]
        oomed = [c for c in tried if c in info.failed_configs]
        assert len(oomed) == len(set(oomed))


def test_sia_ilp_prefers_faster_type_for_one_job() -> None:
    spec = parse_cluster({"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 4},
                                    {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})  # fmt: skip
    job = TraceJob("a", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 10, 2)
    sim = Simulator(spec, [job], SiaPolicy(), runtime_noise=0.0)
    sim.run()
    assert sim.placements[0][2] == "H100-80GB"


def test_restart_factor_formula() -> None:
    # Sia SOSP'23 sec. 3.3: r = (T - N S) / (T + S); the policy clamps it to (0, 1].
    age, restarts, s = 1000.0, 2, 100.0
    assert (age - restarts * s) / (age + s) == pytest.approx(800 / 1100)


def test_frenzy_policy_calls_has_schedule(monkeypatch: pytest.MonkeyPatch, jobs: list[TraceJob],
                                          book: ProfileBook) -> None:  # fmt: skip
    calls: list[QueuePolicy] = []

    def spy(cluster, queue, now, policy=QueuePolicy(), running=()):  # noqa: ANN001, B008
        calls.append(policy)
        # only jobs submitted within the preemption window are handed over, unless the
        # long-job stop (frenzy's, preempt_long_gain) weighs every running job
        assert policy.preempt_long_gain > 0 or all(now - r.submitted_at <= policy.preempt_within_s for r in running)
        return schedule(cluster, queue, now, policy, running)

    monkeypatch.setattr(baselines, "schedule", spy)
    simulate(SMALL, jobs[:5], make_policy("frenzy-completion"), profiles=book)
    assert calls and all(p == QueuePolicy.named("frenzy-completion", explain=False) for p in calls)
    assert calls[0].preempt_within_s == 60.0 and calls[0].plan_choice is PlanChoice.COMPLETION
    calls.clear()
    simulate(SMALL, jobs[:5], make_policy("frenzy"), profiles=book)  # the split's choice, the live default
    assert calls and all(p == QueuePolicy.frenzy(explain=False) for p in calls)
    assert calls[0].plan_choice is PlanChoice.RANKED_WAIT and calls[0].preempt_long_gain > 0


def test_engine_rejects_double_booking(jobs: list[TraceJob], book: ProfileBook) -> None:
    class Greedy:
        name, round_s = "greedy", None

        def decide(self, view: SimView) -> Sequence[Start]:
            return [Start(j.job_id, "H100-80GB", (("h10080gb-0", 0),)) for j in view.queue[:2]]

    two = [dataclasses.replace(j, submit_s=0.0) for j in jobs[:2]]
    with pytest.raises(SimError, match="already held"):
        simulate(SMALL, two, Greedy(), profiles=book)


def test_unknown_policy_and_gpu_are_clear_errors() -> None:
    with pytest.raises(UnknownPolicyError, match="unknown policy 'nope'"):
        make_policy("nope")
    with pytest.raises(SimError, match="unknown GPU type 'Z80'"):
        ProfileBook(parse_cluster({"nodes": [{"gpu": "Z80", "count": 1}]}))


def test_node_failure_requeues_and_keeps_progress(book: ProfileBook) -> None:
    job = TraceJob("long", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 2000, 1)
    base = Simulator(SMALL, [job], FrenzyPolicy("frenzy", QueuePolicy.frenzy(explain=False)), profiles=book,
                     runtime_noise=0.0)  # fmt: skip
    base.run()
    first = base.placements[0][3][0][0]
    failed = Simulator(SMALL, [job], FrenzyPolicy("frenzy", QueuePolicy.frenzy(explain=False)), profiles=book,
                       runtime_noise=0.0, node_failures=[(10.0, first, 3600.0)])  # fmt: skip
    res = failed.run()
    assert res.restarts == 1 and res.jobs[0].finish_s is not None
    assert all(g[0] != first for _, _, _, gs in failed.placements[1:] for g in [gs[0]])


def _first_fit_reference(view: SimView) -> list[Start]:
    """Opportunistic's placement written the plain way: for each job, sum the free GPUs of each
    candidate type, then take them node by node from the first node in name order."""
    from has.sim.baselines import _type_order

    cluster = view.cluster
    types = _type_order(view)
    totals = {t: sum(cluster.healthy_by_node(t).values()) for t in types}
    free = {t: [(name, [s.index for s in nf.slots]) for name, nf in cluster.free_by_node(t).items()] for t in types}
    out = []
    for job in view.queue:
        req = OpportunisticPolicy.request(job, types, totals)
        if req is None:
            continue
        n, candidates = req
        for t in candidates:
            if sum(len(ix) for _, ix in free[t]) < n:
                continue
            picked: list[tuple[str, int]] = []
            for name, ix in free[t]:
                take = ix[: n - len(picked)]
                picked.extend((name, i) for i in take)
                del ix[: len(take)]
                if len(picked) == n:
                    break
            out.append(Start(job.job_id, t, tuple(picked)))
            break
    return out


@pytest.mark.parametrize("seed", range(4))
def test_opportunistic_first_fit_matches_the_plain_walk(seed: int) -> None:
    """The policy walks each type's nodes once per decision (not once per job); its placements
    must be exactly those of the plain walk, on states with partly used nodes and many jobs."""
    from has.sim.scale import build_state

    sim, now = build_state(128 + 64 * seed, seed, queued=120)
    got = OpportunisticPolicy().decide(SimView(sim, now))
    assert got == _first_fit_reference(SimView(sim, now))
    assert len(got) > 10 and any(len({node for node, _ in s.gpus}) > 1 for s in got)  # multi-node fits too


# ----- gavel ------------------------------------------------------------------------------


def test_gavel_time_shares_one_gpu_type_between_jobs_round_by_round() -> None:
    """Two 4-GPU jobs, room for one: max-min fairness gives each half the time (X = 0.5), and
    the round mechanism realises it by alternating them (each preempted while the other runs)."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob(f"j{i}", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 10_000, 4) for i in range(2)]
    sim = Simulator(spec, jobs, GavelPolicy(), runtime_noise=0.0)
    res = sim.run()
    _check_timeline(sim)
    assert res.metrics()["jobs_finished"] == 2
    starts = [j for _, j, _, _ in sim.placements]
    assert starts[:4] == ["j0", "j1", "j0", "j1"]  # alternating rounds
    assert res.restarts >= 2


def test_gavel_leaves_jobs_where_they_run_when_there_is_room() -> None:
    """With a GPU type free for everyone, the max-min allocation is X = 1 on the fastest type
    for every job (the efficiency step keeps the LP from splitting them), so no job moves."""
    spec = parse_cluster({"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 4},
                                    {"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8}]})  # fmt: skip
    jobs = [TraceJob(f"j{i}", 30.0 * i, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 300, 2) for i in range(4)]
    sim = Simulator(spec, jobs, GavelPolicy(), runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == 4 and res.restarts == 0
    assert {t for _, _, t, _ in sim.placements} == {"H100-80GB"}  # the fastest type, for all


def test_gavel_lp_is_max_min_fair_then_efficient() -> None:
    g = GavelPolicy()
    # Job 0 runs 2x faster on A than on B, job 1 the same on both; one GPU of each, 1-GPU jobs.
    pairs = [(0, "A", 1, 2.0), (0, "B", 1, 1.0), (1, "A", 1, 1.0), (1, "B", 1, 1.0)]
    x = g._fair(pairs, {"A": 1, "B": 1})
    got = {(i, t): round(v, 6) for (i, t, _, _), v in zip(pairs, x, strict=True)}
    # max-min level 1 (job 0 on A, job 1 on B); the efficient optimum is that very split
    assert got == {(0, "A"): 1.0, (0, "B"): 0.0, (1, "A"): 0.0, (1, "B"): 1.0}
