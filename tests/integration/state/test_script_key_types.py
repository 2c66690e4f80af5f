"""A script that meets a key of the wrong type writes nothing (issue 37; lua/lib/check_types.lua).

Redis does not roll a script back: a WRONGTYPE part-way would leave the writes before it applied.
Each script that writes several keys checks every key it may write before its first write. Here
every such script is called the way the scheduler or the agent calls it, against state in which it
would write (a job placed, running, requeued, ...): the call is captured instead of sent. Then, one
key at a time -- each of its KEYS and the keys it derives from them (the queue's ``:users``, the
usage keys) -- that key is replaced by one of another type, every key under the test's prefix is
read (DUMP; a hash's or set's members), the captured call is sent, and it must fail (``place_jobs``: that job is not placed, naming
the key) with every DUMP unchanged. ``test_every_writing_script_is_covered`` keeps the list whole.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend
from frenzy.agent.logship import LogShipper
from frenzy.scheduler.leader import LeaderLease
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state import scripts
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.records import JobRecord
from support.placed import place
from support.state import add_node, make_plan, make_spec

# Scripts that write at most one key (nothing to leave half done) or only read.
SINGLE_OR_READ = {"read_hashes", "read_nodes", "renew_lease", "release_port", "set_draining",
                  "recount_queue_users"}  # (recount: DEL then HSET of one hash; DEL takes any type)


class Captured(BaseException):  # (not an Exception: no store code may catch it)
    """The script call the scenario made, stopped before it reached Redis."""

    def __init__(self, sha: str, numkeys: int, rest: tuple) -> None:
        super().__init__(sha)
        self.sha, self.keys, self.args = sha, list(rest[:numkeys]), list(rest[numkeys:])


@dataclass
class Ctx:
    loop: SchedulerLoop
    client: redis.Redis
    keys: Keys
    url: str
    tmp: Path
    armed: bool = True  # capture the target script's next call (False: let it run, the setup's own)

    @property
    def store(self):
        return self.loop.store

    def submit(self, name: str = "kt", **spec_fields: object) -> str:
        spec = make_spec(name)
        for k, v in spec_fields.items():
            setattr(spec, k, v)
        job_id, _ = self.store.submit(spec, [make_plan("A100-80GB")], "gpt2-124m", 1, max_attempts=5, user="ann")
        return job_id

    def running(self, gpus: list[int] | None = None) -> JobRecord:
        job_id = self.submit()
        ok, why = place(self.loop, job_id, [("a", gpus or [0])])
        assert ok, why
        job = self.store.get(job_id)
        assert job is not None
        self.loop.handle_event(AgentEvent(kind=EventKind.RUNNING, job_id=job_id, attempt=job.attempt, node="a",
                                          fence=job.fence, pid=100))
        job = self.store.get(job_id)
        assert job is not None and job.state == JobState.RUNNING
        return job

    def agent(self) -> Agent:
        agent = Agent(self.url, "b", FakeBackend("A100-80GB:2", "b"), keys=self.keys, log_dir=self.tmp / "logs",
                      use_spawner=False)
        agent._gpus = agent.backend.discover()  # noqa: SLF001
        return agent


def _finish_late(ctx: Ctx) -> None:
    first = ctx.running()
    assert ctx.store.requeue(first, ["a"], "node a lost", 5).done
    ok, why = place(ctx.loop, first.id, [("a", [1])])
    assert ok, why
    second = ctx.store.get(first.id)
    assert second is not None
    ctx.store.finish_from_earlier_attempt(second, first.attempt, first.fence, "a")


def _transition(ctx: Ctx) -> None:
    ctx.armed = False  # (RUNNING moves the job through transition_job too)
    job = ctx.running()
    ctx.armed = True
    ctx.store.transition(job, JobState.FAILED, "stopped", release=True)


def _release_stale(ctx: Ctx) -> None:
    job = ctx.running()
    ctx.client.hset(ctx.keys.job(job.id), "fence", "999")  # the reservation is no longer the job's live one
    ctx.store.release_stale(job.id, "a", job.fence)


def _declare_dead(ctx: Ctx) -> None:
    ctx.client.delete(ctx.keys.node_alive("a"))
    ctx.store.declare_dead("a", ctx.client.hget(ctx.keys.node("a"), "heartbeat_at"), time.time())


def _queued(ctx: Ctx, n: int) -> list[str]:
    ids = [ctx.submit(f"q{i}") for i in range(n)]
    ctx.store.queue()
    return ids


def _append_log(ctx: Ctx) -> None:
    path = ctx.tmp / "job.log"
    path.write_text("step 1\nstep 2\n")
    shipper = LogShipper(ctx.client, ctx.keys, "b")
    shipper.watch("job-x", 1, str(path), new_file=True)
    shipper.finish("job-x", 1)


def _heartbeat(ctx: Ctx) -> None:
    agent = ctx.agent()
    agent._register()  # noqa: SLF001 - (not the captured script: it runs)
    agent._heartbeat_once()  # noqa: SLF001


def _batch_outcome(ctx: Ctx) -> None:
    scripts.register(ctx.client, "record_batch_outcome")(
        keys=[ctx.keys.batch("b1"), ctx.keys.batches()],
        args=["0", '{"status": "submitted"}', "1", repr(time.time()), "b1", "3600"])


# script -> how the scheduler or the agent comes to call it (the call is captured, then replayed)
SCENARIOS: dict[str, Callable[[Ctx], object]] = {
    "submit_job": lambda c: c.submit(idempotency_key="once"),
    "place_jobs": lambda c: place(c.loop, c.submit(), [("a", [0])]),
    "transition_job": _transition,
    "requeue_job": lambda c: c.store.requeue(c.running(), ["a"], "node a lost", 5),
    "record_exit": lambda c: (job := c.running(), c.loop.handle_event(AgentEvent(
        kind=EventKind.EXITED, job_id=job.id, attempt=job.attempt, node="a", fence=job.fence, exit_code=0))),
    "release_stale": _release_stale,
    "declare_node_dead": _declare_dead,
    "finish_from_earlier_attempt": _finish_late,
    "mark_deadline_missed": lambda c: c.store.mark_deadline_missed(_queued(c, 2), time.time()),
    "set_pending_reasons": lambda c: c.store.set_pending_reasons({j: "waiting for GPUs" for j in _queued(c, 2)}),
    "request_cancel": lambda c: c.store.request_cancel(c.running(), "stop it", user=True),
    "acquire_lease": lambda c: LeaderLease(c.client, c.keys, holder="s1").hold(),
    "record_batch_outcome": _batch_outcome,
    "append_log": _append_log,
    "register_node": lambda c: c.agent()._register(),  # noqa: SLF001
    "heartbeat": _heartbeat,
}


def test_every_writing_script_is_covered() -> None:
    assert set(scripts.names()) - SINGLE_OR_READ == set(SCENARIOS)
    for name in SCENARIOS:  # each writes several keys through the check
        assert "--#include check_types" in scripts.template(name), name


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)  # bytes: DUMP / RESTORE
    yield client
    client.close()


def _dumps(raw: redis.Redis, prefix: str) -> dict[bytes, bytes]:
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{prefix}:*", count=1000))}


def _snapshot(raw: redis.Redis, prefix: str) -> dict[bytes, object]:
    """Every key under ``prefix``: its DUMP, whether it has a TTL -- but a hash's or a set's members
    sorted instead: a large one is a hash table, whose DUMP order changes as Redis rehashes it (in
    the background, or on a read), though nothing was written."""
    out: dict[bytes, object] = {}
    for k, dumped in _dumps(raw, prefix).items():
        kind = raw.type(k)
        if kind == b"hash":
            value: object = sorted(raw.hgetall(k).items())
        elif kind == b"set":
            value = sorted(raw.smembers(k))
        else:
            value = dumped
        out[k] = (kind, value, raw.pttl(k) > 0)
    return out


def _restore(raw: redis.Redis, prefix: str, dumps: dict[bytes, bytes]) -> None:
    extra = [k for k in raw.scan_iter(match=f"{prefix}:*", count=1000) if k not in dumps]
    if extra:
        raw.delete(*extra)
    for k, v in dumps.items():
        raw.restore(k, 0, v, replace=True)


def _plant(raw: redis.Redis, key: str) -> str:
    """Replace ``key`` with one of another type than it has (a set where it is missing). -> the type planted"""
    had = raw.type(key).decode()
    raw.delete(key)
    if had in ("none", "string"):
        raw.sadd(key, "planted")
        return "set"
    raw.set(key, "planted")
    return "string"


def _derived(name: str, keys: Keys) -> list[str]:
    """Keys the script derives from its KEYS and may write."""
    text = scripts.template(name)
    out = []
    if "--#include queue_users" in text:
        out.append(keys.queue_users())
    if "--#include usage_record" in text:
        out += [keys.usage_stream(), keys.usage_totals(), keys.usage_user("ann")]
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_wrong_typed_key_makes_the_script_write_nothing(name: str, redis_client: redis.Redis, raw: redis.Redis,
                                                          redis_url: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    keys = Keys(f"kt{uuid.uuid4().hex[:10]}")
    add_node(redis_client, keys, "a", "A100-80GB", 4)
    ctx = Ctx(SchedulerLoop(redis_client, keys, master_ports=(30000, 30100)), redis_client, keys, redis_url, tmp_path)
    target = scripts.sha1(name)
    real = redis.Redis.evalsha

    def capture(self: redis.Redis, sha: str, numkeys: int, *rest: object):
        if sha == target and ctx.armed:
            raise Captured(sha, numkeys, rest)
        return real(self, sha, numkeys, *rest)

    monkeypatch.setattr(redis.Redis, "evalsha", capture)
    with pytest.raises(Captured) as caught:
        SCENARIOS[name](ctx)
    monkeypatch.undo()
    call = caught.value
    raw.script_load(scripts.script_source(name))
    baseline = _dumps(raw, keys.prefix)
    planted_keys = list(dict.fromkeys([*call.keys, *_derived(name, keys)]))
    assert len(planted_keys) >= 2
    for key in planted_keys:
        _restore(raw, keys.prefix, baseline)
        kind = _plant(raw, key)
        before = _snapshot(raw, keys.prefix)
        try:
            reply = raw.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
        except redis.ResponseError as exc:
            assert "WRONGTYPE" in str(exc), f"{name}, {key} a {kind}: {exc}"
        else:
            # place_jobs refuses the one job (the batch goes on), every other script the whole call
            assert name == "place_jobs" and reply[0] == 0 and b"WRONGTYPE" in reply[1], (
                f"{name} ran with {key} a {kind}: {reply!r}")
        assert _snapshot(raw, keys.prefix) == before, f"{name} wrote something with {key} a {kind}"
    # and with every key as it was, the call does write (the scenario is one that changes state)
    _restore(raw, keys.prefix, baseline)
    untouched = _snapshot(raw, keys.prefix)
    raw.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
    assert _snapshot(raw, keys.prefix) != untouched, f"{name}'s captured call changes nothing: a weak scenario"
