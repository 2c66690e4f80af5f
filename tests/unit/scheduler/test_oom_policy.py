"""oom_policy: what an out-of-memory exit means for a job (pure, no Redis)."""

from __future__ import annotations

import pytest

from frenzy.scheduler.agent_events import Exited, interpret
from frenzy.scheduler.oom_policy import (
    DEFAULT_MAX_OOM_RETRIES,
    OomGiveUp,
    OomRetry,
    decide_oom,
    describe_plan,
    max_oom_retries,
)
from frenzy.state.job_states import JobState
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2

GiB = 2**30


def plan(peak_gib: float, gpus: int = 1, gpu: str = "A100-80GB", memory_gib: int = 80, mb: int = 4,
         recompute: str = "none") -> types_pb2.Plan:
    return types_pb2.Plan(gpu_type=gpu, num_gpus=gpus, peak_bytes_per_gpu=int(peak_gib * GiB),
                          gpu_memory_bytes=memory_gib * GiB,
                          layout=types_pb2.Layout(tp=1, pp=1, dp=gpus, zero_stage=1, micro_batch=mb, grad_accum=1,
                                                  recompute=recompute))


# MARP's ranking: the cheapest plan first; the failed one was predicted at 60 of 80 GiB (75 %).
RANKED = [plan(60), plan(64, mb=8), plan(50, gpus=2), plan(40, gpus=2, recompute="full"), plan(30, gpu="L4", memory_gib=24),
          plan(70, gpu="H100-80GB")]


def test_first_oom_keeps_only_plans_predicted_below_the_failed_share_in_ranked_order() -> None:
    d = decide_oom(RANKED[0], None, 79 * GiB, 1, 2, RANKED)
    assert isinstance(d, OomRetry)
    assert d.threshold == pytest.approx(60 / 80)
    # 64/80 and 70/80 (and the failed plan itself) are out; the L4 plan at 30/24 GiB > 100 % is out too.
    assert [(p.gpu_type, p.num_gpus, p.peak_bytes_per_gpu // GiB) for p in d.plans] == [
        ("A100-80GB", 2, 50), ("A100-80GB", 2, 40)]
    assert d.why == ("out of memory on 1 x A100-80GB (tp 1, pp 1, dp 1, ZeRO-1, micro-batch 4): observed 79.0 GiB, "
                     "predicted 60.0 GiB of 80.0 GiB; re-planned: 2 plans left, next 2 x A100-80GB (tp 1, pp 1, dp 2, "
                     "ZeRO-1, micro-batch 4)")


def test_a_second_oom_keeps_the_smaller_threshold() -> None:
    d = decide_oom(plan(50, gpus=2), 0.75, 0, 2, 2, RANKED)
    assert isinstance(d, OomRetry)
    assert d.threshold == pytest.approx(50 / 80)
    assert [p.peak_bytes_per_gpu // GiB for p in d.plans] == [40]
    assert "observed: not measured" in d.why and "1 plan left" in d.why


def test_past_the_retry_limit_the_job_fails_saying_how_to_fix_it() -> None:
    d = decide_oom(plan(40, gpus=2, recompute="full"), 0.625, 0, 3, 2, RANKED)
    assert isinstance(d, OomGiveUp)
    assert "3 out-of-memory exits, the job allows 2 re-plans" in d.why and "To fix: resubmit with --max-oom-retries 3" in d.why
    d = decide_oom(RANKED[0], None, 0, 1, 0, RANKED)  # max_oom_retries 0: no re-plan at all
    assert isinstance(d, OomGiveUp) and "allows 0 re-plans" in d.why


def test_no_plan_left_fails_with_the_threshold() -> None:
    d = decide_oom(plan(20, gpus=8), None, 0, 1, 2, RANKED)  # 25 %: every candidate needs more
    assert isinstance(d, OomGiveUp)
    assert "no plan left that is predicted below 25% of its GPU's memory" in d.why and "To fix:" in d.why


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="oom_exits >= 1"):
        decide_oom(RANKED[0], None, 0, 0, 2, RANKED)


def test_max_oom_retries_defaults_to_two() -> None:
    assert max_oom_retries(types_pb2.JobSpec()) == DEFAULT_MAX_OOM_RETRIES == 2
    assert max_oom_retries(types_pb2.JobSpec(max_oom_retries=0)) == 0
    assert describe_plan(plan(1, gpus=4, recompute="full")).endswith("micro-batch 4, recompute full)")


def _job(**kw: object) -> JobRecord:
    base = dict(id="job-1", state=JobState.RUNNING, seq=1, submitted_at=0.0, attempt=1, spec=types_pb2.JobSpec(),
                plans=list(RANKED), model_name="m", parameter_count=1, plan=RANKED[0], placement=[("a", [0]), ("b", [0])],
                fence=7, pending_reason="", cancel_requested=False, exit_codes={}, log_paths={})
    base.update(kw)
    return JobRecord(**base)  # type: ignore[arg-type]


def _exit(node: str = "a", code: int = 1, cause: str = "oom", **kw: object) -> AgentEvent:
    return AgentEvent(kind=EventKind.EXITED, job_id="job-1", attempt=1, node=node, fence=7, exit_code=code,
                      cause=cause, tail=["torch.OutOfMemoryError: CUDA out of memory."], peak_bytes_per_gpu=5 * GiB,
                      **kw)  # type: ignore[arg-type]


def test_interpret_marks_an_attempts_first_oom_for_re_planning() -> None:
    m = interpret(_exit(), _job())
    assert isinstance(m, Exited) and m.oom and m.cause == "oom" and m.peak == 5 * GiB
    assert m.reason == "a exited with code 1: out of memory" and m.tail == ("torch.OutOfMemoryError: CUDA out of memory.",)
    # Not when something else ended the attempt first, or it was stopped, or it is not an OOM.
    assert not interpret(_exit(), _job(failed_node="b")).oom  # type: ignore[union-attr]
    assert not interpret(_exit(), _job(cancel_requested=True)).oom  # type: ignore[union-attr]
    assert not interpret(_exit(), _job(stop_requested=True)).oom  # type: ignore[union-attr]
    assert not interpret(_exit(cancelled=True), _job()).oom  # type: ignore[union-attr]
    other = interpret(_exit(cause="signal 9 (SIGKILL)", code=-9), _job())
    assert isinstance(other, Exited) and not other.oom and other.reason == "a exited with code -9: signal 9 (SIGKILL)"
    plain = interpret(_exit(cause="exit code 2", code=2), _job())
    assert isinstance(plain, Exited) and plain.reason == "a exited with code 2"
