"""Priorities over REST: the body's ``priority`` reaches the job, /api/jobs shows it, and a user
token asking more than the cap gets 403 with the scheduler's "To fix:" (real scheduler, predictor
and Redis on loopback)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import redis

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app
from frenzy.auth.roles import Role
from frenzy.state.keys import Keys
from support.servers import Servers, running_servers
from support.state import add_node

GOOD = {"name": "api-job", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "true"}


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 1)
    with running_servers(redis_url, prefix) as s:
        yield s


def _client(servers: Servers, token: str) -> TestClient:
    return TestClient(create_app(servers.scheduler_addr), base_url="http://localhost",
                      headers={"authorization": f"Bearer {token}"})


def test_priority_over_rest(servers: Servers) -> None:
    user_token, _ = servers.scheduler.tokens.create("bob", Role.SUBMIT)
    with _client(servers, user_token) as bob, _client(servers, servers.token) as admin:
        refused = bob.post("/api/jobs", json={**GOOD, "priority": 100})
        assert refused.status_code == 403, refused.text
        detail = refused.json()["detail"]
        assert "spec.priority: 100 is above 0" in detail and "To fix:" in detail
        assert bob.get("/api/jobs").json() == {"jobs": []}  # nothing queued
        bad = bob.post("/api/jobs", json={**GOOD, "priority": 1000})
        assert bad.status_code == 400 and "priority" in bad.json()["detail"]

        low = bob.post("/api/jobs", json={**GOOD, "priority": -7})
        assert low.status_code == 200, low.text
        high = admin.post("/api/jobs", json={**GOOD, "name": "urgent", "priority": 100})
        assert high.status_code == 200, high.text
        rows = {j["name"]: j for j in admin.get("/api/jobs").json()["jobs"]}
        assert rows["api-job"]["priority"] == -7 and rows["urgent"]["priority"] == 100
