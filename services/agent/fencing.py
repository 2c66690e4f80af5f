"""When an agent cut off from Redis stops its own jobs (pure; issue 37).

The scheduler declares a node dead ``node_dead_after_s`` after its last heartbeat and runs its jobs
elsewhere. A node that is alive but cut off (a switch port, a partition) would otherwise keep its
copy running beside the new one -- twice the GPUs, and a second writer of the job's checkpoints and
output. Like Slurm's slurmd giving up its jobs and a Kubernetes kubelet's node lease, the agent
fences itself: past a deadline without a heartbeat it stops each job, so that the SIGKILL after
its cancel grace lands before the scheduler's deadline (with a heartbeat to spare). The launch
carries the scheduler's ``node_dead_after_s``, signed; a launch without it (an older scheduler) is
never stopped this way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Fenceable(Protocol):
    node_dead_after_s: float
    fenced: bool

    @property
    def exited(self) -> object: ...


def fence_deadline_s(node_dead_after_s: float, cancel_grace_s: float, heartbeat_s: float) -> float | None:
    """Seconds without a heartbeat after which a job is stopped here (None: never).

    SIGTERM at ``node_dead_after_s - cancel_grace_s - 2 * heartbeat_s``, so the SIGKILL that follows
    the grace still comes a heartbeat before the scheduler's deadline; never sooner than three
    heartbeats, so one slow round trip stops nothing."""
    if node_dead_after_s <= 0:
        return None
    return max(node_dead_after_s - cancel_grace_s - 2 * heartbeat_s, 3 * heartbeat_s)


def to_fence(jobs: Iterable[Fenceable], silent_s: float, cancel_grace_s: float, heartbeat_s: float) -> list:
    """The jobs, still running and not stopped for this already, whose deadline ``silent_s`` seconds
    without a heartbeat have passed."""
    out = []
    for job in jobs:
        if job.fenced or job.exited.is_set():  # type: ignore[attr-defined]
            continue
        deadline = fence_deadline_s(job.node_dead_after_s, cancel_grace_s, heartbeat_s)
        if deadline is not None and silent_s >= deadline:
            out.append(job)
    return out
