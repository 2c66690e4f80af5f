"""The queue read model: what the scheduler's last queue read found, kept between ticks so a
waiting job's plans are parsed once and its ``QueuedJob`` object reused (HAS's per-job caches hold
while it waits), and returned as a ``QueueSnapshot`` value rather than left on attributes for
other code to read later. No Redis here: ``StateStore.queue`` reads and hands the replies over.

What the queue read decides is pure and lives in ``has``: a job credited with part of its work
(a resumable job stopped part-way) is queued with its plans' runtimes scaled to what is left
(``has.preemption.runtime_left``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from frenzy.state.job_states import JobState
from frenzy.state.plan_options import option_from_json
from frenzy.state.records import fraction
from has import PlanOption, QueuedJob
from has.preemption import runtime_left

log = logging.getLogger(__name__)

# A queued job as the queue read stamps it: (attempt, submitted_at, seq). Its plans are parsed
# again only when the stamp changes (a requeue may bring new plans).
Stamp = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """One read of the queue: the PENDING jobs in FIFO order as HAS sees them, why an operator
    holds the queue (None when open), and when the read began (``time.monotonic()``)."""

    jobs: tuple[QueuedJob, ...]
    hold: str | None
    read_at: float


def priority_of(raw: str | None) -> int:
    """A job hash's ``priority`` field (checked at submission): absent (a job written before
    priorities) or unreadable is 0, normal."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def plans_left(options: tuple[PlanOption, ...], done_fraction: float) -> tuple[PlanOption, ...]:
    """A job's plans with their runtimes, and so their dollars, scaled to the work left
    (``has.preemption.runtime_left``): the rest of the run is what a deadline and a budget weigh."""
    if done_fraction <= 0.0:
        return options
    return tuple(o if o.runtime_s is None else replace(o, runtime_s=runtime_left(o.runtime_s, done_fraction),
                                                       cost_usd=runtime_left(o.cost_usd, done_fraction))
                 for o in options)


# The wire's objectives (types.proto ``Objective``, proto3 JSON names) as HAS names them.
_OBJECTIVES = {"OBJECTIVE_COST": "cost", "OBJECTIVE_GPU_HOURS": "gpu-hours", 2: "cost", 3: "gpu-hours"}


def goal_of(spec: dict[str, Any], submitted_at: float) -> tuple[float | None, str]:
    """A stored spec's goal as HAS takes it (issue 35): the absolute deadline (submission plus
    ``goal.deadline_s``, on the clock of ``submitted_at`` and the loop's ``now``; None for none)
    and the objective ("time" when unset)."""
    goal = spec.get("goal") or {}
    if not isinstance(goal, dict):
        return None, "time"
    within = float(goal.get("deadlineS", goal.get("deadline_s", 0.0)) or 0.0)
    return (submitted_at + within if within > 0 else None), _OBJECTIVES.get(goal.get("objective", ""), "time")


class QueueReadModel:
    """The queued jobs of the last read, their launch sources, and the reasons last written."""

    # The fields read per queued job on every tick (``read_hashes.lua``), and per job whose stamp
    # changed (HMGET): what ``pending`` and ``admit`` take, in this order.
    HEAD_FIELDS = ("attempt", "submitted_at", "state", "user")
    BODY_FIELDS = ("plans", "attempt", "submitted_at", "spec", "priority", "done_fraction")

    def __init__(self) -> None:
        self._queued: dict[str, tuple[Stamp, QueuedJob]] = {}
        # What a launch is rendered from, read with the plans when a job enters the queue
        # (job id -> (attempt as stored, spec JSON, the stored plans)): placing costs no read.
        self._sources: dict[str, tuple[str, str, list[dict[str, Any]]]] = {}
        self._unreadable: set[str] = set()  # jobs whose stored plans did not parse (logged once)
        self._reasons: dict[str, tuple[object, str]] = {}  # job -> (queued stamp, reason) as last written
        self.last_hold: str | None = None  # the last read's hold: a held queue's ticks read no node

    def waiting(self) -> bool:
        """Whether the last read found jobs waiting in an open queue (the tick reads the cluster next)."""
        return bool(self._queued) and self.last_hold is None

    def pending(self, entries: Sequence[tuple[str, float]], heads: Sequence[Sequence[str | None]],
                hold: str | None) -> list[tuple[str, Stamp, str]]:
        """The PENDING jobs among the queue's ``entries`` (id, seq), given each one's ``HEAD_FIELDS``:
        (id, stamp, user) in FIFO order."""
        self.last_hold = hold
        out = []
        for (job_id, seq), (attempt, submitted_at, state, user) in zip(entries, heads, strict=True):
            if state == JobState.PENDING:
                out.append((job_id, (attempt or "", submitted_at or "", int(seq)), user or ""))
        return out

    def missing(self, pending: Sequence[tuple[str, Stamp, str]]) -> list[str]:
        """The jobs whose plans must be read: new, requeued (the stamp moved), or without a launch
        source (also a job whose source went with a placement and that is PENDING again at the same
        attempt, which no script does today: read again rather than placed without one)."""
        cached, sources = self._queued, self._sources
        return [job_id for job_id, stamp, _ in pending
                if cached.get(job_id, ((),))[0] != stamp or job_id not in sources]

    def admit(self, pending: Sequence[tuple[str, Stamp, str]], read: dict[str, Sequence[str | None]]) -> None:
        """Take the ``BODY_FIELDS`` read for the ``missing`` jobs. A job whose stamp moved between the
        two reads waits for the next tick; one whose plans do not parse is logged once, never queued."""
        for job_id, stamp, user in pending:
            row = read.get(job_id)
            if row is None:
                continue
            raw, attempt, submitted_at, spec, priority, done = row
            if (attempt or "", submitted_at or "") != stamp[:2]:
                continue  # changed between the two reads: left for the next tick
            try:
                stored = json.loads(raw or "[]")
                options = plans_left(tuple(option_from_json(p) for p in stored), fraction(done))
                # (the spec is parsed only for a job that has a goal: most have none, and a restart
                # admits every waiting job at once)
                deadline, objective = (goal_of(json.loads(spec), float(submitted_at or 0))
                                       if spec and '"goal"' in spec else (None, "time"))
            except (ValueError, TypeError, AttributeError) as exc:  # not what submit writes
                if job_id not in self._unreadable:
                    self._unreadable.add(job_id)
                    log.error("job %s: stored plans unreadable (%s); it is not scheduled", job_id, exc)
                continue
            self._queued[job_id] = (stamp, QueuedJob(job_id=job_id, seq=stamp[2],
                                                     submitted_at=float(submitted_at or 0), plans=options,
                                                     priority=priority_of(priority), user=user,
                                                     deadline=deadline, objective=objective))
            self._sources[job_id] = (attempt or "1", spec or "{}", stored)

    def snapshot(self, pending: Sequence[tuple[str, Stamp, str]], hold: str | None, read_at: float) -> QueueSnapshot:
        """The read as a value (and, now and then, the jobs that left the queue forgotten)."""
        cached = self._queued
        jobs = tuple(cached[job_id][1] for job_id, stamp, _ in pending if cached.get(job_id, ((),))[0] == stamp)
        if len(cached) > 2 * len(pending) + 64:
            keep = {job_id for job_id, _, _ in pending}
            self._queued = {j: v for j, v in cached.items() if j in keep}
            self._sources = {j: v for j, v in self._sources.items() if j in keep}
        return QueueSnapshot(jobs, hold, read_at)

    def changed_reasons(self, reasons: dict[str, str]) -> dict[str, str]:
        """The reasons that differ from what was last written for the same queued attempt (and from
        now on count as written). A reason another writer changed meanwhile (a requeue, a placement)
        belongs to a new attempt or to a job that left the queue."""
        written = self._reasons
        changed: dict[str, str] = {}
        for job_id, reason in reasons.items():
            stamp = self._queued.get(job_id, ((),))[0]
            if written.get(job_id) != (stamp, reason):
                written[job_id] = (stamp, reason)
                changed[job_id] = reason
        if len(written) > 2 * len(self._queued) + 64:
            self._reasons = {j: v for j, v in written.items() if j in self._queued}
        return changed

    def source(self, job_id: str) -> tuple[str, str, list[dict[str, Any]]] | None:
        """(attempt, spec JSON, stored plans) of ``job_id`` as the last read kept them."""
        return self._sources.get(job_id)

    def placed(self, job_id: str) -> None:
        """``job_id`` left the queue by a placement: its source is not used again."""
        self._sources.pop(job_id, None)

    def user(self, job_id: str) -> str:
        """The submitter of ``job_id`` as the last read found it ("" when it is not there)."""
        hit = self._queued.get(job_id)
        return hit[1].user if hit is not None else ""

    def codes(self) -> set[str]:
        """The code sha256 of every job the last read kept that runs in packed code (a job that
        left the queue since may be among them until the read forgets it: its code lives a little
        longer, nothing more)."""
        shas: set[str] = set()
        for _attempt, spec, _plans in self._sources.values():
            if "ha256" not in spec:  # no "codeSha256" (or "code_sha256"): nothing to parse
                continue
            try:
                raw = json.loads(spec)
            except ValueError:
                continue
            sha = raw.get("codeSha256") or raw.get("code_sha256") if isinstance(raw, dict) else None
            if isinstance(sha, str) and sha:
                shas.add(sha)
        return shas
