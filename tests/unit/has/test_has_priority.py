"""Job priorities in HAS (``QueuedJob.priority``): higher classes are walked first, a higher-class
job that cannot start holds GPUs at once so lower classes only backfill around it, and
preemption never stops a job for one of a lower class. Pure: no Redis."""

from __future__ import annotations

import dataclasses

import pytest
from unit.has.has_builders import A100, L4, cluster, free_node, job, node, plan
from unit.has.test_has_preemption import NOW, burst, policy

from has import QueuedJob, QueuePolicy, WaitKind, schedule

POLICIES = {
    "paper": QueuePolicy(),
    "frenzy": QueuePolicy.frenzy(),
    "fifo-easy": QueuePolicy(starvation_s=0.0),
}


def prio(j: QueuedJob, priority: int) -> QueuedJob:
    return dataclasses.replace(j, priority=priority)


@pytest.mark.parametrize("name", POLICIES)
def test_a_later_higher_priority_job_takes_the_one_free_gpu(name: str) -> None:
    c = cluster(free_node("a", 1, n=2))
    q = [job("first", 1, plan(), at=0.0), prio(job("urgent", 2, plan(), at=1.0), 10)]
    res = schedule(c, q, 10.0, POLICIES[name])
    assert [p.job_id for p in res.placements] == ["urgent"]
    assert "first" in res.pending
    # without the priority, submit order wins: the test could fail
    plain = schedule(c, [job("first", 1, plan()), job("urgent", 2, plan(), at=1.0)], 10.0, POLICIES[name])
    assert [p.job_id for p in plain.placements] == ["first"]


def test_within_a_class_the_policys_order_holds_and_lower_classes_come_last() -> None:
    c = cluster(free_node("a", 8))
    q = [
        prio(job("low", 1, plan()), -5),
        job("normal", 2, plan()),
        prio(job("hi-b", 4, plan()), 5),
        prio(job("hi-a", 3, plan()), 5),
    ]
    res = schedule(c, q, 10.0, QueuePolicy())
    assert [p.job_id for p in res.placements] == ["hi-a", "hi-b", "normal", "low"]


def test_one_shared_priority_decides_as_no_priority() -> None:
    c = cluster(free_node("a", 3), node("b", L4, 4, busy=[0]))
    q = [job("big", 1, plan(dp=8), at=0.0), job("s1", 2, plan(), at=1.0), job("s2", 3, plan(L4, dp=2), at=2.0)]
    for pol in POLICIES.values():
        base = schedule(c, q, 1e6, pol)
        same = schedule(c, [prio(j, 7) for j in q], 1e6, pol)
        assert same.placements == base.placements and same.blocked_by == base.blocked_by
        assert {k: v.summary for k, v in same.pending.items()} == {k: v.summary for k, v in base.pending.items()}


@pytest.mark.parametrize("name", ["paper", "frenzy"])
def test_a_higher_priority_job_that_cannot_start_holds_gpus_so_lower_ones_backfill_only_around_it(name: str) -> None:
    # 4 of 8 A100s free; "big" (priority 10) needs 8 and has waited seconds, far from starving.
    # Without priority the 1-GPU jobs would take the free A100s (backfill) and delay it each
    # time a GPU frees; with it, the A100s are held and only the L4 job backfills.
    c = cluster(node("a", A100, 8, busy=range(4)), free_node("l", 2, n=2, gpu_type=L4))
    q = [
        job("small", 1, plan(), at=0.0),
        prio(job("big", 2, plan(dp=8), at=5.0), 10),
        job("on-l4", 3, plan(L4), at=6.0),
    ]
    now = 10.0
    res = schedule(c, q, now, POLICIES[name])
    assert [p.job_id for p in res.placements] == ["on-l4"]
    assert res.blocked_by == "big"
    assert res.reservation is not None and res.reservation.held_count == 4
    assert res.pending["big"].kind is WaitKind.RESERVING
    assert "priority 10, above waiting jobs of priority 0: holding 4 free" in res.pending["big"].summary
    held = res.pending["small"]
    assert held.kind is WaitKind.HELD_FOR_STARVING
    assert "held for higher-priority job big (priority 10)" in held.summary
    # the same queue without the priority: "small" backfills onto a free A100
    plain = schedule(c, [prio(j, 0) for j in q], now, POLICIES[name])
    assert "small" in {p.job_id for p in plain.placements} and plain.blocked_by is None


def test_a_starving_low_priority_job_does_not_hold_against_a_higher_class() -> None:
    # "old" (priority 0) has starved for hours; "new" (priority 1) needs the same 8 A100s.
    c = cluster(node("a", A100, 8, busy=range(4)))
    q = [job("old", 1, plan(dp=8), at=0.0), prio(job("new", 2, plan(dp=8), at=9_000.0), 1)]
    res = schedule(c, q, 10_000.0, QueuePolicy(starvation_s=300.0))
    assert res.blocked_by == "new"
    assert res.pending["old"].kind is not WaitKind.RESERVING
    # alone in its class, the old job holds as it always did
    alone = schedule(c, [q[0]], 10_000.0, QueuePolicy(starvation_s=300.0))
    assert alone.blocked_by == "old"


def test_a_negative_priority_waits_for_normal_jobs_and_they_hold_against_it() -> None:
    c = cluster(node("a", A100, 8, busy=range(6)))
    q = [prio(job("batch", 1, plan(dp=2), at=0.0), -50), job("normal", 2, plan(dp=4), at=1.0)]
    res = schedule(c, q, 5.0, QueuePolicy())
    assert res.placements == () and res.blocked_by == "normal"
    assert "held for higher-priority job normal (priority 0)" in res.pending["batch"].summary


def test_preemption_never_stops_a_job_for_a_lower_class() -> None:
    c, q, running = burst()
    assert len(schedule(c, q, NOW, policy(), running).preemptions) == 1  # same class: preempted
    high_victim = [dataclasses.replace(r, priority=5) for r in running]
    assert schedule(c, q, NOW, policy(), high_victim).preemptions == ()
    # a waiting job of the victim's class or above still may
    assert len(schedule(c, [prio(j, 5) for j in q], NOW, policy(), high_victim).preemptions) == 1


def test_the_pass_does_not_reorder_when_nothing_differs() -> None:
    from has.queue_order import queue_order

    q = [job(f"j{i}", i, plan(), at=float(i)) for i in range(5)]
    assert [r[3] for r in queue_order(q, 10.0, QueuePolicy())] == q
    mixed = [prio(j, i % 2) for i, j in enumerate(q)]
    order = [r[3].job_id for r in queue_order(mixed, 10.0, QueuePolicy())]  # type: ignore[attr-defined]
    assert order == ["j1", "j3", "j0", "j2", "j4"]
