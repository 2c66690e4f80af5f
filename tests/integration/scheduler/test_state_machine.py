"""One job state machine: every Lua script that writes a job's state, driven from every state
against a real Redis, moves a job only as ``job_states.ALLOWED`` lists.

Each script is called the way the store calls it, with everything but the job's state set up so
that it would act (free healthy GPUs, live leases, the right attempt and fence, a late success
complete): the state is the only thing left for its guard to decide on. A script whose guard lets
a move through that ``ALLOWED`` does not list either makes it (the test sees the state change) or
is stopped by ``set_state`` (the test sees its error): both fail here, naming the script and the
move. ``test_every_state_write_goes_through_set_state`` keeps the drivers complete: a script that
writes a state must be driven here, and none may write one around ``set_state``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import pytest
import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state import scripts
from frenzy.state.job_states import ALLOWED, JobState
from frenzy.state.keys import Keys
from frenzy.state.outcomes import Moved
from frenzy.state.records import JobRecord
from frenzy.state.store import PlacementOrder, StateStore
from support.state import add_node, make_plan, make_spec

Move = tuple[JobState, JobState]
# One driver call: (script, what else was set up, the state it started from, the state after it,
# or the error the script raised).
Seen = tuple[str, str, JobState, JobState | str]

NODE = "a"


def _loop(client: redis.Redis, keys: Keys) -> SchedulerLoop:
    """A scheduler of its own (own key prefix) on node a's 4 GPUs: each driver call starts clean."""
    keys = Keys(f"{keys.prefix}-{uuid.uuid4().hex[:6]}")
    add_node(client, keys, NODE, "A100-80GB", 4)
    return SchedulerLoop(client, keys, master_ports=(30000, 30100))


def _state(store: StateStore, job_id: str) -> JobState:
    return JobState(store.r.hget(store.k.job(job_id), "state"))


def _force(store: StateStore, job_id: str, state: JobState) -> JobRecord:
    """The job as if it had got to ``state`` (what the scripts are driven from)."""
    store.r.hset(store.k.job(job_id), "state", state.value)
    job = store.get(job_id)
    assert job is not None
    return job


def _placed_second_attempt(loop: SchedulerLoop) -> tuple[str, int]:
    """A job whose first attempt (on node a) a requeue ended, its second attempt placed on node a
    again: every field any script reads is there. -> (job id, the first attempt's fence)"""
    store = loop.store
    job_id, _ = store.submit(make_spec("sm"), [make_plan("A100-80GB")], "gpt2-124m", 1, max_attempts=5)
    assert loop.tick().placed == [job_id]
    first = store.get(job_id)
    assert first is not None
    assert store.requeue(first, [NODE], "node a lost", 5) == Moved(True, JobState.PENDING)
    assert loop.tick().placed == [job_id]
    return job_id, first.fence


def _call(script: str, variant: str, start: JobState, store: StateStore, job_id: str,
          run: Callable[..., object], *args: object, **kwargs: object) -> Seen:
    """``run(*args, **kwargs)`` (a store method calling ``script``), and what became of the job."""
    try:
        run(*args, **kwargs)
    except redis.ResponseError as exc:
        return script, variant, start, str(exc)
    return script, variant, start, _state(store, job_id)


Fresh = Callable[[], SchedulerLoop]


def _place_jobs(fresh: Fresh, start: JobState) -> list[Seen]:
    store = fresh().store
    job_id, _ = store.submit(make_spec("p"), [make_plan("A100-80GB")], "gpt2-124m", 1)
    _force(store, job_id, start)
    order = PlacementOrder(job_id=job_id, attempt=1, fence=store.fences.take(1)[0], nodes=((NODE, (0,)),), need_bytes=1,
                           port=30050, master_addr="127.0.0.1", gpu_type="A100-80GB", plan_json="{}",
                           messages=("launch",))
    return [_call("place_jobs", "free GPU, live node", start, store, job_id, store.place, [order])]


def _transition_job(fresh: Fresh, start: JobState) -> list[Seen]:
    """Asked for every move, from every state (the widest caller)."""
    out = []
    for target in JobState:
        loop = fresh()
        job_id, _ = _placed_second_attempt(loop)
        job = _force(loop.store, job_id, start)
        out.append(_call("transition_job", f"to {target.value}", start, loop.store, job_id,
                         loop.store.transition, job, target, "test", release=True,
                         from_states=list(JobState)))
    return out


def _record_exit(fresh: Fresh, start: JobState) -> list[Seen]:
    out = []
    for variant, code, cancel in (("exit 0", 0, False), ("exit 1", 1, False), ("cancelled", 137, True)):
        loop = fresh()
        job_id, _ = _placed_second_attempt(loop)
        if cancel:
            loop.store.r.hset(loop.store.k.job(job_id), "cancel_requested", "1")
        job = _force(loop.store, job_id, start)
        out.append(_call("record_exit", variant, start, loop.store, job_id,
                         loop.store.run_call, loop.store.record_exit_call(job, job.attempt, NODE, code, "exited",
                                                                          told_to_stop=cancel)))
    return out


def _requeue_job(fresh: Fresh, start: JobState) -> list[Seen]:
    out = []
    for variant, limit in (("below the limit", 10), ("at the limit", 2), ("preempted", 10)):
        loop = fresh()
        job_id, _ = _placed_second_attempt(loop)
        job = _force(loop.store, job_id, start)
        out.append(_call("requeue_job", variant, start, loop.store, job_id,
                         loop.store.requeue, job, [NODE], "lost", limit,
                         preempted=variant == "preempted"))
    return out


def _finish_from_earlier_attempt(fresh: Fresh, start: JobState) -> list[Seen]:
    loop = fresh()
    job_id, fence = _placed_second_attempt(loop)
    job = _force(loop.store, job_id, start)
    return [_call("finish_from_earlier_attempt", "every node of attempt 1 exited 0", start, loop.store, job_id,
                  loop.store.finish_from_earlier_attempt, job, 1, fence, NODE)]


# Every script that writes a job's state (but submit_job, which creates a PENDING job), and how to
# drive it from a given state.
DRIVERS: dict[str, Callable[[Fresh, JobState], list[Seen]]] = {
    "place_jobs": _place_jobs,
    "transition_job": _transition_job,
    "record_exit": _record_exit,
    "requeue_job": _requeue_job,
    "finish_from_earlier_attempt": _finish_from_earlier_attempt,
}


def _code(name: str) -> str:
    """A script's template without its comment lines (what Lua runs)."""
    return "\n".join(line for line in scripts.template(name).splitlines() if not line.lstrip().startswith("--"))


def test_every_state_write_goes_through_set_state() -> None:
    writers = {name for name in scripts.names() if re.search(r"\bset_state\(", _code(name))}
    assert writers == set(DRIVERS), "a script that writes a job's state needs a driver here (and one that no " \
                                    "longer does, none)"
    for name in scripts.names():
        for line in _code(name).splitlines():
            if '"state"' in line and name != "submit_job":
                # (a read: HGET / HMGET; a write goes through set_state, which checks ALLOWED)
                assert re.search(r'redis\.call\("(HGET|HMGET)"', line), f"{name}.lua: {line.strip()}"
    # submit_job creates the job: PENDING, the state every job starts in, and nothing else.
    creates = [line for line in _code("submit_job").splitlines() if '"state"' in line]
    assert len(creates) == 1 and '"state", JOB_STATE.pending' in creates[0]


@pytest.mark.parametrize("script", sorted(DRIVERS))
def test_every_move_a_script_makes_is_allowed(script: str, redis_client: redis.Redis, keys: Keys) -> None:
    seen: list[Seen] = []
    for start in JobState:
        seen += DRIVERS[script](lambda: _loop(redis_client, keys), start)
    refused = [s for s in seen if not isinstance(s[3], JobState)]
    assert refused == [], f"{script} tried moves the state machine refuses: {refused}"
    moves = {(start, end) for _, _, start, end in seen if isinstance(end, JobState) and end != start}
    outside = sorted((f"{a.value} -> {b.value}", [v for _, v, s, e in seen if (s, e) == (a, b)]) for a, b in moves
                     if b not in ALLOWED[a])
    assert outside == [], f"{script} makes moves outside job_states.ALLOWED: {outside}"
    assert moves, f"{script}'s driver moved no job: it tests nothing"


def _moves_of(script: str, client: redis.Redis, keys: Keys) -> set[Move]:
    return {(start, end) for first in JobState for _, _, start, end in DRIVERS[script](lambda: _loop(client, keys), first)
            if isinstance(end, JobState) and end != start}


def test_the_moves_each_script_makes(redis_client: redis.Redis, keys: Keys) -> None:
    """What the drivers see, spelled out: the moves the issue found outside the table are in it now,
    each for its reason (job_states.ALLOWED's comments)."""
    P, R, L, U, S, F, C = (JobState.PENDING, JobState.RESERVED, JobState.LAUNCHING, JobState.RUNNING,
                           JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    assert _moves_of("place_jobs", redis_client, keys) == {(P, L)}
    assert _moves_of("requeue_job", redis_client, keys) == {(s, t) for s in (R, L, U) for t in (P, F)}
    assert _moves_of("finish_from_earlier_attempt", redis_client, keys) == {(s, S) for s in (P, R, L, U)}
    assert _moves_of("record_exit", redis_client, keys) == {(s, t) for s in (R, L, U) for t in (S, F, C)}


def test_a_cancel_of_a_job_placed_since_it_was_read_goes_through_its_agents(redis_client: redis.Redis,
                                                                             keys: Keys) -> None:
    """The cancel moves the job only from the state it was read in: a job placed in between has
    launches out, so it is asked to stop on its nodes (and ends CANCELLED when they report), never
    marked CANCELLED while its processes start on GPUs nothing would free."""
    loop = _loop(redis_client, keys)
    job_id, _ = loop.store.submit(make_spec("c"), [make_plan("A100-80GB")], "gpt2-124m", 1)
    read = loop.store.get(job_id)
    assert read is not None and read.state == JobState.PENDING
    assert loop.tick().placed == [job_id]
    assert loop.cancel(read, "by the user") == Moved(True, JobState.LAUNCHING)
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.LAUNCHING and job.cancel_requested
