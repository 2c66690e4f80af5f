"""The live loop hands HAS each job's goal (issue 35): the stored spec's deadline and objective and
the stored plans' dollars. A job of objective cost starts on its cheapest plan that meets the
deadline; a job whose deadline can no longer be met is flagged once per attempt (a history note,
the job hash, the counter) and still runs, late."""

from __future__ import annotations

import time

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.v1 import types_pb2
from support.state import add_node, make_plan, make_spec


def plan(gpu_type: str, dp: int, completion_s: float, cost_usd: float) -> types_pb2.Plan:
    p = make_plan(gpu_type, dp=dp)
    p.completion_s, p.cost_usd = completion_s, cost_usd
    return p


def test_objective_cost_starts_the_cheapest_plan_that_meets_the_deadline(redis_client: redis.Redis,
                                                                         keys: Keys) -> None:
    add_node(redis_client, keys, "a100", "A100-80GB", 4)
    add_node(redis_client, keys, "l4", "L4", 4)
    loop = SchedulerLoop(redis_client, keys, master_ports=(30100, 30110))
    fast, cheap, too_slow = plan("A100-80GB", 4, 3600, 50.0), plan("L4", 4, 7200, 20.0), plan("L4", 2, 90000, 10.0)
    spec = make_spec("cheap")
    spec.goal.objective = types_pb2.OBJECTIVE_COST
    spec.goal.deadline_s = 4 * 3600.0
    job_id, _ = loop.store.submit(spec, [fast, cheap, too_slow], "gpt2-124m", 1)
    assert loop.tick().placed == [job_id]
    job = loop.store.get(job_id)
    assert job.plan.gpu_type == "L4" and job.plan.num_gpus == 4, job.plan  # not the faster A100s, not the 25 h one

    plain_id, _ = loop.store.submit(make_spec("plain"), [fast, cheap], "gpt2-124m", 1)
    assert loop.tick().placed == [plain_id]
    assert loop.store.get(plain_id).plan.gpu_type == "A100-80GB"  # no goal: MARP's order, as before


def test_a_missed_deadline_is_flagged_once_and_the_job_still_runs(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "small", "A100-80GB", 2)
    loop = SchedulerLoop(redis_client, keys, master_ports=(30120, 30130))
    spec = make_spec("late")
    spec.goal.deadline_s = 60.0  # its only plan runs an hour: missed from the start
    job_id, _ = loop.store.submit(spec, [plan("A100-80GB", 4, 3600, 40.0)], "gpt2-124m", 1)
    before = loop.metrics.deadline_missed._value.get()
    for _ in range(3):
        assert loop.tick(now=time.time()).placed == []  # 4 GPUs asked, 2 here: it waits
    job = loop.store.get(job_id)
    assert redis_client.hget(keys.job(job_id), "deadline_missed_attempt") == "1"
    notes = [h for h in job.history if "deadline can no longer be met" in h.get("reason", "")]
    assert len(notes) == 1 and job.state == JobState.PENDING
    assert loop.metrics.deadline_missed._value.get() == before + 1

    add_node(redis_client, keys, "more", "A100-80GB", 2)
    assert loop.tick().placed == [job_id]  # late, flagged, but run
    assert len([h for h in loop.store.get(job_id).history if "deadline" in h.get("reason", "")]) == 1
