"""QueuePolicy(starving_order="ideal"): the order of the jobs that waited ``starvation_s``."""

from __future__ import annotations

import dataclasses

import pytest
from unit.has.has_builders import cluster, free_node, job, plan

from has import PlanOption, QueuePolicy, schedule

HOUR = 3600.0


def timed(runtime_s: float, dp: int = 8) -> PlanOption:
    return dataclasses.replace(plan(dp=dp), runtime_s=runtime_s)


def policy(starving_order: str) -> QueuePolicy:
    # (no starvation_stretch: these jobs starve on the plain threshold; test_has_starvation_stretch
    # has the stretch)
    return QueuePolicy.frenzy(starvation_s=HOUR, starving_order=starving_order, starvation_stretch=0.0, explain=False)


def test_frenzy_orders_starving_jobs_by_ideal_completion() -> None:
    assert QueuePolicy.frenzy().starving_order == "ideal"
    assert QueuePolicy().starving_order == "fifo"  # the paper's HAS is unchanged


def test_a_burst_that_starves_together_goes_shortest_first() -> None:
    # Three 8-GPU jobs arrived together (seconds apart) and have all starved; one node is free.
    c = cluster(free_node("a", 8))
    q = [
        job("long", 1, timed(9 * HOUR), at=0.0),
        job("mid", 2, timed(4 * HOUR), at=1.0),
        job("short", 3, timed(1 * HOUR), at=2.0),
    ]
    ideal = schedule(c, q, now=5 * HOUR, policy=policy("ideal"))
    assert [p.job_id for p in ideal.placements] == ["short"]
    fifo = schedule(c, q, now=5 * HOUR, policy=policy("fifo"))
    assert [p.job_id for p in fifo.placements] == ["long"]


def test_a_job_goes_before_every_job_submitted_after_its_ideal_completion() -> None:
    # "old" would have finished at 2 h; "new" arrived at 3 h. Both starve: old goes first
    # although it is much longer (this is what keeps a big job from starving).
    c = cluster(free_node("a", 8))
    q = [job("new", 2, timed(0.1 * HOUR), at=3 * HOUR), job("old", 1, timed(2 * HOUR), at=0.0)]
    res = schedule(c, q, now=10 * HOUR, policy=policy("ideal"))
    assert [p.job_id for p in res.placements] == ["old"]
    # Had "new" arrived before old's ideal completion, the shorter one would have gone first.
    q = [job("new", 2, timed(0.1 * HOUR), at=1 * HOUR), job("old", 1, timed(2 * HOUR), at=0.0)]
    res = schedule(c, q, now=10 * HOUR, policy=policy("ideal"))
    assert [p.job_id for p in res.placements] == ["new"]


def test_the_holder_is_the_starving_job_with_the_earliest_ideal_completion() -> None:
    # Nothing fits now (4 free, every job needs 8): the first starving job in the order holds.
    c = cluster(free_node("a", 4))
    q = [
        job("long", 1, timed(9 * HOUR), at=0.0),
        job("short", 2, timed(1 * HOUR), at=60.0),
    ]
    assert schedule(c, q, now=5 * HOUR, policy=policy("ideal")).blocked_by == "short"
    assert schedule(c, q, now=5 * HOUR, policy=policy("fifo")).blocked_by == "long"


def test_without_runtimes_starving_jobs_keep_submit_order() -> None:
    c = cluster(free_node("a", 8))
    q = [job("b", 2, plan(dp=8), at=10.0), job("a", 1, plan(dp=8), at=0.0)]
    res = schedule(c, q, now=5 * HOUR, policy=policy("ideal"))
    assert [p.job_id for p in res.placements] == ["a"]


def test_starving_order_is_validated() -> None:
    with pytest.raises(ValueError, match="starving_order"):
        QueuePolicy(starving_order="shortest")
