"""issue 14 items 7, 8 and 10 (scheduler side): limits and clean errors on the gRPC surface.

Against real scheduler and predictor servers on loopback and a real Redis. Before this:
16 open WatchJob streams took every gRPC thread (health and ListNodes timed out); any user
could queue without limit and as fast as they liked; one job with a 3.9 MB name broke
ListJobs for everyone; a job id like ``JOB:history`` reached Redis and came back as a Redis
error; a huge seq_len came back as "Exception calling application: Value out of range";
an unreachable predictor's address reached the client. Each test here failed on that code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frenzy.auth.roles import Role
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.auth import with_token
from frenzy.rpc.limits import RateLimit
from frenzy.rpc.server import stop_server
from frenzy.scheduler.service import SchedulerServer, UserQuotas
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from support.servers import Servers, running_servers
from support.state import add_node, make_spec
from support.waiting import wait_for

MiB = 1024 * 1024


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "n0", "A100-80GB", 4)
    with running_servers(redis_url, prefix) as s:
        yield s


@contextmanager
def scheduler(redis_url: str, prefix: str, quotas: UserQuotas,
              predictor_addr: str | None = None) -> Iterator[SchedulerServer]:
    """A scheduler with its own quotas (and a real predictor unless one is named)."""
    pserver = None
    if predictor_addr is None:
        pserver, pport, phealth = serve_predictor("127.0.0.1:0")
        predictor_addr = f"127.0.0.1:{pport}"
    sched = SchedulerServer(redis_url, predictor_addr, "127.0.0.1:0", prefix=prefix, tick_s=0.05, quotas=quotas)
    try:
        yield sched
    finally:
        sched.stop()
        if pserver is not None:
            stop_server(pserver, phealth, grace_s=0.5)


def stub(sched: SchedulerServer, user: str, role: Role = Role.SUBMIT) -> scheduler_pb2_grpc.SchedulerStub:
    token, _ = sched.tokens.create(user, role)
    return scheduler_pb2_grpc.SchedulerStub(with_token(grpc.insecure_channel(f"127.0.0.1:{sched.port}"), token))


def submit(s: scheduler_pb2_grpc.SchedulerStub, name: str = "q", **recipe: int) -> types_pb2.Job:
    spec = make_spec(name)
    for k, v in recipe.items():
        setattr(spec.recipe, k, v)
    return s.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job


def refused(call, code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED) -> str:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as err:
        result = call()
        if not hasattr(result, "ListFields"):
            next(iter(result))
    assert err.value.code() == code, err.value.details()
    details = err.value.details()
    assert "Exception" not in details and "Traceback" not in details and ".py" not in details
    return details


# ---- item 7: streams never starve unary calls --------------------------------------------------


def test_streams_beyond_the_caps_are_refused_and_unary_calls_and_health_still_answer(servers: Servers) -> None:
    users = [f"watcher{i}" for i in range(5)]
    # each user on a connection of their own (channels in one process share one otherwise, and a
    # connection holds at most 8 streams: issue 34 item 5)
    own = [("grpc.use_local_subchannel_pool", 1)]
    stubs = {u: scheduler_pb2_grpc.SchedulerStub(with_token(grpc.insecure_channel(servers.scheduler_addr, options=own),
                                                            servers.scheduler.tokens.create(u, Role.SUBMIT)[0]))
             for u in users}
    jobs = {u: submit(stubs[u], u).id for u in users}
    streams = []
    try:
        # 4 per user is the per-user cap: a fifth from one user is refused, naming it.
        for _ in range(4):
            it = stubs[users[0]].WatchJob(scheduler_pb2.WatchJobRequest(job_id=jobs[users[0]]), timeout=30)
            next(it)
            streams.append(it)
        why = refused(lambda: stubs[users[0]].WatchJob(
            scheduler_pb2.WatchJobRequest(job_id=jobs[users[0]]), timeout=5))
        assert "per user" in why and "4" in why
        # 16 in all, 4 of them kept for admins (issue 34 item 5): users 1-2 fill the users' 12; user 4 is
        # refused by the total cap.
        for u in users[1:3]:
            for _ in range(4):
                it = stubs[u].WatchJob(scheduler_pb2.WatchJobRequest(job_id=jobs[u]), timeout=30)
                next(it)
                streams.append(it)
        why = refused(lambda: stubs[users[4]].WatchJob(scheduler_pb2.WatchJobRequest(job_id=jobs[users[4]]),
                                                       timeout=5))
        assert "12" in why and "--max-streams" in why and "kept for admins" in why
        refused(lambda: stubs[users[4]].StreamLogs(
            scheduler_pb2.StreamLogsRequest(job_id=jobs[users[4]], follow=True), timeout=5))

        # With the users' 12 streams open, everyone else is served at once.
        channel = grpc.insecure_channel(servers.scheduler_addr)
        try:
            for _ in range(5):
                t0 = time.monotonic()
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
                servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=2)
                servers.stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=2)
                stubs[users[4]].GetJob(scheduler_pb2.GetJobRequest(job_id=jobs[users[4]]), timeout=2)
                assert time.monotonic() - t0 < 2.0
        finally:
            channel.close()
    finally:
        for it in streams:
            it.cancel()
    # Closed streams give their slots back.
    def reopened() -> bool:
        try:
            it = stubs[users[4]].WatchJob(scheduler_pb2.WatchJobRequest(job_id=jobs[users[4]]), timeout=5)
            next(it)
            it.cancel()
            return True
        except grpc.RpcError:
            return False
    wait_for(reopened, timeout=5, what="a stream slot to come back")


# ---- item 8: quotas, rate, listings --------------------------------------------------------------


def _queued(sched: Any, user: str) -> int:
    """How many of ``user``'s jobs wait, as the per-user count admission control reads (lib/queue_users)."""
    store = sched.loop.store
    return int(store.r.hget(store.k.queue_users(), user) or 0)


def test_queued_jobs_per_user_are_capped(redis_url: str, prefix: str) -> None:
    with scheduler(redis_url, prefix, UserQuotas(max_queued=3)) as sched:  # no nodes: jobs stay PENDING
        alice, bob = stub(sched, "alice"), stub(sched, "bob")
        for i in range(3):
            submit(alice, f"a{i}")
        why = refused(lambda: submit(alice, "a3"))
        assert "3 queued jobs" in why and "--max-queued-per-user" in why and "alice" in why
        submit(bob, "b0")  # one user's quota is not another's
        jobs = alice.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs
        assert len(jobs) == 3


def test_a_burst_of_submissions_cannot_overrun_the_queued_quota(redis_url: str, prefix: str) -> None:
    """The count of a user's queued jobs is checked and raised in the write's own atomic step
    (submit_job.lua; no scan of the queue per submission): 12 submissions at once with a quota of
    5 admit 5."""
    with scheduler(redis_url, prefix, UserQuotas(max_queued=5)) as sched:
        alice = stub(sched, "alice")
        outcomes: list[str] = []

        def one(i: int) -> None:
            try:
                submit(alice, f"a{i}")
                outcomes.append("ok")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert outcomes.count("ok") == 5 and outcomes.count("RESOURCE_EXHAUSTED") == 7, outcomes
        time.sleep(0.3)  # several ticks later the loop's own count says the same
        why = refused(lambda: submit(alice, "late"))
        assert "5 queued jobs" in why


def test_two_schedulers_admitting_at_once_share_the_quota_exactly(redis_url: str, prefix: str) -> None:
    """Two scheduler processes on one Redis (a leader and a standby serving the API, or API
    replicas) admit against the same count: a burst split between them still queues 4 of 4."""
    with scheduler(redis_url, prefix, UserQuotas(max_queued=4)) as one, \
            scheduler(redis_url, prefix, UserQuotas(max_queued=4)) as two:
        token, _ = one.tokens.create("alice", Role.SUBMIT)
        stubs = [scheduler_pb2_grpc.SchedulerStub(with_token(grpc.insecure_channel(f"127.0.0.1:{s.port}"), token))
                 for s in (one, two)]
        outcomes: list[str] = []

        def go(i: int) -> None:
            try:
                submit(stubs[i % 2], f"a{i}")
                outcomes.append("ok")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert outcomes.count("ok") == 4 and outcomes.count("RESOURCE_EXHAUSTED") == 6, outcomes
        assert _queued(one, "alice") == 4


def test_the_queued_count_follows_the_queue_and_is_rebuilt_when_tampered(redis_url: str, prefix: str,
                                                                         redis_client: redis.Redis,
                                                                         keys: Keys) -> None:
    with scheduler(redis_url, prefix, UserQuotas(max_queued=2)) as sched:
        alice = stub(sched, "alice")
        a0, _a1 = submit(alice, "a0"), submit(alice, "a1")
        assert _queued(sched, "alice") == 2
        alice.CancelJob(scheduler_pb2.CancelJobRequest(job_id=a0.id), timeout=10)  # leaves the queue
        assert _queued(sched, "alice") == 1
        submit(alice, "a2")  # room again
        refused(lambda: submit(alice, "a3"))
        # A count lost or edited by hand (or written before counts existed) is rebuilt from the
        # queue by a leader taking over; here, by hand.
        redis_client.hset(keys.queue_users(), "alice", 0)
        redis_client.hset(keys.queue_users(), "mallory", 7)
        assert sched.loop.store.recount_queue_users() == 2
        assert redis_client.hgetall(keys.queue_users()) == {"alice": "2"}
        refused(lambda: submit(alice, "a4"))


def test_a_placed_job_no_longer_counts_as_queued(redis_url: str, prefix: str, redis_client: redis.Redis,
                                                keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 8)
    with scheduler(redis_url, prefix, UserQuotas(max_queued=1)) as sched:
        alice = stub(sched, "alice")
        first = submit(alice, "a0")
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(job_id=first.id), timeout=5).placement,
                 timeout=10, what="the first job placed")
        assert _queued(sched, "alice") == 0
        submit(alice, "a1")  # the quota is on waiting jobs, and none waits now


def test_gpus_held_per_user_are_capped(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 8)
    with scheduler(redis_url, prefix, UserQuotas(max_gpus=1)) as sched:
        alice = stub(sched, "alice")
        first = submit(alice, "a0", seq_len=512)
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(job_id=first.id), timeout=5).placement,
                 timeout=10, what="the first job to hold a GPU")
        # Held GPUs are counted at placement (issue 34 item 4, tests/security/test_tenant_quota.py): the
        # job is accepted and waits, its reason naming the quota.
        second = submit(alice, "a1", seq_len=512)

        def reason() -> str:
            return alice.GetJob(scheduler_pb2.GetJobRequest(job_id=second.id), timeout=5).pending_reason

        wait_for(lambda: "quota" in reason(), timeout=10, what="the second job waiting for the quota")
        assert "holds 1 GPUs" in reason() and "--max-gpus-per-user" in reason()
        assert not alice.GetJob(scheduler_pb2.GetJobRequest(job_id=second.id), timeout=5).placement


def test_submissions_per_user_are_rate_limited(redis_url: str, prefix: str) -> None:
    with scheduler(redis_url, prefix, UserQuotas(rate=RateLimit(per_s=0.5, burst=3))) as sched:
        alice, bob = stub(sched, "alice"), stub(sched, "bob")
        bad = scheduler_pb2.SubmitJobRequest(spec=types_pb2.JobSpec(name="no-model"))
        for _ in range(3):  # even refused submissions count: each costs the scheduler work
            refused(lambda: alice.SubmitJob(bad, timeout=10), grpc.StatusCode.INVALID_ARGUMENT)
        why = refused(lambda: alice.SubmitJob(bad, timeout=10))
        assert "rate limit" in why and "--submit-rate" in why
        refused(lambda: bob.SubmitJob(bad, timeout=10), grpc.StatusCode.INVALID_ARGUMENT)  # bob has his own


def test_a_huge_name_over_grpc_is_refused_naming_the_field(servers: Servers) -> None:
    spec = make_spec("x" * (int(3.9 * MiB)))
    why = refused(lambda: servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10),
                  grpc.StatusCode.INVALID_ARGUMENT)
    assert why.startswith("spec.name:") and "256" in why
    spec = make_spec("ok")
    spec.env["BIG"] = "v" * (100 * 1024)
    why = refused(lambda: servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10),
                  grpc.StatusCode.INVALID_ARGUMENT)
    assert why.startswith("spec.command:") and "64 KiB" in why


def test_listings_fit_one_message_whatever_the_records_hold(servers: Servers, redis_client: redis.Redis,
                                                           keys: Keys) -> None:
    # Records from before the field limits: two 3.9 MB names, an inline config and a big env.
    store = StateStore(redis_client, keys)
    big = make_spec("n" * int(3.9 * MiB))
    big.env["BIG"] = "v" * MiB
    for _ in range(2):
        store.submit(big, [], "gpt2-124m", 124_000_000, user="test-admin")
    servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("small")), timeout=10)
    resp = servers.stub.ListJobs(scheduler_pb2.ListJobsRequest(limit=100_000), timeout=10)
    assert resp.ByteSize() < 4 * MiB
    names = sorted(j.spec.name for j in resp.jobs)
    assert names[-1] == "small" and all(len(n) <= 256 for n in names) and len(names) == 3
    nodes = servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10)
    assert nodes.ByteSize() < 4 * MiB


# ---- item 10: ids, overflows, no internals -------------------------------------------------------

BAD_IDS = ["JOB:history", "../../../../x", "a b", "-leading-dash", "x" * 129, "job-1\n", "*"]


def test_every_rpc_taking_a_job_id_checks_it(servers: Servers) -> None:
    s = servers.stub
    for bad in BAD_IDS:
        for call in (lambda bad=bad: s.GetJob(scheduler_pb2.GetJobRequest(job_id=bad), timeout=10),
                     lambda bad=bad: s.CancelJob(scheduler_pb2.CancelJobRequest(job_id=bad), timeout=10),
                     lambda bad=bad: s.WatchJob(scheduler_pb2.WatchJobRequest(job_id=bad), timeout=10),
                     lambda bad=bad: s.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=bad), timeout=10)):
            why = refused(call, grpc.StatusCode.INVALID_ARGUMENT)
            assert why.startswith("job_id:") and "WRONGTYPE" not in why and "HGETALL" not in why


def test_overflowing_numbers_are_invalid_argument_naming_the_field(servers: Servers) -> None:
    for field, value in (("seq_len", 1 << 40), ("global_batch", 1 << 40), ("micro_batch", 1 << 40),
                         ("train_steps", 1 << 62), ("seq_len", -1)):
        spec = make_spec("big")
        setattr(spec.recipe, field, value)
        why = refused(lambda spec=spec: servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec),
                                                               timeout=10), grpc.StatusCode.INVALID_ARGUMENT)
        assert why.startswith(f"spec.recipe.{field}:"), why
        assert "out of range" in why
    # The predictor itself, called straight, answers the same way.
    with grpc.insecure_channel(servers.predictor_addr) as channel:
        predictor = predictor_pb2_grpc.PredictorStub(channel)
        for recipe in (types_pb2.TrainingRecipe(seq_len=1 << 40, global_batch=8),
                       types_pb2.TrainingRecipe(seq_len=512, global_batch=1 << 40)):
            why = refused(lambda recipe=recipe: predictor.Predict(predictor_pb2.PredictRequest(
                model=types_pb2.ModelSpec(catalog_name="qwen2.5-0.5b"), recipe=recipe,
                pools=[types_pb2.GpuPool(gpu_type="A100-80GB", total_gpus=4, gpus_per_node=4)]), timeout=10),
                grpc.StatusCode.INVALID_ARGUMENT)
            assert why.startswith("recipe.") and "Value out of range" not in why


def test_predictor_failures_reach_clients_without_their_detail(redis_url: str, prefix: str) -> None:
    with scheduler(redis_url, prefix, UserQuotas(), predictor_addr="127.0.0.1:1") as sched:
        why = refused(lambda: submit(stub(sched, "alice"), "p"), grpc.StatusCode.UNAVAILABLE)
        assert why == "predictor unavailable, try again"


def test_open_health_watches_are_capped_too_and_health_checks_still_answer(servers: Servers) -> None:
    # Health is open (no token): its Watch streams count as one "unauthenticated" user.
    channel = grpc.insecure_channel(servers.scheduler_addr)
    health = health_pb2_grpc.HealthStub(channel)
    watches = []
    try:
        for _ in range(4):
            it = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(it).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(it)
        why = refused(lambda: health.Watch(health_pb2.HealthCheckRequest(), timeout=5))
        assert "unauthenticated callers" in why
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == \
            health_pb2.HealthCheckResponse.SERVING
    finally:
        for it in watches:
            it.cancel()
        channel.close()
