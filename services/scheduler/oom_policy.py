"""What an out-of-memory exit means for a job, decided without I/O: another attempt on a plan
that may fit, or the end of the job with a reason that says what to change.

The agent recognised the exit as out of memory (``frenzy.agent.exit_cause``). Which plans may
still fit is ``has.oom``'s rule (the one the simulator uses too): the failed plan's predicted
share of its GPU's memory becomes the job's threshold, and only plans predicted below it are
tried again — more GPUs, a higher ZeRO stage, recomputation, a smaller micro-batch with the
global batch kept, or a larger GPU, in MARP's ranking order. The candidates are the predictor's
fresh plans for the cluster as it is, or the job's own plans when the predictor is out of reach.
A job gets ``max_oom_retries`` such attempts (JobSpec field, 2 when unset); they do not use up
the attempts a lost node may take (``--max-attempts``).

``SchedulerLoop`` carries the decision out (``requeue_job.lua``, one step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from frenzy.v1 import types_pb2
from has.oom import memory_share, oom_threshold, plans_that_may_fit

DEFAULT_MAX_OOM_RETRIES = 2
GIB = 2**30


@dataclass(frozen=True)
class OomRetry:
    """Queue the next attempt with ``plans`` (ranked, each predicted below ``threshold``)."""

    threshold: float
    plans: list[types_pb2.Plan]
    why: str  # the history reason


@dataclass(frozen=True)
class OomGiveUp:
    """End the job FAILED: no retry left, or no plan left that may fit."""

    threshold: float
    why: str  # the failure reason, with "To fix:"


def max_oom_retries(spec: types_pb2.JobSpec) -> int:
    """The job's limit on out-of-memory retries (``DEFAULT_MAX_OOM_RETRIES`` when it set none)."""
    return spec.max_oom_retries if spec.HasField("max_oom_retries") else DEFAULT_MAX_OOM_RETRIES


def plan_share(plan: types_pb2.Plan) -> float:
    """A plan's predicted peak as a share of its GPU's memory (``has.oom.memory_share``)."""
    return memory_share(max(0, plan.peak_bytes_per_gpu), max(0, plan.gpu_memory_bytes))


def describe_plan(plan: types_pb2.Plan) -> str:
    """``"4 x A100-80GB (tp 2, pp 1, dp 2, ZeRO-1, micro-batch 2, recompute full)"``."""
    lay = plan.layout
    parts = [f"tp {lay.tp}", f"pp {lay.pp}", f"dp {lay.dp}", f"ZeRO-{lay.zero_stage}", f"micro-batch {lay.micro_batch}"]
    if lay.recompute and lay.recompute != "none":
        parts.append(f"recompute {lay.recompute}")
    return f"{plan.num_gpus} x {plan.gpu_type} ({', '.join(parts)})"


def gib(n: int | float) -> str:
    return f"{n / GIB:.1f}"


def decide_oom(failed: types_pb2.Plan, previous_threshold: float | None, observed_peak: int, oom_exits: int,
               max_retries: int, candidates: Sequence[types_pb2.Plan]) -> OomRetry | OomGiveUp:
    """What to do after the job's attempt on ``failed`` ran out of memory.

    ``previous_threshold``: the job's threshold before (None: its first OOM); ``observed_peak``: the
    highest memory per GPU an agent saw (0: not measured); ``oom_exits``: the job's out-of-memory
    exits including this one; ``candidates``: ranked plans to choose from (fresh or the job's own)."""
    if oom_exits < 1 or max_retries < 0:
        raise ValueError(f"decide_oom: need oom_exits >= 1 and max_retries >= 0 (got {oom_exits}, {max_retries})")
    threshold = oom_threshold(previous_threshold, max(0, failed.peak_bytes_per_gpu), max(0, failed.gpu_memory_bytes))
    seen = f"observed {gib(observed_peak)} GiB" if observed_peak > 0 else "observed: not measured"
    head = (f"out of memory on {describe_plan(failed)}: {seen}, predicted {gib(failed.peak_bytes_per_gpu)} GiB "
            f"of {gib(failed.gpu_memory_bytes)} GiB")
    if oom_exits > max_retries:
        return OomGiveUp(threshold, (
            f"{head}; {oom_exits} out-of-memory exits, the job allows {max_retries} re-plans (max_oom_retries). "
            f"To fix: resubmit with --max-oom-retries {max_retries + 1}, or a recipe that needs less memory per GPU "
            "(a smaller --micro-batch, recompute allowed, more GPUs with --max-gpus); `frenzy predict` shows the plans"))
    left = plans_that_may_fit(candidates, threshold, plan_share)
    if not left:
        return OomGiveUp(threshold, (
            f"{head}; re-planned: no plan left that is predicted below {threshold:.0%} of its GPU's memory. "
            "To fix: a recipe that needs less memory per GPU (a smaller --micro-batch or --seq-len, recompute "
            "allowed, ZeRO stage 3), more GPUs (--max-gpus) or larger GPUs in the cluster"))
    return OomRetry(threshold, left, (
        f"{head}; re-planned: {len(left)} plan{'s' if len(left) != 1 else ''} left, next {describe_plan(left[0])}"))
