"""Several schedulers on one Redis: one leads (places, reaps), the others serve the API and stand by;
a standby takes over within seconds of the leader's death, and a leader that lost its lease while
it stalled can place nothing (fencing)."""

from __future__ import annotations

import time

import grpc
import pytest
import redis

from frenzy.auth.roles import Role
from frenzy.rpc.auth import with_token
from frenzy.scheduler.leader import LeaderLease
from frenzy.scheduler.service import SchedulerServer
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.store import PlacementOrder, StateStore
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc
from support.servers import running_servers
from support.state import GiB, add_node, make_plan, make_spec
from support.waiting import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_holder_at_a_time_and_a_new_epoch_on_takeover(redis_client: redis.Redis, keys: Keys) -> None:
    clock = Clock()
    a = LeaderLease(redis_client, keys, "a", ttl_s=0.5, clock=clock)
    b = LeaderLease(redis_client, keys, "b", ttl_s=0.5, clock=clock)
    assert a.hold() and not b.hold()
    first = a.epoch
    time.sleep(0.7)  # a stalls past its lease (no renewal): Redis lets it expire
    clock.now = 0.7
    assert b.hold() and b.epoch == first + 1
    assert not a.hold() and a.value == ""  # its renewal finds the lease gone; b's stands
    assert redis_client.get(keys.leader()) == b.value
    b.release()
    assert redis_client.get(keys.leader()) is None and a.hold()


def test_a_deposed_leader_places_nothing_and_declares_no_node_dead(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 1)
    old = StateStore(redis_client, keys)
    job_id, _ = old.submit(make_spec(), [make_plan("A100-80GB")], "gpt2-124m", 1)
    lease = LeaderLease(redis_client, keys, "old", ttl_s=5.0)
    assert lease.hold()
    old.lease = lease.value
    redis_client.delete(keys.leader())  # its lease expired while it stalled ...
    assert LeaderLease(redis_client, keys, "new", ttl_s=5.0).hold()  # ... and a standby took over
    (fence,) = old.fences.take(1)
    (result,) = old.place([PlacementOrder(job_id=job_id, attempt=1, fence=fence, nodes=(("n0", (0,)),),
                                          need_bytes=GiB, port=30001, master_addr="127.0.0.1",
                                          gpu_type="A100-80GB", plan_json="{}", messages=("{}",))])
    assert not result.placed and "not the leader" in result.why
    assert old.get(job_id).state == JobState.PENDING and redis_client.xlen(keys.launch_stream("n0")) == 0
    redis_client.delete(keys.node_alive("n0"))
    heartbeat = redis_client.hget(keys.node("n0"), "heartbeat_at")
    assert old.declare_dead("n0", heartbeat, time.time()) is False
    assert redis_client.hget(keys.node("n0"), "dead_at") is None


def _standby(redis_url: str, predictor_addr: str, prefix: str) -> SchedulerServer:
    return SchedulerServer(redis_url, predictor_addr, "127.0.0.1:0", prefix=prefix, tick_s=0.05, leader_ttl_s=1.0)


def test_a_standby_takes_over_within_seconds_of_the_leaders_death(redis_url: str, redis_client: redis.Redis,
                                                                  prefix: str, keys: Keys,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRENZY_LEADER_TTL_S", "1.0")
    add_node(redis_client, keys, "n0", "A100-80GB", 8)
    with running_servers(redis_url, prefix) as servers:
        leader = servers.scheduler
        wait_for(lambda: leader.loop.leading.is_set(), 5, "the first scheduler to lead")
        standby = _standby(redis_url, servers.predictor_addr, prefix)
        try:
            time.sleep(0.5)
            assert not standby.loop.leading.is_set()
            # A job submitted to the standby's API is placed by the leader, woken through Redis.
            token, _ = standby.tokens.create("standby-user", Role.ADMIN)
            with grpc.insecure_channel(f"127.0.0.1:{standby.port}") as raw:
                stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, token))
                spec = make_spec("via-standby")
                first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
                store = StateStore(redis_client, keys)
                wait_for(lambda: store.get(first).state == JobState.LAUNCHING, 5, "the leader to place it")
                assert standby.loop.metrics.placements._value.get() == 0  # noqa: SLF001 (the counter)

                # The leader dies: its loop stops without giving the lease back (a kill -9 would).
                monkeypatch.setattr(leader.lease, "release", lambda: None)
                leader.stop_event.set()
                leader.loop.wake.set()
                leader.thread.join(timeout=5)
                died = time.monotonic()
                wait_for(lambda: standby.loop.leading.is_set(), 5, "the standby to take over")
                took = time.monotonic() - died
                assert took <= 2.5, f"takeover took {took:.1f} s with a 1 s lease"
                second = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("after")), timeout=30).job.id
                wait_for(lambda: store.get(second).state == JobState.LAUNCHING, 5, "the new leader to place it")
                assert standby.lease.epoch == int(redis_client.get(keys.leader_epoch()))
        finally:
            standby.stop()


def test_an_api_process_and_a_loop_process_split_the_work(redis_url: str, redis_client: redis.Redis, prefix: str,
                                                          keys: Keys) -> None:
    """`frenzy scheduler --serve api` and `--serve loop` on one Redis: the API process takes the
    submission and never leads; the loop process places it (woken through Redis) and serves no
    Scheduler call, only health."""
    from frenzy.predictor.server import serve as serve_predictor
    from frenzy.rpc.client import wait_healthy
    from frenzy.rpc.server import stop_server

    add_node(redis_client, keys, "n0", "A100-80GB", 8)
    pserver, pport, phealth = serve_predictor("127.0.0.1:0")
    loop = api = None
    try:
        loop = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix, tick_s=5.0,
                               leader_ttl_s=1.0, serve="loop")
        api = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix, tick_s=0.05,
                              leader_ttl_s=1.0, serve="api")
        wait_for(lambda: loop.loop.leading.is_set(), 5, "the loop process to lead")
        assert wait_healthy(f"127.0.0.1:{loop.port}", timeout_s=5)
        token, _ = api.tokens.create("alice", Role.SUBMIT)
        with grpc.insecure_channel(f"127.0.0.1:{api.port}") as raw:
            stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, token))
            started = time.monotonic()
            job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("split")), timeout=30).job.id
            store = StateStore(redis_client, keys)
            # (the loop's own tick is 5 s: a placement well before it is the API's wake token)
            wait_for(lambda: store.get(job).state == JobState.LAUNCHING, 4, "the loop process to place it")
            assert time.monotonic() - started < 4.0
        assert not api.loop.leading.is_set() and not api.thread.is_alive()
        assert api.loop.metrics.placements._value.get() == 0  # noqa: SLF001 (the counter)
        with grpc.insecure_channel(f"127.0.0.1:{loop.port}") as raw:
            with pytest.raises(grpc.RpcError) as err:
                scheduler_pb2_grpc.SchedulerStub(with_token(raw, token)).ListJobs(
                    scheduler_pb2.ListJobsRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        for s in (api, loop):
            if s is not None:
                s.stop()
        stop_server(pserver, phealth, grace_s=0.5)


def test_an_unknown_serve_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="serve: one of all, api, loop"):
        SchedulerServer("redis://127.0.0.1:1/0", "127.0.0.1:1", "127.0.0.1:0", serve="both")


def test_a_new_submission_wakes_the_leader_in_its_own_script_and_a_duplicate_does_not(
        redis_client: redis.Redis, keys: Keys) -> None:
    # The token the leader's loop waits on (StateStore.wait_wake) comes with the job's write:
    # an API process that does not lead needs no round trip of its own to wake the one that does.
    store = StateStore(redis_client, keys)
    assert not store.wait_wake(0.01)
    spec = make_spec("woken")
    spec.idempotency_key = "once"
    first, duplicate = store.submit(spec, [], "m", 1)
    assert not duplicate and store.wait_wake(0.01)
    assert not store.wait_wake(0.01)  # one token, taken
    again, duplicate = store.submit(spec, [], "m", 1)
    assert duplicate and again == first and not store.wait_wake(0.01)
    for i in range(5):
        store.submit(make_spec(f"many-{i}"), [], "m", 1)
    assert redis_client.llen(keys.wake()) == 1  # a burst leaves one token, not five
