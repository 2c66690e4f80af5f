"""The live scheduler feeds HAS what completion-time-aware choice needs:
each plan's expected runtime, and when busy GPUs are expected to free up."""

from __future__ import annotations

import time

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from has import QueuePolicy
from support.state import add_node, make_plan, make_spec, set_gpu


def test_reservation_records_expected_end_and_cluster_reports_free_at(
    redis_client: redis.Redis, keys: Keys,
) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 2)
    loop = SchedulerLoop(redis_client, keys)
    assert loop.policy == QueuePolicy.frenzy()
    plan = make_plan("A100-80GB", dp=2)
    plan.completion_s = 3600.0
    job_id, _ = loop.store.submit(make_spec(), [plan], "gpt2-124m", 1)
    assert loop.store.queue().jobs[0].plans[0].runtime_s == 3600.0
    before = time.time()
    report = loop.tick()
    assert report.placed == [job_id]
    assert loop.store.get(job_id).state == JobState.LAUNCHING
    est_end = float(redis_client.hget(keys.job(job_id), "est_end"))
    assert before + 3600 <= est_end <= time.time() + 3600
    slots = [g for n in loop.store.cluster().view.nodes for g in n.gpus]
    assert {g.owner for g in slots} == {job_id}
    assert {g.free_at for g in slots} == {est_end}


def test_completion_aware_policy_waits_for_a_fast_gpu_instead_of_a_slow_one(
    redis_client: redis.Redis, keys: Keys,
) -> None:
    """A100 busy for another minute; the same job on the L4 would take 10x longer:
    the live loop waits for the A100 (the paper's HAS would start on the L4 now)."""
    add_node(redis_client, keys, "a-0", "A100-80GB", 1)
    add_node(redis_client, keys, "l4-0", "L4", 1, memory=23 * 1024**3)
    set_gpu(redis_client, keys, "a-0", 0, owner="job-busy")
    redis_client.hset(keys.job("job-busy"), mapping={"id": "job-busy", "state": "RUNNING",
                                                     "est_end": repr(time.time() + 60)})
    fast, slow = make_plan("A100-80GB"), make_plan("L4", peak=10 * 1024**3)
    fast.completion_s, slow.completion_s = 600.0, 6000.0
    live = SchedulerLoop(redis_client, keys)
    job_id, _ = live.store.submit(make_spec(), [fast, slow], "m", 1)
    assert live.tick().placed == []
    assert live.store.get(job_id).state == JobState.PENDING
    paper = SchedulerLoop(redis_client, keys, QueuePolicy())
    assert paper.tick().placed == [job_id]
    assert live.store.get(job_id).placement == [("l4-0", [0])]
