"""The default policy's long-job stop, live against a real Redis: a running job whose spec says it
resumes from its checkpoint (``JobSpec.resumable``) and that has hours left is stopped once for a
burst of much shorter jobs that would otherwise wait for it; the shorter jobs start on its GPUs
once its agent reports the exit, and it runs again after them, never stopped a second time. A
job that is not resumable is never stopped (``QueuePolicy.preempt_long_gain``; the simulator's
``frenzy`` makes the same decision, tests/unit/has/test_has_stop_long.py).

Agents are played by writing their events, as in test_preemption.py."""

from __future__ import annotations

import time

import pytest
import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, command_from, payload
from frenzy.v1 import types_pb2
from has import QueuePolicy
from support.state import add_node, make_plan, make_spec

HOUR = 3600.0


def _plan(gpus: int, runtime_s: float) -> types_pb2.Plan:
    plan = make_plan("A100-80GB", dp=gpus)
    plan.completion_s = runtime_s
    return plan


def _spec(name: str, resumable: bool = False) -> types_pb2.JobSpec:
    spec = make_spec(name)
    spec.resumable = resumable
    return spec


def _owners(client: redis.Redis, keys: Keys) -> set[str]:
    return {client.hget(keys.gpu("a-0", i), "owner") or "" for i in range(8)}


def _long_then_burst(loop: SchedulerLoop, resumable: bool) -> tuple[str, list[str]]:
    """A 10-hour job on the node's 8 GPUs, then four 6-minute 2-GPU jobs."""
    store = loop.store
    long_id, _ = store.submit(_spec("long", resumable), [_plan(8, 10 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().placed == [long_id]
    shorts = [store.submit(_spec(f"short{i}"), [_plan(2, 0.1 * HOUR)], "gpt2-124m", 1)[0] for i in range(4)]
    return long_id, shorts


def test_the_default_policy_stops_a_resumable_long_job_for_a_burst_of_short_ones(
    redis_client: redis.Redis, keys: Keys,
) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, max_attempts=1)  # no retries: the stop must not use one up
    assert loop.policy == QueuePolicy.frenzy() and loop.policy.preempt_long_gain > 0
    store = loop.store
    long_id, shorts = _long_then_burst(loop, resumable=True)
    first = store.get(long_id)
    assert first is not None

    report = loop.tick()
    assert len(report.preempted) == 1 and report.preempted[0].startswith(f"{long_id} for ")
    assert report.placed == []  # its GPUs are still the victim's until its agent reports the exit
    stopped = store.get(long_id)
    assert stopped is not None
    assert (stopped.state, stopped.attempt, stopped.preemptions) == (JobState.PENDING, 2, 1)
    assert "resumes from its checkpoint" in stopped.pending_reason
    for job_id in shorts:  # every taker of its GPUs waits for the exit, none is placed on busy GPUs
        reason = store.get(job_id).pending_reason  # type: ignore[union-attr]
        assert reason.startswith(f"starting once {long_id} has stopped"), reason
    cancel = command_from(payload(redis_client.xrange(keys.launch_stream("a-0"))[-1][1]))
    assert (cancel.job_id, cancel.attempt) == (long_id, 1)
    assert _owners(redis_client, keys) == {long_id}
    assert loop.tick().preempted == []  # no second victim while the first one stops

    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=long_id, attempt=1, node="a-0", fence=first.fence,
                                 exit_code=-15, cancelled=True))
    assert sorted(loop.tick().placed) == sorted(shorts)  # all four on its 8 GPUs
    assert store.get(long_id).state == JobState.PENDING  # type: ignore[union-attr]

    for job_id in shorts:
        job = store.get(job_id)
        assert job is not None
        assert store.run_call(store.record_exit_call(job, job.attempt, "a-0", 0, "done")).status == "finished"
    assert loop.tick().placed == [long_id]
    rerun = store.get(long_id)
    assert rerun is not None and rerun.attempt == 2
    # stopped once, never again: a second burst waits for it
    assert [(r.job_id, r.stops) for r in store.cluster().weighed(loop.policy, rerun.reserved_at + 1)] == [
        (long_id, 1)]
    store.submit(_spec("late"), [_plan(2, 0.1 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().preempted == []


def test_a_long_job_that_is_not_resumable_is_never_stopped(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys)
    long_id, shorts = _long_then_burst(loop, resumable=False)
    store = loop.store
    assert store.cluster().weighed(loop.policy, store.get(long_id).reserved_at + 1) == []  # type: ignore[union-attr]
    report = loop.tick()
    assert report.preempted == [] and report.placed == []
    assert store.get(long_id).state == JobState.LAUNCHING  # type: ignore[union-attr]
    assert _owners(redis_client, keys) == {long_id}


def test_without_the_long_job_stop_a_resumable_job_keeps_its_gpus(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, policy=QueuePolicy.named("frenzy-nostop"))
    long_id, _ = _long_then_burst(loop, resumable=True)
    assert loop.tick().preempted == []
    assert loop.store.get(long_id).state == JobState.LAUNCHING  # type: ignore[union-attr]


def test_a_stopped_resumable_job_queues_again_with_what_it_has_left(redis_client: redis.Redis, keys: Keys) -> None:
    """It ran 4 of its 10 estimated hours when it was stopped: queued again, each of its plans
    counts 6 hours (shortest-first and the release estimates see the work left, as the simulator's
    steps left), and a second stop part-way credits the time it ran again."""
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys)
    store = loop.store
    long_id, _ = store.submit(_spec("long", True), [_plan(8, 10 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().placed == [long_id]
    started = float(redis_client.hget(keys.job(long_id), "reserved_at"))
    redis_client.hset(keys.job(long_id), "reserved_at", repr(started - 4 * HOUR))  # as if it ran 4 h
    assert loop.preempt(long_id, "someone-shorter", resumes=True)
    job = store.get(long_id)
    assert job is not None and job.done_fraction == pytest.approx(0.4, abs=1e-3)
    [queued] = [q for q in store.queue().jobs if q.job_id == long_id]
    assert queued.plans[0].runtime_s == pytest.approx(6 * HOUR, rel=1e-3)
    # a stop without a checkpoint (the short-window preemption) credits nothing more
    fence = int(redis_client.hget(keys.gpu("a-0", 0), "fence"))
    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=long_id, attempt=1, node="a-0", fence=fence,
                                 exit_code=-15, cancelled=True))
    assert loop.tick().placed == [long_id]
    est_end = float(redis_client.hget(keys.job(long_id), "est_end"))
    assert est_end == pytest.approx(time.time() + 6 * HOUR, abs=60)  # its GPUs free when the rest is done
    assert loop.preempt(long_id, "another")
    assert store.get(long_id).done_fraction == pytest.approx(0.4, abs=1e-3)  # type: ignore[union-attr]


def test_the_credit_is_capped_and_garbage_reads_as_none(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys)
    store = loop.store
    long_id, _ = store.submit(_spec("long", True), [_plan(8, HOUR)], "gpt2-124m", 1)
    loop.tick()
    redis_client.hset(keys.job(long_id), "reserved_at", repr(time.time() - 30 * HOUR))  # ran far over its estimate
    assert loop.preempt(long_id, "x", resumes=True)
    assert store.get(long_id).done_fraction == pytest.approx(0.9)  # type: ignore[union-attr]
    [queued] = [q for q in store.queue().jobs if q.job_id == long_id]
    assert queued.plans[0].runtime_s == pytest.approx(0.1 * HOUR)  # never "nothing left"
    redis_client.hset(keys.job(long_id), "done_fraction", "lots")
    assert store.get(long_id).done_fraction == 0.0  # type: ignore[union-attr]


def test_frenzy_restop_stops_a_resumed_job_again_after_an_hour_of_its_run(redis_client: redis.Redis,
                                                                          keys: Keys) -> None:
    """--policy frenzy-restop: the store reports how often a job was stopped (RunningJob.stops), so
    a resumed job that has run an hour since may be stopped again; the default never does."""
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, policy=QueuePolicy.named("frenzy-restop"))
    store = loop.store
    long_id, _ = store.submit(_spec("long", True), [_plan(8, 10 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().placed == [long_id]
    assert loop.preempt(long_id, "earlier-burst", resumes=True)
    fence = int(redis_client.hget(keys.gpu("a-0", 0), "fence"))
    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=long_id, attempt=1, node="a-0", fence=fence,
                                 exit_code=-15, cancelled=True))
    assert loop.tick().placed == [long_id]  # resumed (attempt 2), stopped once
    shorts = [store.submit(_spec(f"s{i}"), [_plan(2, 0.1 * HOUR)], "gpt2-124m", 1)[0] for i in range(4)]
    default = SchedulerLoop(redis_client, keys)  # once per job: never again
    assert default.tick().preempted == []
    assert loop.tick().preempted == []  # restop: it has not run an hour since it resumed
    resumed = float(redis_client.hget(keys.job(long_id), "reserved_at"))
    redis_client.hset(keys.job(long_id), "reserved_at", repr(resumed - 2 * HOUR))
    report = loop.tick()
    assert len(report.preempted) == 1 and report.preempted[0].startswith(f"{long_id} for ")
    job = store.get(long_id)
    assert job is not None and (job.attempt, job.preemptions) == (3, 2)
    assert all(store.get(j).state == JobState.PENDING for j in shorts)  # type: ignore[union-attr]


def test_a_pair_of_long_jobs_is_stopped_for_a_job_that_needs_both_their_gpus(redis_client: redis.Redis,
                                                                            keys: Keys) -> None:
    """Two resumable 10-hour jobs split the node's 8 GPUs; a 6-minute job needs all 8: the default
    stops both (preempt_long_pairs), and the short job says it waits for both exits."""
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys)
    store = loop.store
    longs = [store.submit(_spec(f"long{i}", True), [_plan(4, 10 * HOUR)], "gpt2-124m", 1)[0] for i in range(2)]
    assert sorted(loop.tick().placed) == sorted(longs)
    short, _ = store.submit(_spec("short"), [_plan(8, 0.1 * HOUR)], "gpt2-124m", 1)
    report = loop.tick()
    assert sorted(s.split(" for ")[0] for s in report.preempted) == sorted(longs) and report.placed == []
    reason = store.get(short).pending_reason  # type: ignore[union-attr]
    assert reason.startswith("starting once ") and all(j in reason for j in longs) and "have stopped" in reason
    for job_id in longs:
        job = store.get(job_id)
        assert job is not None and (job.state, job.preemptions) == (JobState.PENDING, 1)
