"""The queue walk: one scheduling pass from (cluster, queue, now) to decisions (``schedule``).

The policy it applies is described in ``has.policy`` (and docs/has-policy.md). ``_Pass`` holds
what one pass changes as it walks the queue in ``has.queue_order``'s order: the free-GPU index
(``PassFree``), the release estimates (``has.releases``), the placements, the pending reasons,
and the starving job's hold (``has.drain``); at the end it weighs one preemption
(``has.preemption``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import final

from has.cluster import ClusterView
from has.drain import PassInventory, drain_target
from has.pass_state import PassFree
from has.placement import PendingReason, Placement, PlanOption, WaitKind, explain_with
from has.policy import PlanChoice, Preemption, QueuePolicy, Reservation, RunningJob, ScheduleResult
from has.preemption import PassView, PreemptionChoice, preempt, stop_long
from has.queue_order import QueueRow, queue_order, starves
from has.queue_order import as_job as _job
from has.queued import JobPlans, LeanCandidate, QueuedJob, goal_cut, plans_of, within
from has.releases import ReleaseList, Releases

_INF = float("inf")
_LAST = 1 << 62  # a plan index after every real one: "none yet" that loses every tie
_NO_FIT_NOW = PendingReason("no plan fits the free GPUs now", ())


def _wait_s(job: QueuedJob, now: float) -> float:
    return max(0.0, now - job.submitted_at)


@final
class _Pass:
    """One scheduling pass (see ``schedule``): the queue walk and the state it changes.

    ``free`` is the GPUs still free in this pass minus the holder's held GPUs; ``unheld``
    is the same without the hold (it tells "held for X" from "no room"), kept separately only
    once a hold exists. Both are ``PassFree`` indexes, changed in place as jobs are placed.
    ``holder`` / ``reservation``: the starving job GPUs are held for, and its hold (or, with
    priorities, a job of a higher class than the lowest waiting one: ``by_priority`` says which);
    ``lowest``: the lowest priority in the queue;
    ``fifo_head``: with backfill off, the first job that did not fit (every later job waits
    behind it, with ``behind`` as its reason).
    ``quota`` / ``held``: the per-user GPU quota (``QueuePolicy.max_gpus_per_user``, 0: none) and,
    with one, the GPUs each user holds, this pass's placements included.
    """

    def __init__(
        self,
        cluster: ClusterView,
        now: float,
        policy: QueuePolicy,
        running: Sequence[RunningJob] = (),
        held: Mapping[str, int] | None = None,
    ) -> None:
        self.cluster = cluster
        self.quota = policy.max_gpus_per_user
        self.held: dict[str, int] = dict(held) if self.quota and held else {}
        self._quota_reasons: dict[tuple[str, int, int], PendingReason] = {}
        self.now = now
        self.policy = policy
        self.backfill = policy.backfill  # (read per waiting job)
        self.mixed = policy.mixed_plans  # mixed plans may be placed (``QueuePolicy.mixed_plans``)
        self.running = running
        # job id → estimated completion if it waits (completion plan choice), for preemption
        self.est_done: dict[str, float] | None = (
            {} if policy.preempt_within_s > 0 and running and policy.plan_choice is PlanChoice.COMPLETION else None
        )
        # job id → estimated completion if it waits ("ranked-wait"), for the long-job stop
        self.wait_done: dict[str, float] | None = (
            {} if policy.preempt_long_gain > 0 and running and policy.plan_choice is PlanChoice.RANKED_WAIT else None
        )
        self.est_type: dict[str, str] = {}  # job id → GPU type of the plan it chose (placed or waits for)
        self.free = PassFree(cluster)
        self.unheld: PassFree | None = None
        self.releases = Releases(cluster, now)
        self.placements: list[Placement] = []
        self.pending: dict[str, PendingReason] = {}
        self.holder: QueuedJob | None = None
        self.reservation: Reservation | None = None
        self.fifo_head: QueuedJob | None = None
        self.behind = _NO_FIT_NOW
        self.lowest = 0  # the lowest priority queued (set by ``run``)
        self.by_priority = False  # the holder holds for its priority, not because it starves
        self._lines: dict[tuple[str, int, int, int, int, str, int], str] = {}
        self._reasons: dict[tuple[int, tuple[int, ...]], PendingReason] = {}
        self.most_free = max(self.free.total.values(), default=0)  # of any one type, in ``free``
        # free GPUs in ``free`` of each release list's GPU type (``total``, indexed by list number)
        self.free_n: list[int] = []
        # release lists by number (``Releases``), loaded by ``run`` for completion plan choice
        self.lists: list[ReleaseList] = []
        # Deadlines and objectives (``has.queued.goal_cut``): the queued jobs whose deadline can no
        # longer be met, in the walk's order; job id -> (its cut job, that job's plan summary, the
        # cut's plan indices among the job's own) for every job the pass planned on a cut
        self.missed: list[str] = []
        self.cuts: dict[str, tuple[QueuedJob, JobPlans, tuple[int, ...]]] = {}

    def _take(
        self, free: PassFree, gpu_type: str, nodes: Sequence[tuple[str, Sequence[int]]], checked: bool
    ) -> None:
        free.take(gpu_type, nodes, checked)
        if free is self.free:
            self.most_free = max(free.total.values(), default=0)
            self._count_free()

    def _count_free(self) -> None:
        total = self.free.total
        self.free_n[:] = [total.get(t, 0) for t in self.releases.types]  # (in place: callers hold it)

    def _lean(self, job: QueuedJob, info: JobPlans) -> None:
        """The job's completion candidates as the pass walks them (``lean``: runtime, index,
        GPUs - 1, release-list number; a plan that may fit now is read from ``info.rows``),
        kept on the job while the capacity is the same (the numbers depend on its memory
        levels), like ``info.ever``."""
        width_slack, lid = self.policy.width_slack, self.releases.lid
        cands = info.candidates(job.plans, width_slack)
        info.lean = [LeanCandidate(c.runtime, c.index, c.nm1, lid(c.bytes_per_gpu, c.gpu_type)) for c in cands]
        info.lean_for = (self.cluster._capacity, width_slack)
        if len(self.free_n) < len(self.releases.types):  # new lists numbered
            self._count_free()

    def run(self, rows: list[QueueRow]) -> ScheduleResult:
        """Walk ``rows`` (the queue in ``queue_order``'s order): each job is placed or gets its
        pending reason; then at most one preemption."""
        completion = self.policy.plan_choice is PlanChoice.COMPLETION
        ranked_wait = self.policy.plan_choice is PlanChoice.RANKED_WAIT
        if completion or ranked_wait:
            self.lists = self.releases.load()
        self._count_free()
        if rows:  # (``queue_order`` puts the lowest class last)
            self.lowest = rows[-1][4].priority
        pending, quota, held = self.pending, self.quota, self.held
        for _, _, _, queued, info in rows:
            if self.fifo_head is not None:
                pending[info.job_id] = self.behind
                continue
            job = _job(queued)
            top = info  # (the job's own summary: its deadline, for the pending reason)
            kept: tuple[int, ...] | None = None  # with the quota or a goal: the plans of ``job`` its cut keeps
            if quota and info.most + held.get(info.user, 0) > quota:  # (0: no quota; a job with no plans: most 0)
                used = held.get(info.user, 0)
                if info.fewest > quota - used:  # no plan fits its user's room: it waits, holding nothing
                    pending[info.job_id] = self._over_quota(info, used)
                    continue
                job, kept = within(job, info, quota - used)
                info = plans_of(job)
            if top.goal:  # a deadline or an objective: the plans that meet it, in its order
                job, kept, info = self._goal(job, info, kept)
            preferred: int | None = None
            if completion and info.timed and not top.goal:
                result, preferred = self._by_completion(job, info)
            elif (ranked_wait or completion) and info.timed:  # (a job with a goal: "ranked-wait" on its cut)
                result, preferred = self._ranked_wait(job, info)
            else:
                result = self._ranked(job, info)
            if isinstance(result, Placement):
                if kept is not None:  # (named by its index among the job's own plans)
                    result = dataclasses.replace(result, plan_index=kept[result.plan_index])
                self._place(result)
                if quota:
                    held[info.user] = held.get(info.user, 0) + result.plan.num_gpus
            elif not info.has_plans:
                pending[info.job_id] = result
            else:
                pending[info.job_id] = self._why_waiting(job, info, result, preferred)
                if top.deadline != _INF:
                    pending[info.job_id] = _with_deadline(pending[info.job_id], top, self.now)
                if kept is not None and self.holder is job and self.reservation is not None:
                    # the cut job became the holder: its hold names the job's own plan, and the
                    # job itself holds (what the preemption rules compare rows with)
                    self.holder = _job(queued)
                    self.reservation = dataclasses.replace(
                        self.reservation, plan_index=kept[self.reservation.plan_index]
                    )
        preemptions: tuple[Preemption, ...] = ()
        if self.est_done is not None and self.est_done:
            preemptions = self._preempt(rows)
        if not preemptions and self.wait_done is not None and pending:
            preemptions = self._stop_long(rows)
        head = self.holder if self.holder is not None else self.fifo_head
        return ScheduleResult(
            tuple(self.placements), pending, head.job_id if head is not None else None, self.reservation, preemptions,
            tuple(self.missed),
        )

    def _goal(
        self, job: QueuedJob, info: JobPlans, kept: tuple[int, ...] | None
    ) -> tuple[QueuedJob, tuple[int, ...] | None, JobPlans]:
        """``job`` (perhaps cut to its user's room: ``kept``) cut to the plans that meet its
        deadline, in its objective's order (``goal_cut``): the cut job, its plans' indices among
        the queued job's own, its summary. A missed deadline is recorded (``missed``)."""
        cut, goal_kept, missed = goal_cut(job, info, self.now)
        if missed:
            self.missed.append(info.job_id)
        if cut is job:
            return job, kept, info
        kept = goal_kept if kept is None else tuple([kept[i] for i in goal_kept])
        cut_info = plans_of(cut)
        self.cuts[info.job_id] = (cut, cut_info, kept)
        return cut, kept, cut_info

    def _by_completion(self, job: QueuedJob, info: JobPlans) -> tuple[Placement | PendingReason, int | None]:
        """Completion-time-aware plan choice (``QueuePolicy.plan_choice``): the earliest
        estimated completion among the job's non-wasteful plans, starting now or after a wait
        for busy GPUs. Returns the decision and the plan a waiting job waits for. This loop is
        the pass's hot path (~10 plans per queued job): locals, no calls per plan but the
        release lookups."""
        now, inf, last = self.now, _INF, _LAST
        slack = 1.0 + self.policy.wait_slack
        if info.lean_for[0] is not self.cluster._capacity or info.lean_for[1] != self.policy.width_slack:
            self._lean(job, info)
        lists, free_n = self.lists, self.free_n
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
            rows, free = info.rows, self.free
            for c in info.lean:
                runtime = c.runtime
                # Fastest first: no later plan can finish before now + runtime, nor be
                # accepted over a waiting plan unless within the wait slack: stop early.
                if runtime > limit:
                    break
                i, nm1, lid = c.index, c.nm1, c.lid
                # free_n[lid]: free GPUs of the plan's type; row: (i, type, GPUs, tp, bytes)
                if free_n[lid] > nm1 and free.fits((row := rows[i])[1], row[3], row[2], row[4]):
                    done = now + runtime
                    if done < now_done or (done == now_done and i < now_i):
                        now_done, now_i, now_plan, now_lid = done, i, job.plans[i], lid
                    found = None
                else:  # start when the (nm1+1)-th earliest release of its GPUs comes
                    found = lists[lid]  # (inf: fewer such GPUs than it needs, or none with the memory)
                    done = found.at(nm1) + runtime
                if done <= any_done and (done < any_done or i < any_i):  # (as above)
                    any_done, any_i, any_list, any_n = done, i, found, nm1 + 1
                    limit = (any_done - now) * slack
        est_done = self.est_done
        if est_done is not None:
            est_done[info.job_id] = any_done
            if any_i != last:  # the type of the plan it chose (placed, or waits for)
                self.est_type[info.job_id] = job.plans[any_i].gpu_type
        if now_plan is not None:
            return self._settle(job, now_done, now_i, now_plan, lists[now_lid], any_done, any_i, any_list)
        preferred: int | None = None
        if any_done < inf:  # wait for the best plan: claim its GPUs' earliest releases
            preferred = any_i
            # any_list is the plan's list (it did not fit now, so it was looked up)
            any_list.commit(any_n, any_done)  # type: ignore[union-attr]
        return (self._explain(job.plans, info) if self.policy.explain else _NO_FIT_NOW), preferred

    def _place(self, placement: Placement) -> None:
        self.placements.append(placement)
        if placement.plan.parts:  # a mixed plan: its GPUs of each type
            for gpu_type, nodes in placement.by_type():
                self._take(self.free, gpu_type, nodes, False)
                if self.unheld is not None:
                    self._take(self.unheld, gpu_type, nodes, False)
            return
        # checked: chosen on ``free``, a subset of ``unheld``'s free GPUs
        self._take(self.free, placement.plan.gpu_type, placement.nodes, True)
        if self.unheld is not None:
            self._take(self.unheld, placement.plan.gpu_type, placement.nodes, True)

    def _plans_if_mixed(self, job: QueuedJob, info: JobPlans) -> tuple[PlanOption, ...] | None:
        """The job's plans when the pass weighs its mixed plans (it has some and the policy allows
        them: ``_first_fit`` then tries those too), else None."""
        return job.plans if info.mixed and self.mixed else None

    def _commit(self, plan: PlanOption, until: float) -> None:
        """``Releases.commit`` of a placed plan: a mixed plan's GPUs of each of its types."""
        if not plan.parts:
            self.releases.commit(plan, until)
            return
        for gpu_type, need, tp, need_bytes in plan.type_needs():
            self.releases.commit(PlanOption(gpu_type, tp, 1, need // tp, need_bytes), until)

    def _why_waiting(
        self, job: QueuedJob, info: JobPlans, result: PendingReason, preferred: int | None
    ) -> PendingReason:
        """The pending reason of a job with plans that was not placed (``result``: why no plan
        was taken now), in order: it never fits; GPUs are held for the starving job; strict FIFO (it
        becomes the head everything waits behind); it starves (it becomes the holder, with
        GPUs held for ``preferred`` or its best plan)."""
        capacity = self.cluster._capacity
        # "Could this job ever fit?" depends only on the capacity, which views share while no
        # node or GPU changes health (ClusterView reuses it): answered once per job and kept.
        if info.ever[0] is not capacity:  # could some plan fit with every job ended?
            groups = self.cluster.capacity_groups
            ever = any(groups(t, b, tp) * tp >= n for _, t, n, tp, b in info.rows)
            if not ever and info.mixed:  # a mixed plan fits some day when each of its types does
                ever = any(all(groups(t, b, tp) * tp >= n for t, n, tp, b in job.plans[i].type_needs())
                           for i in info.mixed)  # fmt: skip
            info.ever = (capacity, ever)
        if not info.ever[1]:
            return PendingReason(
                result.summary + "; cannot fit this cluster even with every job ended",
                result.per_plan,
                WaitKind.NEVER_FITS,
            )
        if self.reservation is not None:
            held = self._held_reason(job, info, result)
            if held is not None:
                return held
        if not self.backfill:
            self.fifo_head = job
            self.behind = PendingReason(
                f"waiting behind {info.job_id} (strict FIFO, backfill off)", (), WaitKind.BEHIND_HEAD
            )
            return result
        # A job of a higher class than some waiting job holds at once: otherwise lower-priority
        # jobs would take each GPU as it frees and it would wait as long as if it had no
        # priority (until it starves).
        if self.holder is None:
            if starves(info, self.now, self.policy):
                reserving = self._hold_for(job, result, preferred, False)
                if reserving is not None:
                    return reserving
            elif info.priority > self.lowest:
                reserving = self._hold_for(job, result, preferred, True)
                if reserving is not None:
                    return reserving
        return result

    def _held_reason(self, job: QueuedJob, info: JobPlans, result: PendingReason) -> PendingReason | None:
        """"Held for the starving job" when the hold is what keeps the job out: some plan fits
        the GPUs without the hold, none fits those left (a job that chose to wait for a faster
        plan, or skipped a wasteful one that fits, keeps its reason)."""
        holder, reservation = self.holder, self.reservation
        if reservation is None or holder is None or not reservation.held:
            return None
        assert self.unheld is not None
        mixed = self._plans_if_mixed(job, info)
        alt = _first_fit(self.unheld, info, mixed)
        if alt is None or _first_fit(self.free, info, mixed) is not None:
            return None
        why = (
            f"higher-priority job {holder.job_id} (priority {holder.priority})" if self.by_priority
            else f"starving job {holder.job_id} (waiting {_wait_s(holder, self.now):.0f} s)"
        )  # fmt: skip
        return PendingReason(
            f"would fit now ({job.plans[alt].describe()}) but those GPUs are held for {why}",
            result.per_plan,
            WaitKind.HELD_FOR_STARVING,
        )

    def _hold_for(
        self, job: QueuedJob, result: PendingReason, preferred: int | None, by_priority: bool
    ) -> PendingReason | None:
        """Make ``job`` the holder (it starves, or ``by_priority``: its class is above the lowest
        waiting one): hold the free GPUs of its drain target (for ``preferred``, the plan it
        chose to wait for, else its best) and return its reason; None when no plan of it can
        drain (it keeps ``result``)."""
        view = PassInventory(self.cluster, self.free, self.placements)
        if preferred is not None and job.plans[preferred].parts:
            preferred = None  # (GPUs are held for single-type plans only)
        if preferred is None:
            singles = [i for i, p in enumerate(job.plans) if not p.parts]
            if len(singles) == len(job.plans):
                res = drain_target(view, job.job_id, job.plans)
            else:  # a job with mixed plans holds GPUs for its best single-type plan that can drain
                res = drain_target(view, job.job_id, tuple([job.plans[i] for i in singles]))
                if res is not None:
                    res = dataclasses.replace(res, plan_index=singles[res.plan_index])
        else:  # hold GPUs for the plan the job chose to wait for
            res = drain_target(view, job.job_id, (job.plans[preferred],))
            if res is not None:
                res = dataclasses.replace(res, plan_index=preferred)
        if res is None:
            return None
        self.holder, self.reservation, self.by_priority = job, res, by_priority
        self.unheld = self.free.copy()
        self._take(self.free, res.plan.gpu_type, res.held, False)
        nodes = ", ".join(f"{n}×{c}" for n, c in res.target)
        why = (
            f"priority {job.priority}, above waiting jobs of priority {self.lowest}" if by_priority
            else f"starving for {_wait_s(job, self.now):.0f} s"
        )  # fmt: skip
        return PendingReason(
            f"{result.summary}; {why}: holding {res.held_count} free "
            f"{res.plan.gpu_type} for plan {res.plan_index} (target {nodes}), "
            f"waiting for {res.missing} more to be released",
            result.per_plan,
            WaitKind.RESERVING,
        )

    def _over_quota(self, info: JobPlans, used: int) -> PendingReason:
        """Why a job none of whose plans fits its user's room under the GPU quota waits (one
        reason per user, GPUs held and smallest plan)."""
        key = (info.user, used, info.fewest)
        reason = self._quota_reasons.get(key)
        if reason is None:
            reason = self._quota_reasons[key] = PendingReason(
                f"over the GPU quota: user {info.user!r} holds {used} GPUs, the limit is {self.quota} per user "
                f"(--max-gpus-per-user) and the smallest plan needs {info.fewest}; it waits until the user's "
                "jobs release GPUs",
                (),
                WaitKind.OVER_QUOTA,
            )
        return reason

    def _in_quota(self, choice: PreemptionChoice | None, rows: list[QueueRow]) -> PreemptionChoice | None:
        """``choice`` unless one of its placements would take its user over the GPU quota (the
        preemption rules weigh a job's plans whatever its user holds): then no preemption."""
        if choice is None or not self.quota:
            return choice
        users = {row[4].job_id: row[4].user for row in rows}
        held = dict(self.held)
        for placement in choice.placements:
            user = users.get(placement.job_id, "")
            held[user] = held.get(user, 0) + placement.plan.num_gpus
            if held[user] > self.quota:
                return None
        self.held = held
        return choice

    def _preempt(self, rows: list[QueueRow]) -> tuple[Preemption, ...]:
        """At most one preemption (``has.preemption``), applied to the pass (``_switch``)."""
        assert self.est_done is not None
        return self._switch(self._in_quota(preempt(self._view(rows), self.est_done, self.est_type), rows))

    def _stop_long(self, rows: list[QueueRow]) -> tuple[Preemption, ...]:
        """At most one long job (or pair) stopped for much shorter waiting ones
        (``has.preemption.stop_long``), applied to the pass (``_switch``)."""
        assert self.wait_done is not None
        return self._switch(self._in_quota(stop_long(self._view(rows), self.wait_done), rows))

    def _view(self, rows: list[QueueRow]) -> PassView:
        """This pass as the preemption rules read it (``has.preemption.PassView``). A job the pass
        planned on a cut (its deadline and objective) is weighed as that cut: the rules place it
        only on a plan that meets its deadline, the cheapest first under "cost"."""
        holder = self.holder
        cuts = self.cuts
        if cuts:
            out: list[QueueRow] = []
            for row in rows:
                cut = cuts.get(row[4].job_id)
                out.append(row if cut is None else (row[0], row[1], row[2], cut[0], cut[1]))
            rows = out
            if holder is not None and holder.job_id in cuts:
                holder = cuts[holder.job_id][0]
        return PassView(self.policy, self.now, self.cluster, self.running, self.free, rows, self.pending, holder)

    def _switch(self, choice: PreemptionChoice | None) -> tuple[Preemption, ...]:
        """A preemption applied to the pass: its placements added, their jobs no longer pending,
        the pass's free GPUs the ones after the switch."""
        if choice is None:
            return ()
        for placement in choice.placements:
            cut = self.cuts.get(placement.job_id)
            if cut is not None:  # (a plan of its cut: named by its index among the job's own plans)
                placement = dataclasses.replace(placement, plan_index=cut[2][placement.plan_index])
            self.placements.append(placement)
            del self.pending[placement.job_id]
        self.free = choice.free
        return choice.preemptions

    def _explain(self, plans: tuple[PlanOption, ...], info: JobPlans) -> PendingReason:
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
            if p.parts:
                return self._mixed_line(p)
            key = (p.gpu_type, p.tp, p.pp, p.dp, p.bytes_per_gpu, p.label, version.get(p.gpu_type, 0))
            text = lines.get(key)
            if text is None:
                text = free.explain(p, healthy(p.gpu_type))
                lines[key] = text
            return text

        reason = self._reasons[key] = explain_with(line, plans)
        return reason

    def _mixed_line(self, plan: PlanOption) -> str:
        """A mixed plan's line of a pending reason: mixed plans are off, or which of its types lack
        GPUs now (each type's single-type line)."""
        if not self.mixed:
            return (f"needs {plan.describe()}; mixed plans are off (policy frenzy-single-type): it would "
                    + ("fit now" if self.free.fits_plan(plan) else "not fit now either"))
        short = []
        for gpu_type, need, tp, need_bytes in plan.type_needs():
            if not self.free.fits(gpu_type, tp, need, need_bytes):
                part = PlanOption(gpu_type, tp, 1, need // tp, need_bytes)
                short.append(self.free.explain(part, self.cluster.healthy_span(gpu_type)))
        if not short:
            return f"needs {plan.describe()}; fits now"
        return f"needs {plan.describe()}; its share " + "; its share ".join(short)

    def _ranked(self, job: QueuedJob, info: JobPlans) -> Placement | PendingReason:
        """MARP's order, first plan that fits now (``place_job`` on the pass's free GPUs)."""
        i = _first_fit(self.free, info, self._plans_if_mixed(job, info))
        if i is not None:
            found = self.free.choose_plan(job.job_id, i, job.plans[i])
            assert found is not None
            return found
        if self.policy.explain or not job.plans:
            return self._explain(job.plans, info)
        return _NO_FIT_NOW

    def _ranked_wait(self, job: QueuedJob, info: JobPlans) -> tuple[Placement | PendingReason, int | None]:
        """``PlanChoice.RANKED_WAIT``: MARP's first plan that fits now, unless a plan ranked
        before it, started when its busy GPUs are released (``Releases``), would finish more
        than ``wait_slack`` sooner; then the job waits for that plan (and claims its GPUs'
        releases, as completion plan choice does, so later jobs do not count on them). When
        no plan fits now, the job claims the releases of the plan that would finish first.
        Returns the decision and the plan index a waiting job waits for."""
        now, slack, inf = self.now, 1.0 + self.policy.wait_slack, _INF
        lists = self.lists
        if info.waits_for is not self.cluster._capacity:  # (list numbers depend on the capacity)
            lid = self.releases.lid
            info.waits = sorted((r or 0.0, j, lid(b, t), n - 1)
                                for (j, t, n, _, b), r in zip(info.rows, info.runtimes, strict=True))  # fmt: skip
            info.waits_for = self.cluster._capacity  # (``lid`` builds the list of a new number)
            # (a mixed plan's type has no GPUs: its list is empty, no wait is ever for it)
        i = _first_fit(self.free, info, self._plans_if_mixed(job, info))
        # The plans a wait could be for: those ranked before the one that fits now (all
        # when none fits); the earliest estimated completion among them (ties: the better
        # ranked). Walked fastest first: a release is never before now, so once now + runtime
        # passes the best completion no later plan can win.
        before = _LAST if i is None else i
        best_done, best_i, best_list = inf, _LAST, None
        deadline = info.deadline  # (inf but for a job cut to the plans that meet its deadline)
        for runtime, j, number, nm1 in info.waits:
            if now + runtime > best_done:
                break
            if j >= before:
                continue
            found = lists[number]
            done = found.at(nm1) + runtime
            if done > deadline:
                continue  # waiting for it would miss the deadline
            if done < best_done or (done == best_done and j < best_i):
                best_done, best_i, best_list = done, j, found
        if i is not None:
            plan = job.plans[i]
            now_done = now + info.runtimes[i]  # type: ignore[operator]  # (timed: not None)
            if best_list is None or now_done - now <= (best_done - now) * slack:
                self._commit(plan, now_done)
                placed = self.free.choose_plan(job.job_id, i, plan)
                assert placed is not None
                return placed, None
            better = job.plans[best_i]
            best_list.commit(better.num_gpus, best_done)
            if self.wait_done is not None:
                self.wait_done[info.job_id] = best_done
            return PendingReason(
                f"waiting for {better.describe()}: estimated done in {best_done - now:.0f} s vs "
                f"{now_done - now:.0f} s on {plan.describe()} now",
                (),
            ), best_i
        if best_list is not None and best_done < inf:
            best_list.commit(job.plans[best_i].num_gpus, best_done)
        if self.wait_done is not None:
            self.wait_done[info.job_id] = best_done
        reason = self._explain(job.plans, info) if self.policy.explain else _NO_FIT_NOW
        return reason, None

    def _settle(
        self,
        job: QueuedJob,
        now_done: float,
        now_i: int,
        now_plan: PlanOption,
        now_list: ReleaseList,
        any_done: float,
        any_i: int,
        any_list: ReleaseList | None,
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


def _with_deadline(reason: PendingReason, info: JobPlans, now: float) -> PendingReason:
    """``reason`` with when the job's deadline becomes unreachable: the latest start of its
    fastest plan (``PendingReason.latest_start``), or that it was missed."""
    if info.fastest == _INF:  # (no runtime estimate: nothing to say when)
        return reason
    latest = info.deadline - info.fastest
    # (absolute times only: the text stays the same from pass to pass, so a caller that writes a
    # reason only when it changes does not rewrite it every tick)
    if latest < now:
        note = (f"deadline missed: its fastest plan ({info.fastest:.0f} s) had to start by t={latest:.0f} "
                f"to finish by the deadline t={info.deadline:.0f}; it runs late when GPUs free")
    else:
        note = (f"deadline t={info.deadline:.0f} becomes unreachable at t={latest:.0f}, the latest start of "
                f"its fastest plan ({info.fastest:.0f} s)")
    return dataclasses.replace(reason, summary=f"{reason.summary}; {note}", latest_start=latest)


def _first_fit(free: PassFree, info: JobPlans, plans: tuple[PlanOption, ...] | None = None) -> int | None:
    """Index of the first plan (ranked order) that fits ``free`` now, or None. ``plans``: the job's
    plans, to weigh its mixed plans too (``PassFree.fits_plan``); None skips them (their type, the
    '+'-joined types, has no GPUs)."""
    if plans is not None:
        fits_plan = free.fits_plan
        for row in info.rows:
            if fits_plan(plans[row[0]]):
                return row[0]
        return None
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


_SEQ_ORDER = operator.attrgetter("seq", "job_id")
_JOB_ID = operator.attrgetter("job_id")


def schedule(
    cluster: ClusterView,
    queue: Sequence[QueuedJob],
    now: float,
    policy: QueuePolicy = QueuePolicy(),
    running: Sequence[RunningJob] = (),
    held: Mapping[str, int] | None = None,
) -> ScheduleResult:
    """One scheduling pass over ``queue`` (FIFO by seq) against ``cluster`` at time ``now``.

    See the module docstring for the policy. Every queued job ends up either in
    ``placements`` or in ``pending`` with a reason. ``running``: the running jobs preemption
    may stop (only read with ``QueuePolicy.preempt_within_s`` > 0). ``held``: GPUs each user's
    jobs hold now (user -> count; only read with ``QueuePolicy.max_gpus_per_user`` > 0).
    """
    if len(set(map(_JOB_ID, queue))) != len(queue):
        seen: set[str] = set()
        for job in sorted(queue, key=_SEQ_ORDER):
            if job.job_id in seen:
                raise ValueError(f"job {job.job_id!r} is queued twice")
            seen.add(job.job_id)
    return _Pass(cluster, now, policy, running, held).run(queue_order(queue, now, policy))
