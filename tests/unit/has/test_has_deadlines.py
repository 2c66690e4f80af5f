"""HAS keeps deadlines and objectives (issue 35; docs/has-policy.md, "Deadlines and objectives").

A queued job may carry a deadline (``QueuedJob.deadline``, an absolute time) and an objective
("time", "cost", "gpu-hours"). The pass places it only on a plan that still meets the deadline
when one can start, cheapest first under "cost"; when none can start, its pending reason says
when the deadline becomes unreachable; once it cannot be met, the job is listed in
``ScheduleResult.deadline_missed`` and runs late. A job without either is decided as before."""

from __future__ import annotations

import dataclasses
import random

import pytest
from unit.has.has_builders import A100, H100, L4, MEM, cluster, free_node, job, plan

from has import GpuSlot, NodeView, PlanOption, QueuedJob, QueuePolicy, schedule
from has.queued import goal_cut, plans_of

NOW = 1_000_000.0
POLICIES = {
    "frenzy": QueuePolicy.frenzy(),
    "frenzy-paper": QueuePolicy(),
    "frenzy-completion": QueuePolicy.named("frenzy-completion"),
}


def priced(gpu_type: str, runtime_s: float, usd_per_gpu_hour: float, dp: int = 4) -> PlanOption:
    p = plan(gpu_type, dp=dp)
    return dataclasses.replace(p, runtime_s=runtime_s, cost_usd=usd_per_gpu_hour * dp * runtime_s / 3600.0)


# MARP's order (time): H100 fastest and dearest, A100, then L4 cheapest and slowest.
FAST = priced(H100, 3_600.0, 6.88)  # 1 h, $27.52
MID = priced(A100, 7_200.0, 3.43)  # 2 h, $27.44
SLOW = priced(L4, 21_600.0, 0.81)  # 6 h, $19.44


def goal_job(job_id: str, *plans: PlanOption, deadline: float | None = None, objective: str = "time",
             seq: int = 1) -> QueuedJob:  # fmt: skip
    return QueuedJob(job_id, seq, NOW - 60.0, tuple(plans), deadline=deadline, objective=objective)


def all_free() -> object:
    return cluster(free_node("h", 4, n=4, gpu_type=H100), free_node("a", 4, n=4, gpu_type=A100),
                   free_node("l", 4, n=4, gpu_type=L4))  # fmt: skip


def busy_until(name: str, gpu_type: str, free_at: float, n: int = 4) -> NodeView:
    gpus = tuple(GpuSlot(name, i, gpu_type, MEM[gpu_type], 1 << 30, "running", True, free_at) for i in range(n))
    return NodeView(name, gpus)


@pytest.mark.parametrize("name", POLICIES)
def test_cost_takes_the_cheapest_plan_that_meets_the_deadline_over_a_faster_pricier_one(name: str) -> None:
    policy = POLICIES[name]
    c = all_free()
    # no deadline: the cheapest of all (L4, 6 h)
    res = schedule(c, [goal_job("j", FAST, MID, SLOW, objective="cost")], NOW, policy)
    assert [(p.plan.gpu_type, p.plan_index) for p in res.placements] == [(L4, 2)]
    # a 3 h deadline drops the L4 plan: the A100 plan ($27.44) meets it and is cheaper than the H100 one
    res = schedule(c, [goal_job("j", FAST, MID, SLOW, deadline=NOW + 3 * 3600.0, objective="cost")], NOW, policy)
    assert [(p.plan.gpu_type, p.plan_index) for p in res.placements] == [(A100, 1)]
    assert res.deadline_missed == ()
    # under "time" the same job takes MARP's first plan (the H100s)
    res = schedule(c, [goal_job("j", FAST, MID, SLOW, deadline=NOW + 3 * 3600.0)], NOW, policy)
    assert [(p.plan.gpu_type, p.plan_index) for p in res.placements] == [(H100, 0)]


@pytest.mark.parametrize("name", POLICIES)
def test_a_deadline_refuses_a_plan_that_fits_now_but_finishes_too_late(name: str) -> None:
    # only the L4s are free: 6 h there, but the deadline is in 2.5 h; the H100s free in 30 min
    c = cluster(busy_until("h", H100, NOW + 1800.0), busy_until("a", A100, NOW + 30 * 3600.0),
                free_node("l", 4, n=4, gpu_type=L4))  # fmt: skip
    q = [goal_job("j", FAST, MID, SLOW, deadline=NOW + 2.5 * 3600.0)]
    res = schedule(c, q, NOW, POLICIES[name])
    assert res.placements == ()
    reason = res.pending["j"]
    # the latest start of its fastest plan: the deadline - 1 h
    assert reason.latest_start == pytest.approx(NOW + 1.5 * 3600.0)
    assert f"becomes unreachable at t={NOW + 5400:.0f}" in reason.summary
    # without the deadline the job starts on the L4s under MARP's first-fit (frenzy-paper)
    if name == "frenzy-paper":
        free = schedule(c, [goal_job("j", FAST, MID, SLOW)], NOW, POLICIES[name])
        assert [p.plan.gpu_type for p in free.placements] == [L4]


def test_ranked_wait_with_a_deadline() -> None:
    # the H100s free in 2 h (done at 3 h); the A100 plan fits now (done at 2 h): a wait for the
    # H100s would not gain 20 % anyway, so make the A100 plan slow enough that it would
    slow_mid = priced(A100, 3 * 3600.0, 3.43)
    c = cluster(busy_until("h", H100, NOW + 600.0), free_node("a", 4, n=4, gpu_type=A100))
    # no deadline: waiting 10 min + 1 h beats 3 h now: it waits for the H100s
    res = schedule(c, [goal_job("j", FAST, slow_mid)], NOW, POLICIES["frenzy"])
    assert res.placements == ()
    # a deadline in 1 h 5 min: the H100 plan (done in 1 h 10 min) would miss it; the A100 plan
    # (3 h) misses it too: the deadline is missed, the job runs late on what fits (the A100s)
    res = schedule(c, [goal_job("j", FAST, slow_mid, deadline=NOW + 3900.0)], NOW, POLICIES["frenzy"])
    assert res.placements == ()  # its fastest plan can still make it if started now: not missed yet
    assert res.deadline_missed == ()
    # a deadline in 3 h 5 min: both meet it from now, but waiting for the H100s meets it too: wait
    res = schedule(c, [goal_job("j", FAST, slow_mid, deadline=NOW + 3 * 3600.0 + 300.0)], NOW, POLICIES["frenzy"])
    assert res.placements == ()
    # (a plan that fits now is in the cut, so it meets the deadline, and a wait is only ever for a
    # plan that finishes sooner: the deadline test on waits matters when nothing fits now, where it
    # keeps the job from claiming the releases of a plan that would end too late)


@pytest.mark.parametrize("name", POLICIES)
def test_a_missed_deadline_is_reported_and_the_job_still_runs_flagged(name: str) -> None:
    c = all_free()
    # the deadline is in 30 min, the fastest plan needs 1 h: missed; it runs (MARP's first plan)
    q = [goal_job("j", FAST, MID, SLOW, deadline=NOW + 1800.0), goal_job("k", MID, seq=2)]
    res = schedule(c, q, NOW, POLICIES[name])
    assert res.deadline_missed == ("j",)
    assert [(p.job_id, p.plan.gpu_type) for p in res.placements] == [("j", H100), ("k", A100)]
    # under cost a late job still goes by dollars
    res = schedule(c, [goal_job("j", FAST, MID, SLOW, deadline=NOW + 1800.0, objective="cost")], NOW, POLICIES[name])
    assert res.deadline_missed == ("j",) and [p.plan.gpu_type for p in res.placements] == [L4]


def test_a_waiting_job_past_its_latest_start_says_its_deadline_was_missed() -> None:
    c = cluster(busy_until("h", H100, NOW + 9000.0), busy_until("a", A100, NOW + 9000.0),
                busy_until("l", L4, NOW + 9000.0))  # fmt: skip
    res = schedule(c, [goal_job("j", FAST, MID, SLOW, deadline=NOW + 1800.0)], NOW, QueuePolicy.frenzy())
    assert res.deadline_missed == ("j",)
    assert "deadline missed" in res.pending["j"].summary
    assert res.pending["j"].latest_start == pytest.approx(NOW - 1800.0)


def test_the_plan_index_names_the_jobs_own_plan_and_quota_and_goal_compose() -> None:
    c = all_free()
    q = [dataclasses.replace(goal_job("j", FAST, MID, SLOW, objective="cost"), user="u")]
    res = schedule(c, q, NOW, QueuePolicy.frenzy(max_gpus_per_user=4))
    (p,) = res.placements
    assert q[0].plans[p.plan_index] == p.plan == SLOW


def test_goal_cut_keeps_the_plans_that_meet_the_deadline_in_the_objectives_order() -> None:
    j = goal_job("j", FAST, MID, SLOW, deadline=NOW + 3 * 3600.0, objective="cost")
    info = plans_of(j)
    cut, kept, missed = goal_cut(j, info, NOW)
    assert kept == (1, 0) and not missed and cut.deadline == j.deadline and cut.objective == "time"
    assert goal_cut(j, info, NOW + 60.0)[0] is cut  # the same plans meet it: the same cut job, kept
    assert goal_cut(j, info, NOW + 2 * 3600.0)[1] == (0,)
    cut, kept, missed = goal_cut(j, info, NOW + 2 * 3600.0 + 1.0)
    assert missed and kept == (2, 1, 0) and cut.deadline is None
    gh = goal_job("g", FAST, MID, SLOW, objective="gpu-hours")
    assert goal_cut(gh, plans_of(gh), NOW)[1] == (0, 1, 2)  # 4, 8, 24 GPU-hours
    plain = goal_job("p", FAST, MID, SLOW, deadline=NOW + 10 * 3600.0)
    assert goal_cut(plain, plans_of(plain), NOW)[1] == (0, 1, 2)
    with pytest.raises(ValueError, match="objective"):
        goal_job("x", FAST, objective="dollars")
    with pytest.raises(ValueError, match="cost_usd"):
        dataclasses.replace(FAST, cost_usd=-1.0)


def test_jobs_without_a_goal_are_decided_as_before_beside_goal_jobs() -> None:
    """A goal on one job changes no decision for a queue without goals, and adding ``cost_usd`` to
    plans changes nothing for jobs whose objective is time (random states, every policy)."""
    rng = random.Random(35)
    for trial in range(60):
        nodes = [free_node(f"n{k}", rng.randint(0, 8), gpu_type=rng.choice((A100, H100, L4))) for k in range(4)]
        c = cluster(*nodes)
        queue = []
        for i in range(rng.randint(1, 8)):
            plans = tuple(dataclasses.replace(plan(rng.choice((A100, H100, L4)), dp=rng.choice((1, 2, 4, 8))),
                                              runtime_s=rng.uniform(600, 36_000))
                          for _ in range(rng.randint(1, 4)))  # fmt: skip
            queue.append(job(f"j{i}", i, *plans, at=NOW - rng.uniform(0, 20_000)))
        with_costs = [dataclasses.replace(q, plans=tuple(dataclasses.replace(p, cost_usd=rng.uniform(1, 100))
                                                         for p in q.plans)) for q in queue]  # fmt: skip
        for name, policy in POLICIES.items():
            a = schedule(c, queue, NOW, policy)
            b = schedule(c, with_costs, NOW, policy)
            assert [(p.job_id, p.plan_index, p.nodes) for p in a.placements] == \
                [(p.job_id, p.plan_index, p.nodes) for p in b.placements], (trial, name)  # fmt: skip
            assert {k: (r.summary, r.kind) for k, r in a.pending.items()} == \
                {k: (r.summary, r.kind) for k, r in b.pending.items()}, (trial, name)  # fmt: skip
            assert a.deadline_missed == () and a.blocked_by == b.blocked_by
