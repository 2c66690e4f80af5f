"""The parts of a submission that run without Redis: plans rendered once per content, and the
count of jobs admitted while a queue read was in flight."""

from __future__ import annotations

import json

from frenzy.scheduler.service import Admitted, PlansJson
from frenzy.state.store import plans_to_json
from support.state import make_plan


def test_plans_are_rendered_once_per_content_and_as_the_store_writes_them() -> None:
    kept = PlansJson(size=2)
    a = [make_plan("A100-80GB", dp=1), make_plan("A100-80GB", dp=2)]
    first = kept.render(a)
    assert first == plans_to_json(a) and json.loads(first)[1]["numGpus"] == 2
    assert kept.render([make_plan("A100-80GB", dp=1), make_plan("A100-80GB", dp=2)]) is first  # same content
    other = kept.render([make_plan("H100-80GB")])
    assert other != first and json.loads(other)[0]["gpuType"] == "H100-80GB"
    kept.render([make_plan("L4")])  # size 2: the oldest is dropped, and rendered again when asked
    assert kept.render(a) == first and kept.render(a) is not first


def test_a_write_in_flight_counts_until_it_is_recorded_by_when_it_ended() -> None:
    admitted = Admitted(keep_s=10.0)
    admitted.begin("alice")
    assert admitted.inflight("alice") == 1 and admitted.inflight("bob") == 0
    admitted.end("alice", "job-1")
    assert admitted.inflight("alice") == 0
    assert admitted.since("alice", 0.0) == 1 and admitted.since("bob", 0.0) == 0
    admitted.begin("alice")
    admitted.end("alice", None)  # refused or a duplicate: nothing new queued
    assert admitted.since("alice", 0.0) == 1


def test_a_job_the_queue_read_saw_is_not_counted_twice() -> None:
    """A write that returned after the read began, whose job the read nevertheless saw, is counted
    by the read only: a user at the quota's edge is not refused for a job counted twice."""
    admitted = Admitted(keep_s=10.0)
    for job_id in ("job-1", "job-2"):
        admitted.begin("alice")
        admitted.end("alice", job_id)
    assert admitted.since("alice", 0.0, frozenset({"job-1"})) == 1
    assert admitted.since("alice", 0.0, frozenset({"job-1", "job-2"})) == 0
