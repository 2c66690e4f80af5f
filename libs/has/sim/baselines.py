"""The policies the simulator compares, each a plug-in of ``SimPolicy`` (``decide(view)``).

Role: turn a ``SimView`` (the cluster, the queue, the running jobs, as the live
system would see them) into Start/Stop actions.

* ``frenzy`` / ``frenzy-paper`` (and ablations): build ``QueuedJob``s from MARP's ranked
  plans and call ``has.schedule`` — the very function the live scheduler calls every tick;
  only the ``QueuePolicy`` differs. frenzy-paper = ``QueuePolicy()`` (first satisfiable
  ranked plan, FIFO, backfill); frenzy = ``QueuePolicy.frenzy()``, the live scheduler's
  default too (shortest-first with aging over MARP's ranked plans, refusing a plan far slower
  than one whose GPUs free soon; chosen on the tuning split, docs/simulator.md); the other
  HAS variants are ``QueuePolicy.named``'s, the same knobs as ``frenzy scheduler --policy``.
* the baselines -- ``opportunistic``, ``sia`` (and ``sia-memaware``), ``gavel`` (``-memaware``,
  ``-minjct``), ``hadar-approx`` (``hadar``: an alias that warns) -- live in
  ``has.sim.competitors`` (none of them calls HAS); they are re-exported here, and
  ``make_policy`` below builds every policy by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import marp
from has import POLICY_NAMES as QUEUE_POLICY_NAMES
from has import QueuedJob, QueuePolicy, RunningJob, schedule
from has.oom import memory_share, oom_threshold, plans_that_may_fit
from has.placement import Placement, PlanOption, PlanPart
from has.preemption import may_weigh, weighs_running
from has.sim.competitors import (
    GavelPolicy,
    HadarPolicy,
    OpportunisticPolicy,
    SiaPolicy,
    SolverStats,
)
from has.sim.competitors import _solve as _solve  # (re-exported: tests read them here)
from has.sim.competitors import _type_order as _type_order
from has.sim.engine import JobInfo, SimView, Start, Stop
from marp.objectives import price_table


class UnknownPolicyError(ValueError):
    pass


# ----- Frenzy: has.schedule ------------------------------------------------------------


@dataclass
class FrenzyPolicy:
    """HAS through ``has.schedule`` — one policy, one place (the live scheduler's code)."""

    name: str
    queue_policy: QueuePolicy
    round_s: float | None = None
    restart_s: float = 120.0
    # True (frenzy-blind): HAS is handed no runtime (``PlanOption.runtime_s`` None): the policy
    # knows a job's plans and their order, not its length (its knobs read none anyway)
    blind: bool = False
    _cache: dict[str, tuple[tuple[float, int, int], QueuedJob]] = field(default_factory=dict, repr=False)
    # job -> (MARP plan index or None for a re-planned plan, plan) of each plan in its QueuedJob
    _plans: dict[str, list[tuple[int | None, marp.Plan]]] = field(default_factory=dict, repr=False)
    _view: SimView | None = field(default=None, repr=False)
    _preempted: dict[str, int] = field(default_factory=dict, repr=False)  # job -> times HAS stopped it
    _running: dict[str, RunningJob] = field(default_factory=dict, repr=False)

    @property
    def runs_mixed(self) -> bool:
        """Whether HAS may place this policy's mixed plans (``QueuePolicy.mixed_plans``: frenzy and
        its variants yes, ``frenzy-single-type`` no). Such a policy is handed MARP's ranked plans
        with mixed plans beside the single-type ones, as the live scheduler's predictor answers on
        a cluster of several types; the other gets the single-type plans, as before issue 33."""
        return bool(self.queue_policy.mixed_plans)

    def queued_job(self, job: JobInfo) -> QueuedJob:
        """The job as the scheduler service would queue it, with runtime estimates per plan, and
        its deadline and objective (a "cost" job's plans priced: ``PlanOption.cost_usd``)."""
        key = (job.steps_left, job.restarts, len(job.oom_plans))
        hit = self._cache.get(job.job_id)
        if hit is not None and hit[0] == key:
            return hit[1]
        extra = self.restart_s if job.restarts else 0.0
        kept = [(i, p) for i, p in self.plans_after_ooms(job, self._view, self.runs_mixed)
                if p.num_gpus <= job.max_gpus]  # fmt: skip
        prices = None
        if job.objective == "cost":
            prices = self._view.prices if self._view is not None else price_table()
        options: list[tuple[tuple[int | None, marp.Plan], PlanOption]] = []
        for ip in kept:
            try:
                options.append((ip, self.option(ip[1], job, extra, self.blind, prices)))
            except ValueError:
                if ip[1].mixed is None:
                    raise
                # (a mixed plan of stages of unequal width: no PlanOption holds it, as live)
        self._plans[job.job_id] = [ip for ip, _ in options]
        plans = tuple(o for _, o in options)
        q = QueuedJob(job.job_id, job.seq, job.submitted_at, plans, job.priority,
                      deadline=job.deadline, objective=job.objective)  # fmt: skip
        self._cache[job.job_id] = (key, q)
        return q

    @staticmethod
    def plans_after_ooms(job: JobInfo, view: SimView | None = None,
                         mixed: bool = False) -> list[tuple[int | None, marp.Plan]]:  # fmt: skip
        """(MARP index, plan) of the plans that may still fit after the job's OOMs, learnt as the
        live scheduler learns (``has.oom``): every plan whose predicted share of its GPU's memory
        is at least a failed plan's share is dropped; the rest keep MARP's order. With a ``view``
        the job is first re-planned with MARP below that share (safety margin just over 1 - threshold:
        MARP keeps the best layout per GPU count, which would otherwise be the one that failed),
        so layouts that need less memory at the same GPU count (a higher ZeRO stage,
        recomputation, a smaller micro-batch) -- not among the best-per-count plans MARP ranked
        first -- become candidates (index None). ``mixed``: the plans with mixed ones among them
        (``JobProfile.mixed_plans``), re-planned so too; a mixed plan's share is its tightest rank's."""
        indexed: list[tuple[int | None, marp.Plan]] = list(enumerate(job.profile.ranked(mixed)))
        if not job.oom_plans:
            return indexed
        threshold: float | None = None
        for failed in job.oom_plans:
            threshold = oom_threshold(threshold, *_peak_and_memory(failed))
        assert threshold is not None
        if view is not None:
            known = {(p.gpu_type, p.layout): i for i, p in indexed}
            indexed = [(known.get((p.gpu_type, p.layout)), p)
                       for p in view.replan(job, max(1.0 - threshold + 1e-6, 0.05), mixed)]  # fmt: skip
        return plans_that_may_fit(indexed, threshold, lambda ip: memory_share(*_peak_and_memory(ip[1])))

    def why_waiting(self, job: JobInfo) -> str | None:
        """Why HAS cannot place this job at all (None: it could, given free GPUs)."""
        if not job.profile.ranked(self.runs_mixed):
            return "MARP finds no plan within its 5 % memory safety margin on this cluster"
        left = self.plans_after_ooms(job, self._view, self.runs_mixed)
        if not left:
            return f"every plan ruled out by its OOMs ({len(job.oom_plans)}, has.oom)"
        if all(p.num_gpus > job.max_gpus for _, p in left):
            return f"every plan left after its OOMs needs more than its width bound of {job.max_gpus} GPUs"
        return None

    @staticmethod
    def option(
        p: marp.Plan, job: JobInfo, extra_s: float = 0.0, blind: bool = False, prices: dict[str, float] | None = None
    ) -> PlanOption:
        """A MARP plan as the scheduler service hands it to HAS, plus the runtime estimate
        (none for a size-unaware policy: ``blind``) and, given ``prices`` (GPU type -> dollars per
        GPU-hour), its dollars: its GPUs x their price x that runtime (none without a runtime).

        A mixed plan (``p.mixed``) gets ``parts``, one per stage and type with its GPUs, tp and
        predicted peak, exactly as the live path builds them from the stored plan
        (``frenzy.state.plan_options.plan_to_option``): ``bytes_per_gpu`` the least any rank
        needs, tp / pp / dp the summary layout. ValueError (``PlanOption``'s) for a mixed plan whose
        stages are not the rectangle that summary describes (HAS holds ``tp x pp x dp`` GPUs; MARP's
        planner proposes only rectangular pipelines)."""
        runtime = None if blind else extra_s + job.steps_left * p.step_time_s
        cost = None
        if prices is not None and runtime is not None:
            cost = sum(n * prices.get(t, 0.0) for t, n in p.gpus_by_type.items()) * runtime / 3600.0
        if p.mixed is not None:
            parts = tuple(PlanPart(st.index, s.gpu_type, s.gpus, st.tp, s.memory.total)
                          for st in p.mixed.stages for s in st.shares)  # fmt: skip
            return PlanOption(p.gpu_type, p.layout.tp, p.layout.pp, p.layout.dp,
                              min(part.bytes_per_gpu for part in parts), p.label, runtime, parts=parts,
                              cost_usd=cost)  # fmt: skip
        return PlanOption(p.gpu_type, p.layout.tp, p.layout.pp, p.layout.dp, p.memory.total,
                          f"{p.gpu_type}x{p.num_gpus}", runtime, cost_usd=cost)  # fmt: skip

    def decide(self, view: SimView) -> list[Start | Stop]:
        self._view = view
        queue = [self.queued_job(j) for j in view.queue]
        if not queue:
            return []
        running: list[RunningJob] = []
        policy = self.queue_policy
        if weighs_running(policy):
            # What the live scheduler knows of a running job: when it was submitted, when it
            # started (this attempt), and how many times HAS stopped it; which of them the pass
            # may weigh is the live scheduler's rule too (``has.preemption.may_weigh``; every
            # simulated job resumes from its progress when stopped).
            # (one RunningJob per job kept while it runs the same attempt: at 10,000 GPUs, hundreds
            # of jobs can be within the window, and building them was a third of a decision)
            cache = self._running
            for j in view.running:
                if j.started_at is None or not may_weigh(policy, view.now, j.submitted_at, True):
                    continue
                r = cache.get(j.job_id)
                stops = self._preempted.get(j.job_id, 0)
                if r is None or r.started_at != j.started_at or r.stops != stops:
                    r = cache[j.job_id] = RunningJob(j.job_id, j.started_at, j.submitted_at, True, j.priority, stops)
                running.append(r)
            if len(cache) > 2 * len(running) + 64:  # forget jobs that ended, now and then
                keep = {r.job_id for r in running}
                self._running = {k: v for k, v in cache.items() if k in keep}
        result = schedule(view.cluster, queue, view.now, self.queue_policy, running)
        stops: list[Start | Stop] = []
        for pre in result.preemptions:
            self._preempted[pre.job_id] = self._preempted.get(pre.job_id, 0) + 1
            # a job stopped seconds after its start has no checkpoint yet (lost_s > 0); a long
            # job stopped for shorter ones keeps its progress (lost_s 0)
            stops.append(Stop(pre.job_id, lose_progress=pre.lost_s > 0.0))
        return stops + [self.start_of(p, self._plans.get(p.job_id)) for p in result.placements]

    @staticmethod
    def start_of(p: Placement, plans: list[tuple[int | None, marp.Plan]] | None = None) -> Start:
        """The placement as a Start; ``plans`` maps the QueuedJob's plan order to MARP's plans."""
        if plans is None or p.plan_index is None:
            return Start(p.job_id, p.plan.gpu_type, tuple(p.gpus()), p.plan_index)
        index, plan = plans[p.plan_index]
        return Start(p.job_id, p.plan.gpu_type, tuple(p.gpus()), index, plan)


def _peak_and_memory(plan: marp.Plan) -> tuple[int, int]:
    """(predicted peak, GPU memory) of a plan's tightest rank by share of its GPU's memory (a
    mixed plan's ranks sit on GPUs of different sizes) -- what ``has.oom`` weighs."""
    if plan.mixed is None:
        return plan.memory.total, marp.get_gpu(plan.gpu_type).memory_bytes
    s = max((s for st in plan.mixed.stages for s in st.shares), key=lambda s: s.memory.total / s.gpu_memory_bytes)
    return s.memory.total, s.gpu_memory_bytes


# ----- registry ------------------------------------------------------------------------

# The baselines, beside HAS's variants (``has.POLICY_NAMES``, QueuePolicy.named's table).
BASELINE_NAMES = (
    "opportunistic", "sia", "sia-memaware", "gavel", "gavel-memaware", "gavel-minjct", "hadar-approx",
)  # fmt: skip
# Old names that still resolve, each with a warning naming the new one (cached cells, old docs).
ALIASES = {"hadar": "hadar-approx"}
POLICY_NAMES = (*QUEUE_POLICY_NAMES, *BASELINE_NAMES)


def make_policy(
    name: str, restart_s: float = 120.0, gavel_round_s: float = 360.0, max_width_factor: float | None = None
) -> FrenzyPolicy | OpportunisticPolicy | SiaPolicy | GavelPolicy | HadarPolicy:
    """A fresh policy by name (frenzy = shortest-first with aging over MARP's ranked plans, a
    plan refused when waiting for a better-ranked one finishes more than 20 % sooner, and a
    long running job (or two of one GPU type together) stopped, keeping its progress, for much
    shorter waiting ones: the default the tuning split chose; ablations: frenzy-single = frenzy
    stopping one job at a time, frenzy-nostop = frenzy without the stop, frenzy-restop =
    frenzy-single whose stop may stop a job again after an hour of its run since it resumed,
    frenzy-ranked = frenzy without the refusal,
    frenzy-fifo = frenzy without shortest-first,
    frenzy-completion = completion-time-aware plan choice and preemption (the live default
    before issue 18), frenzy-nopreempt = that without preemption; frenzy-blind = frenzy knowing
    no job's length (submit order, MARP's first plan that fits, no long-job stop; HAS is handed
    no runtime); sia-memaware = Sia told
    which configurations fit, a baseline stronger than the paper's; gavel-memaware = Gavel told which
    configurations fit; gavel-minjct = that with the completion-time objective; hadar-approx = our
    one-type reconstruction of Hadar (``hadar`` still names it, with a warning); ``gavel_round_s``:
    Gavel's round length; ``max_width_factor`` K: Sia's and Hadar's ``max_scale`` (2 without one) --
    the engine holds every policy to K x the request, ``JobInfo.max_gpus``)."""
    if name in ALIASES:
        import warnings

        warnings.warn(f"policy {name!r} is now {ALIASES[name]!r} (a reconstruction, not the published "
                      "Hadar; docs/simulator.md)", FutureWarning, stacklevel=2)  # fmt: skip
        policy = make_policy(ALIASES[name], restart_s, gavel_round_s, max_width_factor)
        policy.name = name  # results stay under the name asked for
        return policy
    scale = 2.0 if max_width_factor is None else float(max_width_factor)
    if name in QUEUE_POLICY_NAMES:
        # HAS itself, the live scheduler's knobs under the same name (QueuePolicy.named);
        # preemption's switch cost is the simulator's restart cost
        return FrenzyPolicy(name, QueuePolicy.named(name, preempt_restart_s=restart_s, explain=False),
                            restart_s=restart_s, blind=name == "frenzy-blind")  # fmt: skip
    if name == "opportunistic":
        return OpportunisticPolicy()
    if name == "sia":
        return SiaPolicy(restart_s=restart_s, max_scale=scale)
    if name == "sia-memaware":
        return SiaPolicy(name="sia-memaware", restart_s=restart_s, memory_aware=True, max_scale=scale)
    if name == "gavel":
        return GavelPolicy(round_s=gavel_round_s, restart_s=restart_s)
    if name == "gavel-memaware":
        return GavelPolicy(name=name, round_s=gavel_round_s, restart_s=restart_s, memory_aware=True)
    if name == "gavel-minjct":
        return GavelPolicy(name=name, round_s=gavel_round_s, restart_s=restart_s, memory_aware=True, objective="minjct")
    if name == "hadar-approx":
        return HadarPolicy(restart_s=restart_s, max_scale=scale)
    raise UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


__all__ = [
    "ALIASES",
    "BASELINE_NAMES",
    "POLICY_NAMES",
    "FrenzyPolicy",
    "GavelPolicy",
    "HadarPolicy",
    "OpportunisticPolicy",
    "SiaPolicy",
    "SolverStats",
    "UnknownPolicyError",
    "make_policy",
]
