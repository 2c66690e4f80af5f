"""issue 14 item 1: the stack's Redis is never open.

Before: the embedded Redis ran ``default on nopass +@all``; anyone who reached the port
could read and write every job, node and launch stream."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from frenzy.devstack.redis_server import start_redis


@pytest.fixture(scope="module")
def private_redis():
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


def test_a_client_without_credentials_is_refused(private_redis) -> None:
    port = urlsplit(private_redis.url).port
    for kwargs in ({}, {"username": "default", "password": ""}, {"password": "guess"}):
        # (no retries: redis-py counts a refused AUTH as a connection error and backs off ~4 s)
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, retry=Retry(NoBackoff(), 0), **kwargs)
        with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
            client.set("frenzy:job:x", "owned")
        client.close()
    assert redis.Redis.from_url(private_redis.url).ping()  # the stack's own URL works


def test_the_password_is_not_on_the_command_line_and_its_file_is_private(private_redis) -> None:
    password = urlsplit(private_redis.url).password
    assert password and len(password) >= 24
    cmdline = Path(f"/proc/{private_redis.proc.pid}/cmdline").read_bytes()
    assert password.encode() not in cmdline  # `ps` shows every local user the command line
    conf = Path(private_redis.workdir) / "redis.conf"
    assert os.stat(conf).st_mode & 0o077 == 0


def test_locked_redis_keeps_scripted_writes_across_a_restart(tmp_path: Path) -> None:
    """With the append-only file on, Redis replays each Lua script's writes as MULTI/EXEC under the
    ``default`` user; a config with ``default`` off lost every one of them on restart."""
    server = start_redis(workdir=str(tmp_path), appendonly=True)
    password = urlsplit(server.url).password
    try:
        client = redis.Redis.from_url(server.url)
        client.eval("redis.call('HSET', KEYS[1], 'state', 'RUNNING'); return 1", 1, "frenzy:job:j1")
        pipe = client.pipeline(transaction=True)
        pipe.set("frenzy:a", "1")
        pipe.set("frenzy:b", "2")
        pipe.execute()
        client.close()
    finally:
        server.stop()
    again = start_redis(workdir=str(tmp_path), appendonly=True, password=password)
    try:
        client = redis.Redis.from_url(again.url, decode_responses=True)
        assert client.hget("frenzy:job:j1", "state") == "RUNNING"
        assert client.mget("frenzy:a", "frenzy:b") == ["1", "2"]
        client.close()
    finally:
        again.stop()
