"""HAS: heterogeneity-aware placement and queue policy for Frenzy (pure library).

Three layers, each a pure function of its inputs:

- ``cluster``: ``GpuSlot`` / ``NodeView`` snapshots and ``ClusterView``, indexed by GPU type.
- ``placement``: ``place_job`` maps a job's ranked ``PlanOption``s to a concrete
  ``Placement`` or a ``PendingReason`` with numbers.
- ``policy``: ``schedule`` runs one FIFO + backfill + starvation-reservation pass
  over the queue. The live scheduler and the simulator call the same code.
"""

from has.cluster import ClusterView, GpuSlot, NodeFree, NodeView
from has.placement import (
    GIB,
    PendingReason,
    Placement,
    PlanOption,
    WaitKind,
    choose_nodes,
    explain_job,
    explain_plan,
    place_job,
)
from has.policy import (
    Preemption,
    QueuedJob,
    QueuePolicy,
    Reservation,
    RunningJob,
    ScheduleResult,
    drain_target,
    schedule,
)

__all__ = [
    "GIB",
    "ClusterView",
    "GpuSlot",
    "NodeFree",
    "NodeView",
    "PendingReason",
    "Placement",
    "PlanOption",
    "Preemption",
    "QueuePolicy",
    "QueuedJob",
    "Reservation",
    "RunningJob",
    "ScheduleResult",
    "WaitKind",
    "choose_nodes",
    "drain_target",
    "explain_job",
    "explain_plan",
    "place_job",
    "schedule",
]
