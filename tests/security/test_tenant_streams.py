"""issue 34 item 5: streams between tenants -- an admin is never locked out, a connection cannot
take the cap, and a revoked token's streams end.

Measured before: 16 follow-streams from 4 anonymous health watches and 3 users filled the
scheduler's cap, and the admin's WatchJob (and the dashboard's logs) were refused; a revoked
token's open streams kept delivering for 31.5 s. Against real scheduler and predictor servers
and a real Redis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frenzy.auth.roles import Role
from frenzy.rpc.auth import with_token
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc
from support.servers import Servers, running_servers
from support.state import add_node, make_spec


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "n0", "A100-80GB", 4)
    with running_servers(redis_url, prefix) as s:
        yield s


OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # (channels in one process share one otherwise)


def _stub(servers: Servers, token: str, channels: list) -> scheduler_pb2_grpc.SchedulerStub:
    """A stub on a connection of its own, as another process's would be."""
    channel = grpc.insecure_channel(servers.scheduler_addr, options=OWN_CONNECTION)
    channels.append(channel)
    return scheduler_pb2_grpc.SchedulerStub(with_token(channel, token))


def _watch(stub, job_id: str) -> grpc.Future:  # noqa: ANN001
    it = stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id), timeout=60)
    next(it)  # open: its first update came
    return it


def test_an_admins_watch_works_while_users_and_anonymous_watches_hold_the_maximum(servers: Servers) -> None:
    streams = []
    health_channels: list = []
    try:
        # 4 anonymous health watches, as the reproducer opened
        for _ in range(4):
            channel = grpc.insecure_channel(servers.scheduler_addr, options=OWN_CONNECTION)
            health_channels.append(channel)
            it = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            next(it)
            streams.append(it)
        # users fill whatever the server lets them
        users = [f"u{i}" for i in range(4)]
        refused = None
        for u in users:
            stub = _stub(servers, servers.scheduler.tokens.create(u, Role.SUBMIT)[0], health_channels)
            job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec(u)), timeout=30).job.id
            for _ in range(4):
                try:
                    streams.append(_watch(stub, job_id))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
                    refused = exc.details()
                    break
            if refused:
                break
        assert refused is not None and "kept for admins" in refused, refused
        # the admin (and the dashboard, which reads logs as its user) still gets a stream
        job_id = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("admin")), timeout=30).job.id
        admin = _stub(servers, servers.token, health_channels)
        streams.append(_watch(admin, job_id))
        logs = admin.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id), timeout=10)
        assert list(logs) == []
    finally:
        for it in streams:
            it.cancel()
        for channel in health_channels:
            channel.close()


def test_one_connection_cannot_hold_more_than_its_share(servers: Servers) -> None:
    """Users sharing one connection (as the REST gateway's users do) hold at most 8 streams on it."""
    channel = grpc.insecure_channel(servers.scheduler_addr, options=OWN_CONNECTION)
    channels = [channel]
    shared = [scheduler_pb2_grpc.SchedulerStub(with_token(channel, servers.scheduler.tokens.create(f"p{i}",
                                                                                                  Role.SUBMIT)[0]))
              for i in range(3)]
    jobs = [s.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("p")), timeout=30).job.id for s in shared]
    streams = []
    why = None
    try:
        for s, j in zip(shared, jobs, strict=True):
            for _ in range(4):
                try:
                    streams.append(_watch(s, j))
                except grpc.RpcError as exc:
                    why = exc.details()
                    break
            if why:
                break
        assert why is not None and "per connection" in why, why
        assert len(streams) == 8
        # another connection is not held back by that one
        other = _stub(servers, servers.scheduler.tokens.create("q", Role.SUBMIT)[0], channels)
        job_id = other.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("q")), timeout=30).job.id
        streams.append(_watch(other, job_id))
    finally:
        for it in streams:
            it.cancel()
        for c in channels:
            c.close()


def test_a_revoked_tokens_stream_ends_within_5_s(servers: Servers) -> None:
    token, info = servers.scheduler.tokens.create("mallory", Role.SUBMIT)
    stub = servers.stub_for(token)
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("m")), timeout=30).job.id
    it = stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id), timeout=60)
    next(it)
    logs = stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=True), timeout=60)
    ended: dict[str, tuple[float, grpc.StatusCode | None]] = {}

    def drain(name: str, stream) -> None:  # noqa: ANN001
        code = None
        try:
            for _ in stream:
                pass
        except grpc.RpcError as exc:
            code = exc.code()
        ended[name] = (time.monotonic(), code)

    threads = [threading.Thread(target=drain, args=(n, s), daemon=True) for n, s in (("watch", it), ("logs", logs))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    # revoked by an operator elsewhere (another scheduler process's cache is not this one's)
    revoked_at = time.monotonic()
    redis_client = servers.scheduler.client
    redis_client.delete(servers.scheduler.keys.token(info.token_id))
    for t in threads:
        t.join(timeout=10)
    assert set(ended) == {"watch", "logs"}, "a revoked token's streams were still open after 10 s"
    for name, (at, code) in ended.items():
        assert at - revoked_at <= 5.0, (name, at - revoked_at)
        assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.CANCELLED), (name, code)
