"""Jobs as JSON for people and scripts, one serializer for the CLI and the HTTP API.

* ``job_list``: ``{"jobs": [row, ...]}``, what ``GET /api/jobs`` returns and ``frenzy jobs --json``
  prints. A row (``job_row``) is what a jobs table shows: id, name, user (who submitted it), state
  (short name), pending reason, priority, model name and size, seq_len, global_batch, attempt,
  submitted_at, the chosen plan flattened (GPU type and count, tp/pp/dp, ZeRO stage, micro-batch,
  recompute, peak bytes per GPU, step time; null before placement), the placement and the exit codes.
  ``GET /api/jobs?user=&name=&since=`` and `frenzy jobs --user/--name/--since` narrow the same list.
* ``job_detail``: ``GET /api/jobs/{id}``: the row, ``memory`` (below) and ``job``, the whole record
  (``frenzy.rpc.protojson``: proto field names, enums by short name, 64-bit integers as numbers),
  which is what ``frenzy job ID --json`` prints.
* ``attempt_memory``: one attempt's memory as ``frenzy accuracy`` compares it -- MARP's predicted
  peak per GPU for the plan it ran with against the peak an agent observed (NVML on real GPUs,
  what the job declared on fake ones), and ``error``, observed / predicted - 1 (None until
  observed). The dashboard's job view shows these rows (``GET /api/jobs/{id}``'s ``memory``) and
  ``frenzy accuracy`` averages the same ratio (``memory_ratio``) by model, GPU type and layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from frenzy.rpc.protojson import to_json
from frenzy.v1 import types_pb2


def job_row(job: types_pb2.Job) -> dict[str, Any]:
    """One job as a jobs table shows it (module docstring), without the candidate plans."""
    plan = None
    if job.HasField("plan"):
        p, lay = job.plan, job.plan.layout
        plan = {"gpu_type": p.gpu_type, "num_gpus": p.num_gpus, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp,
                "zero_stage": lay.zero_stage, "micro_batch": lay.micro_batch, "recompute": lay.recompute,
                "peak_bytes_per_gpu": int(p.peak_bytes_per_gpu), "step_time_s": p.step_time_s}
    return {
        "id": job.id,
        "name": job.spec.name,
        "user": job.user,
        "state": types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_"),
        "pending_reason": job.pending_reason,
        "priority": job.spec.priority,
        "resumable": job.spec.resumable,
        "model_name": job.model_name or job.spec.model.catalog_name or job.spec.model.display_name,
        "parameter_count": int(job.parameter_count),
        "seq_len": int(job.spec.recipe.seq_len),
        "global_batch": int(job.spec.recipe.global_batch),
        "attempt": job.attempt,
        "submitted_at": job.submitted_at,
        "plan": plan,
        "placement": [{"node": a.node, "gpu_indices": list(a.gpu_indices)} for a in job.placement],
        "exit_codes": dict(job.exit_codes),
    }


def job_list(jobs: Iterable[types_pb2.Job]) -> dict[str, Any]:
    """``{"jobs": [row, ...]}``: GET /api/jobs and `frenzy jobs --json`."""
    return {"jobs": [job_row(j) for j in jobs]}


def job_detail(job: types_pb2.Job) -> dict[str, Any]:
    """GET /api/jobs/{id}: the row, each attempt's predicted against observed peak memory per GPU
    (``memory``: what `frenzy accuracy` compares; the dashboard's job view shows it) and the whole
    record (``job``: what `frenzy job ID --json` prints)."""
    return {**job_row(job), "memory": [attempt_memory(a) for a in job.attempts], "job": to_json(job)}


def memory_ratio(attempt: types_pb2.Attempt) -> float | None:
    """Observed / predicted peak per GPU, or None when either is unknown."""
    if attempt.observed_peak_bytes <= 0 or attempt.predicted_peak_bytes <= 0:
        return None
    return attempt.observed_peak_bytes / attempt.predicted_peak_bytes


def attempt_memory(attempt: types_pb2.Attempt) -> dict[str, Any]:
    """One attempt's plan and its predicted against observed peak memory per GPU (bytes)."""
    lay = attempt.layout
    ratio = memory_ratio(attempt)
    return {
        "attempt": attempt.attempt,
        "gpu_type": attempt.gpu_type,
        "num_gpus": attempt.num_gpus,
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero_stage": lay.zero_stage,
                   "micro_batch": lay.micro_batch, "recompute": lay.recompute},
        "predicted_peak_bytes": int(attempt.predicted_peak_bytes),
        "observed_peak_bytes": int(attempt.observed_peak_bytes),
        "gpu_memory_bytes": int(attempt.gpu_memory_bytes),
        "error": None if ratio is None else ratio - 1.0,
        "cause": attempt.cause,
        "outcome": attempt.outcome,
    }
