"""The attempt limit against a real Redis, where its exceptions meet: a stop by HAS (preemption, the
long-job stop) and an out-of-memory re-plan never use up one of the job's attempts, each alone and
one after the other; a lost node does. Agents are played by their events, as in test_oom_replan.py.
"""

from __future__ import annotations

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import EventKind
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2
from support.placed import event
from support.state import GiB, add_node, make_spec

HOUR = 3600.0


def _plan(peak_gib: int, gpus: int, runtime_s: float, recompute: str = "none") -> types_pb2.Plan:
    return types_pb2.Plan(gpu_type="A100-80GB", num_gpus=gpus, peak_bytes_per_gpu=peak_gib * GiB,
                          gpu_memory_bytes=80 * GiB, completion_s=runtime_s,
                          layout=types_pb2.Layout(tp=1, pp=1, dp=gpus, zero_stage=1, micro_batch=2, grad_accum=1,
                                                  recompute=recompute), step_time_s=1.0, gpu_hours=1.0, rank=1)


def _running(loop: SchedulerLoop, job_id: str) -> JobRecord:
    """Place the job's current attempt (one tick) and report it RUNNING on node a."""
    assert loop.tick().placed == [job_id]
    job = loop.store.get(job_id)
    assert job is not None
    loop.handle_event(event(job, EventKind.RUNNING, pid=100))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.RUNNING
    return job


def test_a_job_with_one_attempt_replanned_after_an_oom_and_then_stopped_is_queued_again(
        redis_client: redis.Redis, keys: Keys) -> None:
    """--max-attempts 1: the first attempt runs out of memory and is re-planned (attempt 2, not
    counted); the second is stopped by the long-job rule for a burst of short jobs (attempt 3, not
    counted either). It waits in the queue to resume, never failed "no retries left"."""
    add_node(redis_client, keys, "a", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, max_attempts=3)
    spec = make_spec("long")
    spec.resumable = True
    job_id, _ = loop.store.submit(spec, [_plan(60, 8, 10 * HOUR), _plan(40, 8, 12 * HOUR, "full")], "gpt2-124m", 1,
                                  max_attempts=1)
    job = _running(loop, job_id)
    loop.handle_event(event(job, EventKind.EXITED, exit_code=1, cause="oom", peak_bytes_per_gpu=79 * GiB))
    job = loop.store.get(job_id)
    assert job is not None and (job.state, job.attempt, job.oom_exits) == (JobState.PENDING, 2, 1)
    assert [p.peak_bytes_per_gpu // GiB for p in job.plans] == [40]

    _running(loop, job_id)
    shorts = [loop.store.submit(make_spec(f"short{i}"), [_plan(10, 2, 0.1 * HOUR)], "gpt2-124m", 1)[0]
              for i in range(4)]
    report = loop.tick()
    assert [s.split(" for ")[0] for s in report.preempted] == [job_id]
    job = loop.store.get(job_id)
    assert job is not None
    assert (job.state, job.attempt, job.preemptions) == (JobState.PENDING, 3, 1), job.history[-1]
    assert "no retries left" not in job.history[-1]["reason"]
    # Both ends uncounted: one attempt of its own, two more for the re-plan and the stop.
    assert job.to_proto().max_attempts == 3
    assert job.history[-1]["reason"].startswith("requeued for attempt 3 of 3: stopped for ")
    assert all(loop.store.get(s).state == JobState.PENDING for s in shorts)  # type: ignore[union-attr]


def test_a_lost_node_after_an_oom_replan_and_a_stop_uses_the_one_attempt(redis_client: redis.Redis,
                                                                          keys: Keys) -> None:
    """The same job, its third attempt (the first counted one since the first) lost with its node:
    --max-attempts 1 is used up now, it fails naming the node."""
    add_node(redis_client, keys, "a", "A100-80GB", 8)
    loop = SchedulerLoop(redis_client, keys, max_attempts=3)
    job_id, _ = loop.store.submit(make_spec("j"), [_plan(60, 8, HOUR), _plan(40, 8, HOUR, "full")], "gpt2-124m", 1,
                                  max_attempts=1)
    job = _running(loop, job_id)
    loop.handle_event(event(job, EventKind.EXITED, exit_code=1, cause="oom", peak_bytes_per_gpu=79 * GiB))
    second = _running(loop, job_id)
    assert loop.preempt(job_id, "someone-shorter")
    job = loop.store.get(job_id)
    assert job is not None and (job.state, job.attempt) == (JobState.PENDING, 3)
    loop.handle_event(event(second, EventKind.EXITED, exit_code=-15, cancelled=True))  # its GPUs back
    job = _running(loop, job_id)
    assert loop.requeue(job, ["a"], "node a lost") == JobState.FAILED.value
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert job.history[-1]["reason"].endswith("attempt 3 of 3, no retries left")
