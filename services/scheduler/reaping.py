"""What the reaper does about lost nodes and leaked GPUs and ports, decided without I/O.

``SchedulerLoop.reap`` reads a ``ReapSnapshot`` (nodes with their lease, the GPUs'
owners, the rendezvous port tables and the jobs named there), asks ``decide_reap``
what to do, and writes that through the store. The decision:

* a node whose lease is gone and that has been silent for at least ``dead_after_s``
  (on the Redis clock the heartbeats are stamped with) is dead; it is declared dead
  unless that was done before. Silence is counted from its last heartbeat, or from
  ``ReapSnapshot.count_from`` when that is later: the moment Redis became reachable
  again after an outage. A lease that expired while Redis was down or out
  of the scheduler's reach says nothing about the node, so after an outage every node
  gets a fresh ``dead_after_s`` to heartbeat (issue 14, D2);
* every job still holding a GPU of a dead node under its live reservation is
  requeued (or failed, the store decides at the attempt limit), once, naming every
  dead node of its placement;
* a GPU or port held for a reservation that is no longer live (the job ended, moved
  to another fence, or is being requeued now) is an orphan: freed at once on a dead
  node, else once it has been seen for ``orphan_release_s`` (its agent had that long
  to report the exit). When each orphan was first seen is the ``OrphanClock``, kept
  by the loop from one reap to the next on the monotonic clock.

A job is never left reserved without its launches: ``place_jobs.lua`` takes the GPUs and
publishes the launches in one step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from frenzy.state.job_states import ACTIVE
from frenzy.state.records import JobRecord, NodeRecord

# ("gpu", node, job id, fence) or ("port", node, job id, port)
OrphanKey = tuple[str, str, str, str]
# orphan -> when it was first seen (monotonic seconds)
OrphanClock = Mapping[OrphanKey, float]


@dataclass(frozen=True)
class ReapSettings:
    dead_after_s: float  # how long a node's lease may be gone before the node is dead
    orphan_release_s: float  # how long an ended reservation may hold a GPU or port on a live node


@dataclass(frozen=True)
class HeldGpu:
    """One GPU as read: its owner ("" when free) and the fence of the reservation that took it."""

    owner: str
    fence: str | None


@dataclass(frozen=True)
class NodeLease:
    """One registered node as the reaper reads it."""

    name: str
    alive: bool  # the heartbeat lease exists
    heartbeat_at: str  # the last heartbeat, Redis time as written ("" if never)
    dead_at: str  # set once the scheduler declared it dead
    gpus: tuple[HeldGpu, ...] = ()

    @classmethod
    def of(cls, node: NodeRecord) -> NodeLease:
        """What the reaper weighs of a node as read (``StateStore.load_nodes``)."""
        return cls(name=node.name, alive=node.alive, heartbeat_at=node.heartbeat_at, dead_at=node.dead_at,
                   gpus=tuple(HeldGpu(g.owner, g.fence) for g in node.gpus))


@dataclass(frozen=True)
class ReapSnapshot:
    now: float  # Redis time when the nodes were read
    nodes: tuple[NodeLease, ...]
    ports: Mapping[str, Mapping[str, str]]  # node -> {port: job id}, read before any job
    jobs: Mapping[str, JobRecord | None]  # every job named by a GPU owner or a port (None: gone)
    # Redis time from which a node's silence counts when its heartbeat is older: when Redis
    # was last reachable again after an outage (0: no outage seen)
    count_from: float = 0.0


@dataclass(frozen=True)
class NodeDeath:
    node: str
    heartbeat_at: str  # the heartbeat judged too old: the declaration holds only if it is still the last
    age_s: float


@dataclass(frozen=True)
class LostJob:
    job_id: str
    lost: tuple[str, ...]  # its dead nodes, sorted
    why: str


@dataclass(frozen=True)
class GpuRelease:
    node: str
    job_id: str
    fence: int
    waited_s: float | None  # how long it was seen held; None on a dead node (freed at once)


@dataclass(frozen=True)
class PortRelease:
    node: str
    port: str
    job_id: str


@dataclass(frozen=True)
class ReapPlan:
    declare: tuple[NodeDeath, ...]  # dead nodes not declared dead before
    dead: Mapping[str, float]  # every dead node -> seconds since its last heartbeat
    requeue: tuple[LostJob, ...]
    gpus: tuple[GpuRelease, ...]
    ports: tuple[PortRelease, ...]
    orphans: dict[OrphanKey, float] = field(default_factory=dict)  # the clock for the next reap


def decide_reap(snapshot: ReapSnapshot, clock_now: float, orphans: OrphanClock, settings: ReapSettings,
                came_back: frozenset[str] = frozenset()) -> ReapPlan:
    """What to do about ``snapshot``; see the module docstring.

    ``clock_now``: the monotonic time the orphan clock counts in. ``came_back``: nodes
    whose declaration was refused because they heartbeated after the snapshot (they are
    treated as alive: decide again with them after such a refusal)."""
    declare: list[NodeDeath] = []
    dead: dict[str, float] = {}
    for node in snapshot.nodes:
        if not node.name or node.alive or node.name in came_back:
            continue
        beat = float(node.heartbeat_at or 0)
        age = snapshot.now - beat
        # Declared before: dead whatever happened since. Else silent since the later of its
        # last heartbeat and Redis being reachable (an outage is nobody's silence).
        if not node.dead_at and snapshot.now - max(beat, snapshot.count_from) < settings.dead_after_s:
            continue
        if not node.dead_at:
            declare.append(NodeDeath(node.name, node.heartbeat_at, age))
        dead[node.name] = age
    requeue = _lost_jobs(snapshot, dead)
    ending = {lost.job_id for lost in requeue}
    gpus, ports, clock = _orphans(snapshot, dead, ending, clock_now, orphans, settings.orphan_release_s)
    return ReapPlan(tuple(declare), dead, requeue, gpus, ports, clock)


def _live(job: JobRecord | None, ending: set[str]) -> JobRecord | None:
    """``job`` while its reservation is live: not gone, not ended, not being requeued now."""
    if job is None or job.state not in ACTIVE or job.id in ending:
        return None
    return job


def _lost_jobs(snapshot: ReapSnapshot, dead: Mapping[str, float]) -> tuple[LostJob, ...]:
    """The jobs holding a GPU of a dead node under their live reservation, each once."""
    out: list[LostJob] = []
    taken: set[str] = set()
    for node in snapshot.nodes:
        if node.name not in dead:
            continue
        for gpu in node.gpus:
            job = _live(snapshot.jobs.get(gpu.owner), taken) if gpu.owner else None
            if job is None or str(job.fence) != gpu.fence:
                continue
            lost = sorted(n for n, _ in job.placement if n in dead)
            why = f"node {', '.join(lost)} is dead (no heartbeat for {dead[lost[0]]:.0f} s)"
            out.append(LostJob(job.id, tuple(lost), why))
            taken.add(job.id)
    return tuple(out)


def _orphans(snapshot: ReapSnapshot, dead: Mapping[str, float], ending: set[str], clock_now: float,
             orphans: OrphanClock, release_after_s: float,
             ) -> tuple[tuple[GpuRelease, ...], tuple[PortRelease, ...], dict[OrphanKey, float]]:
    """GPUs and ports held for no live reservation that are due for release, and the clock kept
    for the rest (an orphan not seen this time resolved itself: its exit came in)."""
    clock = dict(orphans)
    seen: set[OrphanKey] = set()
    gpus: list[GpuRelease] = []
    ports: list[PortRelease] = []
    for node in snapshot.nodes:
        for gpu in node.gpus:
            fence = gpu.fence or "0"
            if not gpu.owner:
                continue
            job = _live(snapshot.jobs.get(gpu.owner), ending)
            if job is not None and str(job.fence) == fence:
                continue
            key = ("gpu", node.name, gpu.owner, fence)
            if key in seen and key not in clock:
                continue  # released already: one release frees all of the node's GPUs under that fence
            seen.add(key)
            first = clock.setdefault(key, clock_now)
            if node.name in dead or clock_now - first >= release_after_s:
                gpus.append(GpuRelease(node.name, gpu.owner, int(fence),
                                       None if node.name in dead else clock_now - first))
                del clock[key]
    for name, table in snapshot.ports.items():
        for port, owner in table.items():
            job = _live(snapshot.jobs.get(owner), ending)
            if job is not None and job.master_node == name and str(job.master_port) == port:
                continue
            key = ("port", name, owner, port)
            seen.add(key)
            first = clock.setdefault(key, clock_now)
            if clock_now - first >= release_after_s:
                ports.append(PortRelease(name, port, owner))
                del clock[key]
    return tuple(gpus), tuple(ports), {key: at for key, at in clock.items() if key in seen}
