"""HAS: heterogeneity-aware placement and queue policy for Frenzy (pure library).

Three layers, each a pure function of its inputs:

- ``cluster``: ``GpuSlot`` / ``NodeView`` snapshots and ``ClusterView``, indexed by GPU type.
- ``placement``: ``place_job`` maps a job's ranked ``PlanOption``s to a concrete
  ``Placement`` or a ``PendingReason`` with numbers.
- ``policy`` (the knobs and results) and ``queue_pass`` (``schedule``): one FIFO + backfill +
  starvation-reservation pass over the queue, with its parts in ``queued``, ``queue_order``,
  ``releases``, ``drain`` and ``preemption``. The live scheduler and the simulator call the
  same code.

Those modules, with ``cluster``, ``placement`` and ``pass_state``, may be compiled by mypyc at install
(setup.py): the same source, 2.5–3.5x as fast. ``NATIVE`` says whether the compiled build
is in use; when it is missing, disabled (``FRENZY_PURE_PYTHON=1``) or older than its sources,
the sources are loaded as plain Python here, before anything imports them.
"""

from has._native import load as _load_native

NATIVE: bool = _load_native()

from has.cluster import ClusterView, GpuSlot, NodeFree, NodeView  # noqa: E402
from has.drain import drain_target  # noqa: E402
from has.placement import (  # noqa: E402
    GIB,
    PendingReason,
    Placement,
    PlanOption,
    PlanPart,
    WaitKind,
    choose_nodes,
    explain_job,
    explain_plan,
    place_job,
)
from has.policy import (  # noqa: E402
    POLICY_NAMES,
    PlanChoice,
    Preemption,
    QueueOrder,
    QueuePolicy,
    Reservation,
    RunningJob,
    ScheduleResult,
    StarvingOrder,
)
from has.queue_pass import schedule  # noqa: E402
from has.queued import QueuedJob  # noqa: E402

__all__ = [
    "GIB",
    "NATIVE",
    "POLICY_NAMES",
    "ClusterView",
    "GpuSlot",
    "NodeFree",
    "NodeView",
    "PendingReason",
    "Placement",
    "PlanChoice",
    "PlanOption",
    "PlanPart",
    "Preemption",
    "QueueOrder",
    "QueuePolicy",
    "QueuedJob",
    "Reservation",
    "RunningJob",
    "ScheduleResult",
    "StarvingOrder",
    "WaitKind",
    "choose_nodes",
    "drain_target",
    "explain_job",
    "explain_plan",
    "place_job",
    "schedule",
]
