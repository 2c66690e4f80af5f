"""An agent's Redis credential writes only its own node's job logs (issue 34).

Node a's credential attacks a job that runs on node b: through Frenzy's own append_log script,
with a raw XADD on b's log stream of the job, by moving b's shipped offset (so b's agent would
skip its real output), and on the one stream of every node jobs had before. Each is refused
(NOPERM) with nothing written. And what a may write, its own stream of any job id, never shows in
the log of a job that did not run on a, nor can a speak as b there.

Why a check inside append_log.lua could not do this: Redis checks every command a script runs
against the *caller's* ACL, so for the script's XADD to work the agent must hold XADD on the log
key itself, and then it can skip the script. The confinement is in the key names the ACL matches:
each node's output under keys of its own (``{p}:node:{n}:logs:{job}`` and its ``:offsets``,
pattern ``~{p}:node:{n}:logs:*``), read and merged by StreamLogs for the nodes the job was placed
on (``frenzy.state.job_logs``). docs/security.md, "Redis".
"""

from __future__ import annotations

import json

import pytest
import redis

from frenzy.devstack.redis_server import RoleUrls
from frenzy.state import scripts
from frenzy.state.job_logs import LogReader
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk
from frenzy.state.records import decode_job

JOB = "job-on-node-b"


def _job_on_b(admin: redis.Redis, keys: Keys) -> None:
    admin.hset(keys.job(JOB), mapping={"id": JOB, "state": "RUNNING", "attempt": 1,
                                       "placement": json.dumps([["b", [0]]])})


def _written(admin: redis.Redis, keys: Keys) -> list[str]:
    """Every log key of the job that exists: b's stream and offsets, and the legacy ones."""
    names = [keys.job_logs(JOB, "b"), keys.job_log_offsets(JOB, "b"), keys.legacy_job_logs(JOB),
             keys.legacy_job_log_offsets(JOB)]
    return [k for k in names if admin.exists(k)]


def test_node_a_cannot_append_to_a_job_on_node_b_through_append_log(admin_url: str, users: RoleUrls,
                                                                    keys: Keys) -> None:
    admin = redis.Redis.from_url(admin_url, decode_responses=True)
    agent_a = redis.Redis.from_url(users.agents["a"], decode_responses=True)
    try:
        scripts.ensure_loaded(admin)
        _job_on_b(admin, keys)
        forged = LogChunk(node="b", attempt=1, offset=0, text="forged by a\n").model_dump_json()
        append = scripts.register_loaded(agent_a, "append_log")
        for target in ([keys.job_logs(JOB, "b"), keys.job_log_offsets(JOB, "b")],
                       [keys.legacy_job_logs(JOB), keys.legacy_job_log_offsets(JOB)]):
            with pytest.raises(redis.exceptions.NoPermissionError):
                append(keys=target, args=["b/1", 0, 12, 1000, forged, 0, 0, 0])
        assert _written(admin, keys) == []
    finally:
        agent_a.close()
        admin.close()


def test_node_a_cannot_write_b_s_log_keys_directly(admin_url: str, users: RoleUrls, keys: Keys) -> None:
    admin = redis.Redis.from_url(admin_url, decode_responses=True)
    agent_a = redis.Redis.from_url(users.agents["a"], decode_responses=True)
    try:
        _job_on_b(admin, keys)
        for stream in (keys.job_logs(JOB, "b"), keys.legacy_job_logs(JOB)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                agent_a.xadd(stream, {"data": "junk"})
        for offsets in (keys.job_log_offsets(JOB, "b"), keys.legacy_job_log_offsets(JOB)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                agent_a.hset(offsets, "b/1", 10**12)  # b would skip all its output
            with pytest.raises(redis.exceptions.NoPermissionError):
                agent_a.pexpire(offsets, 1)
        assert _written(admin, keys) == []
    finally:
        agent_a.close()
        admin.close()


def test_what_node_a_writes_of_its_own_never_shows_in_a_job_it_did_not_run(admin_url: str, users: RoleUrls,
                                                                          keys: Keys) -> None:
    """a may write its own stream of any job id (its keys), and b's agent may name another node in
    its chunks: the reader reads only the nodes the job was placed on, and each node's stream
    speaks for that node only."""
    admin = redis.Redis.from_url(admin_url, decode_responses=True)
    agent_a = redis.Redis.from_url(users.agents["a"], decode_responses=True)
    agent_b = redis.Redis.from_url(users.agents["b"], decode_responses=True)
    try:
        scripts.ensure_loaded(admin)
        _job_on_b(admin, keys)

        def ship(client: redis.Redis, node: str, as_node: str, text: str, offset: int) -> None:
            chunk = LogChunk(node=as_node, attempt=1, offset=offset, text=text).model_dump_json()
            scripts.register_loaded(client, "append_log")(
                keys=[keys.job_logs(JOB, node), keys.job_log_offsets(JOB, node)],
                args=[f"{as_node}/1", offset, offset + len(text), 1000, chunk, 0, 0, 0])

        ship(agent_a, "a", "a", "a was never here\n", 0)  # allowed: a's own key
        ship(agent_b, "b", "b", "real output\n", 0)
        ship(agent_b, "b", "a", "b speaking as a\n", 0)
        job = decode_job(admin.hgetall(keys.job(JOB)), [])
        reader = LogReader(admin, keys, job)
        read, chunks = reader.read()
        assert read == 2  # b's two entries; a's stream is not read at all
        assert [(c.node, c.text) for c in chunks] == [("b", "real output\n")]
    finally:
        agent_a.close()
        agent_b.close()
        admin.close()
