"""A job read from Redis parses its spec and ranked plans only when something reads them.

An agent's event needs a job's state, attempt, fence and placement; the reaper its state. The
~40 ranked plans cost ``json_format`` milliseconds to parse (issue 15), so ``JobRecord`` keeps
them as stored text until first read. What it hands out then must be exactly what was stored,
and a record built in code (tests, ``StateStore.submit``) behaves as before.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis

from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.records import JobRecord, Stored
from frenzy.state.store import StateStore
from support.state import make_plan, make_spec


def test_plans_and_spec_are_parsed_on_first_read_and_equal_what_was_stored(
        store: StateStore, redis_client: redis.Redis, keys: Keys) -> None:
    plans = [make_plan("A100-80GB", dp=d) for d in (1, 2, 4)]
    spec = make_spec()
    job_id, _ = store.submit(spec, plans, "m", 1)
    job = store.get_many([job_id])[job_id]
    assert job is not None
    assert isinstance(job.__dict__["plans"], Stored)  # not parsed by the read
    assert isinstance(job.__dict__["spec"], Stored)
    assert job.state.value == "PENDING" and job.attempt == 1
    assert job.plans == plans  # parsed now, equal to what went in
    assert job.__dict__["plans"] is job.plans  # and kept: a second read does not parse again
    assert job.spec == spec
    assert job.plan is None
    assert store.get(job_id) == job  # equality reads every field


def test_a_job_with_unreadable_plans_still_serves_the_fields_events_need(
        store: StateStore, redis_client: redis.Redis, keys: Keys) -> None:
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=1)], "m", 1)
    redis_client.hset(keys.job(job_id), "plans", "not json")
    job = store.get(job_id)
    assert job is not None and job.attempt == 1  # the read itself does not fail
    with pytest.raises(ValueError):  # but its plans do not read as plans
        job.plans  # noqa: B018


def test_a_record_built_in_code_and_replaced_keeps_its_values() -> None:
    plan = make_plan("A100-80GB", dp=2)
    job = JobRecord(id="j", state=JobState.RUNNING,
                    seq=1, submitted_at=0.0, attempt=1, model_name="m", parameter_count=0, placement=[],
                    fence=1, pending_reason="", cancel_requested=False, exit_codes={}, log_paths={},
                    spec=make_spec(), plans=[plan], plan=plan)
    moved = dataclasses.replace(job, attempt=2)
    assert moved.plans == [plan] and moved.plan == plan and moved.attempt == 2
    with pytest.raises(TypeError, match="spec"):  # spec, plans and plan stay required
        JobRecord(id="j", state=job.state, seq=1, submitted_at=0.0, attempt=1, model_name="m",  # type: ignore[call-arg]
                  parameter_count=0, placement=[], fence=1, pending_reason="", cancel_requested=False,
                  exit_codes={}, log_paths={})
