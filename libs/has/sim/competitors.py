"""The policies Frenzy is compared against -- none of them calls HAS (``has.schedule``).

Role: the baselines of ``has.sim.baselines``' registry (``make_policy`` builds them there, beside
the ``frenzy`` variants), each a ``SimPolicy`` turning a ``SimView`` into Start/Stop actions:

* ``opportunistic`` (event-driven, memory-blind first fit of the user's request on the fastest
  free type, FIFO with backfill). Its OOM rule (``OpportunisticPolicy.request``, Gavel's too):
  after an OOM on (type, n) the job tries the next type at n; once every type failed at n, 2n;
* ``sia`` / ``sia-memaware`` (Sia's round-based goodput ILP), ``gavel`` / ``gavel-memaware`` /
  ``gavel-minjct`` (Gavel's LPs), both solved by HiGHS under deterministic limits (``_solve``);
* ``hadar-approx`` (a one-type reconstruction of Hadar's primal-dual pricing);

and what the round-based ones share: GPU types in cluster-file order (``_type_order``), per-type
shape and capacity, and how a round's allocation becomes actions (``_place_round``). The papers'
terms and our assumptions: the classes' docstrings and docs/simulator.md, "The policies".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import marp
from has.sim.engine import JobInfo, JobProfile, SimError, SimView, Start, Stop, require

# ----- opportunistic -------------------------------------------------------------------


def _shape_and_capacity(view: SimView) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """Per GPU type with healthy GPUs, in ``_type_order``: (GPUs on its fullest node, nodes) and the
    healthy GPUs in all — what Sia's and Hadar's rounds size their allocations by."""
    shape: dict[str, tuple[int, int]] = {}
    capacity: dict[str, int] = {}
    for t in _type_order(view):
        per = view.cluster.healthy_by_node(t)
        if per:
            shape[t] = (max(per.values()), len(per))
            capacity[t] = sum(per.values())
    return shape, capacity


def _type_order(view: SimView) -> list[str]:
    """GPU types in cluster-file order (the operator's order; no speed or memory knowledge)."""
    seen: list[str] = []
    for g in view.spec.groups:
        name = marp.get_gpu(g.gpu).name
        if name not in seen:
            seen.append(name)
    return seen


@dataclass
class OpportunisticPolicy:
    """Memory-blind first fit of the user's GPU count on the fastest free type (see the module
    docstring)."""

    name: str = "opportunistic"
    round_s: float | None = None
    _sia: SiaPolicy = field(default_factory=lambda: SiaPolicy(), repr=False)  # its believed step times

    @staticmethod
    def request(job: JobInfo, types: Sequence[str], totals: dict[str, int]) -> tuple[int, list[str]] | None:
        """(count, types to try in order) after the OOM rule; None when nothing is left to try.
        The count never exceeds the job's width bound (``JobInfo.max_gpus``): doubling past it
        tries the bound itself once."""
        # (the user knows their recipe's precision: a GPU type that cannot run it is no option)
        totals = {t: c for t, c in totals.items() if t in job.profile.runnable_types}
        bound = job.max_gpus
        biggest = min(max(totals.values(), default=0), bound)
        if biggest < 1:
            return None
        # A request larger than any type's GPU count is cut to the largest power of two that
        # exists (the user would shrink it); otherwise the job could never run.
        n = min(job.requested_gpus, 1 << (biggest.bit_length() - 1))
        while n <= biggest:
            left = [t for t in types if (t, n) not in job.failed_configs and totals.get(t, 0) >= n
                    and t in job.profile.runnable_types]
            if left:
                return n, left
            n = bound if n < bound < 2 * n else 2 * n  # (the bound itself, once, if doubling passes it)
        return None

    def fastest_first(self, job: JobInfo, n: int, types: Sequence[str]) -> list[str]:
        """``types`` by the step time the user believes on n GPUs of each (the compute-only
        estimate Sia and Gavel believe, memory ignored), fastest first; unknown last, then
        cluster-file order. A user picks the fastest free GPUs, not the first in a file."""
        order = {t: k for k, t in enumerate(types)}
        believed = {t: self._sia.believed_step_time(job, t, n) for t in types}
        return sorted(types, key=lambda t: (believed[t] is None, believed[t] or 0.0, order[t]))

    def decide(self, view: SimView) -> list[Start | Stop]:
        cluster = view.cluster
        types = _type_order(view)
        totals = {t: sum(cluster.healthy_by_node(t).values()) for t in types}
        # free GPUs: type → [(node, [indices])] in node order, consumed as jobs are placed
        free = {t: [(name, [s.index for s in nf.slots]) for name, nf in cluster.free_by_node(t).items()]
                for t in types}  # fmt: skip
        # Free GPUs per type, and per type the first node that still has some: first fit empties
        # nodes from the front, so each decision walks every node at most once (it summed the
        # free lists per job: 70 ms a decision at 10,000 GPUs).
        count = {t: sum(len(ix) for _, ix in free[t]) for t in types}
        first = dict.fromkeys(types, 0)
        out: list[Start | Stop] = []
        for job in view.queue:  # FIFO; a job that does not fit is skipped (backfill)
            req = self.request(job, types, totals)
            if req is None:
                continue
            n, candidates = req
            for t in self.fastest_first(job, n, candidates):
                if count[t] < n:
                    continue
                picked: list[tuple[str, int]] = []
                nodes = free[t]
                k = first[t]
                while len(picked) < n:  # first fit, node by node
                    name, ix = nodes[k]
                    take = ix[: n - len(picked)]
                    picked.extend((name, i) for i in take)
                    del ix[: len(take)]
                    if not ix:
                        k += 1
                first[t] = k  # (every node before k is empty: the ones this fit emptied, or earlier)
                count[t] -= n
                out.append(Start(job.job_id, t, tuple(picked)))
                break
        return out


# Deterministic limits of every HiGHS solve (issue 32): a solve stops after this many
# branch-and-bound nodes (Sia's ILP) or simplex iterations (Gavel's LPs), counts that do not move
# with the machine's load, where a wall-clock limit (30 s before) made a cell depend on what else
# ran. Measured (``SolverStats``) on Pollux 5 and 6 / paper-64, 160 jobs, both truths: Sia's ILP
# took at most 1 branch-and-bound node and 308 simplex iterations per round, Gavel's LPs at most
# 60 iterations; the limits are far above that, so they bound a pathological round without
# changing an ordinary one (the 300-job Philly cells on 512 GPUs were not measured: issue 32).
# The wall-clock limit stays only as a last resort (SOLVER_SAFETY_S).
MIP_MAX_NODES = 20_000
SIMPLEX_ITERATION_LIMIT = 1_000_000
SOLVER_SAFETY_S = 3600.0


@dataclass
class SolverStats:
    """What the solves of one policy took: solves, those stopped by a limit, the most nodes and
    simplex iterations of one solve (deterministic: the same on any machine)."""

    solves: int = 0
    stopped: int = 0
    max_nodes: int = 0
    max_iterations: int = 0


# ----- Sia -----------------------------------------------------------------------------


@dataclass
class SiaPolicy:
    """Sia's round-based goodput ILP (SOSP'23 sec. 3), for rigid-batch LLM jobs.

    Terms, as the paper defines them:
    * configurations (sec. 3.2): per GPU type with R GPUs per node and N nodes, the counts
      1, 2, 4, ..., R on one node and 2R, 3R, ..., NR as whole nodes; capped at the job's
      max_ngpus (``max_scale`` x the user's request) and at counts its batch can split over.
    * goodput (sec. 3.1): throughput x statistical efficiency. Our jobs keep their global
      batch fixed, so statistical efficiency is 1 and goodput = steps/s, from the same
      step-time estimate a profiled Sia would learn (its bootstrap profiling, sec. 3.4).
      Memory-blind: for a configuration MARP finds no fitting layout for, Sia still believes
      the compute estimate until it has seen the job OOM there (then that count and every
      smaller count of that type are dropped for the job).
    * normalisation and fairness (sec. 3.3): each job's row G_i is divided by its minimum,
      then raised to the power p (default -0.5); with p < 0 the objective is minimised.
    * restart factor (sec. 3.3): r_i = (T_i - N_i S_i) / (T_i + S_i), T_i the job's age,
      N_i its restarts, S_i the seconds a restart costs; it multiplies the goodput of every
      configuration other than the job's current one.
    * ILP (sec. 3.3): min sum_ij A_ij G_ij^p + lambda sum_i (1 - ||A_i||_1), A binary, at
      most one configuration per job, per-type GPU capacity; lambda = 1.1.
    * rounds of 60 s (sec. 3); placement (sec. 3.5): a partial-node allocation stays on one
      node, whole-node allocations take whole free nodes. Where a chosen allocation cannot be
      placed we leave the job for the next round (Sia evicts and retries).
    Simplifications (generous to Sia): no 2x-per-round scale-up limit, no profiling cost.
    """

    name: str = "sia"
    round_s: float | None = 60.0
    p: float = -0.5
    lam: float = 1.1
    restart_s: float = 120.0
    max_scale: float = 2
    time_limit_s: float = SOLVER_SAFETY_S  # a last resort; the solve's limits are MIP_MAX_NODES etc.
    stats: SolverStats = field(default_factory=SolverStats, repr=False)
    # True: Sia given MARP's memory truth (only configurations that fit): an upper bound for a
    # Sia whose profiling caught every OOM for free, to separate "avoids OOMs" from the rest.
    memory_aware: bool = False
    _est: dict[tuple[int, str, int], float | None] = field(default_factory=dict, repr=False)
    last_ilp: tuple[int, int] = (0, 0)  # (variables, constraints) of the last solve

    def believed_step_time(self, job: JobInfo, t: str, n: int) -> float | None:
        """What Sia believes a step takes on (t, n): MARP's estimate, memory ignored."""
        known = job.profile.configs.get((t, n))
        if known is not None:
            return known
        key = (id(job.profile), t, n)
        if key not in self._est:
            self._est[key] = self._compute_only(job.profile, t, n)
        return self._est[key]

    @staticmethod
    def _compute_only(profile: JobProfile, t: str, n: int) -> float | None:
        """The step time on (t, n) from compute alone (memory ignored); None where the job
        cannot run at all: a GPU type without the recipe's precision (a V100 has no bf16:
        MARP refuses the pairing, it is not "zero speed") or a batch that does not split."""
        if not profile.plans or t not in profile.runnable_types:
            return None
        ref = profile.plans[0]
        model = marp.get_model(profile.model)
        gb = ref.layout.samples_per_step
        if gb % n:
            return None  # the global batch does not split over n replicas
        seq = int(round(ref.tokens_per_s * ref.step_time_s / gb))
        recipe = marp.TrainingRecipe(seq_len=seq, global_batch=gb)
        layout = marp.Layout(
            tp=1, pp=1, dp=n, zero_stage=1 if n > 1 else 0, micro_batch=1, grad_accum=gb // n
        )
        step = marp.estimate_step_time(model, recipe, layout, marp.get_gpu(t))
        return step if math.isfinite(step) and step > 0 else None

    def configs(
        self, view: SimView, job: JobInfo, shape: dict[str, tuple[int, int]]
    ) -> list[tuple[str, int]]:
        # max_ngpus: the user's request x max_scale; after OOMs the user asks for twice the
        # largest count that failed (the same rule as opportunistic), or the job could never run.
        worst = max((n for _, n in job.failed_configs), default=0)
        # (memory-aware: at least the smallest count MARP says fits, as Hadar's rule, so a request
        # below it -- never in a mapped trace, whose request fits the reference GPU -- can run)
        fits_from = min((n for _, n in job.profile.configs), default=1) if self.memory_aware else 1
        cap = min(max(1, job.requested_gpus * self.max_scale, 2 * worst, fits_from), job.max_gpus)
        out = []
        for t, (per_node, nodes) in shape.items():
            counts = [c for c in (1 << k for k in range(8)) if c <= per_node]
            counts += [per_node * m for m in range(2, nodes + 1)]
            dead = max((n for (ft, n) in job.failed_configs if ft == t), default=0)
            for c in counts:
                if self.memory_aware and (t, c) not in job.profile.configs:
                    continue
                if c <= cap and c > dead and self.believed_step_time(job, t, c) is not None:
                    out.append((t, c))
        return out

    def decide(self, view: SimView) -> list[Start | Stop]:
        highspy: Any = require("highspy")

        shape, capacity = _shape_and_capacity(view)
        jobs = list(view.running) + list(view.queue)
        cols: list[tuple[int, str, int, float]] = []  # (job row, type, count, cost)
        for i, job in enumerate(jobs):
            cfgs = self.configs(view, job, shape)
            if not cfgs:
                continue
            goodput = np.array([1.0 / self.believed_step_time(job, t, c) for t, c in cfgs])  # type: ignore[operator]
            if job.config is not None:
                age = max(view.now - job.submitted_at, 1e-9)
                r = (age - job.restarts * self.restart_s) / (age + self.restart_s)
                r = min(1.0, max(r, 1e-3))
                goodput = np.where([cfg != job.config for cfg in cfgs], goodput * r, goodput)
            norm = goodput / goodput.min()
            cost = norm**self.p
            if not np.all(np.isfinite(cost)):  # a NaN column would be "optimal" to the solver
                raise SimError(f"{self.name}: non-finite score for {job.job_id} on {cfgs}")
            if job.config is not None:
                # Ties keep the current allocation (what the restart factor intends); without
                # this, identical jobs could swap every round and never make progress.
                cost = cost - np.where([cfg == job.config for cfg in cfgs], 1e-3, 0.0)
            for (t, c), g in zip(cfgs, cost, strict=True):
                cols.append((i, t, c, float(g)))
        if not cols:
            return []
        types = sorted(capacity)
        trow = {t: len(jobs) + k for k, t in enumerate(types)}
        ncol = len(cols)
        lp = highspy.HighsLp()
        lp.num_col_ = ncol
        lp.num_row_ = len(jobs) + len(types)
        # min sum A (G^p - lambda): the constant lambda * jobs is dropped.
        lp.col_cost_ = np.array([c[3] - self.lam for c in cols])
        lp.col_lower_ = np.zeros(ncol)
        lp.col_upper_ = np.ones(ncol)
        lp.row_lower_ = np.full(lp.num_row_, -highspy.kHighsInf)
        lp.row_upper_ = np.array([1.0] * len(jobs) + [float(capacity[t]) for t in types])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.arange(0, 2 * ncol + 1, 2, dtype=np.int32)
        index = np.empty(2 * ncol, dtype=np.int32)
        value = np.empty(2 * ncol)
        for k, (i, t, c, _) in enumerate(cols):
            index[2 * k], value[2 * k] = i, 1.0
            index[2 * k + 1], value[2 * k + 1] = trow[t], float(c)
        lp.a_matrix_.index_ = index
        lp.a_matrix_.value_ = value
        lp.integrality_ = [highspy.HighsVarType.kInteger] * ncol
        x = _solve(lp, self.time_limit_s, self.stats)
        self.last_ilp = (ncol, lp.num_row_)
        chosen: dict[str, tuple[str, int]] = {}
        for k, (i, t, c, _) in enumerate(cols):
            if x[k] > 0.5:
                chosen[jobs[i].job_id] = (t, c)
        return _place_round(view, chosen)


def _solve(lp: object, time_limit_s: float = SOLVER_SAFETY_S, stats: SolverStats | None = None) -> list[float]:
    """Solve a ``highspy.HighsLp`` quietly on one thread under the deterministic limits above;
    its column values (all 0 when a limit stopped it before any feasible point: nothing
    allocated this round)."""
    highspy: Any = require("highspy")

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("mip_max_nodes", MIP_MAX_NODES)
    h.setOptionValue("simplex_iteration_limit", SIMPLEX_ITERATION_LIMIT)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.passModel(lp)
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    if stats is not None:
        stats.solves += 1
        stats.stopped += status != highspy.HighsModelStatus.kOptimal
        stats.max_nodes = max(stats.max_nodes, int(info.mip_node_count))
        stats.max_iterations = max(stats.max_iterations, int(info.simplex_iteration_count))
    values = list(h.getSolution().col_value)
    if info.primal_solution_status != 2 or len(values) != lp.num_col_:  # type: ignore[attr-defined]
        return [0.0] * lp.num_col_  # type: ignore[attr-defined]
    return values


def _place_round(view: SimView, chosen: dict[str, tuple[str, int]]) -> list[Start | Stop]:
    """A round-based policy's allocation (job → (GPU type, count)) as actions: running jobs
    whose allocation changed or was dropped stop; the others keep their GPUs; new allocations,
    largest first, take whole free nodes (a count of at least a node's size) or the fullest
    node with room (Sia sec. 3.5). An allocation that cannot be placed waits for the next round."""
    out: list[Start | Stop] = []
    cluster = view.cluster
    free: dict[str, dict[str, list[int]]] = {}  # type → node → free indices
    for t in _type_order(view):
        free[t] = {name: [s.index for s in nf.slots] for name, nf in cluster.free_by_node(t).items()}
    for job in view.running:
        if chosen.get(job.job_id) != job.config:
            out.append(Stop(job.job_id))  # reallocated or dropped this round
            for node, idx in job.gpus:
                free[job.gpu_type].setdefault(node, []).append(idx)  # type: ignore[index]
    keep = {j.job_id for j in view.running if chosen.get(j.job_id) == j.config}
    new = [(jid, cfg) for jid, cfg in chosen.items() if jid not in keep]
    new.sort(key=lambda x: (-x[1][1], x[0]))  # big allocations first: they need whole nodes
    per_node = {
        t: max(view.cluster.healthy_by_node(t).values()) for t in free if view.cluster.healthy_by_node(t)
    }
    for job_id, (t, c) in new:
        nodes = free.get(t, {})
        gpus: list[tuple[str, int]] = []
        if c >= per_node[t]:
            whole = [n for n, ix in sorted(nodes.items()) if len(ix) == per_node[t]]
            k = c // per_node[t]
            if len(whole) >= k and c % per_node[t] == 0:
                for n in whole[:k]:
                    gpus += [(n, i) for i in sorted(nodes[n])]
                    nodes[n] = []
        else:
            fits = [(len(ix), n) for n, ix in nodes.items() if len(ix) >= c]
            if fits:
                _, n = min(fits)  # best fit: the fullest node that still has room
                take = sorted(nodes[n])[:c]
                gpus = [(n, i) for i in take]
                nodes[n] = [i for i in nodes[n] if i not in take]
        if len(gpus) == c:
            out.append(Start(job_id, t, tuple(gpus)))
    return out


# ----- Gavel ---------------------------------------------------------------------------


@dataclass
class GavelPolicy:
    """Gavel's heterogeneity-aware Least Attained Service — max-min fairness — with its
    round-based mechanism (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies
    for Deep Learning Workloads", OSDI'20; section numbers below refer to it), memory-blind.

    * Throughputs (sec. 3.1): T[m, j] = steps/s of job m on GPU type j at its scale factor
      n_m — the user's requested GPU count (after OOMs the same rule as ``opportunistic``:
      the next type at n, then 2n) — from the compute-only step time Sia believes
      (``SiaPolicy.believed_step_time``, memory ignored); 0 where the job already OOMed.
    * Allocation (sec. 3.1): X[m, j], the fraction of time job m should spend on type j;
      X >= 0, sum_j X[m, j] <= 1, sum_m n_m X[m, j] <= GPUs of type j.
    * Max-min fairness (sec. 4.1): maximise min_m (n_m / T_iso[m]) sum_j T[m, j] X[m, j], where
      T_iso[m] = sum_j T[m, j] X_iso[m, j] and X_iso solves the same problem with every
      throughput 1 (the heterogeneity-agnostic share each job would get); equal priority
      weights. Two LPs per round, solved with HiGHS.
    * Rounds (sec. 5): every ``round_s`` (360 s, the round Sia's comparison gave Gavel), jobs
      get GPUs in decreasing priority X[m, j] / (fraction of its rounds so far spent on type
      j) — a job never served on j comes first — each job at most once, while the type has
      n_m GPUs left; placement as Sia's (``_place_round``). A running job allocated the same
      type again keeps its GPUs; one not allocated this round is stopped (checkpointed), and
      pays the simulator's restart cost when it runs again.
    Simplifications: no space sharing (job pairs on one GPU), no priority weights, no
    throughput estimation: the believed step times are known from the start (generous).

    ``objective="minjct"`` (``gavel-minjct``): Gavel expresses each policy as an objective over
    the effective throughput sum_j T[m, j] X[m, j] (sec. 3.1, 4.2); its FIFO objective weights
    job m's normalised throughput by its arrival rank. The completion-time objective here weights
    it by 1 / the job's remaining time instead (Smith's rule, the LP relaxation of minimum total
    completion time): maximise sum_m sum_j T[m, j] X[m, j] / steps_left[m] -- each job's share of
    its remaining work done per second -- under the same constraints and the same rounds. (Gavel's
    artifact ships a min-JCT policy, AlloX, for single-GPU jobs only; this is our generalisation
    to scale factors, not the paper's formula.)
    """

    name: str = "gavel"
    round_s: float | None = 360.0
    restart_s: float = 120.0  # what a restart costs (the simulator's), for the amortisation guard
    time_limit_s: float = SOLVER_SAFETY_S  # a last resort; the solve's limits are SIMPLEX_ITERATION_LIMIT etc.
    stats: SolverStats = field(default_factory=SolverStats, repr=False)
    # True: Gavel given MARP's memory knowledge -- a job is never placed on a (type, count) MARP
    # says does not fit; at the requested count with no fitting type it asks for 2x (gavel-memaware)
    memory_aware: bool = False
    # "maxmin": sec. 4.1's max-min fairness (LAS); "minjct": a completion-time objective (below)
    objective: str = "maxmin"
    _sia: SiaPolicy = field(default_factory=SiaPolicy, repr=False)  # its believed step times
    _rounds: dict[str, int] = field(default_factory=dict, repr=False)  # job → rounds it was active
    _served: dict[str, dict[str, int]] = field(default_factory=dict, repr=False)  # job → type → rounds run
    last_lp: tuple[int, int] = (0, 0)  # (variables, constraints) of the last fairness LP

    def decide(self, view: SimView) -> list[Start | Stop]:
        cluster = view.cluster
        types = _type_order(view)
        capacity = {t: sum(cluster.healthy_by_node(t).values()) for t in types}
        per_node = {t: max(cluster.healthy_by_node(t).values(), default=0) for t in types}
        jobs = list(view.running) + list(view.queue)
        pairs: list[tuple[int, str, int, float]] = []  # (job row, type, GPUs, steps/s)
        for i, job in enumerate(jobs):
            if job.config is not None and job.config not in job.failed_configs:
                n, allowed = job.config[1], [t for t in types if (t, job.config[1]) not in job.failed_configs]
            else:
                req = self.request(job, types, capacity, per_node)
                if req is None:
                    continue
                n, allowed = req
            if self.memory_aware:
                allowed = [t for t in allowed if (t, n) in job.profile.configs]
            for t in allowed:
                if capacity.get(t, 0) < n:
                    continue
                step = self._sia.believed_step_time(job, t, n)
                if step is not None and step > 0:
                    pairs.append((i, t, n, 1.0 / step))
        chosen: dict[str, tuple[str, int]] = {}
        if pairs:
            if self.objective == "minjct":
                # Smith's rule over the effective throughput: sum T X / steps_left, one LP
                weighted = [(i, t, n, thr / max(jobs[i].steps_left, 1e-9)) for i, t, n, thr in pairs]
                # scaled so the largest weight is 1 (Smith's rule is scale-free; raw weights,
                # steps/s per step left, are ~1e-5 and the solver is happier near 1)
                top = max(c for _, _, _, c in weighted)
                weighted = [(i, t, n, c / top) for i, t, n, c in weighted]
                _, alloc = self._lp(weighted, capacity, 0.0)
            else:
                iso = self._fair([(i, t, n, 1.0) for i, t, n, _ in pairs], capacity)
                t_iso = [0.0] * len(jobs)
                for (i, _, _, thr), x in zip(pairs, iso, strict=True):
                    t_iso[i] += thr * x
                weighted = [(i, t, n, thr * n / t_iso[i] if t_iso[i] > 0 else 0.0) for i, t, n, thr in pairs]
                alloc = self._fair(weighted, capacity)
            ranked = []
            for (i, t, n, _), x in zip(pairs, alloc, strict=True):
                job = jobs[i]
                amortising = self._amortising(job, view.now) and job.config == (t, n)
                if x <= 1e-6 and not amortising:
                    continue
                rounds = self._rounds.get(job.job_id, 0)
                served = self._served.get(job.job_id, {}).get(t, 0)
                share = served / rounds if rounds else 0.0
                priority = x / share if share > 0 else math.inf
                if amortising:
                    priority = 1e300  # kept before anything else (inf is a never-served job)
                # (x rounded: an LP's equal shares may differ in the last digits; ties go by seq)
                ranked.append((-priority, -round(x, 6), job.seq, job.job_id, t, n))
            ranked.sort()
            left = dict(capacity)
            for _, _, _, job_id, t, n in ranked:
                if job_id not in chosen and left[t] >= n:
                    chosen[job_id] = (t, n)
                    left[t] -= n
        actions = _place_round(view, chosen)
        # The round's bookkeeping (Gavel tracks the time each job received per type): a job was
        # served on a type when it runs there this round — kept, or started (an allocation
        # that could not be placed was not).
        stopped = {a.job_id for a in actions if isinstance(a, Stop)}
        ran = {j.job_id: j.config[0] for j in view.running if j.config is not None and j.job_id not in stopped}
        ran.update((a.job_id, a.gpu_type) for a in actions if isinstance(a, Start))
        for job in jobs:
            self._rounds[job.job_id] = self._rounds.get(job.job_id, 0) + 1
            t = ran.get(job.job_id)
            if t is not None:
                per = self._served.setdefault(job.job_id, {})
                per[t] = per.get(t, 0) + 1
        if len(self._rounds) > 2 * len(jobs) + 64:  # forget jobs that ended, now and then
            active = {j.job_id for j in jobs}
            self._rounds = {k: v for k, v in self._rounds.items() if k in active}
            self._served = {k: v for k, v in self._served.items() if k in active}
        return actions

    def _amortising(self, job: JobInfo, now: float) -> bool:
        """Has a running job not yet run as long as the restart it paid? Then it keeps its GPUs
        this round. Our guard, not Gavel's: with a round no longer than the restart cost,
        rotating every round would give jobs no progress at all (a livelock); with Gavel's 360 s
        rounds and our 120 s restarts it never fires (jobs start at round boundaries)."""
        if job.started_at is None or not job.restarts:
            return False
        return now - job.started_at < 2 * self.restart_s

    def request(
        self, job: JobInfo, types: Sequence[str], capacity: dict[str, int], per_node: dict[str, int] | None = None
    ) -> tuple[int, list[str]] | None:
        """(GPU count, types) for a job not running: opportunistic's OOM rule; memory-aware, the
        smallest count at or above the request at which MARP says some type fits, among the
        counts a round can place (a power of two within a node, or whole nodes)."""
        if not self.memory_aware:
            return OpportunisticPolicy.request(job, types, capacity)
        per = per_node or {}

        def placeable(t: str, n: int) -> bool:
            r = per.get(t, 0)
            return r > 0 and capacity.get(t, 0) >= n and ((n <= r and n & (n - 1) == 0) or n % r == 0)

        fits = sorted({n for (t, n) in job.profile.configs
                       if placeable(t, n) and (t, n) not in job.failed_configs and n <= job.max_gpus})  # fmt: skip
        if not fits:
            # every configuration MARP says fits has OOMed (its prediction was short): fall
            # back to the memory-blind rule -- the next type, then twice the GPUs
            return OpportunisticPolicy.request(job, types, capacity)
        # the smallest count at or above the request where MARP says a type fits (else the largest)
        n = next((c for c in fits if c >= job.requested_gpus), fits[-1])
        return n, [t for t in types if (t, n) in job.profile.configs and placeable(t, n) and (t, n) not in job.failed_configs]

    def _fair(self, pairs: list[tuple[int, str, int, float]], capacity: dict[str, int]) -> list[float]:
        """The max-min fair X for ``pairs`` = (m, j, n_m, c[m, j]) — maximise min_m sum_j
        c[m, j] X[m, j] — made Pareto-efficient: any X at the max-min level is optimal, and an
        LP solver may return one that splits a job across types for no gain (moving a job
        every round). So a second LP, as Gavel's water-filling variant intends (simplified to
        one step): maximise sum c X with every job kept at the max-min level or above."""
        z, _ = self._lp(pairs, capacity, None)
        _, x = self._lp(pairs, capacity, z * (1.0 - 1e-6))
        return x

    def _lp(
        self, pairs: list[tuple[int, str, int, float]], capacity: dict[str, int], floor: float | None
    ) -> tuple[float, list[float]]:
        """Subject to sum_j X[m, j] <= 1, sum_m n_m X[m, j] <= capacity[j], 0 <= X <= 1: with
        ``floor`` None, maximise z <= sum_j c[m, j] X[m, j] for every job m; else maximise
        sum c X with sum_j c[m, j] X[m, j] >= floor for every job. -> (objective, X per pair)."""
        highspy: Any = require("highspy")

        jobs = sorted({i for i, _, _, _ in pairs})
        fair = {i: k for k, i in enumerate(jobs)}  # the row of job i's (weighted) throughput
        share = {i: len(jobs) + k for k, i in enumerate(jobs)}  # its sum-of-shares row
        types = sorted({t for _, t, _, _ in pairs})
        cap_row = {t: 2 * len(jobs) + k for k, t in enumerate(types)}
        nrow = 2 * len(jobs) + len(types)
        ncol = len(pairs) + (1 if floor is None else 0)  # X per pair (then z)
        starts, index, value = [0], [], []
        for i, t, n, c in pairs:
            index += [fair[i], share[i], cap_row[t]]
            value += [-c, 1.0, float(n)]
            starts.append(len(index))
        if floor is None:  # z - sum c X <= 0
            index += [fair[i] for i in jobs]
            value += [1.0] * len(jobs)
            starts.append(len(index))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = ncol, nrow
        if floor is None:
            lp.col_cost_ = np.array([0.0] * len(pairs) + [-1.0])  # maximise z
            lp.col_upper_ = np.array([1.0] * len(pairs) + [highspy.kHighsInf])
            fair_upper = [0.0] * len(jobs)
        else:
            lp.col_cost_ = np.array([-c for _, _, _, c in pairs])  # maximise sum c X
            lp.col_upper_ = np.ones(ncol)
            fair_upper = [-floor] * len(jobs)  # -sum c X <= -floor
        lp.col_lower_ = np.zeros(ncol)
        lp.row_lower_ = np.full(nrow, -highspy.kHighsInf)
        lp.row_upper_ = np.array(fair_upper + [1.0] * len(jobs) + [float(capacity[t]) for t in types])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value)
        sol = _solve(lp, self.time_limit_s, self.stats)
        self.last_lp = (ncol, nrow)
        x = [min(1.0, max(0.0, float(v))) for v in sol[: len(pairs)]]
        return (float(sol[-1]) if floor is None else sum(c * v for (_, _, _, c), v in zip(pairs, x, strict=True))), x


# ----- Hadar ---------------------------------------------------------------------------


@dataclass
class HadarPolicy:
    """Hadar (Sultana et al., "Resource Heterogeneity-Aware and Utilization-Enhanced Scheduling for
    Deep Learning Clusters", arXiv 2503.10918, 2025), built from the paper's description: a
    task-level heterogeneity-aware scheduler that decides, round by round, which jobs run on which
    GPU types, by an online primal-dual optimisation over each job's throughput on each type.

    What we take from the paper: rounds (the temporal dimension; preemption between rounds),
    per-job throughputs per GPU type from profiling, an online primal-dual framework in which each
    GPU type has a price that rises with its allocation in the round, and a dual subroutine that
    gives each job the allocation maximising its utility minus the price of the GPUs it takes
    (admitted only when positive). What we had to assume (docs/simulator.md, "Hadar"):

    * utility of a configuration c = (type, n): round_s / the job's estimated JCT on c -- a
      decreasing function of the completion time, as in the primal-dual schedulers Hadar builds
      on -- with the estimated JCT = time since submission + restart (when c differs from where
      it runs) + steps_left x step time; so short jobs are worth more per GPU when GPUs are dear.
      (A utility normalised per job, best JCT / JCT on c, did worse: 1.29 h vs 0.66 h avg JCT on
      Pollux workload 6, paper-64, seed 0: every job was worth the same, so the first arrivals took
      their widest configurations);
    * prices per GPU: p_t(y) = L (U / L)^(y / C_t), y the GPUs of type t given out this round,
      C_t the type's healthy GPUs, U the largest utility per GPU of any job's configuration this
      round and L a quarter of the smallest (the exponential price of the primal-dual framework
      Hadar builds on, Bao et al., INFOCOM'18); a configuration costs n x p_t(y + n / 2);
    * jobs are offered the round's GPUs in arrival order (an online algorithm's order);
    * task level collapses to one type per job: our LLM jobs run TP/PP layouts, and a synchronous
      job split over types runs at its slowest type's pace, so a mix never beats one type;
    * memory: Hadar profiles each job, so it knows which (type, n) run -- MARP's fit (like
      sia-memaware); counts as Sia's (1, 2, 4, ... per node, whole nodes), up to max_scale x the
      request (more where nothing smaller fits); 360 s rounds as Gavel (the paper compares with
      Gavel's round-based simulator); no job forking (that is HadarE).
    """

    name: str = "hadar-approx"
    round_s: float | None = 360.0
    restart_s: float = 120.0
    max_scale: float = 2

    def configs(self, job: JobInfo, shape: dict[str, tuple[int, int]]) -> list[tuple[str, int, float]]:
        """(type, n, predicted step s) Hadar may give the job: fitting, not failed, within scale."""
        out = []
        for (t, n), step in job.profile.configs.items():
            if t in shape and n <= shape[t][0] * shape[t][1] and (t, n) not in job.failed_configs:
                per, _ = shape[t]
                if n <= per and n & (n - 1) == 0 or n % per == 0:
                    out.append((t, n, step))
        if not out:
            return []
        smallest = min(n for _, n, _ in out)
        cap = min(max(job.requested_gpus * self.max_scale, smallest), job.max_gpus)
        return [c for c in out if c[1] <= cap]

    def decide(self, view: SimView) -> list[Start | Stop]:
        shape, capacity = _shape_and_capacity(view)
        jobs = sorted(list(view.running) + list(view.queue), key=lambda j: j.seq)
        offers: list[tuple[JobInfo, list[tuple[str, int, float]]]] = []
        density: list[float] = []
        for job in jobs:
            cfgs = self.configs(job, shape)
            if not cfgs:
                continue
            age = view.now - job.submitted_at
            est = []
            for t, n, step in cfgs:
                switch = self.restart_s if (job.config is not None and job.config != (t, n)) or (
                    job.config is None and job.restarts) else 0.0
                est.append(age + switch + job.steps_left * step)
            utility = [(t, n, self.round_s / max(e, 1.0)) for (t, n, _), e in zip(cfgs, est, strict=True)]
            offers.append((job, utility))
            density += [u / n for _, n, u in utility]
        if not offers:
            return []
        upper = max(density)
        lower = min(density) / 4.0
        used = dict.fromkeys(capacity, 0)
        chosen: dict[str, tuple[str, int]] = {}
        for job, utility in offers:
            pick, gain = None, 0.0
            for t, n, u in utility:
                if used[t] + n > capacity[t]:
                    continue
                price = lower * (upper / lower) ** ((used[t] + n / 2) / capacity[t])
                payoff = u - n * price + (1e-6 if job.config == (t, n) else 0.0)  # ties keep a job where it is
                if payoff > gain:
                    pick, gain = (t, n), payoff
            if pick is not None:
                chosen[job.job_id] = pick
                used[pick[0]] += pick[1]
        return _place_round(view, chosen)


__all__ = [
    "MIP_MAX_NODES",
    "SIMPLEX_ITERATION_LIMIT",
    "SOLVER_SAFETY_S",
    "GavelPolicy",
    "HadarPolicy",
    "OpportunisticPolicy",
    "SiaPolicy",
    "SolverStats",
]
