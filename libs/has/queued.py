"""A queued job and what a scheduling pass derives from its plans, once per job.

``QueuedJob`` is what callers hand ``schedule``; ``JobPlans`` (``plans_of``) is the summary a
pass reads instead of the plans — per-plan rows, sort keys, the completion candidates — cached
on the job, since its plans never change. Pure data, no cluster state.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import final

from has.placement import PlanOption


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs: ``seq`` is its FIFO position, ``plans`` are ranked best first,
    ``priority`` its class (higher first; 0 normal; docs/has-policy.md, "Priorities"), ``user``
    whose GPU quota it counts against (``QueuePolicy.max_gpus_per_user``; "" for none named).

    ``deadline``: the time (the clock of ``submitted_at`` and ``schedule``'s ``now``) by which the
    job must finish, None for none; ``objective``: what orders its plans, "time" (the order given:
    MARP's), "cost" (``PlanOption.cost_usd``, cheapest first) or "gpu-hours" (``runtime_s`` x
    GPUs). A job with either (``goal_cut``) is placed only on a plan that still meets its deadline
    while one can; docs/has-policy.md, "Deadlines and objectives". Neither (the default) leaves
    every decision as before."""

    job_id: str
    seq: int
    submitted_at: float
    plans: tuple[PlanOption, ...]
    priority: int = 0
    user: str = ""
    deadline: float | None = None
    objective: str = "time"
    # What ``schedule`` derives from the plans, computed on first use and kept with the job
    # (``plans_of``). Not part of equality, hashing or repr; ``dataclasses.replace`` gives
    # the new job an empty cache (its plans may differ).
    _has_plans: JobPlans | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Accept any sequence from callers but keep the dataclass hashable and immutable.
        if not isinstance(self.plans, tuple):
            object.__setattr__(self, "plans", tuple(self.plans))
        if self.objective not in OBJECTIVES:
            raise ValueError(f"QueuedJob.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.deadline is not None and self.deadline != self.deadline:
            raise ValueError("QueuedJob.deadline must be a time or None, got NaN")
        object.__setattr__(self, "_has_plans", None)  # (a compiled build does not apply the default)


_INF = float("inf")
# A job's objectives (``QueuedJob.objective``; marp.objectives.OBJECTIVES, the same names)
OBJECTIVES: tuple[str, ...] = ("time", "cost", "gpu-hours")


@final
class Candidate:
    """One plan a job weighs under completion plan choice (``JobPlans.candidates``): its
    runtime, index among the job's plans, GPU type, GPUs - 1, TP width, bytes per GPU, and
    the plan. A compiled build keeps it as a C struct."""

    __slots__ = ("runtime", "index", "gpu_type", "nm1", "tp", "bytes_per_gpu", "plan")

    def __init__(
        self, runtime: float, index: int, gpu_type: str, nm1: int, tp: int, bytes_per_gpu: int, plan: PlanOption
    ) -> None:
        self.runtime = runtime
        self.index = index
        self.gpu_type = gpu_type
        self.nm1 = nm1
        self.tp = tp
        self.bytes_per_gpu = bytes_per_gpu
        self.plan = plan


@final
class LeanCandidate:
    """One completion candidate as the pass walks it: runtime, plan index, GPUs - 1, number of
    its release list (``Releases.lid``). A class, not a tuple: a compiled build keeps the
    fields unboxed in the object, so reading a candidate touches one object, not a tuple and
    a float elsewhere in memory (the pass is bound by those memory reads)."""

    __slots__ = ("runtime", "index", "nm1", "lid")

    def __init__(self, runtime: float, index: int, nm1: int, lid: int) -> None:
        self.runtime = runtime
        self.index = index
        self.nm1 = nm1
        self.lid = lid


@final
class JobPlans:
    """What a pass needs of one job's plans, computed once per ``QueuedJob`` (its plans never
    change) and kept on the object, so a pass over a queue it has seen does no per-plan setup.

    rows: (index, gpu_type, GPUs, tp, bytes) per plan in ranked order; least: per GPU type the
    fewest GPUs any of its plans needs (a job none of whose types has that many free GPUs is
    rejected without looking at a plan); size: GPU-seconds of the cheapest timed plan;
    ideal_run: that plan's runtime (0 unless every plan is timed);
    ideal_key: (submit time + that plan's runtime, seq, job id), the starving order "ideal";
    lean: the candidates as the pass walks them, with their release-list numbers, valid for
    ``lean_for`` (``has.queue_pass``, ``_Pass._lean``); waits: per plan (runtime, index,
    release-list number, GPUs - 1), fastest first, what ``"ranked-wait"`` plan choice reads,
    valid for ``waits_for``.
    The cache is keyed by nothing but the object (``QueuedJob`` and ``PlanOption`` are frozen),
    except what depends on the capacity (``ever``, ``lean_for``, ``waits_for``).
    """

    __slots__ = (
        "rows", "runtimes", "least", "fewest", "timed", "size", "ideal_run", "fifo_key", "short_key", "ideal_key", "by_slack",
        "short_first", "ideal_first", "seq", "job_id", "submitted_at", "has_plans", "priority",
        "_shape", "ever", "sigs", "lean_for", "lean", "waits_for", "waits", "user", "most", "cut", "mixed",
        "goal", "deadline", "fastest", "goal_order", "goal_runs", "goal_cuts",
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
        # indices of its mixed plans (``PlanOption.parts``), which only the pass's mixed path places
        self.mixed: tuple[int, ...] = tuple([i for i, p in enumerate(plans) if p.parts])
        self.runtimes = runtimes
        self.least = tuple(least.items())
        self.fewest = min(least.values(), default=0)  # GPUs of the job's smallest plan
        self.most = max([r[2] for r in rows], default=0)  # GPUs of its largest plan
        self.timed = bool(plans) and len(sizes) == len(plans)
        self.size = min(sizes) if sizes else _INF
        # Sort keys of the queue orders, typed as tuples of objects so a compiled build keeps
        # each as one Python tuple rather than rebuilding it from its parts on every read.
        self.fifo_key: tuple[object, ...] = (job.seq, job.job_id)
        self.short_key: tuple[object, ...] = (self.size, job.seq, job.job_id)
        # unknown runtime: 0, so jobs without estimates keep submit (FIFO) order
        self.ideal_run = cheapest_run if self.timed else 0.0  # runtime of the cheapest plan
        ideal = job.submitted_at + self.ideal_run
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
        self.priority = job.priority
        self.user = job.user
        # The job cut to its plans of at most N GPUs (its user's room under the GPU quota), by N:
        # (that job, its plans' indices among this job's). Built by ``within`` when first needed.
        self.cut: dict[int, tuple[QueuedJob, tuple[int, ...]]] = {}
        self.by_slack: dict[float, list[Candidate]] = {}
        self.sigs: dict[float, tuple[int, tuple[int, ...]]] = {}
        self.ever: tuple[object, bool] = (None, True)  # (capacity it was answered for, answer)
        self._shape: tuple[int, tuple[str, ...]] | None = None
        self.lean_for: tuple[object, float] = (None, 0.0)  # (capacity, width_slack) of lean
        self.lean: list[LeanCandidate] = []
        self.waits_for: object = None  # the capacity ``waits`` was computed for
        self.waits: list[tuple[float, int, int, int]] = []
        # Deadlines and objectives (``goal_cut``): whether the job has either, its deadline (inf:
        # none), the runtime of its fastest timed plan (inf: none); built on first use: its plans'
        # indices in the objective's order, its timed plans' runtimes sorted, and the cut jobs
        # by the number of timed plans that still meet the deadline (-1: no deadline, -2: missed).
        self.goal = job.deadline is not None or job.objective != "time"
        self.deadline = job.deadline if job.deadline is not None else _INF
        self.fastest = min([r for r in runtimes if r is not None], default=_INF)
        self.goal_order: list[int] | None = None
        self.goal_runs: list[float] = []
        self.goal_cuts: dict[int, tuple[QueuedJob, tuple[int, ...]]] = {}

    def shape(self, plans: tuple[PlanOption, ...]) -> tuple[int, tuple[str, ...]]:
        """(id of what the job's pending reason depends on, its GPU types): jobs with the same
        plan shapes — the same model and recipe, whatever their length — share one id."""
        if self._shape is None:
            key: tuple[object, ...] = tuple(
                (p.gpu_type, p.tp, p.pp, p.dp, p.bytes_per_gpu, p.label, p.parts) for p in plans
            )
            if len(_SHAPES) > 100_000:  # bounded: distinct plan shapes seen by a long-lived process
                _SHAPES.clear()
            shape = _SHAPES.get(key)
            if shape is None:
                shape = _SHAPES[key] = next(_SHAPE_IDS)  # never reused, even after a clear
            # (a mixed plan's reason depends on the free GPUs of each of its types)
            self._shape = (shape, tuple(sorted({t for p in plans for t, _, _, _ in p.type_needs()})))
        return self._shape

    def candidate_signature(self, plans: tuple[PlanOption, ...], width_slack: float) -> tuple[int, tuple[int, ...]]:
        """(plan shapes id, candidate plan indices in order): two jobs with the same signature
        have the same candidates as far as placement goes (types, widths, bytes, order)."""
        sig = self.sigs.get(width_slack)
        if sig is None:
            sig = self.sigs[width_slack] = (
                self.shape(plans)[0], tuple([c.index for c in self.candidates(plans, width_slack)])
            )
        return sig

    def candidates(self, plans: tuple[PlanOption, ...], width_slack: float) -> list[Candidate]:
        """The ``Candidate``s (runtime, index, type, GPUs - 1, tp, bytes, plan) of the plans within
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
            out = [Candidate(r, i, t, n - 1, tp, b, plans[i]) for r, (i, t, n, tp, b) in ranked]
            self.by_slack[width_slack] = out
        return out


_SHAPES: dict[tuple[object, ...], int] = {}
_SHAPE_IDS = itertools.count()


def within(job: QueuedJob, info: JobPlans, room: int) -> tuple[QueuedJob, tuple[int, ...]]:
    """``job`` with only its plans of at most ``room`` GPUs (its user's room under the GPU quota),
    in ranked order, and their indices among ``job``'s plans (a placement or hold of the cut job
    names its plan by its index there). Kept on ``info`` per ``room``: the cut job keeps its own
    caches from pass to pass, as the job does."""
    hit = info.cut.get(room)
    if hit is None:
        kept = tuple([i for i, p in enumerate(job.plans) if p.tp * p.pp * p.dp <= room])
        cut = QueuedJob(job.job_id, job.seq, job.submitted_at, tuple([job.plans[i] for i in kept]), job.priority,
                        job.user, job.deadline, job.objective)
        if len(info.cut) > 16:  # (a few rooms at most: the user's held GPUs move by whole jobs)
            info.cut.clear()
        hit = info.cut[room] = (cut, kept)
    return hit


def _objective_order(job: QueuedJob) -> list[int]:
    """The job's plan indices in its objective's order: "time" keeps the order given (MARP's);
    "cost" by (``cost_usd``, runtime, GPUs); "gpu-hours" by (runtime x GPUs, GPUs, runtime); an
    unknown value sorts last, ties by the order given."""
    plans = job.plans
    keyed: list[tuple[float, float, float, int]]
    if job.objective == "cost":
        keyed = [((_INF if p.cost_usd is None else p.cost_usd), (_INF if p.runtime_s is None else p.runtime_s),
                  float(p.tp * p.pp * p.dp), i) for i, p in enumerate(plans)]  # fmt: skip
    elif job.objective == "gpu-hours":
        keyed = [((_INF if p.runtime_s is None else p.runtime_s * p.tp * p.pp * p.dp), float(p.tp * p.pp * p.dp),
                  (_INF if p.runtime_s is None else p.runtime_s), i) for i, p in enumerate(plans)]  # fmt: skip
    else:
        return list(range(len(plans)))
    keyed.sort()
    return [k[3] for k in keyed]


def goal_cut(job: QueuedJob, info: JobPlans, now: float) -> tuple[QueuedJob, tuple[int, ...], bool]:
    """The job as a pass plans it at ``now`` under its deadline and objective (``info.goal``):
    (the cut job, its plans' indices among ``job``'s, missed).

    The cut keeps the plans that still meet the deadline if started now (``now + runtime_s <=
    deadline``; a plan without a runtime is kept: nothing says it misses), in the objective's
    order, and carries the deadline, so ``"ranked-wait"`` waits only for a plan whose estimated
    completion meets it. When no timed plan can meet it any more (``now`` is past the latest start
    of its fastest plan) the deadline is *missed*: the cut is every plan in the objective's order,
    without the deadline (the job runs late, flagged: ``ScheduleResult.deadline_missed``). A job
    without a deadline is its plans in the objective's order. The cut is ``job`` itself when it
    keeps every plan in their order; cut jobs are kept on ``info`` (by how many timed plans meet
    the deadline), so they keep their own caches from pass to pass."""
    order = info.goal_order
    if order is None:
        order = info.goal_order = _objective_order(job)
        info.goal_runs = sorted([r for r in info.runtimes if r is not None])
    deadline = info.deadline
    missed = False
    if deadline == _INF:
        key = -1
    elif info.fastest > deadline - now:  # (inf: no timed plan, never "missed")
        missed = info.fastest != _INF
        key = -2 if missed else -1
    else:
        key = bisect_right(info.goal_runs, deadline - now)  # the timed plans that meet it: the key fastest
    hit = info.goal_cuts.get(key)
    if hit is None:
        if key >= 0:
            limit = info.goal_runs[key - 1] if key else -1.0
            runtimes = info.runtimes
            kept = tuple([i for i in order if (r := runtimes[i]) is None or r <= limit])
        else:
            kept = tuple(order)
        keep_deadline = job.deadline if key >= 0 else None
        if kept == tuple(range(len(job.plans))) and keep_deadline is None:
            cut = job  # (every plan, in its order, nothing to wait against: the job itself)
        else:
            cut = QueuedJob(job.job_id, job.seq, job.submitted_at, tuple([job.plans[i] for i in kept]),
                            job.priority, job.user, keep_deadline, "time")  # fmt: skip
        if len(info.goal_cuts) > 64:  # (bounded: one per count of plans that meet the deadline)
            info.goal_cuts.clear()
        hit = info.goal_cuts[key] = (cut, kept)
    return hit[0], hit[1], missed


def plans_of(job: QueuedJob) -> JobPlans:
    info = job._has_plans
    if info is None:
        info = JobPlans(job)
        object.__setattr__(job, "_has_plans", info)  # (a frozen dataclass: its cache field only)
    return info
