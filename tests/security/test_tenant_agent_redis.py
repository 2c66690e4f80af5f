"""issue 34 item 2: one agent's Redis credential cannot take down the cluster.

Measured before: a node's Redis user could SCRIPT LOAD a Lua busy loop and EVALSHA it, freezing
Redis for everyone; it could write an unknown GPU type on its own GPU and every submission of every
user failed (the predictor refused the pool); 2 x 50 MiB it appended to ``events`` stayed there
(the stream was never trimmed). Now an agent may call the scripts Frenzy ships (EVALSHA) but load
none (no EVAL, no SCRIPT), the trusted side loads them, an agent that finds them missing says so
and retries; the scheduler trims the events it acknowledged, and a GPU the catalog does not know is
that node's health problem, not everyone's.

Against real Redis servers (the session's 7.x with selectors and the embedded 6.2) and real
scheduler and predictor servers. Each test fails on the code before this change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend
from frenzy.auth.roles import Role
from frenzy.devstack.redis_server import RoleUrls, add_role_users, remove_role_users
from frenzy.state import node_keys, scripts
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore
from frenzy.v1 import scheduler_pb2
from support.servers import running_servers
from support.state import add_node, make_spec
from support.waiting import wait_for

# Harmless here; before, the same rights ran "while true do end" and froze the test's own Redis.
ANY_LUA = "return redis.call('TIME')"


@pytest.fixture
def users62(redis62: str, prefix: str) -> Iterator[RoleUrls]:
    urls = add_role_users(redis62, prefix, ["a", "b"])
    yield urls
    remove_role_users(redis62, prefix, ["a", "b"])


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, protocol=2)


def _refused(call) -> bool:  # noqa: ANN001
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    except redis.ResponseError as exc:
        return "NOPERM" in str(exc) or "no permissions" in str(exc)
    return False


def test_an_agent_can_neither_load_nor_eval_a_script(users: RoleUrls, admin_url: str) -> None:
    agent = _client(users.agents["a"])
    attempts = {
        "SCRIPT LOAD": lambda: agent.script_load(ANY_LUA),
        "EVAL": lambda: agent.eval(ANY_LUA, 0),
        "SCRIPT FLUSH": lambda: agent.script_flush(),
        "SCRIPT KILL": lambda: agent.script_kill(),
        "redis-py Script (falls back to SCRIPT LOAD)": lambda: agent.register_script(ANY_LUA)(),
    }
    allowed = {name for name, call in attempts.items() if not _refused(call)}
    assert allowed == set()
    # What it may still do: call Frenzy's own scripts, loaded by whoever made its user.
    assert _client(admin_url).script_exists(*(scripts.sha1(n) for n in scripts.AGENT_SCRIPTS)) == [True] * 4
    agent.close()


def test_an_agent_whose_scripts_are_missing_says_why_and_retries(users62: RoleUrls, redis62: str, keys: Keys,
                                                                   tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A restarted Redis holds no script: the agent may not load its own, so it waits (a log line
    naming the cause) until a scheduler loads them, then registers; it does not crash."""
    admin = _client(redis62)
    node_keys.create(admin, keys, "a")
    admin.script_flush()
    agent = Agent(users62.agents["a"], "a", FakeBackend("A100-80GB:1", "a"), keys=keys, log_dir=tmp_path / "logs",
                  heartbeat_s=0.2, ttl_s=2.0, block_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    caplog.set_level(logging.WARNING, logger="frenzy.agent.daemon")
    thread.start()
    try:
        wait_for(lambda: any("NOSCRIPT" in r.getMessage() for r in caplog.records), timeout=10,
                 what="the agent's log line naming the missing script")
        assert not agent.ready.is_set() and thread.is_alive()
        assert not admin.exists(keys.node("a"))
        from frenzy.scheduler.service import keep_agent_scripts  # what every scheduler runs

        keeper_stop = threading.Event()
        keeper = threading.Thread(target=keep_agent_scripts, args=(_client(users62.scheduler), keeper_stop, 0.1),
                                  daemon=True)
        keeper.start()
        wait_for(agent.ready.is_set, timeout=10, what="the agent registered once the scripts are back")
        admin.script_flush()  # Redis restarted: the keeper loads them again within its period
        wait_for(lambda: all(admin.script_exists(*(scripts.sha1(n) for n in scripts.AGENT_SCRIPTS))), timeout=5,
                 what="the scheduler reloading the agents' scripts")
        keeper_stop.set()
    finally:
        stop.set()
        thread.join(10)
        admin.close()


def test_the_events_stream_is_trimmed_once_acknowledged(redis_url: str, prefix: str, keys: Keys) -> None:
    """2 x 50 MiB written to ``events`` stayed there; now what the scheduler acknowledged goes."""
    urls = add_role_users(redis_url, prefix, ["a"])
    admin = _client(redis_url)
    try:
        with running_servers(urls.scheduler, prefix):
            agent = _client(urls.agents["a"])
            for _ in range(40):  # 40 MiB of junk: refused (unsigned), acknowledged, and then gone
                agent.xadd(keys.events_stream(), {"kind": "exited", "junk": "x" * (1 << 20)})
            wait_for(lambda: not admin.xpending(keys.events_stream(), "scheduler")["pending"]
                     and admin.xinfo_groups(keys.events_stream())[0]["last-delivered-id"] != "0-0",
                     timeout=20, what="the scheduler to read and acknowledge them")
            wait_for(lambda: admin.xlen(keys.events_stream()) <= 2, timeout=10, what="the stream trimmed")
            agent.close()
    finally:
        admin.close()
        remove_role_users(redis_url, prefix, ["a"])


def test_an_unknown_gpu_type_on_one_node_fails_nobody_s_submission(redis_url: str, prefix: str, keys: Keys,
                                                                   redis_client: redis.Redis) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    add_node(redis_client, keys, "b", "A100-80GB", 2)
    urls = add_role_users(redis_url, prefix, ["a", "b"])
    try:
        with running_servers(redis_url, prefix) as servers:
            bob = servers.stub_for(servers.scheduler.tokens.create("bob", Role.SUBMIT)[0])
            spec = make_spec("bob's")
            spec.limits.max_gpus = 1
            assert bob.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
            # Node a's own credential writes what the catalog does not know on its own GPUs.
            agent = _client(urls.agents["a"])
            agent.hset(keys.gpu("a", 0), "type", "H900-1TB")
            agent.hset(keys.gpu("a", 1), "memory_total", "lots")
            agent.hincrby(keys.node("a"), "rev", 1)  # as its heartbeat script would: the scheduler re-reads it
            agent.close()
            servers.scheduler.loop.wake.set()
            # Submissions plan for the pools of a view at most a few seconds old: keep submitting
            # past that (each a new recipe, so no answer is kept from before).
            deadline = time.monotonic() + 7.0
            batch = 8
            while time.monotonic() < deadline:
                batch += 8
                spec.recipe.global_batch = batch
                try:
                    assert bob.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
                except grpc.RpcError as exc:
                    pytest.fail(f"node a's GPU type failed bob's submission: {exc.code()} {exc.details()}")
                time.sleep(0.25)
            nodes = {n.name: n for n in servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes}
            assert "H900-1TB" in nodes["a"].health_reason and "not scheduled" in nodes["a"].health_reason
            assert not nodes["a"].gpus[0].healthy and nodes["b"].health_reason == ""
            # The node's other GPU, with memory the scheduler cannot read, is not placed on either.
            view = StateStore(redis_client, keys).cluster().view
            a = next(n for n in view.nodes if n.name == "a")
            assert [(g.gpu_type, g.healthy) for g in a.gpus] == [("", False), ("", False)]
    finally:
        remove_role_users(redis_url, prefix, ["a", "b"])
