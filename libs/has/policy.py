"""Queue policy: one scheduling pass from (cluster, queue, now) to decisions.

Policy — FIFO with backfill and a starvation reservation (docs/has-policy.md):

1. Jobs are tried in submit order (``seq``). Each job takes the first of its
   ranked plans that fits the GPUs still free in this pass (``place_job``'s
   rules); every placement is taken out of the pass's free-GPU index
   (``PassFree.take``), so one pass never hands a GPU out twice.
2. Backfill: a job that does not fit is skipped and later jobs may use the
   free GPUs, so a big job at the head never idles the cluster.
3. Starvation: the first job in seq order that cannot be placed and has waited
   at least ``starvation_s`` becomes the *reservation holder*. The policy picks
   a drain target for it — a plan and, per node, how many GPUs it will take
   there once running jobs end — that keeps the most of its GPUs already free
   (exact maximum; ties: fewer nodes, earlier plan, node name). Those free GPUs
   are held idle for it; later jobs may backfill only onto everything else:
   other GPU types, other nodes, and GPUs beyond what the holder needs.
   ``ScheduleResult.blocked_by`` names the holder.

4. Preemption (``QueuePolicy.preempt_within_s``, on in ``QueuePolicy.frenzy()``): given
   the running jobs, a job submitted seconds ago may be stopped for a much shorter waiting
   one, at most one per pass (``_Pass._preempt``; docs/has-policy.md).

Why the holder cannot starve: held GPUs stay free (nothing else may take them)
and the running jobs on its target keep ending, so the best achievable number
of held GPUs never decreases between passes and grows whenever a GPU of the
target is released; when it reaches the plan's size, the plan fits and the
holder is placed. This assumes running jobs end (training jobs do) and seq
follows submission time. Only one holder exists at a time; the next starving
job becomes holder once it is placed.

Jobs that cannot fit even if every job ended (no such GPU type, too few GPUs,
a TP group wider than any node) never become holders: blocking the cluster for
them would help nobody. With ``backfill=False`` the policy is strict FIFO: the
first job that does not fit (and could fit some day) blocks every later job.

Pure and deterministic: no clock (``now`` is an argument), no randomness, all
ties broken by seq, job id or node name. The live scheduler and the simulator
call this same function.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from has.cluster import ClusterView, GpuSlot, NodeFree
from has.pass_state import PassFree
from has.placement import (
    PendingReason,
    Placement,
    PlanOption,
    WaitKind,
    explain_with,
)


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs: ``seq`` is its FIFO position, ``plans`` are ranked best first."""

    job_id: str
    seq: int
    submitted_at: float
    plans: tuple[PlanOption, ...]
    # What ``schedule`` derives from the plans, computed on first use and kept with the job
    # (``_plans_of``). Not part of equality, hashing or repr; ``dataclasses.replace`` gives
    # the new job an empty cache (its plans may differ).
    _has_plans: _JobPlans | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Accept any sequence from callers but keep the dataclass hashable and immutable.
        if not isinstance(self.plans, tuple):
            object.__setattr__(self, "plans", tuple(self.plans))
        object.__setattr__(self, "_has_plans", None)  # (a compiled build does not apply the default)


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
    starving_order: with "shortest", the order of the jobs that waited ``starvation_s``.
      "fifo": by seq. "ideal": by *ideal completion* — submit time + estimated runtime of
      the cheapest plan (the completion the job would have had with no queueing; unknown
      runtime = 0, i.e. by submit time) — so jobs that starve together (a burst) go
      shortest first instead of in arbitrary arrival order, while a job still passes every
      job submitted after its ideal completion (no starvation; docs/has-policy.md).
    plan_choice: "ranked" takes the first plan that fits now (MARP's order).
      "completion" takes the plan with the earliest estimated completion, counting
      the wait for GPUs that are busy (``GpuSlot.free_at``), among the plans whose
      GPU-seconds are within ``width_slack`` of the cheapest plan on that GPU type;
      a job waits for a busy plan only when starting now would finish more than
      ``wait_slack`` later. Plans without ``runtime_s`` fall back to "ranked".
    explain: build per-plan pending reasons (the service shows them; the simulator
      turns them off: decisions are the same, only the reason text differs).
    preempt_within_s: 0 (default) never preempts. > 0 (needs plan_choice="completion" and the
      ``running`` argument of ``schedule``): a running job *submitted* at most this many
      seconds ago (it started at once and has run no longer than that), marked preemptible,
      may be stopped for the first waiting job in the pass's order that needs its GPUs, when
      that job is shorter than what the victim has left (switch cost included) and gains more
      than ``preempt_gain`` x what the victim and the jobs waiting for its GPU type lose:
      its runtime + ``preempt_restart_s`` + the victim's progress since its start (lost: no
      checkpoint so soon) for each. Shortest-first applied retroactively to jobs whose arrival
      order was a matter of seconds. At most one per pass; ``ScheduleResult.preemptions``
      lists it (``_Pass._preempt`` has the rule in full).

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
    starving_order: str = "fifo"
    preempt_within_s: float = 0.0
    preempt_restart_s: float = 120.0
    preempt_gain: float = 2.0

    def __post_init__(self) -> None:
        if self.starvation_s < 0:
            raise ValueError(f"starvation_s must be >= 0, got {self.starvation_s}")
        if self.order not in ("fifo", "shortest"):
            raise ValueError(f"order must be 'fifo' or 'shortest', got {self.order!r}")
        if self.starving_order not in ("fifo", "ideal"):
            raise ValueError(f"starving_order must be 'fifo' or 'ideal', got {self.starving_order!r}")
        if self.plan_choice not in ("ranked", "completion"):
            raise ValueError(f"plan_choice must be 'ranked' or 'completion', got {self.plan_choice!r}")
        if self.width_slack < 0 or self.wait_slack < 0:
            raise ValueError("width_slack and wait_slack must be >= 0")
        if self.preempt_within_s < 0 or self.preempt_restart_s < 0 or self.preempt_gain < 0:
            raise ValueError("preempt_within_s, preempt_restart_s and preempt_gain must be >= 0")

    @classmethod
    def frenzy(cls, **overrides: object) -> QueuePolicy:
        """Shortest-first with aging, completion-time-aware plan choice, backfill, and stopping
        a job submitted under a minute ago for a much shorter one (ours)."""
        # Knobs chosen on Pollux workloads 1-5 on paper-64 (docs/simulator.md has the sweep);
        # held-out checks: workloads 6-7 and the Gavel traces. The preemption window and gain
        # were read off a grid on all ten shipped traces, then checked on held-out synthetic
        # workloads and the Gavel jobs after the first 300 (docs/simulator.md).
        base: dict[str, object] = {
            "order": "shortest", "plan_choice": "completion", "starvation_s": 14400.0,
            "width_slack": 0.15, "wait_slack": 0.2, "starving_order": "ideal",
            "preempt_within_s": 60.0, "preempt_restart_s": 120.0, "preempt_gain": 2.0,
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
class RunningJob:
    """A running job as preemption sees it (``schedule``'s ``running``); its GPUs and estimated
    end are the cluster's (``GpuSlot.owner``, ``GpuSlot.free_at``).

    preemptible: False once the job was preempted (each job at most once, so no job is
    stopped again and again), or whenever the operator says so.
    """

    job_id: str
    started_at: float
    submitted_at: float
    preemptible: bool = True


@dataclass(frozen=True)
class Preemption:
    """Stop ``job_id`` (it goes back to the queue, losing ``lost_s`` of progress) so that
    ``for_job`` — placed in this pass's ``placements`` on its GPUs — starts now."""

    job_id: str
    for_job: str
    lost_s: float


@dataclass(frozen=True)
class ScheduleResult:
    """Decisions of one pass.

    placements: in the order they were made (seq order); never overlapping. A placement made
      for a preemption uses GPUs of the stopped job: stop it before starting the placement.
    preemptions: running jobs to stop (``QueuePolicy.preempt_within_s``); empty unless enabled.
    pending: job id → why it waits, for every queued job not placed.
    blocked_by: the job whose needs currently restrict later jobs — the
      starving reservation holder, or with ``backfill=False`` the blocked head.
    reservation: the holder's held GPUs and drain target, if any.
    """

    placements: tuple[Placement, ...]
    pending: dict[str, PendingReason]
    blocked_by: str | None
    reservation: Reservation | None = field(default=None)
    preemptions: tuple[Preemption, ...] = ()


def _never_fits(cluster: ClusterView, plan: PlanOption) -> bool:
    """True when ``plan`` could not fit even with every job ended."""
    return cluster.capacity_groups(plan.gpu_type, plan.bytes_per_gpu, plan.tp) * plan.tp < plan.num_gpus


class _DrainSource(Protocol):
    """What ``drain_target`` reads: a ``ClusterView``, or the pass's state (``_PassInventory``)."""

    def drain_inventory(
        self, gpu_type: str
    ) -> tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]: ...


class _PassInventory:
    """The snapshot minus this pass's placements, as ``drain_target`` reads it — from the pass's
    free-GPU index and the placements' GPUs, without deriving a ``ClusterView`` (which copies
    every GPU a placement takes: ~60 ms for a 1,000-GPU placement at 10,000 GPUs)."""

    def __init__(self, cluster: ClusterView, free: PassFree, placements: Sequence[Placement]) -> None:
        self.cluster, self.free, self.placements = cluster, free, placements

    def drain_inventory(
        self, gpu_type: str
    ) -> tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]:
        rows, _, busy_levels = self.cluster.drain_inventory(gpu_type)
        placed: dict[str, list[int]] = {}  # node → memory_total of the GPUs placed on it this pass
        for p in self.placements:
            if p.plan.gpu_type == gpu_type:
                for name, indices in p.nodes:
                    total = {g.index: g.memory_total for g in self.cluster.node(name).gpus}
                    placed.setdefault(name, []).extend(total[i] for i in indices)
        now = self.free.free_by_node(gpu_type)
        out = [(name, now.get(name), sorted(busy + placed[name]) if name in placed else busy) for name, _, busy in rows]
        free_levels = sorted({m for nf in now.values() for m in nf.mem_sorted})
        busy_levels = sorted(set(busy_levels).union(*placed.values())) if placed else busy_levels
        return out, free_levels, busy_levels


def drain_target(cluster: _DrainSource, job_id: str, plans: Sequence[PlanOption]) -> Reservation | None:
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
    best: tuple[tuple[int, int, int], _DrainNodes, dict[int, int]] | None = None
    # A job has dozens of plans but few node orders: plans of one GPU type and TP width whose
    # byte needs qualify the same GPUs rank the nodes alike (sorted once), and only their
    # sizes differ (the greedy walk, cheap). Only the winner's GPUs are listed.
    inventories: dict[str, tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]] = {}
    orders: dict[tuple[str, int, int, int], _DrainNodes] = {}
    for plan_index, plan in enumerate(plans):
        tp = plan.tp
        need_groups = plan.num_gpus // tp
        need_bytes = plan.bytes_per_gpu
        inv = inventories.get(plan.gpu_type)
        if inv is None:
            inv = inventories[plan.gpu_type] = cluster.drain_inventory(plan.gpu_type)
        inventory, free_levels, busy_levels = inv
        key = (plan.gpu_type, tp, bisect.bisect_left(free_levels, need_bytes),
               bisect.bisect_left(busy_levels, need_bytes))  # fmt: skip
        nodes = orders.get(key)
        if nodes is None:
            nodes = orders[key] = _DrainNodes(inventory, tp, need_bytes)
        if nodes.cap < need_groups:
            continue
        groups, held = nodes.pick(need_groups)
        rank = (plan.num_gpus - held, len(groups), plan_index)  # (missing, target nodes, plan)
        if best is None or rank < best[0]:
            best = (rank, nodes, groups)
    if best is None:
        return None
    (_, _, plan_index), nodes, groups = best
    target, held_gpus = nodes.listed(groups)
    return Reservation(job_id, plan_index, plans[plan_index], target, held_gpus)


class _DrainNodes:
    """One (GPU type, TP width, qualifying GPUs) of ``drain_target``: the nodes that can give
    the plan whole TP groups, best first — (name, free qualifying, cap groups, free GPUs) by
    (most free qualifying, most cap, name) — and their total ``cap``."""

    __slots__ = ("rows", "cap", "tp", "need_bytes", "_partial", "_picks")

    def __init__(self, inventory: list[tuple[str, NodeFree | None, list[int]]], tp: int, need_bytes: int) -> None:
        rows: list[tuple[str, int, int, NodeFree | None]] = []
        for name, free, busy in inventory:
            q = free.count_at_least(need_bytes) if free is not None else 0
            cap = (q + len(busy) - bisect.bisect_left(busy, need_bytes)) // tp
            if cap:
                rows.append((name, q, cap, free))
        rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
        self.rows = rows
        self.cap = sum(cap for _, _, cap, _ in rows)
        self.tp = tp
        self.need_bytes = need_bytes
        self._partial: list[tuple[int, int]] | None = None
        self._picks: dict[int, tuple[dict[int, int], int]] = {}  # (plans of one size share a pick)

    def pick(self, need_groups: int) -> tuple[dict[int, int], int]:
        """The ``need_groups`` groups of largest gain, ties by (node order, j) — counted, not
        listed: a node's groups gain tp (whole groups of free GPUs: q // tp of them), then one
        group gains q % tp (when the node has room for it), then the rest gain 0. Returns
        (row → groups taken there, free GPUs they hold)."""
        hit = self._picks.get(need_groups)
        if hit is not None:
            return hit
        rows, tp = self.rows, self.tp
        per_node: dict[int, int] = {}
        left = need_groups
        for order, (_, q, _, _) in enumerate(rows):  # 1. every group already whole, node by node
            if left == 0:
                break
            take = min(q // tp, left)
            if take:
                per_node[order] = take
                left -= take
        if left:  # 2. the partial groups, largest first
            partial = self._partial
            if partial is None:
                partial = self._partial = sorted(
                    (-(q % tp), order) for order, (_, q, cap, _) in enumerate(rows) if q % tp and cap > q // tp
                )
            for _, order in partial[:left]:
                per_node[order] = per_node.get(order, 0) + 1
            left -= min(left, len(partial))
        for order, (_, q, cap, _) in enumerate(rows):  # 3. groups of busy GPUs only, node by node
            if left == 0:
                break
            take = min(cap - -(-q // tp), left)  # cap minus the groups with a free GPU
            if take > 0:
                per_node[order] = per_node.get(order, 0) + take
                left -= take
        held = 0
        for order, groups in per_node.items():  # the first groups*tp of a node's q free ones
            held += min(rows[order][1], groups * tp)
        self._picks[need_groups] = (per_node, held)
        return per_node, held

    def listed(
        self, per_node: dict[int, int]
    ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, tuple[int, ...]], ...]]:
        """``pick``'s groups as (target nodes and GPU counts, free GPUs held), in node order."""
        target = []
        held = []
        for order in sorted(per_node):
            name, q, _, free = self.rows[order]
            gpus = per_node[order] * self.tp
            target.append((name, gpus))
            if q and free is not None:
                held.append((name, tuple([s.index for s in free.slots if s.memory_free >= self.need_bytes][:gpus])))
        return tuple(target), tuple(held)


def _wait_s(job: QueuedJob, now: float) -> float:
    return max(0.0, now - job.submitted_at)


_INF = float("inf")
_MAX_VICTIMS = 4  # running jobs a pass weighs for preemption (the most recently started)
_LAST = 1 << 62  # a plan index after every real one: "none yet" that loses every tie
_NO_FIT_NOW = PendingReason("no plan fits the free GPUs now", ())
# (runtime, plan index, gpu_type, GPUs - 1, tp, bytes_per_gpu, plan)
_Candidate = tuple[float, int, str, int, int, int, PlanOption]


class _Lean:
    """One completion candidate as the pass walks it: runtime, plan index, GPUs - 1, number of
    its release list (``_Releases.lid``). A class, not a tuple: a compiled build keeps the
    fields unboxed in the object, so reading a candidate touches one object, not a tuple and
    a float elsewhere in memory (the pass is bound by those memory reads)."""

    __slots__ = ("runtime", "index", "nm1", "lid")

    def __init__(self, runtime: float, index: int, nm1: int, lid: int) -> None:
        self.runtime = runtime
        self.index = index
        self.nm1 = nm1
        self.lid = lid


class _JobPlans:
    """What a pass needs of one job's plans, computed once per ``QueuedJob`` (its plans never
    change) and kept on the object, so a pass over a queue it has seen does no per-plan setup.

    rows: (index, gpu_type, GPUs, tp, bytes) per plan in ranked order; least: per GPU type the
    fewest GPUs any of its plans needs (a job none of whose types has that many free GPUs is
    rejected without looking at a plan); size: GPU-seconds of the cheapest timed plan;
    ideal_key: (submit time + that plan's runtime, seq, job id), the starving order "ideal";
    lean: the candidates as the pass walks them, with their release-list numbers, valid for
    ``lean_for`` (``_Pass._lean``). The cache is keyed by nothing but the object (``QueuedJob`` and
    ``PlanOption`` are frozen), except what depends on the capacity (``ever``, ``lean_for``).
    """

    __slots__ = (
        "rows", "runtimes", "least", "fewest", "timed", "size", "fifo_key", "short_key", "ideal_key", "by_slack",
        "short_first", "ideal_first", "seq", "job_id", "submitted_at", "has_plans",
        "_shape", "ever", "sigs", "lean_for", "lean",
    )  # fmt: skip

    def __init__(self, job: QueuedJob) -> None:
        plans = job.plans
        rows = []
        runtimes = []
        least: dict[str, int] = {}
        sizes = []
        cheapest, cheapest_run = _INF, 0.0  # fewest GPU-seconds of a plan, that plan's runtime
        for i, p in enumerate(plans):
            t, tp, r = p.gpu_type, p.tp, p.runtime_s
            n = tp * p.pp * p.dp  # p.num_gpus
            rows.append((i, t, n, tp, p.bytes_per_gpu))
            runtimes.append(r)
            if n < least.get(t, n + 1):
                least[t] = n
            if r is not None:
                if r * n < cheapest:
                    cheapest, cheapest_run = r * n, r
                sizes.append(r * n)
        self.rows = rows
        self.runtimes = runtimes
        self.least = tuple(least.items())
        self.fewest = min(least.values(), default=0)  # GPUs of the job's smallest plan
        self.timed = bool(plans) and len(sizes) == len(plans)
        self.size = min(sizes) if sizes else _INF
        # Sort keys of the queue orders, typed as tuples of objects so a compiled build keeps
        # each as one Python tuple rather than rebuilding it from its parts on every read.
        self.fifo_key: tuple[object, ...] = (job.seq, job.job_id)
        self.short_key: tuple[object, ...] = (self.size, job.seq, job.job_id)
        # unknown runtime: 0, so jobs without estimates keep submit (FIFO) order
        ideal = job.submitted_at + (cheapest_run if self.timed else 0.0)
        self.ideal_key: tuple[object, ...] = (ideal, job.seq, job.job_id)
        # Their first elements (FIFO's is ``seq``), typed ``object`` for the same reason
        # (``_sorted`` sorts by them).
        self.short_first: object = self.size
        self.ideal_first: object = ideal
        self.seq: object = job.seq
        # The job's fields the pass reads for every job, kept here so that a waiting job's turn
        # reads this object and not the QueuedJob too (the pass is bound by memory reads).
        self.job_id = job.job_id
        self.submitted_at = job.submitted_at
        self.has_plans = bool(plans)
        self.by_slack: dict[float, list[_Candidate]] = {}
        self.sigs: dict[float, tuple[int, tuple[int, ...]]] = {}
        self.ever: tuple[object, bool] = (None, True)  # (capacity it was answered for, answer)
        self._shape: tuple[int, tuple[str, ...]] | None = None
        self.lean_for: tuple[object, float] = (None, 0.0)  # (capacity, width_slack) of lean
        self.lean: list[_Lean] = []

    def shape(self, plans: tuple[PlanOption, ...]) -> tuple[int, tuple[str, ...]]:
        """(id of what the job's pending reason depends on, its GPU types): jobs with the same
        plan shapes — the same model and recipe, whatever their length — share one id."""
        if self._shape is None:
            key = tuple((p.gpu_type, p.tp, p.pp, p.dp, p.bytes_per_gpu, p.label) for p in plans)
            if len(_SHAPES) > 100_000:  # bounded: distinct plan shapes seen by a long-lived process
                _SHAPES.clear()
            shape = _SHAPES.get(key)
            if shape is None:
                shape = _SHAPES[key] = next(_SHAPE_IDS)  # never reused, even after a clear
            self._shape = (shape, tuple(sorted({p.gpu_type for p in plans})))
        return self._shape

    def candidate_signature(self, plans: tuple[PlanOption, ...], width_slack: float) -> tuple[int, tuple[int, ...]]:
        """(plan shapes id, candidate plan indices in order): two jobs with the same signature
        have the same candidates as far as placement goes (types, widths, bytes, order)."""
        sig = self.sigs.get(width_slack)
        if sig is None:
            sig = self.sigs[width_slack] = (
                self.shape(plans)[0], tuple([c[1] for c in self.candidates(plans, width_slack)])
            )
        return sig

    def candidates(self, plans: tuple[PlanOption, ...], width_slack: float) -> list[_Candidate]:
        """(runtime, index, type, GPUs - 1, tp, bytes, plan) of the plans within
        ``width_slack`` of the cheapest GPU-seconds on their GPU type, fastest first (all plans
        have runtime_s)."""
        out = self.by_slack.get(width_slack)
        if out is None:
            cheapest: dict[str, float] = {}
            for (_, t, n, _, _), r in zip(self.rows, self.runtimes, strict=True):
                cheapest[t] = min(cheapest.get(t, _INF), r * n)  # type: ignore[operator]
            scale = 1.0 + width_slack
            ranked = sorted(
                (r or 0.0, row)
                for row, r in zip(self.rows, self.runtimes, strict=True)
                # more GPUs for little speed-up costs the queue more than it gains
                if (r or 0.0) * row[2] <= scale * cheapest[row[1]]
            )  # (runtime, (index, ...)): indices are unique, so ties sort by plan index
            out = [(r, i, t, n - 1, tp, b, plans[i]) for r, (i, t, n, tp, b) in ranked]
            self.by_slack[width_slack] = out
        return out


_SHAPES: dict[tuple[tuple[str, int, int, int, int, str], ...], int] = {}
_SHAPE_IDS = itertools.count()


def _plans_of(job: QueuedJob) -> _JobPlans:
    info = job._has_plans
    if info is None:
        info = _JobPlans(job)
        object.__setattr__(job, "_has_plans", info)  # (a frozen dataclass: its cache field only)
    return info


def _order(queue: Sequence[QueuedJob], now: float, policy: QueuePolicy) -> list[_Row]:
    """The queue in the order the pass tries it, each job as a row (``_Row``: sort key's first
    element, seq, sort key, job, its plan summary): by (seq, job id); with
    ``order="shortest"``, the jobs that waited ``starvation_s`` that way, then the rest by
    (size, seq, job id); with ``starving_order="ideal"`` the starving jobs by (submit time +
    runtime of the cheapest plan, seq, job id). (Sort keys are cached per job; job ids are unique, so two rows never
    tie on the key.)"""
    if policy.order == "fifo":
        rows: list[_Row] = []
        for j in queue:
            info = _plans_of(j)
            rows.append((info.seq, info.seq, info.fifo_key, j, info))
        return _sorted(rows)
    # Aging: starving jobs keep FIFO priority, so shortest-first cannot starve a big job.
    # (``_wait_s(j, now) >= s`` written out: a pass calls it once per queued job.)
    s = policy.starvation_s
    ideal = policy.starving_order == "ideal"
    starving: list[_Row] = []
    rest: list[_Row] = []
    for j in queue:
        info = j._has_plans or _plans_of(j)  # (_plans_of inline: once per job)
        if s <= 0.0 or now - j.submitted_at >= s:
            if ideal:
                starving.append((info.ideal_first, info.seq, info.ideal_key, j, info))
            else:
                starving.append((info.seq, info.seq, info.fifo_key, j, info))
        else:
            rest.append((info.short_first, info.seq, info.short_key, j, info))
    return _sorted(starving) + _sorted(rest)


# (first element of the sort key, the job's seq, the whole key, job, its plans). Typed
# ``object`` but for the plans: a compiled build then does not read the key and the job (to
# check their types) when the pass unpacks a row; ``_job`` gives the job where it is needed.
_Row = tuple[object, object, object, object, "_JobPlans"]
_KEY = operator.itemgetter(0)
_SEQ = operator.itemgetter(1)
_FULL_KEY = operator.itemgetter(2)


def _sorted(rows: list[_Row]) -> list[_Row]:
    """``rows`` sorted by their whole key ((first element, seq, job id), or (seq, job id) in
    FIFO order), in place.

    CPython sorts a list whose keys are all floats (or all small ints) with a direct
    comparison, several times faster than comparing tuples item by item (~0.4 ms of a
    1,000-job pass). So, when no first element is NaN: rows in strictly increasing seq order
    (a queue usually comes that way; if not, a sort by seq makes it so when no two seqs are
    equal) are stably sorted by the first element alone, which leaves equal first elements
    in seq order: the same order as the whole key. Only when seqs repeat (or a first element
    is NaN) are tuples compared.
    """
    total = sum(cast("list[float]", [r[0] for r in rows]))  # NaN when one is NaN (or both infinities are there)
    if total == total:
        if not _seq_increasing(rows):
            rows.sort(key=_SEQ)
        if _seq_increasing(rows):
            rows.sort(key=_KEY)  # stable: rows with equal first elements stay in seq order
            return rows
    rows.sort(key=_FULL_KEY)
    return rows


def _seq_increasing(rows: list[_Row]) -> bool:
    """Are the rows' seqs strictly increasing (so also distinct)?"""
    prev: int | None = None
    for r in rows:
        seq = cast(int, r[1])
        if prev is not None and seq <= prev:
            return False
        prev = seq
    return True


class _ReleaseList:
    """The release times of one (GPU type, memory level) — one per GPU — as runs: time
    ``times[j]`` (ascending, distinct) for ``counts[j]`` GPUs, live from run ``lo`` on;
    ``size`` GPUs in all (a commit takes as many as it gives back, so it never changes).

    Runs, not one entry per GPU: the GPUs of a running job share one release time, and so do
    the GPUs a decision claims, so a list of ~3,000 GPUs holds a few hundred runs. A commit
    then searches and shifts runs, not GPUs, and never builds ``n`` copies of its time; a
    lookup walks the few runs before the ``k``-th GPU (usually one or two).
    """

    __slots__ = ("times", "counts", "lo", "size")

    def __init__(self, times: list[float], counts: list[int]) -> None:
        """From ``ClusterView.release_runs`` (lists this object then owns and edits)."""
        self.times = times
        self.counts = counts
        self.lo = 0
        self.size = sum(counts)

    def at(self, k: int) -> float:
        """The (k + 1)-th earliest release time; inf when there are not that many GPUs."""
        if k >= self.size:
            return _INF
        counts = self.counts
        j = self.lo
        c = counts[j]
        while k >= c:
            k -= c
            j += 1
            c = counts[j]
        return self.times[j]

    def commit(self, n: int, until: float) -> None:
        """The ``n`` earliest-free GPUs are busy until ``until`` (nothing when fewer than n)."""
        if self.size < n:
            return
        counts, lo, left = self.counts, self.lo, n
        while left:  # take the n earliest from the front runs
            c = counts[lo]
            if c > left:
                counts[lo] = c - left
                break
            left -= c
            lo += 1
        self.lo = lo
        times = self.times
        pos = bisect.bisect_left(times, until, lo)  # give them back as one run at ``until``
        if pos < len(times) and times[pos] == until:
            counts[pos] += n
        else:
            times.insert(pos, until)
            counts.insert(pos, n)


class _Releases:
    """When will ``n`` GPUs of a type be free? A queue-aware estimate for plan choice.

    Per (GPU type, memory level): the sorted release time of every qualifying GPU — free =
    now, busy = its ``free_at``, unknown = never — from the snapshot
    (``ClusterView.release_runs``). Every decision of the pass is *committed* to it: a
    placement makes its GPUs busy until now + runtime; a job that chooses to wait for a plan
    claims the GPUs that free first until its own estimated end. So a job further down the
    queue does not count on GPUs an earlier job already counts on (without this, every job
    would wait for the same soon-free fast GPUs). TP groups are ignored here (an estimate;
    actual placement is ``choose_nodes``).

    ``lists[lid]`` is the list a plan draws from, ``lid`` the number ``lid(bytes, type)``
    gives its (type, memory level) — plans whose bytes fall in one level share one list; a
    need above every GPU of the type gets an empty list (no release ever: estimate inf,
    commits no-ops). The numbers are the capacity's (``_Capacity.release_ids``), so a job
    keeps its candidates' numbers from pass to pass (``_Pass._lean``) and the pass's
    innermost loop indexes a list instead of hashing a key.
    """

    __slots__ = ("cluster", "now", "ids", "lists", "types")

    def __init__(self, cluster: ClusterView, now: float) -> None:
        self.cluster = cluster
        self.now = now
        self.ids = cluster._capacity.release_ids
        self.lists: list[_ReleaseList] = []
        self.types: list[str] = []  # the GPU type of each list

    def load(self) -> list[_ReleaseList]:
        """Every list numbered so far, built now (a few per GPU type: one per memory level
        some job needed), so that a job whose numbers are cached finds its lists built."""
        self._extend()
        return self.lists

    def _extend(self) -> None:
        keys = list(self.ids)  # (dicts keep insertion order: position = number)
        for gpu_type, level in keys[len(self.lists):]:
            times, counts = ([], []) if level is None else self.cluster.release_runs(gpu_type, level, self.now)
            self.lists.append(_ReleaseList(times, counts))
            self.types.append(gpu_type)

    def lid(self, need_bytes: int, gpu_type: str) -> int:
        """The number of the list a plan needing ``need_bytes`` of ``gpu_type`` draws from."""
        key = (gpu_type, self.cluster.memory_level(gpu_type, need_bytes))
        lid = self.ids.get(key)
        if lid is None:
            lid = self.ids[key] = len(self.ids)
        if lid >= len(self.lists):
            self._extend()
        return lid

    def commit(self, plan: PlanOption, until: float, found: _ReleaseList | None = None) -> None:
        """The ``plan.num_gpus`` earliest-free GPUs of its type are taken until ``until``
        (``found``: the plan's list when the caller already looked it up)."""
        if found is None:
            found = self.lists[self.lid(plan.bytes_per_gpu, plan.gpu_type)]
        found.commit(plan.num_gpus, until)


class _Pass:
    """One scheduling pass (see ``schedule``): the queue walk and the state it changes.

    ``free`` is the GPUs still free in this pass minus the holder's held GPUs; ``unheld``
    is the same without the hold (it tells "held for X" from "no room"), kept separately only
    once a hold exists. Both are ``PassFree`` indexes, changed in place as jobs are placed.
    """

    def __init__(
        self, cluster: ClusterView, now: float, policy: QueuePolicy, running: Sequence[RunningJob] = ()
    ) -> None:
        self.cluster = cluster
        self.now = now
        self.policy = policy
        self.running = running
        # job id → estimated completion if it waits (completion plan choice), for preemption
        self.est_done: dict[str, float] | None = (
            {} if policy.preempt_within_s > 0 and running and policy.plan_choice == "completion" else None
        )
        self.est_type: dict[str, str] = {}  # job id → GPU type of the plan it chose (placed or waits for)
        self.free = PassFree(cluster)
        self.unheld: PassFree | None = None
        self.releases = _Releases(cluster, now)
        self.placements: list[Placement] = []
        self._lines: dict[tuple[str, int, int, int, int, str, int], str] = {}
        self._reasons: dict[tuple[int, tuple[int, ...]], PendingReason] = {}
        self.most_free = max(self.free.total.values(), default=0)  # of any one type, in ``free``
        # free GPUs in ``free`` of each release list's GPU type (``total``, indexed by list number)
        self.free_n: list[int] = []

    def _take(
        self, free: PassFree, gpu_type: str, nodes: Sequence[tuple[str, Sequence[int]]], checked: bool
    ) -> None:
        free.take(gpu_type, nodes, checked)
        if free is self.free:
            self.most_free = max(free.total.values(), default=0)
            self._count_free()

    def _count_free(self) -> None:
        total = self.free.total
        self.free_n[:] = [total.get(t, 0) for t in self.releases.types]  # (in place: run holds it)

    def _lean(self, job: QueuedJob, info: _JobPlans) -> None:
        """The job's completion candidates as the pass walks them (``lean``: runtime, index,
        GPUs - 1, release-list number; a plan that may fit now is read from ``info.rows``),
        kept on the job while the capacity is the same (the numbers depend on its memory
        levels), like ``info.ever``: short tuples, because unpacking them is per plan."""
        width_slack, lid = self.policy.width_slack, self.releases.lid
        cands = info.candidates(job.plans, width_slack)
        info.lean = [_Lean(r, i, nm1, lid(b, t)) for r, i, t, nm1, _, b, _ in cands]
        info.lean_for = (self.cluster._capacity, width_slack)
        if len(self.free_n) < len(self.releases.types):  # new lists numbered
            self._count_free()

    def run(self, jobs: list[_Row]) -> ScheduleResult:
        policy, now = self.policy, self.now
        completion = policy.plan_choice == "completion"
        width_slack, slack, explain = policy.width_slack, 1.0 + policy.wait_slack, policy.explain
        starvation_s = policy.starvation_s
        releases, fits = self.releases, self.free.fits
        lists = releases.load() if completion else []  # release lists by number (_Releases)
        free_n = self.free_n
        self._count_free()
        # "Could this job ever fit?" depends only on the capacity, which views share while no
        # node or GPU changes health (ClusterView reuses it): answered once per job and kept.
        capacity, capacity_groups = self.cluster._capacity, self.cluster.capacity_groups
        inf, last = _INF, _LAST
        est_done, est_type, backfill = self.est_done, self.est_type, policy.backfill
        lean_key = (capacity, width_slack)  # what a job's lean depends on (_lean)
        pending: dict[str, PendingReason] = {}
        holder: QueuedJob | None = None
        reservation: Reservation | None = None
        fifo_head: QueuedJob | None = None
        behind = _NO_FIT_NOW

        for _, _, _, queued, info in jobs:
            job_id = info.job_id
            if fifo_head is not None:
                pending[job_id] = behind
                continue

            preferred: int | None = None
            if completion and info.timed:
                # Completion-time-aware plan choice (QueuePolicy): the earliest estimated
                # completion among the job's non-wasteful plans. Written inline, not as a
                # method, because this loop is the pass's hot path (~10 plans per queued job).
                if info.lean_for != lean_key:
                    self._lean(_job(queued), info)
                now_done, now_i, now_plan, now_lid = inf, last, None, 0  # best plan that fits now
                any_done, any_i, any_list, any_n = inf, last, None, 0  # best overall (now or after a wait)
                limit = inf  # (any_done - now) * slack, recomputed only when any_done changes
                # O(1): if no GPU type has as many free GPUs as the job's smallest plan needs,
                # nothing fits now and only release times are looked up (the first loop; once
                # the cluster is full, most jobs of a pass).
                if info.fewest > self.most_free:
                    for c in info.lean:
                        runtime = c.runtime
                        if runtime > limit:  # (as below)
                            break
                        i, nm1, lid = c.index, c.nm1, c.lid
                        found = lists[lid]
                        done = found.at(nm1) + runtime
                        # (done < any_done or (done == any_done and i < any_i)), one test when
                        # it loses, which most plans do
                        if done <= any_done and (done < any_done or i < any_i):
                            any_done, any_i, any_list, any_n = done, i, found, nm1 + 1
                            limit = (any_done - now) * slack
                else:
                    rows = info.rows
                    for c in info.lean:
                        runtime = c.runtime
                        # Fastest first: no later plan can finish before now + runtime, nor be
                        # accepted over a waiting plan unless within the wait slack: stop early.
                        if runtime > limit:
                            break
                        i, nm1, lid = c.index, c.nm1, c.lid
                        # free_n[lid]: free GPUs of the plan's type; row: (i, type, GPUs, tp, bytes)
                        if free_n[lid] > nm1 and fits((row := rows[i])[1], row[3], row[2], row[4]):
                            done = now + runtime
                            if done < now_done or (done == now_done and i < now_i):
                                now_done, now_i, now_plan, now_lid = done, i, _job(queued).plans[i], lid
                            found = None
                        else:  # start when the (nm1+1)-th earliest release of its GPUs comes
                            found = lists[lid]  # (inf: fewer such GPUs than it needs, or none with the memory)
                            done = found.at(nm1) + runtime
                        if done <= any_done and (done < any_done or i < any_i):  # (as above)
                            any_done, any_i, any_list, any_n = done, i, found, nm1 + 1
                            limit = (any_done - now) * slack
                if now_plan is not None:
                    result, preferred = self._settle(
                        _job(queued), now_done, now_i, now_plan, lists[now_lid], any_done, any_i, any_list
                    )
                else:
                    if any_done < inf:  # wait for the best plan: claim its GPUs' earliest releases
                        preferred = any_i
                        # any_list is the plan's list (it did not fit now, so it was looked up)
                        any_list.commit(any_n, any_done)  # type: ignore[union-attr]
                    result = self._explain(_job(queued).plans, info) if explain else _NO_FIT_NOW
                if est_done is not None:
                    est_done[job_id] = any_done
                    if any_i != last:  # the type of the plan it chose (placed, or waits for)
                        est_type[job_id] = _job(queued).plans[any_i].gpu_type
            else:
                result = self._ranked(_job(queued), info)
            if isinstance(result, Placement):
                self.placements.append(result)  # type: ignore[arg-type]
                # checked: chosen on ``free``, a subset of ``unheld``'s free GPUs
                self._take(self.free, result.plan.gpu_type, result.nodes, True)  # type: ignore[union-attr]
                if self.unheld is not None:
                    self._take(self.unheld, result.plan.gpu_type, result.nodes, True)  # type: ignore[union-attr]
                continue
            if not info.has_plans:
                pending[job_id] = result
                continue

            if info.ever[0] is not capacity:  # could some plan fit with every job ended?
                info.ever = (
                    capacity,
                    any(capacity_groups(t, b, tp) * tp >= n for _, t, n, tp, b in info.rows),
                )
            if not info.ever[1]:
                pending[job_id] = PendingReason(
                    result.summary + "; cannot fit this cluster even with every job ended",
                    result.per_plan,
                    WaitKind.NEVER_FITS,
                )
                continue

            # "Held for the starving job" only when the hold is what keeps the job out: some
            # plan fits the GPUs without the hold, none fits those left (a job that chose to
            # wait for a faster plan, or skipped a wasteful one that fits, keeps its reason).
            if reservation is not None and holder is not None and reservation.held:
                assert self.unheld is not None
                alt = _first_fit(self.unheld, info)
                if alt is not None and _first_fit(self.free, info) is None:
                    pending[job_id] = PendingReason(
                        f"would fit now ({_job(queued).plans[alt].describe()}) but those GPUs are held for starving "
                        f"job {holder.job_id} (waiting {_wait_s(holder, now):.0f} s)",
                        result.per_plan,
                        WaitKind.HELD_FOR_STARVING,
                    )
                    continue

            if not backfill:
                fifo_head = _job(queued)
                behind = PendingReason(
                    f"waiting behind {job_id} (strict FIFO, backfill off)", (), WaitKind.BEHIND_HEAD
                )
                pending[job_id] = result
                continue

            # (``_wait_s(job, now) >= starvation_s``, written out)
            if holder is None and (starvation_s <= 0.0 or now - info.submitted_at >= starvation_s):
                view = _PassInventory(self.cluster, self.free, self.placements)
                if preferred is None:
                    res = drain_target(view, job_id, _job(queued).plans)
                else:  # hold GPUs for the plan the job chose to wait for
                    res = drain_target(view, job_id, (_job(queued).plans[preferred],))
                    if res is not None:
                        res = dataclasses.replace(res, plan_index=preferred)
                if res is not None:
                    holder, reservation = _job(queued), res
                    self.unheld = self.free.copy()
                    self._take(self.free, res.plan.gpu_type, res.held, False)
                    nodes = ", ".join(f"{n}×{c}" for n, c in res.target)
                    pending[job_id] = PendingReason(
                        f"{result.summary}; starving for {_wait_s(_job(queued), now):.0f} s: holding {res.held_count} free "
                        f"{res.plan.gpu_type} for plan {res.plan_index} (target {nodes}), "
                        f"waiting for {res.missing} more to be released",
                        result.per_plan,
                        WaitKind.RESERVING,
                    )
                    continue

            pending[job_id] = result

        blocked_by = (
            holder.job_id if holder is not None else (fifo_head.job_id if fifo_head is not None else None)
        )
        preemptions: tuple[Preemption, ...] = ()
        if self.est_done:
            preemptions = self._preempt(jobs, pending, holder)
        return ScheduleResult(tuple(self.placements), pending, blocked_by, reservation, preemptions)

    def _preempt(
        self,
        jobs: list[_Row],
        pending: dict[str, PendingReason],
        holder: QueuedJob | None,
    ) -> tuple[Preemption, ...]:
        """Stop one just-arrived job for a shorter one that arrived right after it
        (``QueuePolicy.preempt_within_s``): shortest-first applied retroactively to jobs whose
        arrival order was a matter of seconds.

        Victims, latest start first (the ``_MAX_VICTIMS`` most recent only, so a pass stays
        cheap on a big cluster): running jobs marked preemptible that were *submitted* at
        most ``preempt_within_s`` ago (so they started at once and have run no longer than
        that) and were not starving. For a victim V, J is the first waiting job in the pass's
        order (starving jobs are left to their reservation) whose fastest non-wasteful plan
        (``width_slack``) fits the pass's free GPUs plus V's but not the free GPUs alone: the
        job that would take V's GPUs were they free. V is stopped for J when

        * J's runtime there + the switch cost (``preempt_restart_s`` + V's progress since its
          start, lost: no checkpoint so soon) is below V's estimated remaining runtime
          (Smith's rule with the switch counted), and
        * J's gain — its estimated completion if it waits minus now + that runtime — exceeds
          ``preempt_gain`` x the loss: J's runtime (V waits for it) + the switch cost, paid
          by V and again by every other waiting job whose chosen plan is of V's GPU type.

        At most one preemption per pass. Costs nothing when no job started that recently.
        """
        policy, now, est_done = self.policy, self.now, self.est_done
        assert est_done is not None
        within = policy.preempt_within_s
        victims = sorted(
            (
                r for r in self.running
                if r.preemptible and 0.0 <= now - r.submitted_at <= within
                and r.started_at - r.submitted_at < policy.starvation_s
            ),
            key=lambda r: (-r.started_at, r.job_id),
        )  # fmt: skip
        if not victims:
            return ()
        # The most recently started few only: a pass must stay cheap on a big busy cluster,
        # where many jobs may have started within the window.
        victims = victims[:_MAX_VICTIMS]
        by_owner = self.cluster.gpus_by_owner()
        waiting_by_type: dict[str, int] | None = None  # GPU type → waiting jobs that chose it
        starvation_s = policy.starvation_s
        total = self.free.total
        for victim in victims:
            slots = by_owner.get(victim.job_id)
            if not slots:
                continue
            # the victim's estimated remaining runtime (an unknown end: not a victim)
            left = max(_INF if g.free_at is None or g.free_at != g.free_at else g.free_at for g in slots) - now
            if left == _INF:
                continue
            vtype, vcount = slots[0].gpu_type, len(slots)  # a job's GPUs are of one type
            free2: PassFree | None = None  # built only when a plan could use the victim's GPUs
            chosen: tuple[QueuedJob, int] | None = None
            # The scan below depends only on a job's candidate plans (their shapes, in order):
            # jobs of one model and recipe share the answer — the index of the plan that would
            # take the victim's GPUs, or -1.
            answers: dict[tuple[int, tuple[int, ...]], int] = {}
            for _, _, _, queued, info in jobs:  # in the pass's priority order
                if info.job_id not in pending or queued is holder or not info.timed:
                    continue
                if starvation_s <= 0.0 or now - info.submitted_at >= starvation_s:
                    continue
                job = _job(queued)
                sig = info.candidate_signature(job.plans, policy.width_slack)
                found = answers.get(sig)
                if found is None:
                    found = -1
                    for _, i, t, nm1, tp, b, _ in info.candidates(job.plans, policy.width_slack):
                        if total.get(t, 0) + (vcount if t == vtype else 0) <= nm1:
                            continue  # too few GPUs of its type even with the victim's: cannot fit
                        if free2 is None:
                            free2 = self._free_with(slots)
                        if free2.fits(t, tp, nm1 + 1, b):
                            if not self.free.fits(t, tp, nm1 + 1, b):  # fits only with the victim gone
                                found = i
                            break  # the fastest plan that fits with the victim gone decides
                    answers[sig] = found
                if found >= 0:
                    chosen = (job, found)
                    break
            if chosen is None:
                continue
            job, i = chosen
            plan = job.plans[i]
            runtime = plan.runtime_s or 0.0
            lost = now - victim.started_at
            switch = policy.preempt_restart_s + lost
            if runtime + switch >= left:
                continue  # not shorter than what the victim has left: Smith's rule says no
            done = est_done.get(job.job_id, _INF)
            if waiting_by_type is None:  # counted once: ``pending`` does not change in this loop
                waiting_by_type = {}
                for other, t in self.est_type.items():
                    if other in pending and est_done.get(other, _INF) < _INF:
                        waiting_by_type[t] = waiting_by_type.get(t, 0) + 1
            # the other waiting jobs whose chosen plan is of this GPU type
            behind = waiting_by_type.get(plan.gpu_type, 0) - (
                self.est_type.get(job.job_id) == plan.gpu_type and done < _INF
            )  # (the job itself is in ``pending``)
            loss = runtime + switch * (1 + behind)
            if not done - (now + runtime) > policy.preempt_gain * loss:  # (inf - x > y: True)
                continue
            assert free2 is not None
            nodes = free2.choose(plan)
            assert nodes is not None
            self.placements.append(Placement(job_id=job.job_id, plan_index=i, plan=plan, nodes=nodes))
            self.free = free2
            del pending[job.job_id]
            return (Preemption(victim.job_id, job.job_id, lost),)
        return ()

    def _free_with(self, slots: Sequence[GpuSlot]) -> PassFree:
        """The pass's free GPUs (after its placements and hold) plus ``slots`` (one running job's
        GPUs), freed: a copy of the pass's index given those GPUs back (``PassFree.give``),
        not a view rebuilt with the placements replayed (that copied every node of a type)."""
        free = self.free.copy()
        free.give(slots[0].gpu_type, [  # (the constructor: dataclasses.replace is ~10x slower)
            GpuSlot(g.node, g.index, g.gpu_type, g.memory_total, g.memory_total, None, g.healthy, None) for g in slots
        ])  # fmt: skip
        return free

    def _explain(self, plans: tuple[PlanOption, ...], info: _JobPlans) -> PendingReason:
        """``explain_job`` on the pass's free GPUs, memoised: a reason depends only on the
        job's plan shapes and the free GPUs of its types, so jobs of the same model and recipe
        share it until a placement changes one of those types; each plan's line is memoised
        the same way (many jobs share plan shapes)."""
        free, lines, healthy = self.free, self._lines, self.cluster.healthy_span
        version = free.versions
        shape, types = info.shape(plans)
        key = (shape, tuple([version.get(t, 0) for t in types]))
        reason = self._reasons.get(key)
        if reason is not None:
            return reason

        def line(p: PlanOption) -> str:
            key = (p.gpu_type, p.tp, p.pp, p.dp, p.bytes_per_gpu, p.label, version.get(p.gpu_type, 0))
            text = lines.get(key)
            if text is None:
                text = free.explain(p, healthy(p.gpu_type))
                lines[key] = text
            return text

        reason = self._reasons[key] = explain_with(line, plans)
        return reason

    def _ranked(self, job: QueuedJob, info: _JobPlans) -> Placement | PendingReason:
        """MARP's order, first plan that fits now (``place_job`` on the pass's free GPUs)."""
        i = _first_fit(self.free, info)
        if i is not None:
            plan = job.plans[i]
            nodes = self.free.choose(plan)
            assert nodes is not None
            return Placement(job_id=job.job_id, plan_index=i, plan=plan, nodes=nodes)
        if self.policy.explain or not job.plans:
            return self._explain(job.plans, info)
        return _NO_FIT_NOW

    def _settle(
        self,
        job: QueuedJob,
        now_done: float,
        now_i: int,
        now_plan: PlanOption,
        now_list: _ReleaseList,
        any_done: float,
        any_i: int,
        any_list: _ReleaseList | None,
    ) -> tuple[Placement | PendingReason, int | None]:
        """A plan fits now: start it unless waiting for the best plan finishes more than
        ``wait_slack`` sooner. Returns the decision and the plan index a waiting job waits for
        (a starving job's reservation drains towards that plan, not a slower one)."""
        now, slack = self.now, 1.0 + self.policy.wait_slack
        if any_i == now_i or now_done - now <= (any_done - now) * slack:
            self.releases.commit(now_plan, now_done, now_list)
            nodes = self.free.choose(now_plan)
            assert nodes is not None
            return Placement(job_id=job.job_id, plan_index=now_i, plan=now_plan, nodes=nodes), None
        better = job.plans[any_i]
        self.releases.commit(better, any_done, any_list)
        return PendingReason(
            f"waiting for {better.describe()}: estimated done in {any_done - now:.0f} s vs "
            f"{now_done - now:.0f} s on {now_plan.describe()} now",
            (),
        ), any_i


def _first_fit(free: PassFree, info: _JobPlans) -> int | None:
    """Index of the first plan (ranked order) that fits ``free`` now, or None."""
    total = free.total
    for gpu_type, least in info.least:
        if total.get(gpu_type, 0) >= least:
            break
    else:
        return None  # O(types): no GPU type has enough free GPUs for even its smallest plan
    fits = free.fits
    for i, t, n, tp, b in info.rows:
        if total.get(t, 0) >= n and fits(t, tp, n, b):
            return i
    return None


def _job(queued: object) -> QueuedJob:
    """A row's job (``_Row`` holds it as ``object``)."""
    return cast(QueuedJob, queued)


_SEQ_ORDER = operator.attrgetter("seq", "job_id")
_JOB_ID = operator.attrgetter("job_id")


def schedule(
    cluster: ClusterView,
    queue: Sequence[QueuedJob],
    now: float,
    policy: QueuePolicy = QueuePolicy(),
    running: Sequence[RunningJob] = (),
) -> ScheduleResult:
    """One scheduling pass over ``queue`` (FIFO by seq) against ``cluster`` at time ``now``.

    See the module docstring for the policy. Every queued job ends up either in
    ``placements`` or in ``pending`` with a reason. ``running``: the running jobs preemption
    may stop (only read with ``QueuePolicy.preempt_within_s`` > 0).
    """
    if len(set(map(_JOB_ID, queue))) != len(queue):
        seen: set[str] = set()
        for job in sorted(queue, key=_SEQ_ORDER):
            if job.job_id in seen:
                raise ValueError(f"job {job.job_id!r} is queued twice")
            seen.add(job.job_id)
    return _Pass(cluster, now, policy, running).run(_order(queue, now, policy))


__all__ = [
    "Preemption",
    "QueuePolicy",
    "QueuedJob",
    "Reservation",
    "RunningJob",
    "ScheduleResult",
    "drain_target",
    "schedule",
]
