"""The job record and its codec live apart from the store (frenzy.state.records): the scheduler's
pure deciders read jobs without loading the store or a Redis client, and a job hash decodes the
same without Redis (the store only reads the hashes)."""

from __future__ import annotations

import json
import subprocess
import sys

from frenzy.state.job_states import JobState
from frenzy.state.records import NodeRecord, decode_job, decode_node, fraction, history_entry


def test_the_pure_deciders_load_neither_the_store_nor_redis() -> None:
    code = ("import sys, frenzy.scheduler.reaping, frenzy.scheduler.agent_events, frenzy.state.records; "
            "print(sorted(m for m in ('frenzy.state.store', 'redis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_job_hash_decodes_with_its_defaults_and_history() -> None:
    raw = {"id": "job-1", "state": "RUNNING", "attempt": "2", "fence": "7", "placement": json.dumps([["a", [0, 1]]]),
           "exit:a": "0", "pid:a": "42", "log:a": "/l", "prev_nodes": "a,b", "preemptions": "1",
           "attempt:1": json.dumps({"attempt": 1, "cause": "oom"}), "attempt:x": "not json", "done_fraction": "2"}
    job = decode_job(raw, [history_entry(JobState.PENDING, "submitted", 1.0)])
    assert (job.id, job.state, job.attempt, job.fence, job.placement) == ("job-1", JobState.RUNNING, 2, 7,
                                                                          [("a", [0, 1])])
    assert (job.exit_codes, job.pids, job.log_paths) == ({"a": 0}, {"a": 42}, {"a": "/l"})
    assert (job.previous_nodes, job.preemptions, job.oom_exits) == (("a", "b"), 1, 1)
    assert job.max_attempts == 0 and job.done_fraction == 0.0  # absent; out of [0, 1): none
    assert job.history == [{"state": "PENDING", "at": 1.0, "reason": "submitted"}]
    assert job.plans == [] and job.plan is None  # nothing stored: parsed on read as empty


def test_a_stored_fraction_outside_0_to_1_or_garbage_reads_as_none() -> None:
    assert [fraction(v) for v in (None, "", "0.25", "1", "-0.1", "lots")] == [0.0, 0.0, 0.25, 0.0, 0.0, 0.0]


def test_a_node_and_its_gpus_decode_from_their_hashes_and_garbage_reads_as_unknown() -> None:
    node = decode_node({"name": "a", "addr": "10.0.0.1", "draining": "1", "heartbeat_at": "12.50",
                        "refused_launches": "x"}, True,
                       [{"index": "1", "type": "L4", "memory_total": "100", "memory_free": "lots", "owner": "j",
                         "fence": "07", "healthy": "0", "utilization": "0", "type_from_memory": "1"},
                        {"owner": "k"}])
    assert (node.name, node.alive, node.addr, node.draining, node.dead_at) == ("a", True, "10.0.0.1", True, "")
    assert node.heartbeat_at == "12.50" and node.refused_launches == 0  # as written; unreadable: 0
    g, bare = node.gpus
    assert (g.index, g.gpu_type, g.memory_total, g.memory_free, g.owner, g.fence) == (1, "L4", 100, 0, "j", "07")
    assert (g.healthy, g.utilization, g.type_from_memory, g.processes, g.links) == (False, 0, True, "[]", "{}")
    assert (bare.index, bare.owner, bare.fence, bare.healthy, bare.utilization) == (-1, "k", None, True, -1)
    assert decode_node({}, False, []) == NodeRecord("", False)
