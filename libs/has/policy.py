"""Queue policy: the knobs of a scheduling pass and what a pass takes and returns.

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

4. Preemption (``QueuePolicy.preempt_within_s``, on in ``QueuePolicy.named("frenzy-completion")``): given
   the running jobs, a job submitted seconds ago may be stopped for a much shorter waiting
   one, at most one per pass (``has.preemption``; docs/has-policy.md). With
   ``QueuePolicy.preempt_long_gain`` (on in ``QueuePolicy.frenzy()``, "ranked-wait" plan
   choice) a long running job may instead be stopped, keeping its progress, for waiting jobs
   much shorter than what it has left (``has.preemption.stop_long``; docs/simulator.md).
5. Priorities (``QueuedJob.priority``, 0 unless set): the queue is walked highest class
   first, each class in the order above (``has.queue_order.by_priority``). The first job
   that cannot be placed and whose class is above the lowest waiting one becomes the holder
   at once, as if it starved: lower-priority jobs backfill only around its held GPUs, so
   they never delay it. Starvation protects a job within its class, not against higher
   classes. Preemption never stops a job for one of a lower class.

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

Where each part lives: this module holds ``QueuePolicy`` (with its option enums),
``RunningJob`` and the pass's results (``ScheduleResult``, ``Reservation``, ``Preemption``);
``has.queued`` a queued job and what a pass derives from its plans; ``has.queue_order`` the
order the pass walks the queue; ``has.queue_pass`` the walk itself (``schedule``);
``has.releases`` the release-time estimates of completion plan choice; ``has.drain`` a
starving job's drain target; ``has.preemption`` the rule for stopping a just-started job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from has.placement import PendingReason, Placement, PlanOption


class QueueOrder(StrEnum):
    """The order a pass tries the queued jobs in (``QueuePolicy.order``)."""

    FIFO = "fifo"  # by seq (submit order)
    SHORTEST = "shortest"  # starving jobs first, then the rest by GPU-seconds of the cheapest plan


class StarvingOrder(StrEnum):
    """With ``QueueOrder.SHORTEST``, the order of the jobs that waited ``starvation_s``."""

    FIFO = "fifo"  # by seq
    IDEAL = "ideal"  # by ideal completion: submit time + runtime of the cheapest plan


class PlanChoice(StrEnum):
    """Which of a job's plans a pass picks (``QueuePolicy.plan_choice``)."""

    RANKED = "ranked"  # MARP's first plan that fits now
    COMPLETION = "completion"  # the earliest estimated completion, counting the wait for busy GPUs
    # MARP's first plan that fits now, unless waiting for a better-ranked plan's busy GPUs
    # finishes more than ``wait_slack`` sooner (``QueuePolicy.plan_choice``)
    RANKED_WAIT = "ranked-wait"


_E = TypeVar("_E", QueueOrder, StarvingOrder, PlanChoice)


def _option(kind: type[_E], name: str, value: str) -> _E:
    """``value`` (a member or its string) as a member of ``kind``; ValueError naming the knob
    and its choices otherwise."""
    try:
        return kind(value)
    except ValueError:
        choices = " or ".join(repr(m.value) for m in kind)
        raise ValueError(f"{name} must be {choices}, got {value!r}") from None


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
      "ranked-wait" takes MARP's first plan that fits now, as "ranked", unless a plan ranked
      before it would, waiting for its busy GPUs (the same release estimates as "completion"),
      finish more than ``wait_slack`` sooner: then the job waits for that plan. MARP's order
      stands; only a plan far slower than one whose GPUs free soon is refused (a 13B job
      offered 16 slow GPUs for 7 h while 16 fast ones free in 20 min for a 35 min run).
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
      lists it (``has.preemption`` has the rule in full).
    preempt_long_gain: 0 (default) never. > 0 (needs plan_choice="ranked-wait" and ``running``): a
      running job, marked preemptible, with an estimated end at least ``preempt_long_ratio`` x
      ``preempt_restart_s`` away may be stopped *keeping its progress* (it checkpoints; the
      ``Preemption``'s ``lost_s`` is 0) for the waiting jobs that would take its GPUs, each
      at most its remaining time / ``preempt_long_ratio``, when their summed gain (estimated
      completion if they wait, capped at the victim's end + their runtime, minus now + their
      runtime) exceeds ``preempt_long_gain`` x the victim's delay (the longest of them +
      ``preempt_restart_s``). A burst of short jobs behind a job that holds a pool for hours
      gets the pool, as a round-based scheduler's next round would give it them. At most one
      per pass, or one pair with ``preempt_long_pairs`` (``has.preemption.stop_long``).
    preempt_long_every_s: 0 (default): the long-job stop stops a job at most once (a job with
      ``RunningJob.stops`` > 0 is never a victim). > 0: a job stopped before may be stopped
      again once it has run this long since it resumed (``RunningJob.started_at``, this
      attempt's start): at most one stop per that many seconds of its run, so the restarts it
      pays stay under ``preempt_restart_s`` / this of its running time (120 s an hour: 3.3 %).
    preempt_long_pairs: False (default): the long-job stop stops one job. True: when it stops
      none, two running jobs of one GPU type may be stopped together for waiting jobs that need
      GPUs of both (a 16-GPU job while two 8-GPU jobs split the pool), by the same rule with
      both victims' delays counted (``ScheduleResult.preemptions`` then has two entries).
    starvation_stretch: 0 (default): a job starves once it has waited ``starvation_s``. > 0: once
      it has waited ``starvation_s`` *and* this many times the runtime of its cheapest plan
      (``starves``): a job's wait is measured against its own length, so a 300 h job that waited
      5 h is not starving while a 10 min job is, and under a queue that never drains the
      starving set does not grow into the whole queue walked in submit order (long jobs first
      among them, short ones stuck behind). Every job still starves in the end: after
      max(``starvation_s``, stretch x its ideal runtime) it goes first and may hold GPUs.
    max_gpus_per_user: 0 (default): no quota. > 0: no placement takes a job's user
      (``QueuedJob.user``) over this many GPUs, counting the GPUs the user's jobs hold already
      (``schedule``'s ``held``) and those placed earlier in the pass. A job tries only its plans
      that fit its user's room; with none, it waits (``WaitKind.OVER_QUOTA``, naming the quota
      and the GPUs held), holds no GPUs and claims no release. Preemption never places a job over
      it. The operator's limit (``frenzy scheduler --max-gpus-per-user``), not a tuning knob: the
      simulator leaves it at 0.
    mixed_plans: True (default): a job's mixed plans (``PlanOption.parts``: one job over several GPU
      types, docs/mixed-plans.md) are weighed in MARP's order beside its single-type plans, under
      "ranked" and "ranked-wait" plan choice (a mixed plan that fits now is taken unless waiting
      for a better-ranked plan finishes more than ``wait_slack`` sooner; no job waits *for* a
      mixed plan, holds GPUs for one or is placed on one by "completion" choice or preemption).
      False (``frenzy-single-type``): mixed plans are skipped, as before issue 33; a job whose
      only fitting plans are mixed says so in its pending reason.

    ``order``, ``starving_order`` and ``plan_choice`` are string enums: ``"shortest"`` (a CLI
    flag, a JSON file) works as well as ``QueueOrder.SHORTEST`` and becomes that member; any
    other string is rejected.

    ``QueuePolicy()`` is the first HAS (frenzy-paper in the simulator);
    ``QueuePolicy.frenzy()`` is the improved one (docs/has-policy.md, docs/simulator.md).
    """

    backfill: bool = True
    starvation_s: float = 300.0
    # (``| str``: a string is accepted and ``__post_init__`` makes it the member)
    order: QueueOrder | str = QueueOrder.FIFO
    plan_choice: PlanChoice | str = PlanChoice.RANKED
    width_slack: float = 0.25
    wait_slack: float = 0.1
    explain: bool = True
    starving_order: StarvingOrder | str = StarvingOrder.FIFO
    preempt_within_s: float = 0.0
    preempt_restart_s: float = 120.0
    preempt_gain: float = 2.0
    preempt_long_gain: float = 0.0
    preempt_long_ratio: float = 4.0
    preempt_long_every_s: float = 0.0
    preempt_long_pairs: bool = False
    starvation_stretch: float = 0.0
    max_gpus_per_user: int = 0
    mixed_plans: bool = True

    def __post_init__(self) -> None:
        if self.starvation_s < 0:
            raise ValueError(f"starvation_s must be >= 0, got {self.starvation_s}")
        # Strings (a CLI flag, a JSON file) become the enum member; anything else is rejected.
        object.__setattr__(self, "order", _option(QueueOrder, "order", self.order))
        object.__setattr__(self, "starving_order", _option(StarvingOrder, "starving_order", self.starving_order))
        object.__setattr__(self, "plan_choice", _option(PlanChoice, "plan_choice", self.plan_choice))
        if self.width_slack < 0 or self.wait_slack < 0:
            raise ValueError("width_slack and wait_slack must be >= 0")
        if self.preempt_within_s < 0 or self.preempt_restart_s < 0 or self.preempt_gain < 0:
            raise ValueError("preempt_within_s, preempt_restart_s and preempt_gain must be >= 0")
        if self.preempt_long_gain < 0 or self.preempt_long_ratio < 1 or self.preempt_long_every_s < 0:
            raise ValueError("preempt_long_gain and preempt_long_every_s must be >= 0 and preempt_long_ratio >= 1")
        if self.max_gpus_per_user < 0:
            raise ValueError(f"max_gpus_per_user must be >= 0 (0: no quota), got {self.max_gpus_per_user}")
        if not 0.0 <= self.starvation_stretch < float("inf"):
            raise ValueError(f"starvation_stretch must be a finite number >= 0, got {self.starvation_stretch}")

    @classmethod
    def frenzy(cls, **overrides: object) -> QueuePolicy:
        """Ours, the default of the live scheduler and the simulator alike: shortest-first with
        aging over MARP's ranked plans, a plan refused while waiting for a better-ranked one's
        GPUs finishes more than ``wait_slack`` sooner, backfill, and the starving job's
        reservation ordered by ideal completion; a long running job (or two of one GPU type
        together) is stopped, keeping its progress, for waiting jobs much shorter than what it
        has left (``preempt_long_gain``, ``preempt_long_pairs``)."""
        # Chosen on the tuning half of bench/sim_tables.py (docs/simulator.md, "Results"): the
        # completion-time plan choice and the preemption that needs it (``frenzy-completion``,
        # the default until issue 18) did not pay there; the long-job stop did (geometric mean
        # of avg JCT vs frenzy-paper 0.513 -> 0.468 exact, 0.568 -> 0.528 with 5 % errors; its
        # knobs, gain 2 and ratio 4, were set before that run and not tuned); then stopping two
        # jobs of one GPU type together for jobs that need both's GPUs (``preempt_long_pairs``,
        # no knob of its own: 0.468 -> 0.460 exact, 0.528 -> 0.521 with errors, all of it on
        # Pollux 2; tried after the held-out Pollux 5 row had been seen).
        base: dict[str, object] = {
            "order": QueueOrder.SHORTEST, "plan_choice": PlanChoice.RANKED_WAIT, "starvation_s": 14400.0,
            "width_slack": 0.15, "wait_slack": 0.2, "starving_order": StarvingOrder.IDEAL,
            "preempt_within_s": 0.0, "preempt_restart_s": 120.0, "preempt_gain": 2.0,
            "preempt_long_gain": 2.0, "preempt_long_ratio": 4.0, "preempt_long_pairs": True,
            "starvation_stretch": 10.0,
        }  # fmt: skip
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]

    @classmethod
    def named(cls, name: str, **overrides: object) -> QueuePolicy:
        """The policy ``name`` of ``POLICY_NAMES`` (``frenzy scheduler --policy``, ``frenzy
        simulate``'s HAS variants), with ``overrides`` on top; ValueError naming the choices."""
        try:
            knobs = _NAMED[name]
        except KeyError:
            raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICY_NAMES)}") from None
        if name == "frenzy-paper":
            return cls(**{**knobs, **overrides})  # type: ignore[arg-type]
        return cls.frenzy(**{**knobs, **overrides})


# The HAS variants by name: one table read by the live scheduler's --policy and by the
# simulator (has.sim.baselines.make_policy), so both run the same knobs under the same name.
# Knobs on top of QueuePolicy.frenzy(), except frenzy-paper's (on top of QueuePolicy()).
_NAMED: dict[str, dict[str, object]] = {
    "frenzy": {},
    # MARP's first plan that fits now, however slow (issue 18's first default)
    # (the long-job stop reads "ranked-wait"'s wait estimates: off in the variants without it)
    "frenzy-ranked": {"plan_choice": PlanChoice.RANKED, "preempt_long_gain": 0.0},
    # completion-time-aware plan choice and stopping a job started under a minute ago for a
    # much shorter one (the default before issue 18's tuning split)
    "frenzy-completion": {"plan_choice": PlanChoice.COMPLETION, "preempt_within_s": 60.0, "preempt_long_gain": 0.0},
    "frenzy-nopreempt": {"plan_choice": PlanChoice.COMPLETION, "preempt_long_gain": 0.0},
    "frenzy-fifo": {"order": QueueOrder.FIFO},
    # frenzy that never places a mixed plan (one job over several GPU types, issue 33): every job
    # on one GPU type, as before mixed plans (docs/mixed-plans.md)
    "frenzy-single-type": {"mixed_plans": False},
    # frenzy whose long-job stop may stop a job again after an hour of its run since it resumed
    # (instead of once per job): tried on the tuning half after the held-out Pollux 5 row, where
    # both 70B jobs were spent after one stop each (docs/simulator.md, "The long-job stop")
    # (on top of frenzy-single: the variant as it was measured)
    "frenzy-restop": {"preempt_long_every_s": 3600.0, "preempt_long_pairs": False},
    # frenzy whose long-job stop stops one job at a time, never two together (the default before
    # stopping a pair won the tuning split; docs/simulator.md)
    "frenzy-single": {"preempt_long_pairs": False},
    # frenzy that never stops a long running job for much shorter waiting ones (the default
    # before the long-job stop won the tuning split; docs/simulator.md)
    "frenzy-nostop": {"preempt_long_gain": 0.0},
    # frenzy whose jobs starve after 4 h whatever their length (no ``starvation_stretch``: the
    # default before a queue that never drains joined the tuning half; docs/simulator.md)
    "frenzy-wait4h": {"starvation_stretch": 0.0},
    # the first HAS (the paper's): FIFO over the ranked plans with backfill
    "frenzy-paper": {},
    # frenzy without any knowledge of a job's length (issue 32), beside the size-aware default:
    # submit order (no shortest-first, no ideal-completion order among starving jobs), a job
    # starves after 4 h whatever its length (no stretch), MARP's first plan that fits now (the
    # wait rule weighs runtimes and running jobs' estimated ends), no long-job stop (it weighs
    # what a job has left). No decision reads ``PlanOption.runtime_s`` or ``GpuSlot.free_at``
    # (tests/unit/has/test_has_frenzy_blind.py). Plans and their order are still MARP's.
    "frenzy-blind": {
        "order": QueueOrder.FIFO, "starving_order": StarvingOrder.FIFO, "plan_choice": PlanChoice.RANKED,
        "preempt_long_gain": 0.0, "starvation_stretch": 0.0,
    },  # fmt: skip
}
POLICY_NAMES: tuple[str, ...] = tuple(_NAMED)


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

    preemptible: False whenever the operator says so, or once the job was preempted (each job
    at most once, so no job is stopped again and again) where the caller does not count
    ``stops``.
    priority: its class (``QueuedJob.priority``); it is stopped only for a job of at least
    that priority.
    stops: how many times HAS stopped it so far. A job with ``stops`` > 0 is never stopped
    again by the rule for just-started jobs, nor by the long-job stop unless
    ``QueuePolicy.preempt_long_every_s`` > 0 and it has run that long since ``started_at``
    (its resume). 0 (default) keeps a caller that marks a preempted job not preemptible as it
    was.
    """

    job_id: str
    started_at: float
    submitted_at: float
    preemptible: bool = True
    priority: int = 0
    stops: int = 0


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
    deadline_missed: the queued jobs (placed in this pass or waiting) whose deadline
      (``QueuedJob.deadline``) can no longer be met: ``now`` is past the latest start of their
      fastest plan. Such a job is not dropped: it is planned as if it had no deadline (its
      objective still orders its plans) and placed when GPUs free, late; the caller records the
      miss (a job stays listed in every pass while it waits) and may cancel it instead.
    """

    placements: tuple[Placement, ...]
    pending: dict[str, PendingReason]
    blocked_by: str | None
    reservation: Reservation | None = field(default=None)
    preemptions: tuple[Preemption, ...] = ()
    deadline_missed: tuple[str, ...] = ()


__all__ = [
    "PlanChoice",
    "Preemption",
    "QueueOrder",
    "QueuePolicy",
    "Reservation",
    "RunningJob",
    "ScheduleResult",
    "StarvingOrder",
]
