"""The cluster read model: what the scheduler's last cluster read found, kept between ticks so
only the nodes whose ``rev`` moved are read and rebuilt, and returned as a ``ClusterSnapshot``
value (HAS's ``ClusterView``, the running jobs as preemption may weigh them, the preempted jobs
still stopping, the GPUs each user holds) rather than left on attributes for other code to read
later. No Redis here: ``StateStore.cluster`` reads and hands the replies over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frenzy.state.job_states import ACTIVE, JobState
from frenzy.state.queue_read import priority_of
from frenzy.state.records import gpu_count, scheduled_gpu
from has import ClusterView, GpuSlot, NodeView, QueuePolicy, RunningJob
from has.preemption import may_weigh

# A node's GPU rows as read (``GPU_FIELDS``, strings or None each).
Rows = list[list[str | None]]


@dataclass(frozen=True, slots=True)
class LiveJob:
    """A job holding GPUs, as preemption sees it (``job``), and whether its spec says it resumes
    from a checkpoint (``JobSpec.resumable``): the facts ``has.preemption.may_weigh`` takes."""

    job: RunningJob
    resumable: bool


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """One read of the cluster: the view HAS places on; every live job holding GPUs (by id);
    the jobs a preemption requeued whose GPUs are not back yet (their agents have not reported
    the exit: read from Redis, so it survives a scheduler restart); and the GPUs each user's
    jobs hold (reserved, launching, running, or stopping after a preemption; on any node, healthy
    or not: what ``QueuePolicy.max_gpus_per_user`` counts)."""

    view: ClusterView
    live: tuple[LiveJob, ...] = ()
    stopping: frozenset[str] = frozenset()
    gpus_by_user: Mapping[str, int] | None = None

    def weighed(self, policy: QueuePolicy, now: float) -> list[RunningJob]:
        """The running jobs preemption may weigh under ``policy`` now (``has.preemption.may_weigh``,
        the rule the simulator uses too), by job id."""
        return [j.job for j in self.live if may_weigh(policy, now, j.job.submitted_at, j.resumable)]


class ClusterReadModel:
    """Each node's GPU rows and ``NodeView`` as last read, and the view built from them."""

    # The GPU fields a ClusterView is built from (not utilization or processes: they change on
    # every heartbeat and the scheduler never reads them).
    GPU_FIELDS = ("index", "type", "memory_total", "memory_free", "owner", "healthy", "uuid")
    # The fields read of each job holding GPUs (``read_hashes.lua``), in ``build``'s order.
    OWNER_FIELDS = ("est_end", "submitted_at", "reserved_at", "preemptions", "state", "priority", "resumable",
                    "user")

    def __init__(self) -> None:
        # node → (rev, GPU count, its GPU rows, the jobs owning them) as last read; the rows are
        # re-read only when rev moved
        self._rows: dict[str, tuple[str, str, Rows, frozenset[str]]] = {}
        self._nodes: dict[str, tuple[tuple[bool, str, Rows], frozenset[str], NodeView]] = {}
        self._owned: dict[str, dict[str, int]] = {}  # node -> {owner: GPUs it holds there}
        self._ends: dict[str, float] = {}
        self._view: ClusterView | None = None
        self.addrs: dict[str, str] = {}  # node -> address, from the last read
        # (name, alive, draining, GPU rows, owners) per node of the read under way: ``take_rows``
        # leaves it for ``build``
        self._per_node: list[tuple[str, bool, str, Rows, frozenset[str]]] = []

    def forget(self, nodes: Iterable[str]) -> None:
        """Re-read these nodes' GPUs on the next read whatever their ``rev`` says."""
        for node in nodes:
            self._rows.pop(node, None)

    def stale(self, names: Sequence[str], raw_heads: Sequence[Sequence[Any]], full: bool) -> list[str]:
        """The nodes whose GPUs must be read (their rev or GPU count moved, they have no rev: not
        written by the scripts, nothing to compare; or ``full``), given ``read_nodes.lua``'s heads."""
        self.addrs = {n: head[5] or "127.0.0.1" for n, head in zip(names, raw_heads, strict=True)}
        known = self._rows
        out = []
        for n, (_, count, _, rev, _, _) in zip(names, raw_heads, strict=True):
            hit = known.get(n)
            if full or rev is None or hit is None or hit[0] != rev or hit[1] != count:
                out.append(n)
        return out

    def take_rows(self, names: Sequence[str], raw_heads: Sequence[Sequence[Any]], stale: Iterable[str],
                  rows: Iterable[Rows | list[Any]]) -> set[str]:
        """The GPU rows read for the ``stale`` nodes (each node's rows in turn, ``gpu_count`` of
        them). -> every job owning a GPU, whose ``OWNER_FIELDS`` ``build`` takes next."""
        stale_set = set(stale)
        rows = iter(rows)
        known, owned = self._rows, self._owned
        fresh_rows: dict[str, tuple[str, str, Rows, frozenset[str]]] = {}
        fresh_owned: dict[str, dict[str, int]] = {}
        self._per_node = []
        owners: set[str] = set()
        for member, (name, count, draining, rev, alive, _) in zip(names, raw_heads, strict=True):
            if member in stale_set:
                gpus = [row for row in (next(rows) for _ in range(gpu_count(count))) if row[0]]
                jobs = frozenset(row[4] for row in gpus if row[4])
                held: dict[str, int] = {}
                for row in gpus:
                    if row[4]:
                        held[row[4]] = held.get(row[4], 0) + 1
                fresh_owned[member] = held
            else:  # (unchanged rows: their owners as well, without a walk over the GPUs)
                _, _, gpus, jobs = known[member]
                fresh_owned[member] = owned.get(member, {})
            fresh_rows[member] = (rev, count, gpus, jobs)
            if name is None and not gpus:
                continue  # registered name without a node hash (being removed): nothing to place on
            owners |= jobs
            self._per_node.append((name or member, bool(alive), draining or "", gpus, jobs))
        self._rows, self._owned = fresh_rows, fresh_owned
        return owners

    def build(self, owners: Sequence[str], owner_rows: Sequence[Sequence[str | None]]) -> ClusterSnapshot:
        """The snapshot, given each owner's ``OWNER_FIELDS`` (``owners`` sorted). A node whose GPU
        fields, liveness, draining flag and jobs' expected ends are as they were keeps its
        ``NodeView``, and ``ClusterView.updated`` re-indexes only the others."""
        ends: dict[str, float] = {}
        live: list[LiveJob] = []
        stopping: set[str] = set()
        users: dict[str, str] = {}
        for job_id, (end, submitted, reserved, preempted, state, priority, resumable, user) in zip(
                owners, owner_rows, strict=True):
            if user:
                users[job_id] = user
            if end:
                ends[job_id] = float(end)
            if state in ACTIVE and submitted and reserved:
                live.append(LiveJob(RunningJob(job_id, float(reserved), float(submitted), priority=priority_of(priority),
                                               stops=int(preempted or 0)), resumable == "1"))
            elif state == JobState.PENDING.value and int(preempted or 0) > 0:
                stopping.add(job_id)  # requeued by a preemption, its processes still stopping
        moved = {j for j in ends.keys() | self._ends.keys() if ends.get(j) != self._ends.get(j)}
        self._ends = ends
        cache = self._nodes
        fresh: dict[str, tuple[tuple[bool, str, Rows], frozenset[str], NodeView]] = {}
        views = []
        for name, alive, draining, gpus, jobs in self._per_node:
            key = (alive, draining, gpus)
            hit = cache.get(name)
            if hit is not None and hit[0] == key and hit[1].isdisjoint(moved):
                fresh[name] = hit
                views.append(hit[2])
                continue
            # (what an agent wrote that the scheduler does not know: that GPU unhealthy, not the read failed)
            slots = tuple(
                GpuSlot(node=name, index=read[0], gpu_type=read[1], memory_total=read[2], memory_free=read[3],
                        owner=owner or None, healthy=read[4], free_at=ends.get(owner or ""))
                for index, gpu_type, total, free, owner, healthy, _uuid in gpus
                if (read := scheduled_gpu(index, gpu_type, total, free, healthy)) is not None
            )
            view = NodeView(name=name, gpus=slots, alive=alive, draining=draining == "1")
            fresh[name] = (key, jobs, view)
            views.append(view)
        self._nodes = fresh
        self._view = ClusterView(views) if self._view is None else self._view.updated(views)
        held: dict[str, int] = {}
        for counts in self._owned.values():
            for job_id, n in counts.items():
                who = users.get(job_id)
                if who is not None:
                    held[who] = held.get(who, 0) + n
        return ClusterSnapshot(self._view, tuple(sorted(live, key=lambda j: j.job.job_id)), frozenset(stopping), held)

    def uuids(self, node: str) -> dict[str, str | None] | None:
        """``node``'s GPU uuids by index as last read (None when it was not read)."""
        rows = self._rows.get(node)
        return {str(row[0]): row[6] for row in rows[2]} if rows is not None else None
