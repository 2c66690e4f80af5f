"""compose.yaml's credentials on a real Redis: the ACL `frenzy secrets init` writes, the tokens
`frenzy secrets tokens` makes, and REDIS_URL_FILE (how every container finds Redis)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.cli.cmd_secrets import ACL_FILE, ADMIN_TOKEN_FILE, URL_FILE, WORKER_TOKEN_FILE, init_redis_secrets
from frenzy.cli.main import app
from frenzy.devstack.redis_server import free_port, redis_binary
from frenzy.state.keys import Keys


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A redis-server started as compose starts it (--aclfile) -> (port, the URL init wrote)."""
    port = free_port()
    init_redis_secrets(tmp_path, host="127.0.0.1", port=port)
    proc = subprocess.Popen([redis_binary(), "--aclfile", str(tmp_path / ACL_FILE), "--port", str(port),
                             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = (tmp_path / URL_FILE).read_text().strip()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, "redis-server refused the ACL file"
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.05)
        yield port, url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_acl_file_lets_in_only_the_password(acl_redis: tuple[int, str]) -> None:
    port, url = acl_redis
    anonymous = redis.Redis(host="127.0.0.1", port=port)
    with pytest.raises(redis.RedisError):
        anonymous.ping()  # the default user is off: no command without AUTH
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, username="frenzy", password="guess").ping()
    health = redis.Redis(host="127.0.0.1", port=port, username="health", password="anything")
    assert health.ping()  # what the container's health check does
    with pytest.raises(redis.exceptions.NoPermissionError):
        health.get("frenzy:tokens")
    with pytest.raises(redis.exceptions.NoPermissionError):
        health.set("x", "1")
    client = redis.Redis.from_url(url)
    client.set("frenzy:probe", "1")
    assert client.get("frenzy:probe") == b"1"


def test_tokens_made_once_kept_and_replaced_when_redis_lost_them(
        tmp_path: Path, redis_url: str, prefix: str, redis_client: redis.Redis) -> None:
    runner = CliRunner()
    argv = ["secrets", "tokens", "--dir", str(tmp_path), "--redis-url", redis_url, "--prefix", prefix]
    first = runner.invoke(app, argv)
    assert first.exit_code == 0 and [ln.split()[0] for ln in first.output.splitlines()] == ["made", "made"], first.output
    store = TokenStore(redis_client, Keys(prefix), cache_s=0)
    admin, worker = (tmp_path / ADMIN_TOKEN_FILE), (tmp_path / WORKER_TOKEN_FILE)
    for path in (admin, worker):
        assert path.stat().st_mode & 0o777 == 0o600
    assert store.verify(admin.read_text().strip()).role == Role.ADMIN
    who = store.verify(worker.read_text().strip())
    assert (who.user, who.role) == ("batch", Role.SUBMIT)
    tokens_before = admin.read_text(), worker.read_text()
    again = runner.invoke(app, argv)
    assert again.exit_code == 0 and [ln.split()[0] for ln in again.output.splitlines()] == ["kept", "kept"], again.output
    assert (admin.read_text(), worker.read_text()) == tokens_before
    assert len(store.list()) == 2  # a restart makes no new tokens
    store.revoke(admin.read_text().strip())  # as if Redis' data volume had been dropped
    third = runner.invoke(app, argv)
    assert third.exit_code == 0 and third.output.startswith("made "), third.output
    assert admin.read_text() != tokens_before[0] and store.verify(admin.read_text().strip()).role == Role.ADMIN
    assert worker.read_text() == tokens_before[1]


def _frenzy(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real entry point in a fresh process: REDIS_URL_FILE is read when frenzy.cli.main is imported."""
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE")}
    return subprocess.run([sys.executable, "-c", "from frenzy.cli.main import app; app()", *args],
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_redis_url_file_reaches_every_redis_url_option(tmp_path: Path, redis_url: str, prefix: str,
                                                       redis_client: redis.Redis) -> None:
    TokenStore(redis_client, Keys(prefix)).create("alice", Role.READ)
    url_file = tmp_path / "redis-url"
    url_file.write_text(redis_url + "\n")
    url_file.chmod(0o600)
    listed = _frenzy(["token", "list", "--prefix", prefix], {"REDIS_URL_FILE": str(url_file)})
    assert listed.returncode == 0 and "alice" in listed.stdout, listed.stdout + listed.stderr
    # REDIS_URL, when set, wins: the file is not even read.
    wins = _frenzy(["token", "list", "--prefix", prefix],
                   {"REDIS_URL": redis_url, "REDIS_URL_FILE": str(tmp_path / "absent")})
    assert wins.returncode == 0 and "alice" in wins.stdout, wins.stderr


@pytest.mark.parametrize("content", [None, "\n"])
def test_unusable_redis_url_file_is_a_clear_error(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "redis-url"
    if content is not None:
        path.write_text(content)
    out = _frenzy(["token", "list"], {"REDIS_URL_FILE": str(path)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"REDIS_URL_FILE={path}" in out.stderr and "Traceback" not in out.stderr, out.stderr
