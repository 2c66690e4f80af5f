"""The live scheduler acts on HAS's preemptions against a real Redis: a long job that started
seconds before a much shorter one arrived is stopped (cancel on its node's launch stream) and
requeued — not counted against its attempts, marked so it is never preempted again — and the
short job is placed once the long one's agent reports the exit, never onto GPUs still in use.

Agents are played by writing their events, as in test_node_loss.py."""

from __future__ import annotations

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, command_from, payload
from frenzy.v1 import types_pb2
from has import QueuePolicy
from support.state import add_node, make_plan, make_spec

HOUR = 3600.0

# the default policy (the simulator's frenzy) does not preempt; frenzy-completion does
PREEMPTING = QueuePolicy.named("frenzy-completion")


def _plan(runtime_s: float) -> types_pb2.Plan:
    plan = make_plan("A100-80GB", dp=8)
    plan.completion_s = runtime_s
    return plan


def _owners(client: redis.Redis, keys: Keys) -> set[str]:
    return {client.hget(keys.gpu("a-0", i), "owner") or "" for i in range(8)}


def test_a_just_started_long_job_is_stopped_for_a_much_shorter_one(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, max_attempts=1, policy=PREEMPTING)  # no retries: preemption must not use one up
    store = loop.store
    long_id, _ = store.submit(make_spec("long"), [_plan(5 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().placed == [long_id]
    first = store.get(long_id)
    assert first is not None and first.state == JobState.LAUNCHING and first.reserved_at > 0
    snap = store.cluster()  # the jobs holding GPUs, as preemption may weigh them
    assert [(r.job_id, r.stops) for r in snap.weighed(PREEMPTING, first.reserved_at + 1)] == [(long_id, 0)]
    assert snap.weighed(PREEMPTING, first.submitted_at + 61) == []  # out of the window

    short_id, _ = store.submit(make_spec("short"), [_plan(0.1 * HOUR)], "gpt2-124m", 1)
    report = loop.tick()
    assert report.preempted == [f"{long_id} for {short_id}"] and report.placed == []
    stopped = store.get(long_id)
    assert stopped is not None
    assert (stopped.state, stopped.attempt, stopped.preemptions) == (JobState.PENDING, 2, 1)
    assert "preempted for " + short_id in stopped.pending_reason
    assert store.get(short_id).pending_reason.startswith(f"starting once {long_id} has stopped")  # type: ignore[union-attr]
    # its agent is told to stop; its GPUs stay held under the old fence until it has
    stream = redis_client.xrange(keys.launch_stream("a-0"))
    cancel = command_from(payload(stream[-1][1]))
    assert (cancel.job_id, cancel.attempt) == (long_id, 1)
    assert _owners(redis_client, keys) == {long_id}
    again = loop.tick()
    assert again.placed == [] and again.preempted == []  # nothing placed on busy GPUs, no second victim

    # The agent reports the old attempt's exit: the GPUs come back, the short job goes first.
    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=long_id, attempt=1, node="a-0", fence=first.fence,
                                 exit_code=-15, cancelled=True))
    assert _owners(redis_client, keys) == {""}
    assert loop.tick().placed == [short_id]
    assert store.get(long_id).state == JobState.PENDING  # type: ignore[union-attr]

    # The short job ends; the long one runs again and can no longer be preempted.
    short = store.get(short_id)
    assert short is not None
    assert store.run_call(store.record_exit_call(short, short.attempt, "a-0", 0, "done")).status == "finished"
    assert loop.tick().placed == [long_id]
    rerun = store.get(long_id)
    assert rerun is not None and rerun.attempt == 2
    assert [(r.job_id, r.stops) for r in store.cluster().weighed(PREEMPTING, rerun.reserved_at + 1)] == [(long_id, 1)]
    third, _ = store.submit(make_spec("short2"), [_plan(0.1 * HOUR)], "gpt2-124m", 1)
    report = loop.tick()
    assert report.preempted == [] and store.get(long_id).state == JobState.LAUNCHING  # type: ignore[union-attr]
    assert third not in report.placed


def test_a_node_loss_after_a_preemption_still_gets_its_retries(redis_client: redis.Redis, keys: Keys) -> None:
    """Preemptions are not the job's failures: a preempted job keeps its whole attempt budget."""
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, max_attempts=2, policy=PREEMPTING)
    store = loop.store
    long_id, _ = store.submit(make_spec("long"), [_plan(5 * HOUR)], "gpt2-124m", 1)
    loop.tick()
    assert loop.preempt(long_id, "someone-shorter")
    job = store.get(long_id)
    assert job is not None and (job.attempt, job.preemptions) == (2, 1)
    first_fence = int(redis_client.hget(keys.gpu("a-0", 0), "fence"))
    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=long_id, attempt=1, node="a-0", fence=first_fence,
                                 exit_code=-15, cancelled=True))
    assert loop.tick().placed == [long_id]
    # attempt 2 of a budget of 2 + 1 preemption: a lost node requeues it once more
    assert loop.requeue(store.get(long_id), ["a-0"], "node lost") == JobState.PENDING.value  # type: ignore[arg-type]
    # and a preemption of a job that is no longer running does nothing
    assert not loop.preempt(long_id, "someone-shorter")


def test_one_preemption_at_a_time_until_the_victims_gpus_are_back(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    add_node(redis_client, keys, "a-1", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, policy=PREEMPTING)
    store = loop.store
    longs = [store.submit(make_spec(f"long{i}"), [_plan(5 * HOUR)], "gpt2-124m", 1)[0] for i in range(2)]
    assert sorted(loop.tick().placed) == sorted(longs)
    for i in range(2):
        store.submit(make_spec(f"short{i}"), [_plan(0.1 * HOUR)], "gpt2-124m", 1)
    assert len(loop.tick().preempted) == 1
    assert loop.tick().preempted == []  # the first victim still holds its GPUs: no second one
    # a restarted scheduler knows it too (it is read from Redis, not kept in memory)
    assert store.cluster().stopping and SchedulerLoop(redis_client, keys, policy=PREEMPTING).tick().preempted == []
    victim = next(j for j in longs if store.get(j).state == JobState.PENDING)  # type: ignore[union-attr]
    held = [n for n in ("a-0", "a-1") if redis_client.hget(keys.gpu(n, 0), "owner") == victim][0]
    fence = int(redis_client.hget(keys.gpu(held, 0), "fence"))
    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=victim, attempt=1, node=held, fence=fence,
                                 exit_code=-15, cancelled=True))
    report = loop.tick()  # GPUs back: the first short job starts, and preemption is possible again
    assert len(report.placed) == 1 and store.cluster().stopping == frozenset()
    # (the other short job now waits 0.1 h for the first one instead: stopping the second long
    # job would cost more than that wait saves, so HAS leaves it running)
    assert report.preempted == []


def test_the_victim_is_read_from_this_ticks_owners_not_an_earlier_ticks(redis_client: redis.Redis,
                                                                        keys: Keys) -> None:
    """Two long jobs start on two ticks; then a short one arrives with no GPU free. The most
    recently started long job is the victim. (The service derives each tick's view from the
    last one; the GPUs-by-owner map read by preemption used to be carried over from the tick
    that first built it, where the second long job held nothing — so the older one was taken.)"""
    add_node(redis_client, keys, "a-0", "A100-80GB", 8)
    add_node(redis_client, keys, "b-0", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, max_attempts=1, policy=PREEMPTING)
    store = loop.store
    long1, _ = store.submit(make_spec("long1"), [_plan(5 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().placed == [long1]
    long2, _ = store.submit(make_spec("long2"), [_plan(5 * HOUR)], "gpt2-124m", 1)
    assert loop.tick().placed == [long2]  # this tick weighed preemption (long1 is a recent start)
    short, _ = store.submit(make_spec("short"), [_plan(0.1 * HOUR)], "gpt2-124m", 1)
    report = loop.tick()
    assert report.preempted == [f"{long2} for {short}"] and report.placed == []
