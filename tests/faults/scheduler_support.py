"""Shared by the scheduler fault tests (they import the fixtures by name): a private Redis
that can be stopped and started again (an outage), node agents with fake GPUs in threads of
the test process, and job commands that leave a mark each time they start (a job run twice
shows)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend
from frenzy.devstack.redis_server import RedisProcess, start_redis
from frenzy.devstack.stack import LocalStack
from frenzy.state import node_keys
from frenzy.state.keys import Keys
from has.cluster_spec import parse_cluster
from support.waiting import wait_for


@dataclass
class RestartableRedis:
    """A redis-server of this test alone that ``stop`` then ``start`` takes away and brings back
    with its data (same port, password and directory): an outage, as the clients see it.

    ``stop`` is ``SHUTDOWN SAVE`` (a snapshot, loaded on start), not the append-only file, so
    the outage tests do not depend on how Redis replays an AOF (Redis 7.0 dropped every
    MULTI/EXEC of one with the ``default`` user off: redis/redis#14541; the stack now locks
    ``default`` instead, see ``frenzy.devstack.redis_server.unusable_default_user``)."""

    workdir: str
    server: RedisProcess | None = None
    port: int = 0
    password: str = ""

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self) -> None:
        self.server = start_redis(port=self.port or None, workdir=self.workdir, password=self.password or None)
        parts = urlsplit(self.server.url)
        self.port, self.password = int(parts.port or 0), parts.password or ""

    def stop(self) -> None:
        if self.server is None or self.server.proc is None or self.server.proc.poll() is not None:
            return
        client = redis.Redis.from_url(self.server.url)
        try:
            client.shutdown(save=True)
        except redis.ConnectionError:
            pass  # it closed the connection as it went down
        finally:
            client.close()
        self.server.proc.wait(timeout=10)
        self.server.stop()


@dataclass
class Agents:
    """Fake-GPU agents (real ``Agent`` code, real job processes) in threads."""

    url: str
    keys: Keys
    log_dir: Path
    running: list[tuple[Agent, threading.Event, threading.Thread]] = field(default_factory=list)

    def start(self, node: str, spec: str = "A100-80GB:1", **options: float) -> Agent:
        opts = {"heartbeat_s": 0.2, "ttl_s": 2.0, "block_s": 0.05, "cancel_grace_s": 2.0, **options}
        with redis.Redis.from_url(self.url) as client:  # as `frenzy node key create` before an agent starts
            node_keys.create(client, self.keys, node)
        agent = Agent(self.url, node, FakeBackend(spec, node), keys=self.keys, log_dir=self.log_dir,
                      state_dir=self.log_dir / ".agent" / node, **opts)  # type: ignore[arg-type]
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), name=f"agent-{node}", daemon=True)
        thread.start()
        self.running.append((agent, stop, thread))
        wait_for(agent.ready.is_set, timeout=10, what=f"agent {node} ready")
        return agent

    def stop_all(self) -> None:
        for _, stop, _ in self.running:
            stop.set()
        for _, _, thread in self.running:
            thread.join(timeout=10)


def runs(marker: Path) -> list[str]:
    """The lines job processes appended to ``marker``: one per start of a job's command."""
    return marker.read_text().split() if marker.exists() else []


def marking_command(marker: Path, tag: str, sleep_s: float = 0.0) -> list[str]:
    """A job command that appends ``tag`` to ``marker`` when it starts, then sleeps."""
    code = f"open({str(marker)!r}, 'a').write({tag!r} + '\\n'); import time; time.sleep({sleep_s})"
    return [sys.executable, "-c", code]


@pytest.fixture
def outage_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    server = RestartableRedis(str(tmp_path / "redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_agents(tmp_path: Path) -> Iterator[Callable[[str, Keys], Agents]]:
    made: list[Agents] = []

    def make(url: str, keys: Keys) -> Agents:
        made.append(Agents(url, keys, tmp_path / "jobs"))
        return made[-1]

    yield make
    for agents in made:
        agents.stop_all()


# ---- a whole local stack whose agents can be frozen (a node cut off) ------------------------

TWO_L4 = {"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 1, "name_prefix": "l4"}]}


@pytest.fixture
def frozen_node_stack(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[LocalStack]:
    """Two one-GPU L4 nodes, short leases (a node is dead 1.5 s after its lease lapses). A test
    freezes an agent with SIGSTOP; teardown wakes every service first (a frozen one cannot stop)."""
    s = LocalStack.create(parse_cluster(TWO_L4), run_dir=str(tmp_path / "run"), redis_url=redis_url, prefix=prefix,
                          with_worker=False, heartbeat_s=0.25, ttl_s=1.0, node_dead_after_s=1.5, cancel_grace_s=2.0)
    s.start()
    try:
        yield s
    finally:
        for svc in s.services:
            try:
                os.killpg(svc.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        s.stop()
