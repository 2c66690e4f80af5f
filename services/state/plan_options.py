"""The few numbers HAS needs from a job's stored plans (``has.PlanOption``), read from the plan
message or straight from its stored JSON (the queue read's hot path), a mixed plan's stages as
``PlanOption.parts`` (docs/mixed-plans.md)."""

from __future__ import annotations

from typing import Any

from frenzy.v1 import types_pb2
from has import PlanOption, PlanPart


def plan_to_option(plan: types_pb2.Plan) -> PlanOption:
    """The few numbers HAS needs from a predicted plan: where it runs, what it needs
    per GPU, and how long MARP expects it to take (for completion-time-aware choice)."""
    lay = plan.layout
    parts = tuple(PlanPart(st.index, s.gpu_type, s.gpus, st.tp, s.peak_bytes) for st in plan.stages for s in st.shares)
    return PlanOption(
        gpu_type=plan.gpu_type, tp=lay.tp, pp=lay.pp, dp=lay.dp,
        bytes_per_gpu=min((p.bytes_per_gpu for p in parts), default=plan.peak_bytes_per_gpu),
        runtime_s=plan.completion_s if plan.completion_s > 0 else None, parts=parts,
        cost_usd=plan.cost_usd if plan.cost_usd > 0 else None,
    )


def option_from_json(plan: dict[str, Any]) -> PlanOption:
    """``plan_to_option(json_format.ParseDict(plan, Plan()))`` without building the message.

    The queue reads every waiting job's stored plans (``MessageToDict`` output); protobuf's
    JSON parser spent ~0.3 ms a plan, 16 s for 1,000 jobs of ~46 plans after a restart. This
    reads the proto3 JSON mapping directly: camelCase names (the original names accepted
    too), int64 as strings, fields at their default left out.
    """
    lay = plan.get("layout") or {}
    completion = float(plan.get("completionS", plan.get("completion_s", 0.0)))
    need = int(plan.get("peakBytesPerGpu", plan.get("peak_bytes_per_gpu", 0)))
    cost = float(plan.get("costUsd", plan.get("cost_usd", 0.0)))  # the predictor's dollars (issue 35)
    parts = tuple(  # a mixed plan's stages (docs/mixed-plans.md): each type's ranks per stage
        PlanPart(int(st.get("index", 0)), s.get("gpuType", s.get("gpu_type", "")), int(s.get("gpus", 0)),
                 int(st.get("tp", 0)), int(s.get("peakBytes", s.get("peak_bytes", 0))))
        for st in plan.get("stages") or () for s in st.get("shares") or ()
    )  # fmt: skip
    return PlanOption(
        gpu_type=plan.get("gpuType", plan.get("gpu_type", "")), tp=int(lay.get("tp", 0)), pp=int(lay.get("pp", 0)),
        dp=int(lay.get("dp", 0)), bytes_per_gpu=min((p.bytes_per_gpu for p in parts), default=need),
        runtime_s=completion if completion > 0 else None, parts=parts,
        cost_usd=cost if cost > 0 else None,
    )
