"""Fixtures of the REST fuzz tests: one real scheduler and predictor (loopback gRPC, real Redis) with
two fake nodes per test module, and the API app in front of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from fastapi import FastAPI

from frenzy.api.app import create_app
from frenzy.state.keys import Keys
from support.servers import Servers, running_servers
from support.state import add_node

GiB = 1024**3


@pytest.fixture(scope="module")
def servers(redis_url: str) -> Iterator[Servers]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        add_node(client, Keys(prefix), "a100-0", "A100-80GB", 4)
        add_node(client, Keys(prefix), "l4-0", "L4", 2, memory=23 * GiB)
        with running_servers(redis_url, prefix) as s:
            yield s
    finally:
        client.close()


@pytest.fixture(scope="module")
def app(servers: Servers) -> FastAPI:
    # Starlette's TestClient sends Host "testserver": allowed here as an operator allows a host name.
    return create_app(servers.scheduler_addr, allowed_hosts=["testserver"])
