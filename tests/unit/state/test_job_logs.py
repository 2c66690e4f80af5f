"""Which log streams a job's reader reads (frenzy.state.job_logs): pure, no Redis."""

from __future__ import annotations

import json

from frenzy.state.acl import RedisRole, role_rules
from frenzy.state.job_logs import entry_order, placed_nodes, sources
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.records import decode_job, history_entry


def _job(**fields: str) -> dict[str, str]:
    return {"id": "job-1", "state": "RUNNING", "attempt": "3", **fields}


def test_every_node_of_every_attempt_is_read_and_no_other() -> None:
    history = [history_entry(JobState.PENDING, "submitted"),
               history_entry(JobState.RESERVED, "2 x A100-80GB on n1, n2"),
               history_entry(JobState.PENDING, "requeued for attempt 2 of 3: node n2 lost on n9"),
               history_entry(JobState.RESERVED, "1 x L4 on n3"),
               history_entry(JobState.RESERVED, "1 x L4 on bad name, ../x")]
    raw = _job(placement=json.dumps([["n4", [0]]]), prev_nodes="n3,n5", **{"log:n6": "/x", "exit:n7": "0"})
    raw["attempt:1"] = json.dumps({"attempt": 1, "node": "n8", "peak_node": "n1"})
    nodes = placed_nodes(decode_job(raw, history))
    assert nodes == ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"]  # (not n9: a PENDING reason)
    keys = Keys("fz")
    srcs = sources(keys, decode_job(raw, history), node="n3")
    assert [(s.key, s.node) for s in srcs] == [("fz:node:n3:logs:job-1", "n3"), ("fz:logs:job-1", "")]


def test_entry_ids_order_by_time_then_sequence() -> None:
    ids = ["1700000000001-0", "1700000000000-12", "1700000000000-2", "9-0"]
    assert sorted(ids, key=entry_order) == ["9-0", "1700000000000-2", "1700000000000-12", "1700000000001-0"]
    assert entry_order("junk") == (0, 0)


def test_an_agents_log_keys_are_its_nodes_alone() -> None:
    """The pattern puts the node first: another node's key never matches, whatever the names."""
    import fnmatch

    keys = Keys("fz")
    pattern = next(r for r in role_rules(RedisRole.AGENT, "fz", "a") if ":logs:" in r)[1:]
    assert pattern == "fz:node:a:logs:*"
    mine = [keys.job_logs("job-1", "a"), keys.job_log_offsets("job-1", "a")]
    others = [keys.job_logs("job-1", "b"), keys.job_log_offsets("job-1", "b"), keys.job_logs("job-1", "ba"),
              keys.job_logs("a", "offsets"), keys.legacy_job_logs("job-1"), keys.legacy_job_log_offsets("job-1"),
              keys.legacy_job_log_offsets("a")]
    assert all(fnmatch.fnmatchcase(k, pattern) for k in mine)
    assert not [k for k in others if fnmatch.fnmatchcase(k, pattern)]
    assert "~fz:node:a\\*:logs:*" in role_rules(RedisRole.AGENT, "fz", "a*")  # (a name's glob characters escaped)
