"""Queue policy: one scheduling pass from (cluster, queue, now) to decisions.

Policy — FIFO with backfill and a starvation reservation (docs/has-policy.md):

1. Jobs are tried in submit order (``seq``). Each job takes the first of its
   ranked plans that fits the GPUs still free in this pass (``place_job``);
   every placement is subtracted from the view (``with_reserved``), so one
   pass never hands a GPU out twice.
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
from collections.abc import Sequence
from dataclasses import dataclass, field

from has.cluster import ClusterView
from has.placement import (
    PendingReason,
    Placement,
    PlanOption,
    WaitKind,
    choose_nodes,
    explain_job,
)


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
            "width_slack": 0.15, "wait_slack": 0.2,
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


# Memo of _candidates: a queued job's plans do not change between passes (the simulator and
# the service reuse the same tuple), so the filter and sort run once per job, not per pass.
# Keyed by id() with the tuple itself kept alive in the value (so the id is not reused).
_CANDIDATES: dict[tuple[int, float], tuple[tuple[PlanOption, ...], list[tuple[float, int, PlanOption]]]] = {}


def _candidates(plans: tuple[PlanOption, ...], width_slack: float) -> list[tuple[float, int, PlanOption]]:
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


def _order(jobs: list[QueuedJob], now: float, policy: QueuePolicy) -> list[QueuedJob]:
    if policy.order == "fifo":
        return jobs
    # Aging: starving jobs keep FIFO priority, so shortest-first cannot starve a big job.
    starving = [j for j in jobs if _wait_s(j, now) >= policy.starvation_s]
    rest = [j for j in jobs if _wait_s(j, now) < policy.starvation_s]
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
    for runtime, i, p in _candidates(plans, policy.width_slack):
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

        if reservation is not None and holder is not None:
            alt = _place_ranked(unheld, job, explain=False)
            if isinstance(alt, Placement):
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

        if holder is None and _wait_s(job, now) >= policy.starvation_s:
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
