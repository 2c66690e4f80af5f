"""The scheduler's side of real launches against a real Redis: rendezvous ports, the first rank failure,
node death (declare, requeue re-planned, retry limit), stale-attempt releases, leak sweeps and drains.

The loop is stepped by hand (``reap``, ``handle_event``); agents are played by writing their events,
exactly the messages a real agent sends (tests/e2e runs real agents)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from frenzy.agent.drain import drain
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, command_from, payload
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2
from support.placed import place
from support.state import GiB, add_node, make_plan, make_spec, set_gpu


def _running(loop: SchedulerLoop, nodes: list[tuple[str, list[int]]], max_attempts: int = 0) -> JobRecord:
    """A job placed (place_jobs.lua) and reported RUNNING on ``nodes``."""
    store = loop.store
    n = sum(len(g) for _, g in nodes)
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=n)], "gpt2-124m", 1, max_attempts=max_attempts)
    ok, why = place(loop, job_id, nodes)
    assert ok, why
    job = store.get(job_id)
    for node, _ in nodes:
        loop.handle_event(_ev(EventKind.RUNNING, job, node, pid=100))
    job = store.get(job_id)
    assert job.state == JobState.RUNNING
    return job


def _ev(kind: EventKind, job: JobRecord, node: str, **kw: object) -> AgentEvent:
    return AgentEvent(kind=kind, job_id=job.id, attempt=kw.pop("attempt", job.attempt), node=node,
                      fence=kw.pop("fence", job.fence), **kw)  # type: ignore[arg-type]


def _owners(client: redis.Redis, keys: Keys, node: str, count: int) -> list[str]:
    return [client.hget(keys.gpu(node, i), "owner") for i in range(count)]


def _kill(client: redis.Redis, keys: Keys, node: str, seconds_ago: float) -> None:
    """The node's agent died ``seconds_ago``: its lease is gone and its last heartbeat is that old."""
    client.delete(keys.node_alive(node))
    client.hset(keys.node(node), "heartbeat_at", repr(time.time() - seconds_ago))


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    return SchedulerLoop(redis_client, keys, dead_after_s=5.0, max_attempts=3, orphan_release_s=60.0,
                         master_ports=(30000, 30003))


# ---------------------------------------------------------------- rendezvous ports

def test_jobs_on_one_master_node_get_distinct_ports_and_free_them(loop: SchedulerLoop, redis_client: redis.Redis,
                                                                  keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 5)
    jobs = [_running(loop, [("a", [i])]) for i in range(4)]
    ports = [j.master_port for j in jobs]
    assert sorted(ports) == [30000, 30001, 30002, 30003]  # the whole range, no port twice
    assert all(j.master_addr == "127.0.0.1" and j.master_node == "a" for j in jobs)
    launch = command_from(payload(redis_client.xrange(keys.launch_stream("a"))[0][1]))
    assert (launch.master_port, launch.rdzv_id) == (jobs[0].master_port, f"{jobs[0].id}-1")
    # A fifth job finds the range exhausted: refused with the numbers, nothing written.
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    extra, _ = loop.store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    ok, why = place(loop, extra, [("a", [4])])
    assert not ok and why == "no free rendezvous port on a: all 4 ports from 30000 are in use"
    assert _owners(redis_client, keys, "a", 5)[4] == "" and loop.store.get(extra).state == JobState.PENDING
    ok, why = place(loop, extra, [("b", [0])])
    assert ok, why  # another master node has its own ports
    # Ending a job (exit) and requeueing one each free the port.
    loop.handle_event(_ev(EventKind.EXITED, jobs[0], "a", exit_code=0))
    assert loop.store.get(jobs[0].id).state == JobState.SUCCEEDED
    assert str(jobs[0].master_port) not in redis_client.hgetall(keys.ports("a"))
    _kill(redis_client, keys, "a", seconds_ago=60)
    report = loop.reap()
    assert sorted(report.requeued) == sorted(j.id for j in jobs[1:])
    assert redis_client.hgetall(keys.ports("a")) == {}


def test_a_draining_node_is_refused_even_when_the_view_was_stale(loop: SchedulerLoop, redis_client: redis.Redis,
                                                                 redis_url: str, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    job_id, _ = loop.store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    # (the operator's frenzy agent --drain: 4 for a node that never registered)
    assert drain(redis_url, keys, "a", wait=False, say=lambda _: None) == 0
    assert drain(redis_url, keys, "ghost", wait=False, say=lambda _: None) == 4
    assert not redis_client.exists(keys.node("ghost"))
    ok, why = place(loop, job_id, [("a", [0])])
    assert not ok and "draining" in why and _owners(redis_client, keys, "a", 1) == [""]
    assert redis_client.xlen(keys.launch_stream("a")) == 0
    assert drain(redis_url, keys, "a", undrain=True, say=lambda _: None) == 0
    assert place(loop, job_id, [("a", [0])])[0]


# ---------------------------------------------------------------- rank failure

def test_the_first_real_failure_is_kept_with_node_rank_and_code(loop: SchedulerLoop, redis_client: redis.Redis,
                                                                keys: Keys) -> None:
    for n in ("a", "b", "c"):
        add_node(redis_client, keys, n, "A100-80GB", 1)
    job = _running(loop, [("a", [0]), ("b", [0]), ("c", [0])])
    loop.handle_event(_ev(EventKind.EXITED, job, "b", exit_code=3))
    # The others are told to stop (a cancel on their streams) and exit by signal: not the failure.
    for node in ("a", "c"):
        assert command_from(payload(redis_client.xrevrange(keys.launch_stream(node), count=1)[0][1])).kind == "cancel"
    loop.handle_event(_ev(EventKind.EXITED, job, "c", exit_code=-15, cancelled=True))
    loop.handle_event(_ev(EventKind.EXITED, job, "a", exit_code=-9, cancelled=True))
    done = loop.store.get(job.id)
    assert done.state == JobState.FAILED
    assert (done.failed_node, done.failed_rank, done.failed_exit_code) == ("b", 1, 3)
    assert done.history[-1]["reason"] == "node b (node rank 1) failed with exit code 3"
    proto = done.to_proto()
    assert (proto.failed_node, proto.failed_node_rank, proto.failed_exit_code) == ("b", 1, 3)
    assert done.pids == {} and redis_client.hgetall(keys.ports("a")) == {}
    assert [_owners(redis_client, keys, n, 1) for n in ("a", "b", "c")] == [[""], [""], [""]]


# ---------------------------------------------------------------- node death

def test_a_dead_node_is_declared_and_its_job_requeued_replanned_and_stopped_elsewhere(
        redis_client: redis.Redis, keys: Keys) -> None:
    asked: list[str] = []

    def replan(job: JobRecord) -> list[types_pb2.Plan]:
        asked.append(job.id)
        return [make_plan("A100-80GB", dp=1, peak=7 * GiB)]

    loop = SchedulerLoop(redis_client, keys, dead_after_s=5.0, replan=replan, master_ports=(30000, 30010))
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    add_node(redis_client, keys, "b", "A100-80GB", 2)
    job = _running(loop, [("a", [0, 1]), ("b", [0, 1])])
    _kill(redis_client, keys, "a", seconds_ago=3)
    assert loop.reap().declared_dead == []  # lease gone, but not for long enough yet
    assert loop.store.get(job.id).state == JobState.RUNNING
    _kill(redis_client, keys, "a", seconds_ago=6)
    report = loop.reap()
    assert report.declared_dead == ["a"] and report.requeued == [job.id]
    assert float(redis_client.hget(keys.node("a"), "dead_at")) > 0
    again = loop.store.get(job.id)
    assert again.state == JobState.PENDING and again.attempt == 2
    assert again.placement == [] and again.fence == 0 and again.exit_codes == {} and again.pids == {}
    assert redis_client.zscore(keys.queue(), job.id) == again.seq  # back at its old queue position
    assert asked == [job.id] and [p.peak_bytes_per_gpu for p in again.plans] == [7 * GiB]  # re-planned
    assert again.history[-1]["reason"].startswith("requeued for attempt 2 of 3: node a is dead")
    # Both nodes were told to stop attempt 1 (a's agent reads it if it ever comes back).
    for node in ("a", "b"):
        cancel = command_from(payload(redis_client.xrevrange(keys.launch_stream(node), count=1)[0][1]))
        assert (cancel.kind, cancel.job_id, cancel.attempt) == ("cancel", job.id, 1)
    # The dead node's GPUs are free; b's stay held under the old fence until b reports the exit.
    assert _owners(redis_client, keys, "a", 2) == ["", ""]
    assert _owners(redis_client, keys, "b", 2) == [job.id, job.id]
    assert loop.reap().requeued == []  # repeated reaping changes nothing
    loop.handle_event(_ev(EventKind.EXITED, job, "b", exit_code=-15, cancelled=True))
    assert _owners(redis_client, keys, "b", 2) == ["", ""]
    assert loop.store.get(job.id).state == JobState.PENDING  # a stale exit does not touch the new attempt
    # The next tick places attempt 2 on what is left (b), with a new fence.
    assert loop.tick().placed == [job.id]
    third = loop.store.get(job.id)
    assert third.state == JobState.LAUNCHING and third.placement[0][0] == "b" and third.fence > job.fence


def test_a_late_event_of_the_old_attempt_never_frees_the_new_reservation(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    job = _running(loop, [("a", [0])])
    _kill(redis_client, keys, "a", seconds_ago=60)
    loop.reap()
    assert loop.tick().placed == [job.id]
    new = loop.store.get(job.id)
    assert new.placement == [("b", [0])]
    # a comes back and reports attempt 1's end; b's GPU (attempt 2) must stay held.
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    loop.handle_event(_ev(EventKind.EXITED, job, "a", exit_code=-15, cancelled=True))
    loop.handle_event(_ev(EventKind.EXITED, job, "b", exit_code=0))  # attempt 1 never ran on b: stale
    assert _owners(redis_client, keys, "b", 1) == [job.id]
    assert loop.store.get(job.id).state == JobState.LAUNCHING


def test_the_retry_limit_fails_the_job_naming_the_lost_node(loop: SchedulerLoop, redis_client: redis.Redis,
                                                            keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    job = _running(loop, [("a", [0]), ("b", [0])], max_attempts=1)
    _kill(redis_client, keys, "b", seconds_ago=60)
    report = loop.reap()
    assert report.failed == [job.id] and report.requeued == []
    done = loop.store.get(job.id)
    assert done.state == JobState.FAILED and done.failed_node == "b" and done.attempt == 1
    assert "node b is dead" in done.history[-1]["reason"] and "no retries left" in done.history[-1]["reason"]
    assert redis_client.zscore(keys.queue(), job.id) is None
    assert _owners(redis_client, keys, "a", 1) == [job.id]  # a is still stopping its rank
    loop.handle_event(_ev(EventKind.EXITED, job, "a", exit_code=-15, cancelled=True))
    assert _owners(redis_client, keys, "a", 1) == [""] and _owners(redis_client, keys, "b", 1) == [""]


def test_a_node_that_comes_back_in_time_is_not_declared_dead(loop: SchedulerLoop, redis_client: redis.Redis,
                                                             keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    job = _running(loop, [("a", [0])])
    _kill(redis_client, keys, "a", seconds_ago=60)
    beat = redis_client.hget(keys.node("a"), "heartbeat_at")
    redis_client.hset(keys.node("a"), "heartbeat_at", repr(time.time()))  # it heartbeated meanwhile
    assert not loop.store.declare_dead("a", beat, time.time())
    assert not redis_client.hexists(keys.node("a"), "dead_at")
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    assert loop.reap().declared_dead == [] and loop.store.get(job.id).state == JobState.RUNNING


def test_a_retryable_launch_failure_requeues(loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    add_node(redis_client, keys, "b", "A100-80GB", 1)
    job = _running(loop, [("a", [0]), ("b", [0])])
    # (b runs its rank; a never started its own: a refusal from a node that reported RUNNING is a
    # late or replayed copy and ignored, agent_events)
    loop.store.r.hdel(loop.store.k.job(job.id), "pid:a")
    job = loop.store.get(job.id)
    loop.handle_event(_ev(EventKind.LAUNCH_FAILED, job, "a", retryable=True,
                          message="rendezvous port 30000 on node a is in use"))
    again = loop.store.get(job.id)
    assert again.state == JobState.PENDING and again.attempt == 2
    assert "launch failed on a: rendezvous port" in again.history[-1]["reason"]
    assert _owners(redis_client, keys, "a", 1) == [""] and _owners(redis_client, keys, "b", 1) == [job.id]


def test_a_launch_failure_from_a_node_already_running_the_attempt_is_ignored(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    job = _running(loop, [("a", [0])])
    loop.handle_event(_ev(EventKind.LAUNCH_FAILED, job, "a", retryable=True, message="replayed"))
    again = loop.store.get(job.id)
    assert again.state == JobState.RUNNING and again.attempt == 1


# ---------------------------------------------------------------- leak sweeps

def test_gpus_and_ports_of_ended_reservations_are_freed_after_the_grace(redis_client: redis.Redis,
                                                                        keys: Keys) -> None:
    loop = SchedulerLoop(redis_client, keys, orphan_release_s=0.3, master_ports=(30000, 30010))
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    job = _running(loop, [("a", [0])])
    live = _running(loop, [("a", [1])])
    # A bug or a lost agent left job's GPU and port held although the job ended.
    loop.store.transition(job, JobState.FAILED, "test")
    assert loop.reap().released == 0  # not before the grace
    time.sleep(0.35)
    report = loop.reap()
    assert report.released == 2
    assert _owners(redis_client, keys, "a", 2) == ["", live.id]
    assert redis_client.hgetall(keys.ports("a")) == {str(live.master_port): live.id}


def test_reaping_with_garbage_in_redis_changes_nothing(loop: SchedulerLoop, redis_client: redis.Redis,
                                                       keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    job = _running(loop, [("a", [0])])
    redis_client.hset(keys.ports("a"), "31999", "job-that-never-was")
    redis_client.sadd(keys.nodes(), "half")  # a name without a node record
    report = loop.reap()
    assert report.declared_dead == [] and report.requeued == []
    assert loop.store.get(job.id).state == JobState.RUNNING and _owners(redis_client, keys, "a", 1) == [job.id]
    assert json.loads(redis_client.lindex(keys.job_history(job.id), -1))["state"] == "RUNNING"


def test_a_requeued_job_is_replanned_by_the_predictor_for_the_remaining_cluster(
        redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> None:
    from frenzy.v1 import scheduler_pb2
    from support.servers import running_servers

    add_node(redis_client, keys, "big", "A100-80GB", 1)
    add_node(redis_client, keys, "small", "L4", 1, memory=23 * GiB)
    set_gpu(redis_client, keys, "small", 0, owner="someone-else")  # keep the first attempt on "big"
    with running_servers(redis_url, prefix) as servers:
        spec = make_spec("replan")
        spec.recipe.seq_len, spec.recipe.global_batch = 512, 8
        job = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        # (a plan over both types, "A100-80GB+L4", may rank among them: issue 33's mixed plans)
        assert {t for p in job.candidate_plans for t in p.gpu_type.split("+")} == {"A100-80GB", "L4"}
        assert {p.gpu_type for p in job.candidate_plans if "+" not in p.gpu_type} == {"A100-80GB", "L4"}
        deadline = time.monotonic() + 10
        while servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.id)).state != types_pb2.JOB_STATE_LAUNCHING:
            assert time.monotonic() < deadline, "first attempt not placed"
            time.sleep(0.05)
        set_gpu(redis_client, keys, "small", 0, owner="")
        _kill(redis_client, keys, "big", seconds_ago=120)
        servers.scheduler.loop.reap()
        while (again := servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.id))).attempt != 2:
            assert time.monotonic() < deadline + 10, "not requeued"
            time.sleep(0.05)
        # The predictor was asked again, for the cluster that is left: only L4 plans now.
        assert {p.gpu_type for p in again.candidate_plans} == {"L4"}
        assert any("requeued for attempt 2" in h.reason for h in again.history)
