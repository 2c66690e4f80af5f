"""QueuePolicy.starvation_stretch: a job starves once it has waited ``starvation_s`` *and* that
many times the runtime of its cheapest plan (``has.queue_order.starves``), so under a queue that
never drains a long job that waited a few hours does not go before every shorter job."""

from __future__ import annotations

import dataclasses

import pytest
from unit.has.has_builders import cluster, free_node, job, plan

from has import PlanOption, QueuePolicy, schedule
from has.queue_order import starves
from has.queued import plans_of

HOUR = 3600.0


def timed(runtime_s: float, dp: int = 8) -> PlanOption:
    return dataclasses.replace(plan(dp=dp), runtime_s=runtime_s)


def policy(stretch: float) -> QueuePolicy:
    return QueuePolicy.frenzy(starvation_s=4 * HOUR, starvation_stretch=stretch, explain=False)


def test_the_default_measures_a_wait_against_the_job_and_the_paper_has_does_not() -> None:
    assert QueuePolicy.frenzy().starvation_stretch == 10.0
    assert QueuePolicy.named("frenzy-wait4h").starvation_stretch == 0.0
    assert QueuePolicy().starvation_stretch == 0.0  # the paper's HAS is unchanged


def test_a_long_job_that_waited_hours_does_not_go_before_a_short_one() -> None:
    # A 20 h job has waited 5 h; a 1 h job arrived 1 h ago. One node is free for either.
    c = cluster(free_node("a", 8))
    q = [job("long", 1, timed(20 * HOUR), at=0.0), job("short", 2, timed(1 * HOUR), at=4 * HOUR)]
    now = 5 * HOUR
    # On the plain threshold the long job starves and goes first (and would hold the GPUs).
    assert [p.job_id for p in schedule(c, q, now, policy(0.0)).placements] == ["long"]
    # Measured against its 20 h it has waited 0.25 of its length: shortest first still applies.
    assert [p.job_id for p in schedule(c, q, now, policy(10.0)).placements] == ["short"]


def test_every_job_starves_in_the_end() -> None:
    # The same 20 h job once it has waited 10 x 20 h: it goes first and, when nothing fits,
    # holds the GPUs (it is the reservation holder) although shorter jobs wait.
    long = job("long", 1, timed(20 * HOUR), at=0.0)
    short = job("short", 2, timed(1 * HOUR), at=199 * HOUR)
    free = cluster(free_node("a", 8))
    assert [p.job_id for p in schedule(free, [long, short], 200 * HOUR, policy(10.0)).placements] == ["long"]
    assert [p.job_id for p in schedule(free, [long, short], 199.9 * HOUR, policy(10.0)).placements] == ["short"]
    busy = cluster(free_node("a", 4))  # 4 free: neither 8-GPU job fits now
    held = schedule(busy, [long, short], 200 * HOUR, policy(10.0))
    assert held.blocked_by == "long" and held.reservation is not None
    assert schedule(busy, [long, short], 199.9 * HOUR, policy(10.0)).reservation is None


def test_a_short_job_still_starves_after_starvation_s() -> None:
    # 10 x a 6 min job is an hour: the 4 h floor decides.
    info = plans_of(job("tiny", 1, timed(0.1 * HOUR), at=0.0))
    assert not starves(info, 3.9 * HOUR, policy(10.0))
    assert starves(info, 4 * HOUR, policy(10.0))


def test_a_job_without_runtimes_starves_on_the_plain_threshold() -> None:
    info = plans_of(job("untimed", 1, plan(dp=8), at=0.0))
    assert starves(info, 4 * HOUR, policy(10.0))
    assert not starves(info, 3.9 * HOUR, policy(10.0))


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_the_stretch_is_validated(bad: float) -> None:
    with pytest.raises(ValueError, match="starvation_stretch"):
        QueuePolicy(starvation_stretch=bad)
