"""Preemption: stop a job that started seconds ago for a much shorter one that arrived right
after it (``QueuePolicy.preempt_within_s``) — shortest-first applied retroactively to jobs
whose arrival order was a matter of seconds.

``preempt`` runs once at the end of a pass, on the pass's state (its free GPUs, the jobs still
pending, the completion estimates it made) and returns at most one ``PreemptionChoice``; the
pass applies it. Pure: it decides, the caller changes its state.

Also the rules every caller of ``schedule`` shares, so the live scheduler and the simulator
hand the pass the same running jobs and credit a stopped job the same way: ``may_weigh``
(which running jobs preemption may weigh) and ``credit_progress`` / ``runtime_left`` (how
much of a stopped job's work is counted done, and what its plans' runtimes become).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

from has.cluster import ClusterView, GpuSlot
from has.pass_state import PassFree
from has.placement import PendingReason, Placement
from has.policy import PlanChoice, Preemption, QueuePolicy, RunningJob
from has.queue_order import QueueRow, as_job, starves
from has.queued import JobPlans, QueuedJob

_INF = float("inf")
MAX_VICTIMS = 4  # running jobs a pass weighs for preemption (the most recently started)
# The most of its estimated work a job stopped part-way is credited with: an estimate that ran
# over still leaves the job some work, not none (``credit_progress``).
MAX_DONE_FRACTION = 0.9


def weighs_running(policy: QueuePolicy) -> bool:
    """Whether ``policy`` weighs running jobs at all: the rule for just-started jobs
    (``preempt_within_s`` > 0 under the "completion" plan choice) or the long-job stop
    (``preempt_long_gain`` > 0 under "ranked-wait") is on. Where neither is, a caller need not
    read or build running jobs: ``schedule`` would not look at them."""
    return (policy.preempt_within_s > 0 and policy.plan_choice is PlanChoice.COMPLETION) or (
        policy.preempt_long_gain > 0 and policy.plan_choice is PlanChoice.RANKED_WAIT
    )


def may_weigh(policy: QueuePolicy, now: float, submitted_at: float, resumable: bool) -> bool:
    """Whether preemption may weigh a running job submitted at ``submitted_at``: the one rule the
    live scheduler (``SchedulerLoop.tick``) and the simulator (``FrenzyPolicy.decide``) both use to
    choose the ``running`` they hand ``schedule``.

    * Just-started jobs (``preempt``): under the "completion" plan choice with
      ``preempt_within_s`` > 0, a job submitted at most that long ago (it can have no checkpoint
      yet: stopping it loses its progress, which the rule weighs).
    * The long-job stop (``stop_long``): under "ranked-wait" with ``preempt_long_gain`` > 0, any
      job that resumes from a checkpoint (``resumable``: the job spec says so live; every
      simulated job keeps its progress when stopped), however long ago it was submitted: a stop
      keeps its progress (``Preemption.lost_s`` 0), which only a resumable job has.

    A job that does not resume is never handed to the long-job stop, whatever the window says
    (before this rule the live scheduler also handed it just-started jobs that do not resume)."""
    if (policy.preempt_within_s > 0 and policy.plan_choice is PlanChoice.COMPLETION
            and 0.0 <= now - submitted_at <= policy.preempt_within_s):
        return True
    return resumable and policy.preempt_long_gain > 0 and policy.plan_choice is PlanChoice.RANKED_WAIT


def credit_progress(done_before: float, ran_s: float, completion_s: float) -> float:
    """The share of its work a job stopped part-way is counted as having done: what it had
    (``done_before``) plus the share of its plan's whole runtime (``completion_s``, the estimate
    for the job from the start) that this attempt ran (``ran_s``), at most
    ``MAX_DONE_FRACTION``. A plan with no estimate credits nothing new. (The simulator counts a
    stopped job's steps exactly and needs no estimate; the live scheduler only has this one.)"""
    if completion_s <= 0.0:
        return done_before
    return min(MAX_DONE_FRACTION, done_before + max(0.0, ran_s) / completion_s)


def runtime_left(runtime_s: float | None, done_fraction: float) -> float | None:
    """A plan's runtime estimate for a job credited with ``done_fraction`` of its work (None stays
    None: no estimate)."""
    if runtime_s is None or done_fraction <= 0.0:
        return runtime_s
    return runtime_s * (1.0 - done_fraction)


@final
class PreemptionChoice:
    """Stop the ``preemptions``' jobs and start ``placements`` on their GPUs; ``free`` is the
    pass's free GPUs with the victims' given back and the placements' taken. ``preempt``: one
    victim, one placement; ``stop_long``: one victim (two with ``preempt_long_pairs``), each
    keeping its checkpoint (``lost_s`` 0), and every waiting job that takes their GPUs."""

    __slots__ = ("preemptions", "placements", "free")

    def __init__(self, preemptions: tuple[Preemption, ...], placements: list[Placement], free: PassFree) -> None:
        self.preemptions = preemptions
        self.placements = placements
        self.free = free


@final
class _Taker:
    """The waiting job that would take a victim's GPUs were they free: the job, its plan's
    index, and the pass's free GPUs with the victim's given back."""

    __slots__ = ("job", "index", "free")

    def __init__(self, job: QueuedJob, index: int, free: PassFree) -> None:
        self.job = job
        self.index = index
        self.free = free


@final
@dataclass(frozen=True, slots=True)
class PassView:
    """What a preemption rule reads of the pass, read only: its policy and clock, the cluster and
    the running jobs, ``free`` (its free GPUs after its placements and hold), ``rows`` (the queue
    in its order), ``pending`` (the jobs it left waiting) and ``holder`` (the job holding GPUs, if
    any). One object, so ``preempt`` and ``stop_long`` take the same pass the same way."""

    policy: QueuePolicy
    now: float
    cluster: ClusterView
    running: Sequence[RunningJob]
    free: PassFree
    rows: list[QueueRow]
    pending: dict[str, PendingReason]
    holder: QueuedJob | None


def _estimated_end(slots: Sequence[GpuSlot]) -> float:
    """When a running job's GPUs are expected free: the latest estimate of its GPUs (inf when any
    is unknown or NaN)."""
    return max(_INF if g.free_at is None or g.free_at != g.free_at else g.free_at for g in slots)


def preempt(view: PassView, est_done: dict[str, float], est_type: dict[str, str]) -> PreemptionChoice | None:
    """The preemption of this pass, if any.

    Victims, latest start first (the ``MAX_VICTIMS`` most recent only, so a pass stays
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

    ``est_done`` / ``est_type``: per job, its estimated completion if it waits and the GPU type
    of the plan it chose.
    At most one preemption per pass. Costs nothing when no job started that recently.
    """
    policy, now, pending = view.policy, view.now, view.pending
    victims = _victims(policy, now, view.running)
    if not victims:
        return None
    by_owner = view.cluster.gpus_by_owner()
    waiting_by_type: dict[str, int] | None = None  # GPU type → waiting jobs that chose it
    for victim in victims:
        slots = by_owner.get(victim.job_id)
        if not slots or _mixed(slots):
            continue
        # the victim's estimated remaining runtime (an unknown end: not a victim)
        left = _estimated_end(slots) - now
        if left == _INF:
            continue
        taker = _taker(view, slots, victim.priority)
        if taker is None:
            continue
        job, i = taker.job, taker.index
        plan = job.plans[i]
        runtime = plan.runtime_s or 0.0
        lost = now - victim.started_at
        switch = policy.preempt_restart_s + lost
        if runtime + switch >= left:
            continue  # not shorter than what the victim has left: Smith's rule says no
        done = est_done.get(job.job_id, _INF)
        if waiting_by_type is None:  # counted once: ``pending`` does not change in this loop
            waiting_by_type = _waiting_by_type(pending, est_done, est_type)
        # the other waiting jobs whose chosen plan is of this GPU type
        behind = waiting_by_type.get(plan.gpu_type, 0) - (
            est_type.get(job.job_id) == plan.gpu_type and done < _INF
        )  # (the job itself is in ``pending``)
        loss = runtime + switch * (1 + behind)
        if not done - (now + runtime) > policy.preempt_gain * loss:  # (inf - x > y: True)
            continue
        nodes = taker.free.choose(plan)
        assert nodes is not None
        placement = Placement(job_id=job.job_id, plan_index=i, plan=plan, nodes=nodes)
        return PreemptionChoice((Preemption(victim.job_id, job.job_id, lost),), [placement], taker.free)
    return None


def _victims(policy: QueuePolicy, now: float, running: Sequence[RunningJob]) -> list[RunningJob]:
    """The running jobs a pass may stop, latest start first: preemptible, submitted at most
    ``preempt_within_s`` ago, not started after starving; the ``MAX_VICTIMS`` most recent only
    (a pass must stay cheap on a big busy cluster, where many jobs may have started within the
    window)."""
    within = policy.preempt_within_s
    victims = sorted(
        (
            r for r in running
            if r.preemptible and r.stops == 0 and 0.0 <= now - r.submitted_at <= within
            # (the plain threshold, not ``starves``: a RunningJob carries no plan runtimes)
            and r.started_at - r.submitted_at < policy.starvation_s
        ),
        key=lambda r: (-r.started_at, r.job_id),
    )  # fmt: skip
    return victims[:MAX_VICTIMS]


def _taker(view: PassView, slots: list[GpuSlot], victim_priority: int) -> _Taker | None:
    """The first waiting, timed, not starving job in the pass's order whose fastest candidate
    plan that fits with the victim's GPUs (``slots``) freed fits only then, of at least the
    victim's priority; None if no job."""
    policy, now, free, pending, holder = view.policy, view.now, view.free, view.pending, view.holder
    width_slack = policy.width_slack
    total = free.total
    vtype, vcount = slots[0].gpu_type, len(slots)  # a victim's GPUs are of one type (``_mixed``)
    free2: PassFree | None = None  # built only when a plan could use the victim's GPUs
    # The scan depends only on a job's candidate plans (their shapes, in order): jobs of one
    # model and recipe share the answer — the index of the plan that would take the victim's
    # GPUs, or -1.
    answers: dict[tuple[int, tuple[int, ...]], int] = {}
    for row in view.rows:  # in the pass's priority order
        info = row[4]
        if info.priority < victim_priority:
            break  # (classes come highest first: every later job is of a lower class too)
        if info.job_id not in pending or row[3] is holder or not info.timed:
            continue
        if starves(info, now, policy):
            continue
        job = as_job(row[3])
        sig = info.candidate_signature(job.plans, width_slack)
        found = answers.get(sig)
        if found is None:
            found = -1
            for c in info.candidates(job.plans, width_slack):
                t, nm1 = c.gpu_type, c.nm1
                if total.get(t, 0) + (vcount if t == vtype else 0) <= nm1:
                    continue  # too few GPUs of its type even with the victim's: cannot fit
                if free2 is None:
                    free2 = _free_with(free, slots)
                if free2.fits(t, c.tp, nm1 + 1, c.bytes_per_gpu):
                    if not free.fits(t, c.tp, nm1 + 1, c.bytes_per_gpu):  # fits only with the victim gone
                        found = c.index
                    break  # the fastest plan that fits with the victim gone decides
            answers[sig] = found
        if found >= 0:
            assert free2 is not None  # (an answer >= 0 was found with it)
            return _Taker(job, found, free2)
    return None


def _waiting_by_type(
    pending: dict[str, PendingReason], est_done: dict[str, float], est_type: dict[str, str]
) -> dict[str, int]:
    """GPU type → the waiting jobs with a completion estimate whose chosen plan is of it."""
    out: dict[str, int] = {}
    for other, t in est_type.items():
        if other in pending and est_done.get(other, _INF) < _INF:
            out[t] = out.get(t, 0) + 1
    return out


def _mixed(slots: Sequence[GpuSlot]) -> bool:
    """Whether a running job's GPUs are of several types (a mixed plan, docs/mixed-plans.md). Such a
    job is no victim of either stop: their rules weigh one GPU type's GPUs (the takers' plans of
    the victim's type, the jobs waiting for it), so a mixed plan's job runs to its end."""
    t = slots[0].gpu_type
    return any(g.gpu_type != t for g in slots)


def _free_with(free: PassFree, slots: Sequence[GpuSlot]) -> PassFree:
    """The pass's free GPUs (after its placements and hold) plus ``slots`` (one running job's
    GPUs), freed: a copy of the pass's index given those GPUs back (``PassFree.give``), each
    under its own type, not a view rebuilt with the placements replayed (that copied every node of
    a type)."""
    out = free.copy()
    by_type: dict[str, list[GpuSlot]] = {}
    for g in slots:  # (the constructor: dataclasses.replace is ~10x slower)
        by_type.setdefault(g.gpu_type, []).append(
            GpuSlot(g.node, g.index, g.gpu_type, g.memory_total, g.memory_total, None, g.healthy, None))
    for t, given in by_type.items():
        out.give(t, given)
    return out


def stop_long(view: PassView, wait_done: dict[str, float]) -> PreemptionChoice | None:
    """A long running job stopped, keeping its progress, for waiting jobs much shorter than what
    it has left (``QueuePolicy.preempt_long_gain``; 0 never).

    Victims, most time left first (the ``MAX_VICTIMS`` longest only): running jobs marked
    preemptible (each job is stopped at most once, or with ``preempt_long_every_s`` > 0 again
    once it has run that long since it resumed) with an estimated end at least
    ``preempt_long_ratio`` x ``preempt_restart_s`` away. For a victim V with ``left`` seconds to go:

    * *its takers* are the waiting jobs, in the pass's order (not starving: their hold is
      theirs; not the holder; of at least V's priority), whose first plan in MARP's order that
      fits the pass's free GPUs plus V's is on V's GPUs (it does not fit the free GPUs alone),
      with a runtime there at most ``left`` / ``preempt_long_ratio`` (much shorter than V), each
      taking its GPUs in turn;
    * a taker *gains* its estimated completion if it waits (``wait_done``: the pass's release
      estimates, capped at V's end + its runtime, when V's GPUs would serve it anyway) minus
      now + its runtime on V's GPUs — little when GPUs elsewhere free soon, so a stop is made
      only for jobs that could not start soon without it;
    * *V's delay*: its GPUs are free again no earlier than the longest taker's runtime, and it
      resumes from its checkpoint paying ``preempt_restart_s``;
    * V is stopped when the takers' summed gain exceeds ``preempt_long_gain`` x V's delay.

    At most one stop per pass; with ``preempt_long_pairs``, when no single victim passes, two
    victims of one GPU type may be stopped together (``_stop_pair``).
    """
    policy, now, pending = view.policy, view.now, view.pending
    if not pending:
        return None
    ratio, restart_s, every_s = policy.preempt_long_ratio, policy.preempt_restart_s, policy.preempt_long_every_s
    by_owner = view.cluster.gpus_by_owner()
    victims: list[tuple[float, str, RunningJob, list[GpuSlot]]] = []
    for r in view.running:
        if not r.preemptible:
            continue
        if r.stops > 0 and (every_s <= 0.0 or now - r.started_at < every_s):
            continue  # stopped before: once per job, or once per ``every_s`` of its run
        slots = by_owner.get(r.job_id)
        if not slots or _mixed(slots):
            continue
        left = _estimated_end(slots) - now
        if left == _INF or left < ratio * restart_s:  # unknown end, or not long even against a restart
            continue
        victims.append((-left, r.job_id, r, slots))
    if not victims:
        return None
    victims.sort()
    # the jobs that may take a victim's GPUs, in the pass's order: waiting, timed, not starving
    # (their hold is theirs), not the holder
    waiting = [
        (row[4], as_job(row[3])) for row in view.rows
        if row[4].job_id in pending and row[3] is not view.holder and row[4].timed and not starves(row[4], now, policy)
    ]  # fmt: skip
    if not waiting:
        return None
    for neg_left, _, victim, slots in victims[:MAX_VICTIMS]:
        found = _long_takers(view, waiting, wait_done, slots, victim.priority, -neg_left)
        if found is None:
            continue
        placements, gain, free2 = found
        delay = restart_s + max(p.plan.runtime_s or 0.0 for p in placements)
        if gain > policy.preempt_long_gain * delay:
            return PreemptionChoice((Preemption(victim.job_id, placements[0].job_id, 0.0),), placements, free2)
    if policy.preempt_long_pairs:
        return _stop_pair(view, waiting, wait_done, victims[:MAX_VICTIMS])
    return None


def _stop_pair(
    view: PassView,
    waiting: list[tuple[JobPlans, QueuedJob]],
    wait_done: dict[str, float],
    victims: list[tuple[float, str, RunningJob, list[GpuSlot]]],
) -> PreemptionChoice | None:
    """Two running jobs of one GPU type stopped together for waiting jobs that need GPUs of both
    (a pool two jobs split: 16 GPUs held by two 8-GPU jobs, a 16-GPU job waiting), by the single
    stop's rule: each taker at most ``preempt_long_ratio`` x shorter than the victim with less
    time left, and the takers' summed gain above ``preempt_long_gain`` x the *two* victims'
    delays (each the longest taker + the restart). Only when no single stop was made; pairs in
    the victims' order (most time left first)."""
    for a in range(len(victims)):
        left_a, _, va, slots_a = victims[a]
        for b in range(a + 1, len(victims)):
            left_b, _, vb, slots_b = victims[b]
            if slots_b[0].gpu_type != slots_a[0].gpu_type:
                continue
            left = min(-left_a, -left_b)
            found = _long_takers(view, waiting, wait_done, slots_a + slots_b, max(va.priority, vb.priority), left)
            if found is None:
                continue
            placements, gain, free2 = found
            used = {g for p in placements for g in p.gpus()}
            if not any((g.node, g.index) in used for g in slots_a) or not any((g.node, g.index) in used for g in slots_b):
                continue  # one victim alone would do (the single stop weighed that) or is not needed
            delay = view.policy.preempt_restart_s + max(p.plan.runtime_s or 0.0 for p in placements)
            if gain > view.policy.preempt_long_gain * 2.0 * delay:
                for_job = placements[0].job_id
                return PreemptionChoice(
                    (Preemption(va.job_id, for_job, 0.0), Preemption(vb.job_id, for_job, 0.0)), placements, free2
                )
    return None


def _long_takers(
    view: PassView,
    waiting: list[tuple[JobPlans, QueuedJob]],
    wait_done: dict[str, float],
    slots: list[GpuSlot],
    victim_priority: int,
    left: float,
) -> tuple[list[Placement], float, PassFree] | None:
    """The waiting jobs that would take the victim's GPUs (``stop_long``): their placements,
    summed gain (s) and the pass's free GPUs after the switch; None if none."""
    now, free = view.now, view.free
    longest = left / view.policy.preempt_long_ratio
    vtype, vcount = slots[0].gpu_type, len(slots)  # a victim's GPUs are of one type (``_mixed``)
    free2: PassFree | None = None  # built only when a job could use the victim's GPUs
    placements: list[Placement] = []
    gain = 0.0
    # The first fit depends only on a job's plan shapes (not their runtimes): jobs of one model
    # and recipe share the answer -- the index of the plan that would take the victim's GPUs,
    # or -1 -- until a taker takes GPUs.
    answers: dict[int, int] = {}
    for info, job in waiting:  # in the pass's priority order
        if info.priority < victim_priority:
            break  # (classes come highest first: every later job is of a lower class too)
        room = free.total.get(vtype, 0) + vcount if free2 is None else free2.total.get(vtype, 0)
        if room == 0:
            break  # the victim's GPUs are all taken
        least = next((n for t, n in info.least if t == vtype), 0)
        if not least or least > room:
            continue  # no plan of the victim's type, or even its smallest needs more GPUs than there would be
        if free2 is None:
            free2 = _free_with(free, slots)
        shape = info.shape(job.plans)[0]
        i = answers.get(shape)
        if i is None:
            i = _first_fit_plans(free2, job)
            if i is None:
                i = -1
            else:
                p = job.plans[i]
                if p.gpu_type != vtype or free.fits(vtype, p.tp, p.num_gpus, p.bytes_per_gpu):
                    i = -1  # it would not run on the victim's GPUs
            answers[shape] = i
        if i < 0:
            continue
        plan = job.plans[i]
        runtime = plan.runtime_s or 0.0
        if runtime > longest:
            continue  # not much shorter than the victim
        saved = min(wait_done.get(info.job_id, _INF), now + left + runtime) - (now + runtime)
        if saved <= 0.0:
            continue
        nodes = free2.choose(plan)
        assert nodes is not None
        free2.take(vtype, nodes, True)
        answers.clear()
        placements.append(Placement(job_id=job.job_id, plan_index=i, plan=plan, nodes=nodes))
        gain += saved
    if not placements:
        return None
    assert free2 is not None
    return placements, gain, free2


def _first_fit_plans(free: PassFree, job: QueuedJob) -> int | None:
    """Index of the job's first plan (MARP's order) that fits ``free``, or None."""
    for i, p in enumerate(job.plans):
        if free.fits(p.gpu_type, p.tp, p.num_gpus, p.bytes_per_gpu):
            return i
    return None
