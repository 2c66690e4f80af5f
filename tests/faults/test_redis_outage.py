"""issue 14 D2 and D4: Redis goes away for longer than ``--node-dead-after-s`` and comes back.

Before: when Redis returned every node's lease had expired, and the reaper declared the nodes
dead before their agents' next heartbeat; their jobs were requeued and ran a second time (the
first run's exit 0 discarded as stale). Every tick and event read meanwhile logged a traceback.
Now a node's silence counts from when Redis was reachable again, so no node dies of an outage
and no job runs twice; the outage is one log line when it starts and one when it ends.

Real parts: a private redis-server (shut down with a snapshot and started again on the same port:
its data back), a scheduler (gRPC, predictor, loop, reaper), fake-GPU agents whose jobs are processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from faults import scheduler_support
from faults.scheduler_support import Agents, RestartableRedis, marking_command, runs

from frenzy.rpc.jobspec import parse_entry
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, types_pb2
from support.servers import Servers, running_servers
from support.waiting import wait_for

make_agents = scheduler_support.make_agents  # fixtures
outage_redis = scheduler_support.outage_redis

DONE = (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED)
DEAD_AFTER_S = 1.5
OUTAGE_S = 4.0  # > the agents' lease (2 s) + DEAD_AFTER_S: every lease is gone when Redis returns


def _jobs(servers: Servers, ids: list[str]) -> list[types_pb2.Job]:
    return [servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=i), timeout=5) for i in ids]


def _outage(redis: RestartableRedis, seconds: float) -> None:
    redis.stop()
    time.sleep(seconds)
    redis.start()


def test_an_outage_longer_than_node_dead_after_kills_no_node_and_runs_no_job_twice(
        outage_redis: RestartableRedis, tmp_path: Path, make_agents: Callable[[str, Keys], Agents],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRENZY_NODE_DEAD_AFTER_S", str(DEAD_AFTER_S))
    prefix = "d2"
    agents = make_agents(outage_redis.url, Keys(prefix))
    nodes = ["n1", "n2", "n3"]
    for node in nodes:  # a heartbeat a second: the reaper (every 0.375 s) would be first after the outage
        agents.start(node, heartbeat_s=1.0, ttl_s=2.0)
    marker = tmp_path / "runs"
    with running_servers(outage_redis.url, prefix) as servers:
        ids = []
        for i in range(len(nodes)):
            spec = parse_entry({"name": f"d2-{i}", "model": "gpt2-124m", "seq_len": 128, "global_batch": 8,
                                "max_gpus": 1, "command": marking_command(marker, f"job{i}", sleep_s=6.0)}).to_proto()
            ids.append(servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id)
        wait_for(lambda: all(j.state == types_pb2.JOB_STATE_RUNNING for j in _jobs(servers, ids)), timeout=10,
                 what="every job running")
        _outage(outage_redis, OUTAGE_S)

        def ended() -> list[types_pb2.Job] | None:
            js = _jobs(servers, ids)
            return js if all(j.state in DONE for j in js) else None

        jobs = wait_for(ended, timeout=20, what="every job to end")
        listed = servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(include_dead=True), timeout=5).nodes
    reasons = {j.id: [h.reason for h in j.history] for j in jobs}  # type: ignore[union-attr]
    assert [(j.state, j.attempt) for j in jobs] == [(types_pb2.JOB_STATE_SUCCEEDED, 1)] * 3, reasons  # type: ignore[union-attr]
    assert sorted(runs(marker)) == ["job0", "job1", "job2"]  # each job's command started once
    assert sorted(n.name for n in listed if n.alive) == nodes


def test_an_outage_is_one_log_line_when_it_starts_and_one_when_it_ends(
        outage_redis: RestartableRedis, caplog: pytest.LogCaptureFixture) -> None:
    with running_servers(outage_redis.url, "d4") as servers:
        servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5)
        time.sleep(0.3)  # the loop and the events thread at work
        caplog.clear()
        caplog.set_level(logging.INFO, logger="frenzy.scheduler")
        _outage(outage_redis, 2.0)
        # Back: the scheduler answers again, its loop and event consumer run.
        wait_for(lambda: servers.stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5) is not None,
                 timeout=5, what="the scheduler to answer")
        time.sleep(1.0)
    records = [r for r in caplog.records if r.name.startswith("frenzy.scheduler")]
    lines = [r.getMessage() for r in records]
    assert [r for r in records if r.exc_info] == [], "tracebacks logged during the outage"
    assert len([m for m in lines if "Redis unreachable" in m]) == 1, lines
    again = [m for m in lines if "Redis reachable again after" in m]
    assert len(again) == 1 and float(again[0].split("after ")[1].split(" s")[0]) >= 1.5, lines
    assert len(records) <= 3, lines  # nothing else repeated on every retry
