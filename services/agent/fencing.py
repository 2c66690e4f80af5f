"""When an agent cut off from Redis stops its own jobs (pure; issue 37).

The scheduler declares a node dead ``node_dead_after_s`` after its last heartbeat and runs its jobs
elsewhere. A node that is alive but cut off (a switch port, a partition) would otherwise keep its
copy running beside the new one -- twice the GPUs, and a second writer of the job's checkpoints and
output. Like Slurm's slurmd giving up its jobs and a Kubernetes kubelet's node lease, the agent
fences itself: past a deadline without a heartbeat it stops each job, so that the SIGKILL after
its cancel grace lands before the scheduler's deadline (with a heartbeat to spare). A heartbeat
counts from when it was sent, not when its reply came: behind a lossy link the reply can come
seconds after Redis ran it, and the scheduler counts from when Redis ran it. The launch
carries the scheduler's ``node_dead_after_s``, signed; a launch without it (an older scheduler) is
never stopped this way.

Redis itself down is not a partition: the scheduler cannot declare anyone dead then, and once Redis
is back it counts every node's silence from that moment (``frenzy.scheduler.reaping``). An agent
that is *refused* (the host answers, no server listens, or it is still loading its data) therefore
does not count that time as silence (``redis_is_down``); only calls that hang or time out do, as
behind a cut cable. A Redis host that dies outright looks like a partition to every agent: without
a replica to fail over to (issue 37), their jobs are stopped and run again once it is back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import redis


class Fenceable(Protocol):
    node_dead_after_s: float
    fenced: bool

    @property
    def exited(self) -> object: ...


def fence_deadline_s(node_dead_after_s: float, cancel_grace_s: float, heartbeat_s: float,
                     lease_s: float = 0.0) -> float | None:
    """Seconds without a heartbeat after which a job is stopped here (None: never).

    SIGTERM at ``node_dead_after_s - cancel_grace_s - 2 * heartbeat_s``, so the SIGKILL that follows
    the grace still comes a heartbeat before the scheduler's deadline; never sooner than three
    heartbeats, so one slow round trip stops nothing, nor than the node's lease (``lease_s``), while
    which no scheduler declares the node dead."""
    if node_dead_after_s <= 0:
        return None
    return max(node_dead_after_s - cancel_grace_s - 2 * heartbeat_s, 3 * heartbeat_s, lease_s)


def to_fence(jobs: Iterable[Fenceable], silent_s: float, cancel_grace_s: float, heartbeat_s: float,
             lease_s: float = 0.0) -> list:
    """The jobs, still running and not stopped for this already, whose deadline ``silent_s`` seconds
    without a heartbeat have passed."""
    out = []
    for job in jobs:
        if job.fenced or job.exited.is_set():  # type: ignore[attr-defined]
            continue
        deadline = fence_deadline_s(job.node_dead_after_s, cancel_grace_s, heartbeat_s, lease_s)
        if deadline is not None and silent_s >= deadline:
            out.append(job)
    return out


def redis_is_down(exc: BaseException) -> bool:
    """Whether a failed Redis call says the server is down rather than out of reach: the connection
    refused (the host answered), or Redis still loading its data after a restart."""
    if isinstance(exc, redis.BusyLoadingError):
        return True
    seen: BaseException | None = exc
    for _ in range(8):  # redis-py wraps the socket's error; a short, bounded walk down the chain
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
