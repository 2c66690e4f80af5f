"""A job that ran is never run again (issue 14, D2): a late exit 0 of the attempt a requeue ended
finishes the job and stops the attempt that replaced it (``finish_from_earlier_attempt.lua``),
on the real test Redis.

The loop is stepped by hand (``reap``, ``tick``, ``drain_events``); agents are played by signed
events on the events stream, as a real agent sends them (tests/faults runs a real stack)."""

from __future__ import annotations

import time

import pytest
import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, command_from, payload
from frenzy.state.outcomes import LateCounted, LateStatus
from frenzy.state.records import JobRecord
from support.placed import place
from support.state import add_node, make_plan, make_spec, send_event


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    return SchedulerLoop(redis_client, keys, dead_after_s=5.0, max_attempts=3, orphan_release_s=60.0,
                         master_ports=(30000, 30010))


def _running(loop: SchedulerLoop, client: redis.Redis, keys: Keys, nodes: list[tuple[str, list[int]]]) -> JobRecord:
    """A job placed (place_jobs.lua) and reported RUNNING on ``nodes``."""
    store = loop.store
    n = sum(len(g) for _, g in nodes)
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=n)], "gpt2-124m", 1)
    ok, why = place(loop, job_id, nodes)
    assert ok, why
    job = store.get(job_id)
    for node, _ in nodes:
        _deliver(loop, client, keys, _ev(EventKind.RUNNING, job, node, pid=100))
    job = store.get(job_id)
    assert job.state == JobState.RUNNING
    return job


def _ev(kind: EventKind, job: JobRecord, node: str, **kw: object) -> AgentEvent:
    return AgentEvent(kind=kind, job_id=job.id, attempt=kw.pop("attempt", job.attempt), node=node,
                      fence=kw.pop("fence", job.fence), **kw)  # type: ignore[arg-type]


def _deliver(loop: SchedulerLoop, client: redis.Redis, keys: Keys, event: AgentEvent) -> None:
    """Send ``event`` signed by its node's agent and let the scheduler handle it."""
    send_event(client, keys, event)
    handled = 0
    for _ in range(3):  # the first read looks at this consumer's unacknowledged entries
        handled += loop.drain_events(block_ms=50)
        if handled:
            break
    refused = loop.metrics.registry.get_sample_value("frenzy_agent_events_total", {"outcome": "refused"})
    assert handled == 1 and not refused


def _kill(client: redis.Redis, keys: Keys, node: str) -> None:
    """The node's agent is cut off: its lease is gone, its last heartbeat a minute old."""
    client.delete(keys.node_alive(node))
    client.hset(keys.node(node), "heartbeat_at", repr(time.time() - 60))


def _owners(client: redis.Redis, keys: Keys, node: str, count: int) -> list[str]:
    return [client.hget(keys.gpu(node, i), "owner") for i in range(count)]


def _requeued(loop: SchedulerLoop, client: redis.Redis, keys: Keys, lost: str, job: JobRecord) -> JobRecord:
    _kill(client, keys, lost)
    assert loop.reap().requeued == [job.id]
    again = loop.store.get(job.id)
    assert again.state == JobState.PENDING and again.attempt == job.attempt + 1
    assert (again.previous_attempt, again.previous_fence) == (job.attempt, job.fence)
    return again


def test_a_late_exit_0_of_a_requeued_job_finishes_it_before_the_next_attempt_is_placed(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    job = _running(loop, redis_client, keys, [("a", [0])])
    again = _requeued(loop, redis_client, keys, "a", job)
    assert again.previous_nodes == ("a",)
    # a comes back; its copy of attempt 1 had run to the end.
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, job, "a", exit_code=0))
    done = loop.store.get(job.id)
    assert done.state == JobState.SUCCEEDED and done.attempt == 2
    assert done.history[-1]["reason"].startswith("attempt 1 succeeded late")
    assert redis_client.hget(keys.job(job.id), "succeeded_attempt") == "1"
    assert redis_client.zscore(keys.queue(), job.id) is None
    assert loop.tick().placed == []  # attempt 2 never starts
    assert _owners(redis_client, keys, "a", 1) == [""] and _owners(redis_client, keys, "b", 1) == [""]
    # a redelivered copy of the event changes nothing
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, job, "a", exit_code=0))
    assert len(loop.store.get(job.id).history) == len(done.history)


def test_a_late_exit_0_stops_the_attempt_running_elsewhere(loop: SchedulerLoop, redis_client: redis.Redis,
                                                           keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    job = _running(loop, redis_client, keys, [("a", [0])])
    _requeued(loop, redis_client, keys, "a", job)
    assert loop.tick().placed == [job.id]
    second = loop.store.get(job.id)
    assert second.placement == [("b", [0])]
    _deliver(loop, redis_client, keys, _ev(EventKind.RUNNING, second, "b", pid=200))
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, job, "a", exit_code=0))
    done = loop.store.get(job.id)
    assert done.state == JobState.SUCCEEDED
    # attempt 2 is told to stop, as a cancel; its GPU stays held under its fence until b reports the exit
    cancel = command_from(payload(redis_client.xrevrange(keys.launch_stream("b"), count=1)[0][1]))
    assert (cancel.kind, cancel.job_id, cancel.attempt) == ("cancel", job.id, 2)
    assert _owners(redis_client, keys, "b", 1) == [job.id]
    assert redis_client.hgetall(keys.ports("b")) == {}  # its rendezvous port is free
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, second, "b", exit_code=-15, cancelled=True))
    assert _owners(redis_client, keys, "b", 1) == [""]
    assert loop.store.get(job.id).state == JobState.SUCCEEDED


def test_late_exits_that_do_not_show_the_work_done_change_nothing(loop: SchedulerLoop, redis_client: redis.Redis,
                                                                  keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    add_node(redis_client, keys, "c", "A100-80GB", 1)
    job = _running(loop, redis_client, keys, [("a", [0])])
    _requeued(loop, redis_client, keys, "a", job)
    assert loop.tick().placed == [job.id]
    second = loop.store.get(job.id)
    _deliver(loop, redis_client, keys, _ev(EventKind.RUNNING, second, second.placement[0][0], pid=200))
    # attempt 2 is lost too: attempt 3 is queued
    third = _requeued(loop, redis_client, keys, second.placement[0][0], second)
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    # attempt 1, two steps back; attempt 2 with a wrong fence; attempt 2 stopped by its agent
    for event in (_ev(EventKind.EXITED, job, "a", exit_code=0),
                  _ev(EventKind.EXITED, second, second.placement[0][0], exit_code=0, fence=second.fence + 100),
                  _ev(EventKind.EXITED, second, second.placement[0][0], exit_code=0, cancelled=True),
                  _ev(EventKind.EXITED, second, second.placement[0][0], exit_code=1)):
        _deliver(loop, redis_client, keys, event)
        now = loop.store.get(job.id)
        assert (now.state, now.attempt) == (JobState.PENDING, 3), event
        assert redis_client.zscore(keys.queue(), job.id) is not None
        assert not any(k.startswith("prev_exit:") for k in redis_client.hkeys(keys.job(job.id)))
    assert len(loop.store.get(job.id).history) == len(third.history)
    # the script itself, asked directly: nothing for an attempt two back or a wrong fence
    assert loop.store.finish_from_earlier_attempt(third, 1, job.fence, "a").status == LateStatus.IGNORED
    assert loop.store.finish_from_earlier_attempt(third, 2, second.fence + 1,
                                                  second.placement[0][0]).status == LateStatus.IGNORED
    assert loop.store.finish_from_earlier_attempt(third, 2, second.fence, "a").status == LateStatus.IGNORED  # not its node


def test_the_script_retries_when_the_next_attempt_moved_on_since_it_was_read(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    job = _running(loop, redis_client, keys, [("a", [0])])
    queued = _requeued(loop, redis_client, keys, "a", job)
    assert loop.tick().placed == [job.id]  # placed after the caller read it queued
    assert loop.store.finish_from_earlier_attempt(queued, 1, job.fence, "a") == LateCounted(LateStatus.RETRY,
                                                                                            JobState.LAUNCHING)
    assert not redis_client.hexists(keys.job(job.id), "prev_exit:a")  # nothing written
    fresh = loop.store.get(job.id)
    assert loop.store.finish_from_earlier_attempt(fresh, 1, job.fence, "a") == LateCounted(LateStatus.FINISHED,
                                                                                           JobState.SUCCEEDED)


def test_a_multi_node_job_finishes_only_when_every_node_of_the_attempt_ended_with_0(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    for node in ("a", "b", "c"):
        add_node(redis_client, keys, node, "A100-80GB", 1)
    # b was told to stop by the requeue: its exit does not count, and a's alone is not enough
    job = _running(loop, redis_client, keys, [("a", [0]), ("b", [0])])
    again = _requeued(loop, redis_client, keys, "a", job)
    assert again.previous_nodes == ("a", "b")
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, job, "b", exit_code=-15, cancelled=True))
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, job, "a", exit_code=0))
    assert loop.store.get(job.id).state == JobState.PENDING
    assert redis_client.hget(keys.job(job.id), "prev_exit:a") == "0"

    # b had ended with 0 before a was declared dead: a's late 0 completes the attempt
    other = _running(loop, redis_client, keys, [("b", [0]), ("c", [0])])
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, other, "b", exit_code=0))
    assert loop.store.get(other.id).state == JobState.RUNNING
    _kill(redis_client, keys, "c")
    assert other.id in loop.reap().requeued
    assert redis_client.hget(keys.job(other.id), "prev_exit:b") == "0"
    add_node(redis_client, keys, "c", "A100-80GB", 1)
    _deliver(loop, redis_client, keys, _ev(EventKind.EXITED, other, "c", exit_code=0))
    done = loop.store.get(other.id)
    assert done.state == JobState.SUCCEEDED and "every node of it (b,c)" in done.history[-1]["reason"]
