"""Out-of-memory exits against a real Redis: the loop re-plans the job on plans that may fit and
queues the next attempt in one step, keeps each attempt's plan, cause, last lines and observed
peak, and fails the job past max_oom_retries or when no plan is left. Agents are played by their
events (tests/e2e runs real ones)."""

from __future__ import annotations

import pytest
import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2
from support.placed import event, run_on
from support.state import GiB, add_node, make_spec

OOM_TAIL = ["  File \"train.py\", line 3, in <module>",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.15 GiB of which 1.23 GiB is free."]


def plan(peak_gib: int, gpus: int, recompute: str = "none") -> types_pb2.Plan:
    return types_pb2.Plan(gpu_type="A100-80GB", num_gpus=gpus, peak_bytes_per_gpu=peak_gib * GiB,
                          gpu_memory_bytes=80 * GiB,
                          layout=types_pb2.Layout(tp=1, pp=1, dp=gpus, zero_stage=1, micro_batch=2, grad_accum=1,
                                                  recompute=recompute), step_time_s=1.0, gpu_hours=1.0, rank=1)


PLANS = [plan(60, 1), plan(64, 2), plan(50, 2), plan(40, 2, "full")]


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    return SchedulerLoop(redis_client, keys, dead_after_s=5.0, max_attempts=3, master_ports=(30100, 30103))


def submit(loop: SchedulerLoop, max_oom_retries: int | None = None) -> str:
    spec = make_spec("oom")
    if max_oom_retries is not None:
        spec.max_oom_retries = max_oom_retries
    job_id, _ = loop.store.submit(spec, PLANS, "gpt2-124m", 1, max_attempts=3)
    return job_id


def oom(job: JobRecord, peak: int = 79 * GiB) -> AgentEvent:
    return event(job, EventKind.EXITED, exit_code=1, cause="oom", tail=OOM_TAIL, peak_bytes_per_gpu=peak)


def owners(client: redis.Redis, keys: Keys) -> list[str]:
    return [client.hget(keys.gpu("a", i), "owner") for i in range(2)]


def test_an_oom_requeues_on_plans_that_may_fit_and_the_next_attempt_succeeds(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    job_id = submit(loop)
    job = run_on(loop, job_id, PLANS[0])
    loop.handle_event(oom(job))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.PENDING and job.attempt == 2
    # 60 of 80 GiB failed: the 64 GiB plan is out with it; the 50 and 40 GiB plans stay, in order.
    assert [p.peak_bytes_per_gpu // GiB for p in job.plans] == [50, 40]
    assert job.oom_threshold == pytest.approx(0.75)
    assert owners(redis_client, keys) == ["", ""]  # the failed node's GPUs are free at once
    reason = job.history[-1]["reason"]
    assert reason.startswith("requeued for attempt 2 of 4: out of memory on 1 x A100-80GB (tp 1, pp 1, dp 1, ZeRO-1, "
                             "micro-batch 2): observed 79.0 GiB, predicted 60.0 GiB of 80.0 GiB; re-planned: 2 plans "
                             "left, next 2 x A100-80GB")
    (first,) = job.attempts
    assert first["cause"] == "oom" and first["exit_code"] == 1 and first["node"] == "a"
    assert first["observed_peak_bytes"] == 79 * GiB and first["predicted_peak_bytes"] == 60 * GiB
    assert first["tail"].split("\n") == OOM_TAIL and first["outcome"].startswith("requeued: out of memory")

    job = run_on(loop, job_id, job.plans[0])
    loop.handle_event(event(job, EventKind.EXITED, exit_code=0, peak_bytes_per_gpu=47 * GiB))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.SUCCEEDED
    assert [(a["attempt"], a["num_gpus"], a.get("cause", ""), a["outcome"]) for a in job.attempts] == [
        (1, 1, "oom", first["outcome"]), (2, 2, "", "succeeded")]
    proto = job.to_proto()
    assert [a.observed_peak_bytes // GiB for a in proto.attempts] == [79, 47]
    assert [a.predicted_peak_bytes // GiB for a in proto.attempts] == [60, 50]
    assert list(proto.attempts[0].tail) == OOM_TAIL and proto.oom_threshold == pytest.approx(0.75)
    assert owners(redis_client, keys) == ["", ""]


def test_an_oom_every_time_fails_after_max_oom_retries(loop: SchedulerLoop, redis_client: redis.Redis,
                                                        keys: Keys) -> None:
    job_id = submit(loop, max_oom_retries=1)
    job = run_on(loop, job_id, PLANS[0])
    loop.handle_event(oom(job))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.PENDING
    job = run_on(loop, job_id, job.plans[0])
    loop.handle_event(oom(job, peak=0))  # not measured this time
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.FAILED and job.attempt == 2
    reason = job.history[-1]["reason"]
    assert "out of memory on 2 x A100-80GB" in reason and "observed: not measured" in reason
    assert "2 out-of-memory exits, the job allows 1 re-plans" in reason and "To fix:" in reason
    assert [a["cause"] for a in job.attempts] == ["oom", "oom"]
    assert job.attempts[-1]["outcome"].startswith("failed: out of memory")
    assert job.oom_threshold == pytest.approx(50 / 80)
    assert owners(redis_client, keys) == ["", ""]


def test_no_plan_left_fails_at_once(loop: SchedulerLoop) -> None:
    job_id = submit(loop)
    job = run_on(loop, job_id, PLANS[3])  # the smallest plan ran out of memory: nothing below it
    loop.handle_event(oom(job))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert "no plan left that is predicted below 50% of its GPU's memory" in job.history[-1]["reason"]


def test_fresh_plans_from_the_predictor_are_filtered_and_a_later_node_loss_keeps_the_threshold(
        loop: SchedulerLoop) -> None:
    fresh = [plan(70, 1), plan(45, 2), plan(30, 2, "full")]
    loop.replan = lambda job: list(fresh)
    job_id = submit(loop)
    job = run_on(loop, job_id, PLANS[0])
    loop.handle_event(oom(job))
    job = loop.store.get(job_id)
    assert job is not None and [p.peak_bytes_per_gpu // GiB for p in job.plans] == [45, 30]
    # A node loss re-plans again: what the OOM ruled out stays out.
    job = run_on(loop, job_id, job.plans[0])
    assert loop.requeue(job, ["a"], "node a lost") == JobState.PENDING.value
    job = loop.store.get(job_id)
    assert job is not None and [p.peak_bytes_per_gpu // GiB for p in job.plans] == [45, 30]
    assert [(a["attempt"], a["cause"]) for a in job.attempts] == [(1, "oom"), (2, "node lost")]


def test_an_ordinary_failure_keeps_its_cause_and_last_lines(loop: SchedulerLoop) -> None:
    job_id = submit(loop)
    job = run_on(loop, job_id, PLANS[0])
    loop.handle_event(event(job, EventKind.EXITED, exit_code=-9, cause="signal 9 (SIGKILL)", tail=["step 3"]))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.FAILED and job.attempt == 1
    (rec,) = job.to_proto().attempts
    assert (rec.cause, rec.exit_code, list(rec.tail), rec.outcome) == ("signal 9 (SIGKILL)", -9, ["step 3"], "failed")
