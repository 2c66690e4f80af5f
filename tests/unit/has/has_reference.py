"""Frozen copy of HAS's scheduling pass as of commit 4ce96d8 (before the fast pass).

The decision-equivalence test (test_has_equivalence.py) feeds the same random states to
this reference and to ``has.schedule`` and requires identical results: placements,
pending reasons, blocked_by and reservation. Do not edit it to make a test pass: it is
the definition of the decisions the fast pass must reproduce. Classes here are separate
from ``has``'s; the test converts inputs and compares plain tuples. The edits: the
policy's ``_candidates`` is renamed ``_plan_candidates`` (placement has one of that name);
and (session 6) a pending reason's HELD_FOR_STARVING label is given only when the hold is
what keeps the job out — a fix of the label, which no placement depends on.
"""

# ruff: noqa

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Protocol


# ----- cluster.py -----
@dataclass(frozen=True)
class GpuSlot:
    """One GPU as the scheduler sees it (memory in bytes)."""

    node: str
    index: int
    gpu_type: str
    memory_total: int
    memory_free: int
    owner: str | None  # job id holding it; None when free
    healthy: bool = True
    # When the owner is expected to release it (seconds, same clock as ``now``); None when
    # unknown. Only completion-time-aware plan choice reads it (docs/has-policy.md).
    free_at: float | None = None

    @property
    def is_free(self) -> bool:
        return self.owner is None and self.healthy


@dataclass(frozen=True)
class NodeView:
    """One node and its GPUs; only ``schedulable`` nodes receive new work."""

    name: str
    gpus: tuple[GpuSlot, ...]
    alive: bool = True
    draining: bool = False

    @property
    def schedulable(self) -> bool:
        # A draining node finishes what it runs but takes nothing new.
        return self.alive and not self.draining


@dataclass(frozen=True)
class NodeFree:
    """Free, healthy GPUs of one type on one schedulable node.

    ``slots`` is sorted by GPU index (a placement takes the lowest indices, so
    CUDA_VISIBLE_DEVICES stays compact); ``mem_sorted`` holds the same GPUs'
    free memory ascending so the qualifying count for a byte need is a bisect.
    """

    node: str
    slots: tuple[GpuSlot, ...]
    mem_sorted: tuple[int, ...]

    @staticmethod
    def of(node: str, slots: Iterable[GpuSlot]) -> NodeFree:
        ordered = tuple(sorted(slots, key=lambda s: s.index))
        return NodeFree(node, ordered, tuple(sorted(s.memory_free for s in ordered)))

    def count_at_least(self, need_bytes: int) -> int:
        """How many of these GPUs have at least ``need_bytes`` free."""
        return len(self.mem_sorted) - bisect.bisect_left(self.mem_sorted, need_bytes)

    def take(self, count: int, need_bytes: int) -> tuple[int, ...]:
        """Indices of the ``count`` lowest-index GPUs with enough free memory."""
        picked = [s.index for s in self.slots if s.memory_free >= need_bytes][:count]
        if len(picked) < count:
            raise ValueError(f"node {self.node}: only {len(picked)} GPUs qualify, {count} asked")
        return tuple(picked)


class _Capacity:
    """Healthy GPUs per type and node, free or not, on schedulable nodes.

    What the cluster could offer once every running job has ended. Reservations
    never change it, so all views derived by ``with_reserved`` share one
    instance — including its memo of TP-group counts, which is why the queue
    policy's "could this ever fit?" check costs a dict lookup per plan.
    """

    __slots__ = ("mems", "counts", "levels", "_groups")

    def __init__(self, raw: dict[str, dict[str, list[int]]]) -> None:
        # gpu_type → node → memory_total of its healthy GPUs, ascending.
        self.mems = {t: {n: tuple(sorted(m)) for n, m in per.items()} for t, per in raw.items()}
        # Read-only: healthy_by_node hands these out, and every derived view shares them.
        self.counts = {
            t: MappingProxyType({n: len(m) for n, m in per.items()}) for t, per in self.mems.items()
        }
        # Distinct memory sizes per type: any byte need between two levels counts the same GPUs.
        self.levels = {t: sorted({x for m in per.values() for x in m}) for t, per in self.mems.items()}
        self._groups: dict[tuple[str, int, int], int] = {}

    def by_node(self, gpu_type: str, need_bytes: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for node, mems in self.mems.get(gpu_type, {}).items():
            n = len(mems) - bisect.bisect_left(mems, need_bytes)
            if n:
                out[node] = n
        return out

    def groups(self, gpu_type: str, need_bytes: int, tp: int) -> int:
        levels = self.levels.get(gpu_type, [])
        i = bisect.bisect_left(levels, need_bytes)
        if i == len(levels):
            return 0
        key = (gpu_type, levels[i], tp)
        cached = self._groups.get(key)
        if cached is None:
            cached = sum(c // tp for c in self.by_node(gpu_type, levels[i]).values())
            self._groups[key] = cached
        return cached


class _HasGpus(Protocol):
    """What ``with_reserved`` needs of a Placement (a protocol, to avoid an import cycle)."""

    @property
    def job_id(self) -> str: ...

    def gpus(self) -> list[tuple[str, int]]: ...


class ClusterView:
    """Read-only cluster snapshot with a GPU-type → node → free-GPUs index.

    Only healthy, unowned GPUs on schedulable (alive, not draining) nodes are
    indexed as free; everything else is still visible through ``nodes`` for
    explanations and for the starvation policy's "what will be free" estimate.
    """

    __slots__ = ("_nodes", "_free", "_capacity", "_free_total")

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        by_name: dict[str, NodeView] = {}
        for node in nodes:
            if node.name in by_name:
                raise ValueError(f"duplicate node name {node.name!r}")
            seen: set[int] = set()
            for gpu in node.gpus:
                if gpu.node != node.name:
                    raise ValueError(f"GPU {gpu.node}:{gpu.index} listed under node {node.name!r}")
                if gpu.index in seen:
                    raise ValueError(f"duplicate GPU index {gpu.index} on node {node.name!r}")
                seen.add(gpu.index)
            by_name[node.name] = node
        # Sorted by name once, so every later walk is deterministic.
        self._nodes: dict[str, NodeView] = dict(sorted(by_name.items()))
        free: dict[str, dict[str, NodeFree]] = {}
        capacity: dict[str, dict[str, list[int]]] = {}
        for node in self._nodes.values():
            if not node.schedulable:
                continue
            per_type: dict[str, list[GpuSlot]] = {}
            for gpu in node.gpus:
                if not gpu.healthy:
                    continue
                capacity.setdefault(gpu.gpu_type, {}).setdefault(node.name, []).append(gpu.memory_total)
                if gpu.owner is None:
                    per_type.setdefault(gpu.gpu_type, []).append(gpu)
            for gpu_type, slots in per_type.items():
                free.setdefault(gpu_type, {})[node.name] = NodeFree.of(node.name, slots)
        self._free = free
        self._capacity = _Capacity(capacity)
        # Free GPUs per type: an O(1) "cannot fit now" test before any node is looked at.
        self._free_total = {t: sum(len(nf.slots) for nf in per.values()) for t, per in free.items()}

    @classmethod
    def _derived(
        cls,
        nodes: dict[str, NodeView],
        free: dict[str, dict[str, NodeFree]],
        capacity: _Capacity,
        free_total: dict[str, int],
    ) -> ClusterView:
        view = cls.__new__(cls)
        view._nodes = nodes
        view._free = free
        view._capacity = capacity
        view._free_total = free_total
        return view

    # ----- read access -------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeView, ...]:
        """All nodes, sorted by name (including dead and draining ones)."""
        return tuple(self._nodes.values())

    def node(self, name: str) -> NodeView:
        return self._nodes[name]

    def gpu_types(self) -> set[str]:
        """GPU types with at least one healthy GPU on a schedulable node."""
        return set(self._capacity.counts)

    def free_by_node(self, gpu_type: str) -> Mapping[str, NodeFree]:
        """Schedulable nodes with free healthy GPUs of ``gpu_type`` (name-sorted)."""
        return self._free.get(gpu_type, {})

    def healthy_by_node(self, gpu_type: str) -> Mapping[str, int]:
        """Healthy GPUs of ``gpu_type`` per schedulable node, free or not (name-sorted)."""
        return self._capacity.counts.get(gpu_type, {})

    def capacity_by_node(self, gpu_type: str, need_bytes: int) -> dict[str, int]:
        """Per schedulable node: healthy GPUs of ``gpu_type`` with memory_total ≥ ``need_bytes``.

        This is what the node could give a job once everything on it has ended.
        """
        return self._capacity.by_node(gpu_type, need_bytes)

    def capacity_groups(self, gpu_type: str, need_bytes: int, tp: int) -> int:
        """Whole ``tp``-GPU groups the cluster could host with every job ended (memoised).

        The queue policy uses it to tell "waits" from "can never fit".
        """
        return self._capacity.groups(gpu_type, need_bytes, tp)

    def free_summary(self) -> dict[str, dict[str, int]]:
        """gpu_type → node → free healthy GPUs, for every schedulable node with that type."""
        out: dict[str, dict[str, int]] = {}
        for gpu_type in sorted(self._capacity.counts):
            free = self._free.get(gpu_type, {})
            out[gpu_type] = {
                node: (len(free[node].slots) if node in free else 0)
                for node in self._capacity.counts[gpu_type]
            }
        return out

    def free_count(self, gpu_type: str | None = None) -> int:
        """Free healthy GPUs on schedulable nodes, of one type or of all types (O(1) per type)."""
        if gpu_type is not None:
            return self._free_total.get(gpu_type, 0)
        return sum(self._free_total.values())

    def memory_level(self, gpu_type: str, need_bytes: int) -> int | None:
        """The smallest memory_total of a healthy ``gpu_type`` GPU that is ≥ ``need_bytes``.

        Byte needs between two levels qualify the same GPUs, so callers key caches on it.
        """
        levels = self._capacity.levels.get(gpu_type, [])
        i = bisect.bisect_left(levels, need_bytes)
        return levels[i] if i < len(levels) else None

    # ----- derivation --------------------------------------------------

    def with_reserved(self, placement: _HasGpus) -> ClusterView:
        """A new view in which the placement's GPUs are owned by its job.

        Raises ``ValueError`` when a GPU is unknown or not free: that would be a
        double booking, which is always a bug in the caller.
        """
        return self.with_owned(placement.gpus(), placement.job_id)

    def with_owned(self, gpus: Iterable[tuple[str, int]], owner: str) -> ClusterView:
        """A new view with ``gpus`` (node, index) marked as owned by ``owner``."""
        by_node: dict[str, set[int]] = {}
        for node_name, index in gpus:
            by_node.setdefault(node_name, set()).add(index)
        if not by_node:
            return self
        nodes = dict(self._nodes)
        free = {t: m for t, m in self._free.items()}
        free_total = dict(self._free_total)
        copied: set[str] = set()
        for node_name, indices in by_node.items():
            node = self._nodes.get(node_name)
            if node is None:
                raise ValueError(f"unknown node {node_name!r}")
            if not node.schedulable:
                raise ValueError(f"node {node_name!r} is not schedulable")
            new_gpus = []
            touched_types: set[str] = set()
            for gpu in node.gpus:
                if gpu.index in indices:
                    if not gpu.is_free:
                        raise ValueError(f"GPU {node_name}:{gpu.index} is not free (owner={gpu.owner!r})")
                    gpu = dataclasses.replace(gpu, owner=owner)
                    touched_types.add(gpu.gpu_type)
                    free_total[gpu.gpu_type] -= 1
                new_gpus.append(gpu)
            missing = indices - {g.index for g in node.gpus}
            if missing:
                raise ValueError(f"node {node_name!r} has no GPU {sorted(missing)}")
            new_node = dataclasses.replace(node, gpus=tuple(new_gpus))
            nodes[node_name] = new_node
            for gpu_type in touched_types:
                if gpu_type not in copied:
                    # Copy-on-write per type: other types keep sharing the old dicts.
                    free[gpu_type] = dict(free[gpu_type])
                    copied.add(gpu_type)
                remaining = [g for g in new_node.gpus if g.gpu_type == gpu_type and g.is_free]
                if remaining:
                    free[gpu_type][node_name] = NodeFree.of(node_name, remaining)
                else:
                    del free[gpu_type][node_name]
                if not free[gpu_type]:
                    del free[gpu_type]
                    del free_total[gpu_type]
        return ClusterView._derived(nodes, free, self._capacity, free_total)

    def __repr__(self) -> str:
        return f"ClusterView(nodes={len(self._nodes)}, free={self.free_count()})"


# ----- placement.py -----
GIB = 1 << 30


def fmt_gib(num_bytes: int) -> str:
    """Bytes as GiB with one decimal, e.g. ``38.2``."""
    return f"{num_bytes / GIB:.1f}"


@dataclass(frozen=True)
class PlanOption:
    """One layout of a job on one GPU type, with its predicted per-GPU memory need."""

    gpu_type: str
    tp: int
    pp: int
    dp: int
    bytes_per_gpu: int
    label: str = ""
    # Estimated seconds the job still needs under this plan (MARP step time x steps left);
    # None when unknown. Read by QueuePolicy(order="shortest", plan_choice="completion").
    runtime_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"PlanOption.{name} must be >= 1, got {getattr(self, name)}")
        if self.bytes_per_gpu < 0:
            raise ValueError(f"PlanOption.bytes_per_gpu must be >= 0, got {self.bytes_per_gpu}")
        if self.runtime_s is not None and not self.runtime_s >= 0:
            raise ValueError(f"PlanOption.runtime_s must be >= 0 or None, got {self.runtime_s}")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def describe(self) -> str:
        """E.g. ``4 × ≥38.2 GiB A100-80GB (tp=2 pp=1 dp=2, 2-GPU TP groups within a node)``."""
        layout = f"tp={self.tp} pp={self.pp} dp={self.dp}"
        if self.tp > 1:
            layout += f", {self.tp}-GPU TP groups within a node"
        if self.label:
            layout += f", {self.label}"
        return f"{self.num_gpus} × ≥{fmt_gib(self.bytes_per_gpu)} GiB {self.gpu_type} ({layout})"


@dataclass(frozen=True)
class Placement:
    """Concrete GPUs for one job: ``nodes`` is ordered, the first node hosts rank 0.

    Each node's GPUs hold consecutive ranks, so a node's share is a multiple of
    ``plan.tp`` and no tensor-parallel group crosses a node boundary.
    """

    job_id: str
    plan_index: int
    plan: PlanOption
    nodes: tuple[tuple[str, tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        if self.gpu_count != self.plan.num_gpus:
            raise ValueError(f"placement has {self.gpu_count} GPUs, plan needs {self.plan.num_gpus}")
        for node, indices in self.nodes:
            if not indices or len(indices) % self.plan.tp:
                raise ValueError(f"node {node} gets {len(indices)} GPUs, not a multiple of tp={self.plan.tp}")

    @property
    def gpu_count(self) -> int:
        return sum(len(indices) for _, indices in self.nodes)

    def gpus(self) -> list[tuple[str, int]]:
        """(node, GPU index) in rank order."""
        return [(node, index) for node, indices in self.nodes for index in indices]


class WaitKind(Enum):
    """Why a job is not placed in this pass (lets the service pick a job state)."""

    NO_PLANS = "no_plans"  # the job has no plan at all
    NO_FIT = "no_fit"  # no plan fits the free GPUs now; may fit later
    NEVER_FITS = "never_fits"  # no plan fits even if every job ended (cluster too small)
    RESERVING = "reserving"  # starving head job: holds free GPUs while the rest drain to it
    HELD_FOR_STARVING = "held_for_starving"  # would fit, but on GPUs held for a starving job
    BEHIND_HEAD = "behind_head"  # strict FIFO (backfill off): waits behind the blocked head


@dataclass(frozen=True)
class PendingReason:
    """Why a job waits: one human line with numbers, plus one reason per plan tried."""

    summary: str
    per_plan: tuple[str, ...]
    kind: WaitKind = WaitKind.NO_FIT


@dataclass(frozen=True)
class _Candidate:
    name: str
    qualifying: int  # free GPUs of the type with enough free memory
    usable: int  # qualifying rounded down to whole TP groups
    free: NodeFree


def _candidates(cluster: ClusterView, plan: PlanOption) -> list[_Candidate]:
    out = []
    for name, nf in cluster.free_by_node(plan.gpu_type).items():
        if len(nf.slots) < plan.tp:
            continue  # cannot host even one TP group; skip the bisect
        qualifying = nf.count_at_least(plan.bytes_per_gpu)
        usable = qualifying - qualifying % plan.tp
        if usable:
            out.append(_Candidate(name, qualifying, usable, nf))
    return out


def choose_nodes(cluster: ClusterView, plan: PlanOption) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """The GPUs ``plan`` would take on ``cluster`` now, rank-0 node first; None if it does not fit.

    A GPU qualifies when it is free, healthy, on a schedulable node, of
    ``plan.gpu_type`` and has ``memory_free >= plan.bytes_per_gpu``. A node's
    usable count is its qualifying count rounded down to a multiple of ``tp``
    (a TP group never spans nodes). Then:

    1. One node if any can hold the whole plan: best fit, i.e. the node with the
       fewest qualifying GPUs that still suffice (leaves big holes for big jobs);
       ties by node name.
    2. Otherwise the fewest nodes k: the smallest k whose k largest usable counts
       reach the need (so the plan is infeasible iff the usable sum falls short).
    3. With k nodes, an equal split (need/k per node, a multiple of tp) when k
       nodes can each give that much — torchrun wants one nproc_per_node; those
       k nodes are picked best-fit (fewest qualifying first, then name) and
       ordered by name.
    4. Else the k-1 largest nodes give all their usable GPUs and the remainder
       goes to the best-fit node among the rest; ordered largest share first.

    Within a node the lowest-index qualifying GPUs are taken.
    """
    need = plan.num_gpus
    b = plan.bytes_per_gpu
    cands = _candidates(cluster, plan)
    if sum(c.usable for c in cands) < need:
        return None

    singles = [c for c in cands if c.usable >= need]
    if singles:
        best = min(singles, key=lambda c: (c.qualifying, c.name))
        return ((best.name, best.free.take(need, b)),)

    by_size = sorted(cands, key=lambda c: (-c.usable, c.name))
    acc = 0
    k = 0
    for c in by_size:
        acc += c.usable
        k += 1
        if acc >= need:
            break

    if need % k == 0 and (need // k) % plan.tp == 0:
        per = need // k
        fitting = sorted((c for c in cands if c.usable >= per), key=lambda c: (c.qualifying, c.name))
        if len(fitting) >= k:
            chosen = sorted(fitting[:k], key=lambda c: c.name)
            return tuple((c.name, c.free.take(per, b)) for c in chosen)

    head = by_size[: k - 1]
    head_names = {c.name for c in head}
    remainder = need - sum(c.usable for c in head)
    # by_size[k-1] has usable >= remainder, so this is never empty.
    rest = [c for c in cands if c.name not in head_names and c.usable >= remainder]
    tail = min(rest, key=lambda c: (c.qualifying, c.name))
    return tuple((c.name, c.free.take(c.usable, b)) for c in head) + (
        (tail.name, tail.free.take(remainder, b)),
    )


def explain_plan(cluster: ClusterView, plan: PlanOption) -> str:
    """One line on why ``plan`` does not fit now, with the numbers that matter."""
    g = plan.gpu_type
    need = plan.num_gpus
    head = f"needs {plan.describe()}"
    healthy = cluster.healthy_by_node(g)
    if not healthy:
        return f"{head}; no schedulable {g} GPUs in the cluster"
    widest = max(healthy.values())
    if plan.tp > widest:
        return f"{head}; a TP group of {plan.tp} exceeds the largest {g} node ({widest} GPUs)"

    free = cluster.free_by_node(g)
    quals = [(name, nf.count_at_least(plan.bytes_per_gpu), len(nf.slots)) for name, nf in free.items()]
    total_q = sum(q for _, q, _ in quals)
    total_free = sum(f for _, _, f in quals)
    usable = sum(q - q % plan.tp for _, q, _ in quals)
    parts = [head]
    if total_q:
        name, q, _ = min(quals, key=lambda x: (-x[1], x[0]))
        parts.append(f"largest free: {q} × {g} on {name}")
        parts.append(f"{total_q} free in total")
    else:
        parts.append(f"largest free: none ({g} free: 0 with enough memory)")
    if total_q >= need > usable:
        parts.append(f"only {usable} of them form whole {plan.tp}-GPU TP groups within a node")
    low_mem = total_free - total_q
    if low_mem:
        parts.append(f"{low_mem} more free {g} skipped: < {fmt_gib(plan.bytes_per_gpu)} GiB free memory")
    total_healthy = sum(healthy.values())
    if total_healthy < need:
        parts.append(f"the cluster has only {total_healthy} schedulable healthy {g}")
    return "; ".join(parts)


def explain_job(
    cluster: ClusterView, plans: Sequence[PlanOption], kind: WaitKind = WaitKind.NO_FIT
) -> PendingReason:
    """PendingReason for a job none of whose plans fits ``cluster`` now."""
    if not plans:
        return PendingReason(
            "no resource plans: the predictor found no layout that fits any GPU type", (), WaitKind.NO_PLANS
        )
    per_plan = tuple(f"plan {i}: {explain_plan(cluster, p)}" for i, p in enumerate(plans))
    summary = explain_plan(cluster, plans[0])
    if len(plans) > 1:
        summary += f" (and {len(plans) - 1} fallback plan{'s' if len(plans) > 2 else ''}: none fits now)"
    return PendingReason(summary, per_plan, kind)


def place_job(cluster: ClusterView, job_id: str, plans: Sequence[PlanOption]) -> Placement | PendingReason:
    """Place ``job_id`` on the first plan in ``plans`` that ``cluster`` can satisfy now.

    Plans are tried strictly in the given (ranked) order; the first one for which
    ``choose_nodes`` finds GPUs wins, so a fallback plan is used only when every
    better-ranked plan is infeasible at this moment. See ``choose_nodes`` for the
    node-selection rules (TP groups within a node, single-node best fit, fewest
    nodes, equal split, best fit for the remainder, name tie-breaks).

    Returns a ``Placement`` (``plan_index`` indexes ``plans``) or a
    ``PendingReason`` with one entry per plan tried.
    """
    for i, plan in enumerate(plans):
        nodes = choose_nodes(cluster, plan)
        if nodes is not None:
            return Placement(job_id=job_id, plan_index=i, plan=plan, nodes=nodes)
    return explain_job(cluster, plans)


# ----- policy.py -----
@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs: ``seq`` is its FIFO position, ``plans`` are ranked best first."""

    job_id: str
    seq: int
    submitted_at: float
    plans: tuple[PlanOption, ...]

    def __post_init__(self) -> None:
        # Accept any sequence from callers but keep the dataclass hashable and immutable.
        if not isinstance(self.plans, tuple):
            object.__setattr__(self, "plans", tuple(self.plans))


@dataclass(frozen=True)
class QueuePolicy:
    """Knobs of ``schedule``.

    backfill: let later jobs use GPUs a blocked earlier job cannot use now.
      False gives strict FIFO (the first job that does not fit blocks the rest).
    starvation_s: after this many seconds in the queue an unplaceable job
      becomes the reservation holder and backfill may no longer take its GPUs.
      0 means "reserve for the head at once" (EASY-style backfill).
    order: "fifo" walks the queue by seq. "shortest" walks jobs that have waited
      ``starvation_s`` first (by seq), then the rest by estimated GPU-seconds of
      their cheapest plan (``PlanOption.runtime_s`` x GPUs; unknown = last).
    plan_choice: "ranked" takes the first plan that fits now (MARP's order).
      "completion" takes the plan with the earliest estimated completion, counting
      the wait for GPUs that are busy (``GpuSlot.free_at``), among the plans whose
      GPU-seconds are within ``width_slack`` of the cheapest plan on that GPU type;
      a job waits for a busy plan only when starting now would finish more than
      ``wait_slack`` later. Plans without ``runtime_s`` fall back to "ranked".
    explain: build per-plan pending reasons (the service shows them; the simulator
      turns them off: decisions are the same, only the reason text differs).

    ``QueuePolicy()`` is the first HAS (frenzy-paper in the simulator);
    ``QueuePolicy.frenzy()`` is the improved one (docs/has-policy.md, docs/simulator.md).
    """

    backfill: bool = True
    starvation_s: float = 300.0
    order: str = "fifo"
    plan_choice: str = "ranked"
    width_slack: float = 0.25
    wait_slack: float = 0.1
    explain: bool = True
    starving_order: str = "fifo"  # added after the freeze: "ideal" orders starving jobs by ideal completion
    # added after the freeze: > 0 also asks a starving job to have waited this many times the
    # runtime of its cheapest plan
    starvation_stretch: float = 0.0

    def __post_init__(self) -> None:
        if self.starvation_s < 0:
            raise ValueError(f"starvation_s must be >= 0, got {self.starvation_s}")
        if self.order not in ("fifo", "shortest"):
            raise ValueError(f"order must be 'fifo' or 'shortest', got {self.order!r}")
        if self.plan_choice not in ("ranked", "completion"):
            raise ValueError(f"plan_choice must be 'ranked' or 'completion', got {self.plan_choice!r}")
        if self.width_slack < 0 or self.wait_slack < 0:
            raise ValueError("width_slack and wait_slack must be >= 0")

    @classmethod
    def frenzy(cls, **overrides: object) -> QueuePolicy:
        """Shortest-first with aging, completion-time-aware plan choice, backfill (ours)."""
        # Knobs chosen on Pollux workloads 1-5 on paper-64 (docs/simulator.md has the sweep);
        # held-out checks: workloads 6-7 and the Gavel traces.
        base: dict[str, object] = {
            "order": "shortest", "plan_choice": "completion", "starvation_s": 14400.0,
            "width_slack": 0.15, "wait_slack": 0.2, "starving_order": "ideal",
        }  # fmt: skip
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Reservation:
    """GPUs held idle for the starving holder while the rest of its target drains.

    target: per node, how many GPUs the holder's plan will use there (each a
      multiple of tp); held: the free GPUs on those nodes kept for it now.
    """

    job_id: str
    plan_index: int
    plan: PlanOption
    target: tuple[tuple[str, int], ...]
    held: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def held_count(self) -> int:
        return sum(len(indices) for _, indices in self.held)

    @property
    def missing(self) -> int:
        """GPUs of the target still busy with other jobs."""
        return self.plan.num_gpus - self.held_count

    def gpus(self) -> list[tuple[str, int]]:
        return [(node, index) for node, indices in self.held for index in indices]


@dataclass(frozen=True)
class ScheduleResult:
    """Decisions of one pass.

    placements: in the order they were made (seq order); never overlapping.
    pending: job id → why it waits, for every queued job not placed.
    blocked_by: the job whose needs currently restrict later jobs — the
      starving reservation holder, or with ``backfill=False`` the blocked head.
    reservation: the holder's held GPUs and drain target, if any.
    """

    placements: tuple[Placement, ...]
    pending: dict[str, PendingReason]
    blocked_by: str | None
    reservation: Reservation | None = field(default=None)


def _never_fits(cluster: ClusterView, plan: PlanOption) -> bool:
    """True when ``plan`` could not fit even with every job ended."""
    return cluster.capacity_groups(plan.gpu_type, plan.bytes_per_gpu, plan.tp) * plan.tp < plan.num_gpus


def drain_target(cluster: ClusterView, job_id: str, plans: Sequence[PlanOption]) -> Reservation | None:
    """The plan and nodes a starving job should wait for, holding the most free GPUs.

    For each plan: a node can give ``cap`` TP groups (its free qualifying GPUs
    plus the GPUs busy with other jobs whose memory_total is enough, rounded
    down to whole groups). The j-th group on a node already has
    ``clamp(free - (j-1)*tp, 0, tp)`` free GPUs — non-increasing in j — so
    taking the need/tp groups with the largest counts (a greedy over a sum of
    concave functions) maximises the GPUs that are free now. Ties prefer nodes
    with more free GPUs, then more capacity, then name, which also keeps the
    target on few nodes. Across plans the one missing the fewest GPUs wins,
    ties to the better-ranked plan. None when no plan fits even then.
    """
    best: tuple[tuple[int, int, int], Reservation] | None = None
    for plan_index, plan in enumerate(plans):
        tp = plan.tp
        need_groups = plan.num_gpus // tp
        rows: list[tuple[str, tuple[int, ...], int]] = []  # node, free qualifying indices, cap groups
        for name in cluster.healthy_by_node(plan.gpu_type):
            free_idx: list[int] = []
            busy = 0
            for gpu in cluster.node(name).gpus:
                if gpu.gpu_type != plan.gpu_type or not gpu.healthy:
                    continue
                if gpu.owner is None:
                    if gpu.memory_free >= plan.bytes_per_gpu:
                        free_idx.append(gpu.index)
                elif gpu.memory_total >= plan.bytes_per_gpu:
                    busy += 1
            cap = (len(free_idx) + busy) // tp
            if cap:
                rows.append((name, tuple(sorted(free_idx)), cap))
        if sum(cap for _, _, cap in rows) < need_groups:
            continue
        rows.sort(key=lambda r: (-len(r[1]), -r[2], r[0]))
        # Every group as (gain, node order, j); the sort keeps a node's groups in j order.
        groups = [
            (-min(tp, max(0, len(free_idx) - j * tp)), order, j)
            for order, (_, free_idx, cap) in enumerate(rows)
            for j in range(cap)
        ]
        groups.sort()
        per_node: dict[int, int] = {}
        for _, order, _ in groups[:need_groups]:
            per_node[order] = per_node.get(order, 0) + 1
        target = []
        held = []
        for order in sorted(per_node):
            name, free_idx, _ = rows[order]
            gpus = per_node[order] * tp
            target.append((name, gpus))
            if free_idx[: min(gpus, len(free_idx))]:
                held.append((name, free_idx[: min(gpus, len(free_idx))]))
        res = Reservation(job_id, plan_index, plan, tuple(target), tuple(held))
        key = (res.missing, len(target), plan_index)
        if best is None or key < best[0]:
            best = (key, res)
    return None if best is None else best[1]


def _wait_s(job: QueuedJob, now: float) -> float:
    return max(0.0, now - job.submitted_at)


_INF = float("inf")


def _job_size(job: QueuedJob) -> float:
    """Estimated GPU-seconds of the job's cheapest plan (inf when no plan has an estimate)."""
    sizes = [p.runtime_s * p.num_gpus for p in job.plans if p.runtime_s is not None]
    return min(sizes) if sizes else _INF


# Memo of _plan_candidates: a queued job's plans do not change between passes (the simulator and
# the service reuse the same tuple), so the filter and sort run once per job, not per pass.
# Keyed by id() with the tuple itself kept alive in the value (so the id is not reused).
_CANDIDATES: dict[tuple[int, float], tuple[tuple[PlanOption, ...], list[tuple[float, int, PlanOption]]]] = {}


def _plan_candidates(
    plans: tuple[PlanOption, ...], width_slack: float
) -> list[tuple[float, int, PlanOption]]:
    """(runtime, index, plan) of the plans within ``width_slack`` of the cheapest GPU-seconds
    on their GPU type, fastest first (all plans must have ``runtime_s``)."""
    key = (id(plans), width_slack)
    hit = _CANDIDATES.get(key)
    if hit is not None and hit[0] is plans:
        return hit[1]
    cheapest: dict[str, float] = {}
    for p in plans:
        gs = p.runtime_s * p.num_gpus  # type: ignore[operator]
        cheapest[p.gpu_type] = min(cheapest.get(p.gpu_type, _INF), gs)
    out = sorted(
        (p.runtime_s or 0.0, i, p)
        for i, p in enumerate(plans)
        # more GPUs for little speed-up costs the queue more than it gains
        if (p.runtime_s or 0.0) * p.num_gpus <= (1.0 + width_slack) * cheapest[p.gpu_type]
    )
    if len(_CANDIDATES) > 50_000:
        _CANDIDATES.clear()
    _CANDIDATES[key] = (plans, out)
    return out


def _cheapest_runtime(job: QueuedJob) -> float:
    """Runtime of the plan with the fewest GPU-seconds (the first such); 0 unless every plan
    has a runtime."""
    if not job.plans or any(p.runtime_s is None for p in job.plans):
        return 0.0
    return min(job.plans, key=lambda p: p.runtime_s * p.num_gpus).runtime_s  # type: ignore[operator,return-value]


def _starves(job: QueuedJob, now: float, policy: QueuePolicy) -> bool:
    if _wait_s(job, now) < policy.starvation_s:
        return False
    # added after the freeze: the wait measured against the job's own length too
    return policy.starvation_s <= 0 or _wait_s(job, now) >= policy.starvation_stretch * _cheapest_runtime(job)


def _order(jobs: list[QueuedJob], now: float, policy: QueuePolicy) -> list[QueuedJob]:
    if policy.order == "fifo":
        return jobs
    # Aging: starving jobs keep FIFO priority, so shortest-first cannot starve a big job.
    starving = [j for j in jobs if _starves(j, now, policy)]
    if policy.starving_order == "ideal":  # added after the freeze: submit + cheapest plan's runtime
        starving.sort(key=lambda j: (j.submitted_at + _cheapest_runtime(j), j.seq, j.job_id))
    rest = [j for j in jobs if not _starves(j, now, policy)]
    rest.sort(key=lambda j: (_job_size(j), j.seq, j.job_id))
    return starving + rest


class _Releases:
    """When will ``n`` GPUs of a type be free? A queue-aware estimate for plan choice.

    Per (GPU type, memory level): a min-heap of every qualifying GPU's release time —
    free = now, busy = its ``free_at``, unknown = never — built once per pass from the
    snapshot. Every decision of the pass is *committed* to it: a placement makes its GPUs
    busy until now + runtime; a job that chooses to wait for a plan claims the GPUs that
    free first until its own estimated end. So a job further down the queue does not count
    on GPUs an earlier job already counts on (without this, every job would wait for the
    same soon-free fast GPUs). TP groups are ignored here (an estimate; actual placement is
    ``choose_nodes``).
    """

    def __init__(self, cluster: ClusterView, now: float) -> None:
        self.cluster = cluster
        self.now = now
        self._times: dict[tuple[str, int], list[float]] = {}

    def _sorted(self, plan: PlanOption) -> list[float] | None:
        level = self.cluster.memory_level(plan.gpu_type, plan.bytes_per_gpu)
        if level is None:
            return None
        key = (plan.gpu_type, level)
        times = self._times.get(key)
        if times is None:
            times = sorted(
                self.now if g.owner is None else (max(self.now, g.free_at) if g.free_at is not None else _INF)
                for name in self.cluster.healthy_by_node(plan.gpu_type)
                for g in self.cluster.node(name).gpus
                if g.gpu_type == plan.gpu_type and g.healthy and g.memory_total >= level
            )
            self._times[key] = times
        return times

    def start_at(self, plan: PlanOption) -> float:
        """O(1) after the first call per (type, level): the n-th earliest release time."""
        times = self._sorted(plan)
        if times is None or len(times) < plan.num_gpus:
            return _INF
        return times[plan.num_gpus - 1]

    def commit(self, plan: PlanOption, until: float) -> None:
        """The ``plan.num_gpus`` earliest-free GPUs of its type are taken until ``until``."""
        times = self._sorted(plan)
        n = plan.num_gpus
        if times is None or len(times) < n:
            return
        del times[:n]
        pos = bisect.bisect_left(times, until)
        times[pos:pos] = [until] * n


def _fits_now(view: ClusterView, plan: PlanOption) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    if view.free_count(plan.gpu_type) < plan.num_gpus:
        return None  # O(1): not enough free GPUs of the type at all
    return choose_nodes(view, plan)


def _place_ranked(view: ClusterView, job: QueuedJob, explain: bool) -> Placement | PendingReason:
    """MARP's order, first plan that fits now (``place_job`` with an O(1) pre-check)."""
    for i, plan in enumerate(job.plans):
        nodes = _fits_now(view, plan)
        if nodes is not None:
            return Placement(job_id=job.job_id, plan_index=i, plan=plan, nodes=nodes)
    if explain or not job.plans:
        return explain_job(view, job.plans)
    return PendingReason("no plan fits the free GPUs now", ())


def _place_completion(
    view: ClusterView, job: QueuedJob, now: float, policy: QueuePolicy, releases: _Releases
) -> tuple[Placement | PendingReason, int | None]:
    """Earliest estimated completion among the plans that are not wasteful (see QueuePolicy).

    Returns the decision and, when the job waits, the index of the plan it waits for
    (a starving job's reservation drains towards that plan, not a slower one).
    """
    plans = job.plans
    if not plans or any(p.runtime_s is None for p in plans):
        return _place_ranked(view, job, policy.explain), None
    best_now: tuple[float, int, Placement] | None = None
    best_any: tuple[float, int] | None = None
    slack = 1.0 + policy.wait_slack
    for runtime, i, p in _plan_candidates(plans, policy.width_slack):
        # Fastest first: no later plan can finish before now + runtime, nor be accepted over
        # a waiting plan unless within the wait slack, so the walk stops early.
        if best_any is not None and runtime > (best_any[0] - now) * slack:
            break
        nodes = _fits_now(view, p)
        if nodes is not None:
            done = now + runtime
            if best_now is None or (done, i) < best_now[:2]:
                best_now = (done, i, Placement(job_id=job.job_id, plan_index=i, plan=p, nodes=nodes))
        else:
            done = releases.start_at(p) + runtime
        if best_any is None or (done, i) < best_any:
            best_any = (done, i)
    if best_now is not None and best_any is not None:
        if best_any[1] == best_now[1] or best_now[0] - now <= (best_any[0] - now) * slack:
            releases.commit(best_now[2].plan, best_now[0])
            return best_now[2], None
        better = plans[best_any[1]]
        releases.commit(better, best_any[0])
        return PendingReason(
            f"waiting for {better.describe()}: estimated done in {best_any[0] - now:.0f} s vs "
            f"{best_now[0] - now:.0f} s on {best_now[2].plan.describe()} now",
            (),
        ), best_any[1]
    preferred = best_any[1] if best_any is not None and best_any[0] < _INF else None
    if preferred is not None:
        releases.commit(plans[preferred], best_any[0])  # type: ignore[index]
    if policy.explain:
        return explain_job(view, plans), preferred
    return PendingReason("no plan fits the free GPUs now", ()), preferred


def schedule(
    cluster: ClusterView,
    queue: Sequence[QueuedJob],
    now: float,
    policy: QueuePolicy = QueuePolicy(),
) -> ScheduleResult:
    """One scheduling pass over ``queue`` (FIFO by seq) against ``cluster`` at time ``now``.

    See the module docstring for the policy. Every queued job ends up either in
    ``placements`` or in ``pending`` with a reason.
    """
    jobs = sorted(queue, key=lambda j: (j.seq, j.job_id))
    seen: set[str] = set()
    for job in jobs:
        if job.job_id in seen:
            raise ValueError(f"job {job.job_id!r} is queued twice")
        seen.add(job.job_id)
    jobs = _order(jobs, now, policy)
    releases = _Releases(cluster, now)

    view = cluster  # free GPUs left in this pass, minus the holder's held GPUs
    unheld = cluster  # the same without the hold: tells "held for X" from "no room"
    placements: list[Placement] = []
    pending: dict[str, PendingReason] = {}
    holder: QueuedJob | None = None
    reservation: Reservation | None = None
    fifo_head: QueuedJob | None = None

    for job in jobs:
        if fifo_head is not None:
            pending[job.job_id] = PendingReason(
                f"waiting behind {fifo_head.job_id} (strict FIFO, backfill off)", (), WaitKind.BEHIND_HEAD
            )
            continue

        preferred: int | None = None
        if policy.plan_choice == "completion":
            result, preferred = _place_completion(view, job, now, policy, releases)
        else:
            result = _place_ranked(view, job, policy.explain)
        if isinstance(result, Placement):
            placements.append(result)
            # Until a hold exists the two views are one; after, each loses the placed GPUs.
            unheld = view.with_reserved(result) if holder is None else unheld.with_reserved(result)
            view = view.with_reserved(result) if holder is not None else unheld
            continue
        if not job.plans:
            pending[job.job_id] = result
            continue

        if all(_never_fits(cluster, p) for p in job.plans):
            pending[job.job_id] = PendingReason(
                result.summary + "; cannot fit this cluster even with every job ended",
                result.per_plan,
                WaitKind.NEVER_FITS,
            )
            continue

        # (Amended in session 6: the label is given only when the hold is what keeps the job
        # out — it fits without the hold and not with it — and never for an empty hold.)
        if reservation is not None and holder is not None and reservation.held:
            alt = _place_ranked(unheld, job, explain=False)
            if isinstance(alt, Placement) and not isinstance(_place_ranked(view, job, explain=False), Placement):
                pending[job.job_id] = PendingReason(
                    f"would fit now ({alt.plan.describe()}) but those GPUs are held for starving job "
                    f"{holder.job_id} (waiting {_wait_s(holder, now):.0f} s)",
                    result.per_plan,
                    WaitKind.HELD_FOR_STARVING,
                )
                continue

        if not policy.backfill:
            fifo_head = job
            pending[job.job_id] = result
            continue

        if holder is None and _starves(job, now, policy):
            if preferred is None:
                res = drain_target(view, job.job_id, job.plans)
            else:  # hold GPUs for the plan the job chose to wait for
                res = drain_target(view, job.job_id, (job.plans[preferred],))
                if res is not None:
                    res = dataclasses.replace(res, plan_index=preferred)
            if res is not None:
                holder, reservation = job, res
                view = view.with_owned(res.gpus(), owner=job.job_id)
                nodes = ", ".join(f"{n}×{c}" for n, c in res.target)
                pending[job.job_id] = PendingReason(
                    f"{result.summary}; starving for {_wait_s(job, now):.0f} s: holding {res.held_count} free "
                    f"{res.plan.gpu_type} for plan {res.plan_index} (target {nodes}), "
                    f"waiting for {res.missing} more to be released",
                    result.per_plan,
                    WaitKind.RESERVING,
                )
                continue

        pending[job.job_id] = result

    blocked_by = (
        holder.job_id if holder is not None else (fifo_head.job_id if fifo_head is not None else None)
    )
    return ScheduleResult(tuple(placements), pending, blocked_by, reservation)


__all__ = [
    "QueuePolicy",
    "QueuedJob",
    "Reservation",
    "ScheduleResult",
    "drain_target",
    "schedule",
]
