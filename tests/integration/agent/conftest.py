"""The ``cluster`` fixture of the agent integration tests (helpers in agent_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from integration.agent.agent_cluster import Cluster

from frenzy.state.keys import Keys


@pytest.fixture
def cluster(redis_url: str, redis_client: redis.Redis, keys: Keys, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(redis_url, redis_client, keys, tmp_path)
    yield c
    c.close()
