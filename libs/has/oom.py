"""What an out-of-memory exit teaches about a job's plans: which of them may still fit.

MARP predicted the failed plan's peak per GPU; the job needed more than its GPU had. Assume the
prediction errs by the same factor on every plan of this job (the same model and recipe: the
error comes from what MARP does not model — allocator fragmentation, a framework's extra
buffers, a library's workspace — which scales with what it does model). Then a plan ``i`` fits
only if ``predicted_i * factor <= capacity_i``, and the OOM says ``factor > capacity_f /
predicted_f``. So every plan whose predicted share of its GPU's memory is at least the failed
plan's share is ruled out — the failed plan itself and, on GPUs of the same size, every plan
predicted to need as much memory per GPU or more. Several OOMs keep the smallest share that
failed. What remains (more GPUs, a higher ZeRO stage, recomputation, a smaller micro-batch with
the global batch kept) is still MARP's ranking, in its order.

One policy, one place: the live scheduler (on an exit the agent recognised as OOM) and the
simulator (when its memory truth exceeds a GPU) both call this module. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def memory_share(bytes_per_gpu: int | float, gpu_memory_bytes: int | float) -> float:
    """The predicted peak as a share of the GPU's memory (``inf`` for a GPU of no memory)."""
    if bytes_per_gpu < 0 or gpu_memory_bytes < 0:
        raise ValueError(f"memory_share: bytes must be >= 0 (got {bytes_per_gpu}, {gpu_memory_bytes})")
    return float("inf") if gpu_memory_bytes == 0 else float(bytes_per_gpu) / float(gpu_memory_bytes)


def oom_threshold(previous: float | None, failed_bytes_per_gpu: int | float, failed_gpu_memory_bytes: int | float) -> float:
    """The share at or above which no plan of the job is tried again, after one more OOM of a plan
    predicted at ``failed_bytes_per_gpu`` on GPUs of ``failed_gpu_memory_bytes``
    (``previous``: the threshold before it, None for the first OOM)."""
    share = memory_share(failed_bytes_per_gpu, failed_gpu_memory_bytes)
    return share if previous is None else min(previous, share)


def plans_that_may_fit(plans: Sequence[T], threshold: float | None, share: Callable[[T], float]) -> list[T]:
    """``plans`` (in their order) whose predicted share of GPU memory is below ``threshold``
    (all of them when no OOM was seen)."""
    if threshold is None:
        return list(plans)
    return [p for p in plans if share(p) < threshold]
