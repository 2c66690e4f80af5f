"""The ``cluster`` fixture of the agent integration tests (helpers in agent_cluster.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from integration.agent.agent_cluster import Cluster

from frenzy.agent import launcher
from frenzy.state.keys import Keys
from frenzy.state.messages import EventKind


@pytest.fixture
def cluster(redis_url: str, redis_client: redis.Redis, keys: Keys, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(redis_url, redis_client, keys, tmp_path)
    yield c
    for running in c.agents:
        running.stop.set()
    for running in c.agents:
        running.thread.join(10)
    for e in c.events():  # no job may outlive its test
        if e.kind == EventKind.RUNNING and e.pid:
            launcher.signal_group(e.pid, signal.SIGKILL)
            launcher.kill_launch(f"{keys.prefix}/{e.node}/{e.job_id}/{e.attempt}", signal.SIGKILL)
