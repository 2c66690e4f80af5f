"""Jobs as JSON for people and scripts, one serializer for the CLI and the HTTP API.

* ``attempt_memory``: one attempt's memory as ``frenzy accuracy`` compares it -- MARP's predicted
  peak per GPU for the plan it ran with against the peak an agent observed (NVML on real GPUs,
  what the job declared on fake ones), and ``error``, observed / predicted - 1 (None until
  observed). The dashboard's job view shows these rows (``GET /api/jobs/{id}``'s ``memory``) and
  ``frenzy accuracy`` averages the same ratio (``memory_ratio``) by model, GPU type and layout.
"""

from __future__ import annotations

from typing import Any

from frenzy.v1 import types_pb2


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
