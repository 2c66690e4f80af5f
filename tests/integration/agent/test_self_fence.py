"""An agent cut off from Redis stops its job before the scheduler runs it elsewhere (issue 37).

A frozen Redis (SIGSTOP) is a silent partition as the agent sees it: its calls neither answer nor
fail. The launch says the scheduler's --node-dead-after-s; the job must be gone (SIGTERM, then
SIGKILL after the grace) before that much silence has passed, and a launch that does not say it
(an older scheduler) is left running."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from integration.agent.agent_cluster import Cluster

from frenzy.devstack.redis_server import RedisProcess, start_redis
from frenzy.state.keys import Keys
from frenzy.state.messages import EventKind
from support.processes import alive

pytestmark = pytest.mark.slow

# Ignores SIGTERM, so only the SIGKILL after the grace ends it: the deadline must allow for that.
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('running', flush=True); time.sleep(120)"]


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[RedisProcess, Cluster]]:
    server = start_redis(workdir=str(tmp_path / "redis"))
    client = redis.Redis.from_url(server.url, decode_responses=True)
    keys = Keys(f"t{uuid.uuid4().hex[:8]}")
    cluster = Cluster(server.url, client, keys, tmp_path)
    try:
        yield server, cluster
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        cluster.close()
        server.stop()


def test_a_job_is_stopped_before_the_node_would_be_declared_dead(private: tuple[RedisProcess, Cluster]) -> None:
    server, cluster = private
    # heartbeat 0.2 s, grace 1 s: with the scheduler's 3 s the job gets SIGTERM after 1.6 s of silence.
    cluster.start(heartbeat_s=0.2, ttl_s=1.0, cancel_grace_s=1.0)
    cluster.launch("fenced", STUBBORN, node_dead_after_s=3.0)
    cluster.launch("unfenced", STUBBORN, indices=[2], fence=2)  # an older scheduler: no deadline given
    fenced = cluster.wait_event("fenced", EventKind.RUNNING)
    unfenced = cluster.wait_event("unfenced", EventKind.RUNNING)
    assert alive(fenced.pid) and alive(unfenced.pid)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)  # every call of the agent now hangs
    cut = time.monotonic()
    while alive(fenced.pid) and time.monotonic() - cut < 10:
        time.sleep(0.05)
    gone_after = time.monotonic() - cut
    assert not alive(fenced.pid), "the job outlived the silence the scheduler allows its node"
    assert gone_after < 3.0, f"stopped {gone_after:.2f}s after the cut: the scheduler runs it elsewhere at 3 s"
    assert alive(unfenced.pid), "a launch without the scheduler's deadline must not be stopped this way"
    os.kill(server.proc.pid, signal.SIGCONT)
    # Back in touch, the agent reports the stopped job's exit (stale to the scheduler by then).
    cluster.wait_event("fenced", EventKind.EXITED, timeout=15)
