"""Event-driven simulator of a heterogeneous GPU cluster running LLM training jobs.

Role: replay a trace (``has.sim.traces``) against a cluster file (``has.cluster_spec``)
under one scheduling policy (``has.sim.baselines``) and record what happened, so
policies can be compared on the same jobs and GPUs. Pure: simulated time only; the
only wall clock is ``time.perf_counter`` around each policy call, recorded as the
policy's decision time (a metric, never an input to a decision).

Truth model (docs/simulator.md):
* A job's speed on (GPU type, n GPUs) is MARP's step-time estimate (``marp.enumerate_plans``,
  the best layout at that count) times a per-job factor drawn from a log-normal around 1
  (``runtime_noise``): policies see the estimate, the job runs at the truth.
* Memory: (type, n) can hold the job iff MARP finds a layout that fits the GPU's full
  memory (safety margin 0). A start on a configuration that cannot hold it fails as an
  OOM ``oom_delay_s`` after the start (process start, model build, first step), the GPUs
  are released and the job goes back to the queue; the policy is told which
  configuration failed.
* A preempted job keeps its progress (checkpoint) — or, stopped with ``lose_progress``,
  loses what it did since its last start — and pays ``restart_s`` of no progress when it
  starts again.

Events: arrival, finish, OOM, node failure (optional injection: the node's jobs are
requeued with their progress, the node is gone for ``down_s``, inf = for good; ``frenzy
simulate --fail-node``), node recovery, round tick
(round-based policies only). After each batch of simultaneous events the policy decides
(event-driven policies), or at each round boundary (round-based ones, e.g. Sia).

Progress: an optional ``progress(finished, total, now_s)`` callback (``SimProgress``) hears how
many jobs have finished out of the trace's and the simulated time, so a caller can draw a bar
(``frenzy simulate`` does, with rich, on a terminal); the engine itself prints nothing.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from bisect import bisect_right as _bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import marp
from has.cluster import ClusterView, GpuSlot, NodeView
from has.cluster_spec import ClusterSpec
from has.sim.errors import SIM_EXTRA, SimError, require  # noqa: F401 - (re-exported: the policies and tests import them from here)
from has.sim.profiles import JobProfile, ProfileBook  # noqa: F401 - (re-exported)
from has.sim.results import JobOutcome, SimResult
from has.sim.traces import TraceJob

if TYPE_CHECKING:
    from has.sim.truth_independent import IndependentTruth

DEFAULT_OOM_DELAY_S = 120.0
DEFAULT_RESTART_S = 120.0
DEFAULT_RUNTIME_NOISE = 0.1
_BUSY_FREE_BYTES = 1 << 30  # memory_free reported for a busy GPU (as an agent would)
# progress(finished jobs, jobs in the trace, simulated seconds): see Simulator's ``progress``.
SimProgress = Callable[[int, int, float], None]
# Between finishes the callback still hears the clock every this many event times, so a bar's
# simulated time moves through long stretches of rounds or arrivals without a finish.
_PROGRESS_EVERY = 256


# ----- what a policy sees and returns --------------------------------------------------


@dataclass
class JobInfo:
    """A job as a policy sees it: no true runtime, no future arrivals."""

    job_id: str
    seq: int
    submitted_at: float
    model: str
    requested_gpus: int
    requested_type: str
    profile: JobProfile
    steps_left: float
    failed_configs: set[tuple[str, int]] = field(default_factory=set)
    # the MARP plans whose start ended in an OOM, in order (what the live scheduler learns from
    # an agent's OOM exit; frenzy re-plans and filters its plans by them with ``has.oom``)
    oom_plans: list[marp.Plan] = field(default_factory=list)
    restarts: int = 0
    priority: int = 0  # the trace's priority column (0 without one)
    # when it must finish (submit + the trace's deadline_s; None: no deadline) and its objective
    deadline: float | None = None
    objective: str = "time"
    # The most GPUs any policy may give it (``Simulator``'s ``max_width_factor``: K x the
    # trace's request, raised to the smallest count at which MARP finds a layout that fits some
    # type); unbounded (a large number) without one. The engine refuses a start above it.
    max_gpus: int = 1 << 30
    # Set while running:
    gpu_type: str | None = None
    gpus: tuple[tuple[str, int], ...] = ()
    plan_index: int | None = None
    plan: marp.Plan | None = None
    started_at: float | None = None
    est_end: float | None = None

    @property
    def config(self) -> tuple[str, int] | None:
        return None if self.gpu_type is None else (self.gpu_type, len(self.gpus))


@dataclass(frozen=True)
class Start:
    """Start ``job_id`` on these GPUs (all of ``gpu_type``) at ``step_time_s`` per step (estimate).

    ``plan_index`` names the MARP plan when the policy used one of the job's ranked plans, or
    ``plan`` gives it (a plan MARP made when the policy re-planned after an OOM, or a mixed plan);
    its layout's step time and memory then apply. Memory-blind policies leave both None and get the
    best layout at that count. A mixed plan (``plan.mixed``, one job over several GPU types,
    docs/mixed-plans.md) is given as ``plan``, with ``gpu_type`` its types '+'-joined and ``gpus``
    holding exactly its GPUs of each type.
    """

    job_id: str
    gpu_type: str
    gpus: tuple[tuple[str, int], ...]
    plan_index: int | None = None
    plan: marp.Plan | None = None


@dataclass(frozen=True)
class Stop:
    """Preempt a running job (it pays the restart cost later). It keeps its progress
    (checkpoint), or with ``lose_progress`` loses what it did since its last start (a job
    stopped minutes after it started has no checkpoint yet)."""

    job_id: str
    lose_progress: bool = False


class SimView:
    """Read-only state handed to a policy at one decision point."""

    def __init__(self, sim: Simulator, now: float) -> None:
        self.now = now
        self.spec = sim.spec
        self.queue: list[JobInfo] = [sim.info[j] for j in sim.queue]
        self.running: list[JobInfo] = [sim.info[j] for j in sim.running]
        self.prices: dict[str, float] = sim.prices  # GPU type -> dollars per GPU-hour (read only)
        self._sim = sim
        self._cluster: ClusterView | None = None

    def replan(self, job: JobInfo, safety_margin: float, mixed: bool = False) -> tuple[marp.Plan, ...]:
        """MARP's ranked plans for the job with a stricter memory margin (what the predictor
        answers when the scheduler re-plans a job after an OOM), mixed plans too when ``mixed``."""
        return self._sim.book.replan(self._sim.trace[job.job_id], safety_margin, mixed)

    @property
    def cluster(self) -> ClusterView:
        """The cluster as the live scheduler would read it (busy GPUs carry their owner's est. end)."""
        if self._cluster is None:
            self._cluster = self._sim.cluster_view()
        return self._cluster


class SimPolicy(Protocol):
    """One scheduling policy. ``round_s`` None = decide after every event batch. A policy with a
    true ``runs_mixed`` attribute places mixed plans (frenzy), so a job only a mixed plan fits
    enters its queue; without one (every baseline, ``frenzy-single-type``) such a job never does."""

    name: str
    round_s: float | None

    def decide(self, view: SimView) -> Sequence[Start | Stop]: ...


# ----- the engine ----------------------------------------------------------------------

_ARRIVE, _FINISH, _OOM, _NODE_DOWN, _NODE_UP, _ROUND = range(6)
TRUTHS = ("marp", "independent")  # Simulator's ``truth`` (``frenzy simulate --truth``)


def width_cap(requested: int, profile: JobProfile, factor: float | None) -> int:
    """The most GPUs a job may get under ``--max-width-factor`` ``factor`` (None: no bound): ``factor``
    x the trace's request, raised to the GPU count of MARP's smallest plan for the job on this
    cluster (its 5 % margin; without one, the smallest count at which a layout fits at all)
    rounded up to a power of two (the counts Sia's and Hadar's rounds place), so the bound never
    leaves a job no configuration under any policy."""
    if factor is None:
        return 1 << 30
    smallest = min((p.num_gpus for p in profile.plans or profile.mixed_plans),
                   default=min((n for _, n in profile.configs), default=1))  # fmt: skip
    smallest = 1 << (smallest - 1).bit_length()
    return max(int(math.floor(factor * max(requested, 1) + 1e-9)), smallest, 1)



class Simulator:
    """One run of one policy over one trace on one cluster. ``run()`` once."""

    def __init__(
        self,
        spec: ClusterSpec,
        trace: Sequence[TraceJob],
        policy: SimPolicy,
        *,
        seed: int = 0,
        runtime_noise: float = DEFAULT_RUNTIME_NOISE,
        memory_error: float = 0.0,
        speed_error: float = 0.0,
        oom_delay_s: float = DEFAULT_OOM_DELAY_S,
        restart_s: float = DEFAULT_RESTART_S,
        node_failures: Sequence[tuple[float, str, float]] = (),
        profiles: ProfileBook | None = None,
        max_time_s: float = 10 * 365 * 86400.0,
        stall_s: float = 60 * 86400.0,
        progress: SimProgress | None = None,
        truth: str = "marp",
        max_width_factor: float | None = None,
    ) -> None:
        if truth not in TRUTHS:
            raise SimError(f"truth: one of {', '.join(TRUTHS)}, got {truth!r}")
        if max_width_factor is not None and not (max_width_factor >= 1 and math.isfinite(max_width_factor)):
            raise SimError(f"max_width_factor: must be a number >= 1 (or None: unbounded), got {max_width_factor}")
        for label, sigma in (("runtime_noise", runtime_noise), ("memory_error", memory_error),
                             ("speed_error", speed_error)):  # fmt: skip
            if not (sigma >= 0 and math.isfinite(sigma)):
                raise SimError(f"{label}: must be a sigma >= 0, got {sigma}")
        self.spec = spec
        self.policy = policy
        self.seed = seed
        self.memory_error = memory_error
        self.speed_error = speed_error
        # The truth the jobs run at: "marp" (MARP's step time and peak, times per-job and per-type
        # factors) or "independent" (has.sim.truth_independent: measured scaling; errors per
        # width and layout). Policies see MARP's predictions under both.
        self.truth = truth
        self._indep: IndependentTruth | None = None
        if truth == "independent":
            from has.sim.truth_independent import IndependentTruth, TruthDataError

            try:
                self._indep = IndependentTruth(spec, seed, speed_error=speed_error, memory_error=memory_error)
            except TruthDataError as exc:
                raise SimError(str(exc)) from exc
        self.max_width_factor = max_width_factor
        self._type_factors: dict[tuple[str, str, str], float] = {}
        self.oom_delay_s = oom_delay_s
        self.restart_s = restart_s
        self.max_time_s = max_time_s
        # A round-based policy that keeps jobs busy without finishing any (e.g. rotating every
        # round with a restart as long as the round) would run to max_time_s; a round more than
        # stall_s after the last arrival or finish stops the run, the jobs left reported stalled.
        self.stall_s = stall_s
        self._stalled = False
        # Called with (finished, total, now_s) when a job finishes, every _PROGRESS_EVERY event
        # times, and once at the end of run() (then now_s is the run's end).
        self.progress = progress
        self.finished = 0
        self.book = profiles or ProfileBook(spec)
        # The policy places mixed plans (one job over several GPU types): a job only a mixed plan
        # fits enters its queue (``SimPolicy``'s ``runs_mixed``; frenzy, not frenzy-single-type)
        self.runs_mixed = bool(getattr(policy, "runs_mixed", False))
        # Dollars per GPU-hour by catalog GPU type: the list prices (marp.prices) under the cluster
        # file's price_per_gpu_hour. Every GPU-second a job holds is charged (JobOutcome.cost_usd).
        self.prices = gpu_prices(spec)
        # GPUs: node → [(index, type, memory)]; ownership kept in one dict.
        self.node_gpus: dict[str, list[tuple[int, str, int]]] = {}
        for name, group in spec.nodes():
            gpu = marp.get_gpu(group.gpu)
            self.node_gpus[name] = [(i, gpu.name, gpu.memory_bytes) for i in range(group.gpus_per_node)]
        self.total_gpus = sum(len(v) for v in self.node_gpus.values())
        self.owner: dict[tuple[str, int], str] = {}
        self.down: set[str] = set()

        self.info: dict[str, JobInfo] = {}
        self.trace: dict[str, TraceJob] = {}
        self.factor: dict[str, float] = {}
        self.outcomes: dict[str, JobOutcome] = {}
        ids: set[str] = set()
        for seq, job in enumerate(sorted(trace, key=lambda j: (j.submit_s, j.job_id))):
            if job.job_id in ids:
                raise SimError(f"trace: job id {job.job_id!r} appears twice")
            ids.add(job.job_id)
            self.trace[job.job_id] = job
            # Same job, same factor under every policy: a str seed is hashed with SHA-512.
            rng = random.Random(f"{seed}:{job.job_id}")
            self.factor[job.job_id] = math.exp(rng.gauss(0.0, runtime_noise)) if runtime_noise > 0 else 1.0
            profile = self.book.get(job)
            self.info[job.job_id] = JobInfo(
                job_id=job.job_id, seq=seq, submitted_at=job.submit_s, model=job.model,
                requested_gpus=job.gpus, requested_type=job.gpu_type, profile=profile,
                steps_left=float(job.train_steps), priority=job.priority,
                max_gpus=width_cap(job.gpus, profile, max_width_factor),
                deadline=None if job.deadline_s is None else job.submit_s + job.deadline_s, objective=job.objective,
            )  # fmt: skip
            self.outcomes[job.job_id] = JobOutcome(job.job_id, job.submit_s, priority=job.priority,
                                                   deadline_s=self.info[job.job_id].deadline)  # fmt: skip

        self.queue: dict[str, None] = {}  # insertion-ordered set of queued job ids
        self.running: dict[str, None] = {}
        self._progress_from: dict[str, float] = {}
        self._true_step: dict[str, float] = {}
        self._attempt: dict[str, int] = {}
        self._events: list[tuple[float, int, int, int, str]] = []
        self._n = 0
        for job in self.trace.values():
            self._push(job.submit_s, _ARRIVE, job.job_id)
        for at, node, down_s in node_failures:
            if node not in self.node_gpus:
                raise SimError(f"node failure: unknown node {node!r}")
            self._push(at, _NODE_DOWN, node)
            if math.isfinite(down_s):  # inf: down for the rest of the run (no recovery event)
                self._push(at + down_s, _NODE_UP, node)
        self.decisions: list[float] = []
        self.busy: list[tuple[float, int]] = [(0.0, 0)]
        self.ooms = 0
        self.restarts = 0
        self.placements: list[tuple[float, str, str, tuple[tuple[str, int], ...]]] = []
        self._changed = True

    # -- the truth --

    def type_factor(self, kind: str, job_id: str, gpu_type: str) -> float:
        """The true/predicted factor of ``kind`` ("mem": peak memory, "speed": step time) for
        one job on one GPU type: exp(N(0, sigma)), seeded by (seed, kind, job, type) so every
        policy meets the same truth and the fastest or fitting type can differ from MARP's."""
        key = (kind, job_id, gpu_type)
        f = self._type_factors.get(key)
        if f is None:
            sigma = self.memory_error if kind == "mem" else self.speed_error
            f = math.exp(random.Random(f"{self.seed}:{kind}:{job_id}:{gpu_type}").gauss(0.0, sigma)) if sigma > 0 else 1.0
            self._type_factors[key] = f
        return f

    def _true_step_of(self, job_id: str, plan: marp.Plan) -> float | None:
        """Under the independent truth: the true seconds per step of this plan's layout (before
        the per-job runtime noise), or None when its true peak does not fit the GPU."""
        assert self._indep is not None
        if plan.mixed is not None:  # each type's ranks hold their own peak (docs/simulator.md)
            lay = plan.mixed
            for st in lay.stages:
                for s in st.shares:
                    if s.memory.total * self._indep.mixed_memory_factor(job_id, s.gpu_type, lay) > s.gpu_memory_bytes:
                        return None
            return self._indep.mixed_step_s(job_id, self.info[job_id].model, self.trace[job_id].recipe(), lay)
        t = plan.gpu_type
        if plan.memory.total * self._indep.memory_factor(job_id, t, plan.layout) > self.book.memory[t]:
            return None
        return self._indep.step_s(job_id, self.info[job_id].model, self.trace[job_id].recipe(), t, plan.layout)

    # -- events --

    def _push(self, t: float, kind: int, key: str, attempt: int = 0) -> None:
        self._n += 1
        heapq.heappush(self._events, (t, kind, self._n, attempt, key))

    def run(self) -> SimResult:
        round_s = self.policy.round_s
        next_round: float | None = None
        now = 0.0
        timed_out = False
        last_event = 0.0  # the last arrival or finish
        ticks = 0  # event times handled, for the progress callback's clock
        total = len(self.trace)
        while self._events:
            if self._events[0][0] > self.max_time_s:
                timed_out = True
                break
            if self._events[0][1] == _ROUND and self._events[0][0] - last_event > self.stall_s and self.running:
                self._stalled = True
                break
            now = self._events[0][0]
            if self._events[0][1] in (_ARRIVE, _FINISH):
                last_event = now
            had_round = False
            finished_before = self.finished
            while self._events and self._events[0][0] == now:
                _, kind, _, attempt, key = heapq.heappop(self._events)
                if kind == _ROUND:
                    had_round = True
                    next_round = None
                else:
                    self._handle(now, kind, key, attempt)
            ticks += 1
            if self.progress is not None and (self.finished != finished_before or ticks % _PROGRESS_EVERY == 0):
                self.progress(self.finished, total, now)
            started, decided = 0, False
            if round_s is None:
                if self._changed:
                    started, decided = self._decide(now), True
            else:
                if had_round and (self._changed or self.queue):
                    started, decided = self._decide(now), True
                if next_round is None and (self.queue or self._changed):
                    # Rounds on a fixed grid (Sia: 60 s); a round with nothing queued and
                    # nothing changed would re-derive the same allocation, so none is scheduled.
                    next_round = (math.floor(now / round_s) + 1) * round_s
                    self._push(next_round, _ROUND, "")
            if not self.running and not self.queue and all(e[1] == _ROUND for e in self._events):
                break
            if (
                decided
                and not self.running
                and self.queue
                and not started
                and all(e[1] == _ROUND for e in self._events)
            ):
                break  # nothing left can ever start (jobs that fit no GPU of this cluster)
        end = now
        for job_id in self.running:  # (a run cut short: what they held until its end is spent too)
            self._charge(end, job_id)
        if self.progress is not None:
            self.progress(self.finished, total, end)
        unfinished = {}
        for job_id, rec in self.outcomes.items():
            if rec.finish_s is None:
                unfinished[job_id] = self._why_unfinished(job_id, timed_out)
        return SimResult(
            policy=self.policy.name, total_gpus=self.total_gpus, jobs=list(self.outcomes.values()),
            decisions_s=self.decisions, busy_timeline=self.busy, oom_failures=self.ooms,
            restarts=self.restarts, placements=self.placements, end_s=end, unfinished=unfinished,
            isolated_s=self._isolated_times(end),
        )  # fmt: skip

    def _why_unfinished(self, job_id: str, timed_out: bool) -> str:
        """Why a job did not finish: the policy's own word where it has one, else what the
        engine saw (no GPU type for its precision, OOMs, never placed, the time limit)."""
        info = self.info[job_id]
        if self._stalled:
            return (f"stalled: no job finished or arrived for {self.stall_s / 86400:.0f} days "
                    f"({self.outcomes[job_id].restarts} restarts; the policy gave no progress)")  # fmt: skip
        if job_id in self.running:
            return f"still running when the run stopped at the {self.max_time_s / 86400:.0f}-day limit"
        if not info.profile.runnable_types:
            return "no GPU type of this cluster runs its precision"
        if not info.profile.configs and not (self.runs_mixed and info.profile.runs_only_mixed):
            if info.profile.runs_only_mixed:
                return ("too big for any one GPU type of this cluster: only a mixed plan fits, and "
                        f"{self.policy.name} places none")
            return "too big for this cluster: MARP finds no layout that fits any of its GPU types"
        explain = getattr(self.policy, "why_waiting", None)
        said = explain(info) if explain is not None else None
        if said:
            return str(said)
        ooms = self.outcomes[job_id].ooms
        if timed_out:
            return f"still queued at the {self.max_time_s / 86400:.0f}-day limit ({ooms} OOMs)"
        if ooms:
            return f"OOM on every configuration the policy would try ({ooms} OOMs)"
        return "never placed: the policy found no configuration for it on this cluster"

    def _isolated_times(self, end: float) -> dict[str, float]:
        """Themis' T_id per job (Mahajan et al., "Themis: Fair and Efficient GPU Cluster
        Scheduling", NSDI'20, sec. 3): the job's runtime alone on an equal 1/N share of the
        cluster, N the time-averaged number of jobs in the system (arrived, not finished) over the
        job's own lifetime. Here: its fastest true runtime over the configurations MARP predicts
        fit, stretched by n / share where a configuration needs more GPUs than the share
        (time-slicing). The same reference under every policy except for N, which is the run's."""
        # N(t): +1 at each submit, -1 at each finish. times[k]: a change point; level[k]: N from
        # times[k] on; integral[k]: the integral of N up to times[k].
        changes = sorted([(o.submit_s, 1) for o in self.outcomes.values()]
                         + [(o.finish_s, -1) for o in self.outcomes.values() if o.finish_s is not None])  # fmt: skip
        times: list[float] = []
        level: list[int] = []
        integral: list[float] = []
        for t, d in changes:
            if times and times[-1] == t:
                level[-1] += d
                continue
            integral.append(integral[-1] + level[-1] * (t - times[-1]) if times else 0.0)
            level.append((level[-1] if level else 0) + d)
            times.append(t)

        def area(t: float) -> float:
            k = _bisect_right(times, t) - 1
            return 0.0 if k < 0 else integral[k] + level[k] * (t - times[k])

        out: dict[str, float] = {}
        for job_id, rec in self.outcomes.items():
            info = self.info[job_id]
            t1 = rec.finish_s if rec.finish_s is not None else max(end, rec.submit_s)
            t0 = rec.submit_s
            n_avg = max(1.0, (area(t1) - area(t0)) / (t1 - t0)) if t1 > t0 else 1.0
            share = self.total_gpus / n_avg
            steps = float(self.trace[job_id].train_steps)
            best = math.inf
            for (gpu_type, n), step in info.profile.configs.items():
                if self._indep is None:
                    true = step * self.factor[job_id] * self.type_factor("speed", job_id, gpu_type)
                else:
                    lay = info.profile.truth_plans[(gpu_type, n)].layout
                    true = self._indep.step_s(job_id, info.model, self.trace[job_id].recipe(), gpu_type, lay)
                    true *= self.factor[job_id]
                best = min(best, steps * true * max(1.0, n / share))
            if not info.profile.configs:  # a job only a mixed plan fits: its mixed plans' truth
                for p in info.profile.mixed_plans:
                    if p.mixed is None:
                        continue
                    if self._indep is None:
                        true = p.step_time_s * max(self.type_factor("speed", job_id, t) for t in p.gpus_by_type)
                    else:
                        true = self._indep.mixed_step_s(job_id, info.model, self.trace[job_id].recipe(), p.mixed)
                    best = min(best, steps * true * self.factor[job_id] * max(1.0, p.num_gpus / share))
            if math.isfinite(best):
                out[job_id] = best
        return out

    def _handle(self, now: float, kind: int, key: str, attempt: int) -> None:
        if kind == _ARRIVE:
            prof = self.info[key].profile
            if (not prof.configs and not (self.runs_mixed and prof.runs_only_mixed)) or not prof.runnable_types:
                # No layout of this job fits any GPU type of the cluster (or none runs its
                # precision): no policy can ever run it here, so it never enters the queue (a
                # memory-blind policy would only OOM on it; round-based ones would keep deciding
                # for it until the end). It is reported unfinished with that reason.
                return
            self.queue[key] = None
            self._changed = True
        elif kind in (_FINISH, _OOM):
            if key not in self.running or self._attempt.get(key, 0) != attempt:
                return  # stale: the job was preempted or its node failed meanwhile
            if kind == _FINISH:
                self._release(now, key)
                self.outcomes[key].finish_s = now
                self.info[key].steps_left = 0.0
                self.finished += 1
            else:
                info = self.info[key]
                cfg = info.config
                if info.plan is not None:
                    info.oom_plans.append(info.plan)
                self._release(now, key)
                self.ooms += 1
                self.outcomes[key].ooms += 1
                assert cfg is not None
                info.failed_configs.add(cfg)
                self.queue[key] = None
            self._changed = True
        elif kind == _NODE_DOWN:
            self.down.add(key)
            for job_id in [j for j in self.running if any(n == key for n, _ in self.info[j].gpus)]:
                self._preempt(now, job_id)
            self._changed = True
        elif kind == _NODE_UP:
            self.down.discard(key)
            self._changed = True

    def _charge(self, now: float, job_id: str) -> None:
        """Charge the job's outcome for its GPUs from its start (this attempt) until ``now``:
        GPU-hours and dollars (their type's price), whether it progressed, restarted or OOMed."""
        info = self.info[job_id]
        if info.started_at is None or info.gpu_type is None:
            return
        per_gpu = max(0.0, now - info.started_at) / 3600.0
        rec = self.outcomes[job_id]
        rec.gpu_hours += len(info.gpus) * per_gpu
        if info.plan is not None and info.plan.mixed is not None:  # each GPU at its own type's price
            rec.cost_usd += per_gpu * sum(self.prices.get(self.node_gpus[n][i][1], 0.0) for n, i in info.gpus)
        else:
            rec.cost_usd += len(info.gpus) * per_gpu * self.prices.get(info.gpu_type, 0.0)

    def _release(self, now: float, job_id: str) -> None:
        self._charge(now, job_id)
        info = self.info[job_id]
        for g in info.gpus:
            del self.owner[g]
        del self.running[job_id]
        info.gpu_type, info.gpus, info.plan_index, info.started_at, info.est_end = None, (), None, None, None
        info.plan = None
        self._attempt[job_id] = self._attempt.get(job_id, 0) + 1
        self._mark_busy(now)

    def _preempt(self, now: float, job_id: str, lose_progress: bool = False) -> None:
        info = self.info[job_id]
        if not lose_progress:
            done = max(0.0, (now - self._progress_from[job_id]) / self._true_step[job_id])
            info.steps_left = max(0.0, info.steps_left - done)
        self._release(now, job_id)
        info.restarts += 1
        self.outcomes[job_id].restarts += 1
        self.restarts += 1
        self.queue[job_id] = None

    def _mark_busy(self, now: float) -> None:
        busy = len(self.owner)
        if self.busy and self.busy[-1][0] == now:
            self.busy[-1] = (now, busy)
        else:
            self.busy.append((now, busy))

    # -- decisions --

    def cluster_view(self) -> ClusterView:
        nodes = []
        for name, gpus in self.node_gpus.items():
            slots = []
            for index, gpu_type, mem in gpus:
                owner = self.owner.get((name, index))
                free_at = self.info[owner].est_end if owner is not None else None
                slots.append(GpuSlot(name, index, gpu_type, mem, mem if owner is None else _BUSY_FREE_BYTES,
                                     owner, True, free_at))  # fmt: skip
            nodes.append(NodeView(name, tuple(slots), alive=name not in self.down))
        return ClusterView(nodes)

    def _decide(self, now: float) -> int:
        self._changed = False
        view = SimView(self, now)
        t0 = time.perf_counter()
        actions = list(self.policy.decide(view))
        self.decisions.append(time.perf_counter() - t0)
        for a in actions:
            if isinstance(a, Stop):
                if a.job_id not in self.running:
                    raise SimError(f"{self.policy.name}: Stop for {a.job_id!r}, which is not running")
                self._preempt(now, a.job_id, a.lose_progress)
                self._changed = True
        started = 0
        for a in actions:
            if isinstance(a, Start):
                self._start(now, a)
                started += 1
        self._mark_busy(now)
        return started

    def _start(self, now: float, a: Start) -> None:
        name = self.policy.name
        if a.job_id not in self.queue:
            raise SimError(f"{name}: Start for {a.job_id!r}, which is not queued (arrived and waiting)")
        if not a.gpus:
            raise SimError(f"{name}: Start for {a.job_id!r} with no GPUs")
        for g in a.gpus:
            node, index = g
            if node not in self.node_gpus or not 0 <= index < len(self.node_gpus[node]):
                raise SimError(f"{name}: {a.job_id}: unknown GPU {node}:{index}")
            if node in self.down:
                raise SimError(f"{name}: {a.job_id}: node {node} is down")
            if g in self.owner:
                raise SimError(f"{name}: {a.job_id}: GPU {node}:{index} already held by {self.owner[g]}")
        if len(set(a.gpus)) != len(a.gpus):
            raise SimError(f"{name}: {a.job_id}: a GPU is listed twice")
        info = self.info[a.job_id]
        plan = a.plan if a.plan is not None else None if a.plan_index is None else info.profile.plans[a.plan_index]
        mixed = plan is not None and plan.mixed is not None
        if mixed:
            assert plan is not None
            got: dict[str, int] = {}
            for node, index in a.gpus:
                t = self.node_gpus[node][index][1]
                got[t] = got.get(t, 0) + 1
            if got != plan.gpus_by_type or a.gpu_type != plan.gpu_type:
                raise SimError(f"{name}: {a.job_id}: mixed plan {plan.label} given GPUs "
                               f"{', '.join(f'{n}x {t}' for t, n in sorted(got.items()))}")  # fmt: skip
        else:
            for node, index in a.gpus:
                if self.node_gpus[node][index][1] != a.gpu_type:
                    raise SimError(f"{name}: {a.job_id}: GPU {node}:{index} is not a {a.gpu_type}")
        for t in plan.gpus_by_type if mixed and plan is not None else (a.gpu_type,):
            if t not in info.profile.runnable_types:
                raise SimError(f"{name}: {a.job_id}: {t} cannot run its precision "
                               f"({info.profile.recipe.precision if info.profile.recipe else '?'})")  # fmt: skip
        n = len(a.gpus)
        if n > info.max_gpus:
            raise SimError(f"{name}: {a.job_id}: {n} GPUs, above its width bound of {info.max_gpus} "
                           f"(--max-width-factor {self.max_width_factor:g} x {info.requested_gpus} requested)")  # fmt: skip
        cfg = (a.gpu_type, n)
        true_est: float | None  # the predicted step time of the layout that truly runs (None: OOM)
        if mixed:
            assert plan is not None and plan.mixed is not None
            est_step = plan.step_time_s
            if self._indep is None:
                # the marp truth of a mixed plan: MARP's step time and each type's peak, times the
                # job's factor on that type (memory), the slowest type's (speed)
                fits = all(s.memory.total * self.type_factor("mem", a.job_id, s.gpu_type) <= s.gpu_memory_bytes
                           for st in plan.mixed.stages for s in st.shares)  # fmt: skip
                true_est = est_step * max(self.type_factor("speed", a.job_id, t) for t in plan.gpus_by_type) if fits else None
            else:
                true_est = self._true_step_of(a.job_id, plan)
        elif plan is not None:
            mem_f = self.type_factor("mem", a.job_id, a.gpu_type)
            if (plan.gpu_type, plan.num_gpus) != cfg:
                raise SimError(
                    f"{name}: {a.job_id}: plan {a.plan_index} is {plan.gpu_type}x{plan.num_gpus}, not {cfg}"
                )
            est_step = plan.step_time_s
            if self._indep is None:
                # the true peak of this very layout: MARP's prediction x the job's factor on this type
                true_est = est_step if plan.memory.total * mem_f <= self.book.memory[a.gpu_type] else None
            else:
                true_est = self._true_step_of(a.job_id, plan)
        else:
            # memory-blind: the user's framework runs the fastest layout that truly fits (generous)
            est_step = info.profile.configs.get(cfg, math.inf)
            mem_f = self.type_factor("mem", a.job_id, a.gpu_type)
            if self._indep is None:
                true_est = self.book.fastest_fitting(self.trace[a.job_id], a.gpu_type, n, mem_f)
            else:
                steps = [self._true_step_of(a.job_id, p) for p in self.book.ladder(self.trace[a.job_id], a.gpu_type, n)]
                true_est = min((s for s in steps if s is not None), default=None)
        del self.queue[a.job_id]
        self.running[a.job_id] = None
        for g in a.gpus:
            self.owner[g] = a.job_id
        info.gpu_type, info.gpus, info.plan_index, info.started_at = (
            a.gpu_type,
            tuple(a.gpus),
            a.plan_index,
            now,
        )
        info.plan = plan
        rec = self.outcomes[a.job_id]
        if rec.first_start_s is None:
            rec.first_start_s = now
        rec.gpu_type, rec.gpus = a.gpu_type, n
        rec.mixed = mixed
        self.placements.append((now, a.job_id, a.gpu_type, tuple(a.gpus)))
        attempt = self._attempt.get(a.job_id, 0)
        progress_from = now + (self.restart_s if info.restarts > 0 else 0.0)
        if true_est is None:
            # The truth: this layout (or, memory-blind, every layout) needs more than the GPU has.
            self._true_step[a.job_id] = math.inf
            self._progress_from[a.job_id] = progress_from
            info.est_end = now + self.oom_delay_s
            self._push(now + self.oom_delay_s, _OOM, a.job_id, attempt)
            return
        if self._indep is None and not mixed:
            true_step = true_est * self.factor[a.job_id] * self.type_factor("speed", a.job_id, a.gpu_type)
        else:  # (the independent truth's own error, or a mixed plan's type factor, is in true_est already)
            true_step = true_est * self.factor[a.job_id]
        self._true_step[a.job_id] = true_step
        self._progress_from[a.job_id] = progress_from
        info.est_end = progress_from + info.steps_left * est_step
        self._push(progress_from + info.steps_left * true_step, _FINISH, a.job_id, attempt)


def gpu_prices(spec: ClusterSpec) -> dict[str, float]:
    """Dollars per GPU-hour by catalog GPU name: ``marp.prices``' list prices, overridden by the
    cluster file's ``price_per_gpu_hour`` (the highest where groups of one type differ)."""
    from marp.objectives import price_table

    overrides: dict[str, float] = {}
    for name, price in spec.price_overrides().items():
        try:
            canonical = marp.get_gpu(name).name
        except marp.MarpError:
            canonical = name
        overrides[canonical] = max(overrides.get(canonical, 0.0), price)
    return price_table(overrides)


def simulate(spec: ClusterSpec, trace: Sequence[TraceJob], policy: SimPolicy, **kwargs: object) -> SimResult:
    """Run one policy over one trace; see ``Simulator`` for the keyword arguments."""
    return Simulator(spec, trace, policy, **kwargs).run()  # type: ignore[arg-type]


__all__ = [
    "JobInfo",
    "JobProfile",
    "JobOutcome",
    "ProfileBook",
    "SIM_EXTRA",
    "SimError",
    "SimPolicy",
    "SimProgress",
    "SimResult",
    "SimView",
    "Simulator",
    "TRUTHS",
    "gpu_prices",
    "Start",
    "Stop",
    "require",
    "simulate",
    "width_cap",
]
