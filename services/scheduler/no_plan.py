"""Why a submission got no plan, said so the user knows what to change (SubmitJob's refusal).

MARP answers "no plan" for the cluster's GPU types filtered by the job's ``--gpu-type``
(``limits.allowed_gpu_types``), with one line per type it rejected. Three different problems
hide behind an empty answer, and each has its own fix:

* the cluster has no GPU of the types asked for: nothing was planned at all, so MARP's lines
  say nothing; the fix is another ``--gpu-type`` (one the cluster has) or none;
* a type cannot run the job's precision (bf16 on T4 or V100: no bf16 in hardware before
  Ampere): the fix is ``--precision fp16``, not a smaller micro-batch;
* the model does not fit: a smaller micro-batch or sequence, recomputation, larger GPUs.

Pure: the caller passes the cluster's pools and MARP's answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import marp
from frenzy.rpc.convert import PRECISION_BY_NAME

MEMORY_FIX = "lower recipe.micro_batch or recipe.seq_len, allow recompute, or add larger GPUs"


def _canonical(gpu_type: str) -> str:
    try:
        return marp.get_gpu(gpu_type).name
    except ValueError:  # not in the catalog (UnknownGpuError): compared as written
        return gpu_type


def _supports(gpu_type: str, precision: str) -> bool:
    try:
        return marp.get_gpu(gpu_type).supports(precision)
    except ValueError:
        return True  # a type MARP does not know was planned by memory alone: not a precision problem


def fp16_instead(precision: str) -> str:
    """The fp16 policy to use where ``precision`` (a bf16 one) does not run: amp-bf16 -> amp-fp16, else fp16."""
    alt = precision.replace("bf16", "fp16")
    return alt if alt in PRECISION_BY_NAME and alt != precision else "fp16"


def no_plan_reason(model_name: str, precision: str, pools: Sequence[tuple[str, int]], allowed: Sequence[str],
                   rejected: Sequence[str]) -> str:
    """The refusal for a job with no plan (module docstring): ``pools`` are the cluster's (GPU type,
    GPUs) among live nodes, ``allowed`` the job's ``--gpu-type`` list (empty: any), ``rejected``
    MARP's lines, ``precision`` the recipe's policy name (``bf16``, ``amp-bf16``, ...)."""
    # Without live nodes the predictor planned on the catalog (the job would wait for nodes).
    have = ", ".join(f"{n} x {t}" for t, n in pools) or "no live nodes, planned on the GPU catalog"
    types = [t for t, _ in pools]
    wanted = list(dict.fromkeys(_canonical(a) for a in allowed))
    if wanted and types and not set(wanted) & set(types):
        choices = " or ".join(f"--gpu-type {t}" for t in types)
        return (f"spec: no node has {' or '.join(wanted)} (--gpu-type, limits.allowed_gpu_types); the cluster "
                f"has {have}. To fix: submit with {choices}, or without --gpu-type")
    planned = types or wanted or [g.name for g in marp.list_gpus()]
    usable = [t for t in planned if not wanted or t in wanted]
    no_precision = [t for t in usable if not _supports(t, precision)]
    alt = fp16_instead(precision)
    if usable and len(no_precision) == len(usable):
        return (f"spec: {', '.join(no_precision)} cannot run {precision} (no {precision} in hardware; cluster: "
                f"{have}). To fix: submit with --precision {alt} (recipe.precision)"
                + ("" if wanted else ", or add GPUs that run bf16 (Ampere or newer)"))
    why = "; ".join(rejected) or "no layout fits"
    fix = MEMORY_FIX
    if no_precision:
        fix = f"submit with --precision {alt} to use {', '.join(no_precision)} as well, or {fix}"
    return (f"spec: no GPU type in the cluster can hold {model_name} with this recipe (cluster: {have}). "
            f"{why}. To fix: {fix}")


def goal_unmet_reason(dropped: Sequence[str], shown: int = 5) -> str:
    """The refusal for a job whose every plan its goal dropped (issue 35): MARP had plans, but each
    one misses the job's deadline or budget. ``dropped`` holds the predictor's one line per plan
    (``PredictResponse.dropped``, fastest first); the first ``shown`` are quoted."""
    lines = "; ".join(dropped[:shown]) + (f"; and {len(dropped) - shown} more" if len(dropped) > shown else "")
    return (f"spec.goal: no plan meets the job's deadline or budget: {lines}. To fix: raise --deadline "
            "(goal.deadline_s) or --budget (goal.budget_usd), or allow more GPUs or GPU types; "
            "`frenzy predict ... --deadline ... --budget ...` shows each plan's time and cost")
