"""`frenzy node join` on a real Redis (the session's URL is the admin's): one 0600 file gives a new node
its own Redis user and signing key, an agent started from it works under that user only, and running
join again rotates the password (issue 14: node keys from a join step, rotatable)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from frenzy.cli.main import app
from frenzy.state import acl, node_keys
from frenzy.state.keys import Keys
from support.waiting import wait_for

NODE, OTHER = "gpu-017", "gpu-018"


@pytest.fixture
def joined(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Path]:
    """`frenzy node join NODE` run once; its Redis user is deleted after the test (a shared server)."""
    path = tmp_path / "join.json"
    done = CliRunner().invoke(app, ["node", "join", NODE, "--redis-url", redis_url, "--prefix", prefix,
                                    "--out", str(path), "--host", socket.gethostname()])  # (issue 34: its host)
    assert done.exit_code == 0, done.output
    yield path
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "DELUSER", acl.user_name(acl.RedisRole.AGENT, prefix, NODE))
    admin.close()


def _url(path: Path) -> str:
    return json.loads(path.read_text())["redis_url"]


def test_join_writes_a_private_file_with_the_node_s_own_user(joined: Path, prefix: str,
                                                             redis_client: redis.Redis, keys: Keys) -> None:
    assert stat.S_IMODE(joined.stat().st_mode) == 0o600
    data = json.loads(joined.read_text())
    assert data["node"] == NODE and data["prefix"] == prefix
    assert data["redis_url"].startswith(f"redis://{prefix}-agent-{NODE}:")
    node = redis.Redis.from_url(data["redis_url"])
    assert node.ping()
    node.close()
    assert node_keys.read(redis_client, keys, NODE) is not None  # the signing key was made


def test_join_never_prints_the_password_unless_asked(redis_url: str, prefix: str, tmp_path: Path) -> None:
    runner = CliRunner()
    common = ["node", "join", NODE, "--redis-url", redis_url, "--prefix", prefix, "--out", str(tmp_path / "j.json")]
    try:
        quiet = runner.invoke(app, common)
        assert quiet.exit_code == 0, quiet.output
        password = _url(tmp_path / "j.json").split("@")[0].rsplit(":", 1)[1]
        assert password not in quiet.output
        shown = runner.invoke(app, [*common, "--print", "--redis-host", "redis.internal"])
        assert shown.exit_code == 0, shown.output
        url = _url(tmp_path / "j.json")
        assert url in shown.output and "@redis.internal:" in url  # --redis-host keeps the port and database
        assert url.endswith(redis_url.rsplit(":", 1)[1])
    finally:
        admin = redis.Redis.from_url(redis_url)
        admin.execute_command("ACL", "DELUSER", acl.user_name(acl.RedisRole.AGENT, prefix, NODE))
        admin.close()


def test_an_agent_from_the_join_file_registers_and_heartbeats_as_its_own_user(
        joined: Path, redis_client: redis.Redis, keys: Keys, prefix: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FRENZY_PREFIX")}
    proc = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "agent", "--join-file", str(joined),
                             "--fake-gpus", "A100-80GB:1", "--log-dir", str(tmp_path / "logs"),
                             "--heartbeat-s", "0.2", "--ttl-s", "3"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        node = keys.node(NODE)

        def beating() -> bool:
            assert proc.poll() is None, proc.communicate()[0]
            at, since = redis_client.hmget(node, "heartbeat_at", "registered_at")
            return bool(at and since and float(at) > float(since))

        wait_for(beating, timeout=30, what="a heartbeat after registration")
        assert NODE in redis_client.smembers(keys.nodes())
        users = {c["user"] for c in redis_client.client_list()}
        assert f"{prefix}-agent-{NODE}" in users
    finally:
        proc.terminate()
        proc.wait(15)


def test_the_file_s_user_is_refused_another_node_s_launch_stream(joined: Path, keys: Keys) -> None:
    node = redis.Redis.from_url(_url(joined), decode_responses=True)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            node.xadd(keys.launch_stream(OTHER), {"forged": "1"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            node.xreadgroup("agents", "x", {keys.launch_stream(OTHER): ">"}, count=1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            node.hget(keys.node_key(OTHER), "current")
    finally:
        node.close()


def test_a_second_join_rotates_the_password(joined: Path, redis_url: str, prefix: str, tmp_path: Path) -> None:
    old_url = _url(joined)
    connected = redis.Redis.from_url(old_url, retry_on_timeout=False)
    assert connected.ping()
    again = CliRunner().invoke(app, ["node", "join", NODE, "--redis-url", redis_url, "--prefix", prefix,
                                     "--out", str(tmp_path / "new.json")])
    assert again.exit_code == 0, again.output
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(old_url).ping()
    # The connection made with the old password is cut too, and cannot come back.
    with pytest.raises((redis.AuthenticationError, redis.ConnectionError)):
        connected.ping()
    fresh = redis.Redis.from_url(_url(tmp_path / "new.json"))
    assert fresh.ping()
    fresh.close()


def test_a_join_file_others_may_read_is_refused(joined: Path, tmp_path: Path) -> None:
    os.chmod(joined, 0o644)
    done = CliRunner().invoke(app, ["agent", "--join-file", str(joined), "--fake-gpus", "A100-80GB:1",
                                    "--log-dir", str(tmp_path / "logs")])
    assert done.exit_code == 2
    assert "--join-file" in done.output and "0644" in done.output and "chmod 600" in done.output


def test_join_file_conflicts_with_node_and_needs_an_admin(joined: Path, redis_url: str, prefix: str,
                                                          tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(app, ["agent", "--join-file", str(joined), "--node", "n9"])
    assert both.exit_code == 2 and "drop --node" in both.output
    not_admin = runner.invoke(app, ["node", "join", OTHER, "--redis-url", _url(joined), "--prefix", prefix,
                                    "--out", str(tmp_path / "x.json")])
    assert not_admin.exit_code == 1 and "admin" in not_admin.output
    assert not (tmp_path / "x.json").exists()
