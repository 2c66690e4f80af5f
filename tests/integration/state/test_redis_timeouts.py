"""Behind a Redis that stops answering (a silent partition: the process SIGSTOPped, its socket open), a
call of the scheduler's or an agent's client fails within its timeout instead of hanging (issue 37,
frenzy.state.connect), while a blocking read up to its block time still answers."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend
from frenzy.devstack.redis_server import RedisProcess, start_redis
from frenzy.scheduler.leader import LeaderLease
from frenzy.state import connect
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    srv = start_redis(workdir=str(tmp_path_factory.mktemp("redis")))
    try:
        yield srv
    finally:
        if srv.proc is not None:
            os.kill(srv.proc.pid, signal.SIGCONT)
        srv.stop()


def _frozen_call_fails(server: RedisProcess, call, timeout: float) -> float:
    """SIGSTOP the server, make ``call``, SIGCONT. -> seconds until it raised redis.TimeoutError."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(redis.TimeoutError):
            call()
        return time.monotonic() - start
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def test_the_schedulers_client_fails_within_its_lease(server: RedisProcess) -> None:
    timeouts = connect.scheduler_timeouts(lease_ttl_s=1.0)  # read timeout 1.5 s (the BLPOP's 0.5 s + margin)
    client = connect.client(server.url, timeouts, decode_responses=True)
    keys = Keys(f"t{uuid.uuid4().hex[:8]}")
    lease = LeaderLease(client, keys, ttl_s=1.0)
    assert lease.hold()
    store = StateStore(client, keys)
    assert store.wait_wake(0.5) is False  # a blocking read of its block time answers
    took = _frozen_call_fails(server, lease.hold, timeouts.socket_timeout)
    assert timeouts.socket_timeout * 0.9 <= took < timeouts.socket_timeout + 1.0, took
    assert client.ping()  # and the next call, Redis back, goes through on a fresh connection
    client.close()


def test_an_agents_clients_fail_within_a_heartbeat(server: RedisProcess, tmp_path: Path) -> None:
    agent = Agent(server.url, "n1", FakeBackend("L4:1", "n1"), keys=Keys(f"t{uuid.uuid4().hex[:8]}"),
                  log_dir=tmp_path / "logs", heartbeat_s=0.5, ttl_s=3.0, block_s=0.3, use_spawner=False)
    timeouts = agent.timeouts
    assert timeouts.socket_timeout == 1.3  # the launch stream's block (0.3 s) plus the margin
    stream = f"{agent.keys.prefix}:launch:n1"
    agent._redis.xgroup_create(stream, "agent", id="$", mkstream=True)  # noqa: SLF001
    assert agent._redis.xreadgroup("agent", "n1", {stream: ">"}, block=300) == []  # noqa: SLF001
    for client in (agent._redis, agent._code_redis):  # noqa: SLF001
        took = _frozen_call_fails(server, lambda c=client: c.get("anything"), timeouts.socket_timeout)
        assert timeouts.socket_timeout * 0.9 <= took < timeouts.socket_timeout + 1.0, took
    agent._redis.close()  # noqa: SLF001
    agent._code_redis.close()  # noqa: SLF001
