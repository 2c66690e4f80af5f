"""HAS: heterogeneity-aware placement and queue policy for Frenzy (pure library).

Three layers, each a pure function of its inputs:

- ``cluster``: ``GpuSlot`` / ``NodeView`` snapshots and ``ClusterView``, indexed by GPU type.
- ``placement``: ``place_job`` maps a job's ranked ``PlanOption``s to a concrete
  ``Placement`` or a ``PendingReason`` with numbers.
- ``policy``: ``schedule`` runs one FIFO + backfill + starvation-reservation pass
  over the queue. The live scheduler and the simulator call the same code.

``cluster``, ``placement``, ``pass_state`` and ``policy`` may be compiled by mypyc at install
(setup.py): the same source, 2.5–3.5x as fast. ``NATIVE`` says whether the compiled build
is in use; when it is missing, disabled (``FRENZY_PURE_PYTHON=1``) or older than its sources,
the sources are loaded as plain Python here, before anything imports them.
"""

from has._native import load as _load_native

NATIVE: bool = _load_native()

from has.cluster import ClusterView, GpuSlot, NodeFree, NodeView  # noqa: E402
from has.placement import (  # noqa: E402
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
from has.policy import (  # noqa: E402
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
    "NATIVE",
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
