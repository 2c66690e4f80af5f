"""What MARP says about each job of a trace on the simulated cluster, computed once and kept.

A ``JobProfile`` holds MARP's ranked plans for one (model, recipe) on the cluster's GPU types
(what HAS sees, with and without mixed plans) and the simulator's "can run there, how fast" per
(GPU type, count); a ``ProfileBook`` caches them per (model, seq_len, global_batch), re-plans with
a larger safety margin after an OOM, and gives the layouts a memory-blind framework would try.
The engine (``has.sim.engine``) and the baselines read them; no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import marp
from has.cluster_spec import ClusterSpec
from has.sim.errors import SimError
from has.sim.traces import TraceJob


@dataclass(frozen=True)
class JobProfile:
    """What MARP says about one (model, recipe) on this cluster's GPU types.

    plans: MARP's ranked plans (predictor defaults: 5 % safety margin) — what HAS sees.
    configs: (gpu_type, n) → seconds per step of the fastest layout that fits the GPU's
      whole memory — the simulator's truth of "can run there" and "how fast".
    """

    model: str
    plans: tuple[marp.Plan, ...]
    configs: dict[tuple[str, int], float]
    # The cluster's GPU types whose tensor cores run the recipe's precision (no bf16 on a V100
    # or T4): on the others the job is infeasible -- never "zero speed" -- for every policy.
    runnable_types: frozenset[str] = frozenset()
    recipe: marp.TrainingRecipe | None = None
    # (gpu_type, n) -> the plan behind ``configs``' step time (its layout: what the independent
    # truth times, ``has.sim.truth_independent``)
    truth_plans: dict[tuple[str, int], marp.Plan] = field(default_factory=dict)
    # MARP's ranked plans with mixed plans beside the single-type ones (``enumerate_plans(...,
    # mixed=True)``, what the live scheduler's predictor answers on a cluster of several types;
    # docs/mixed-plans.md): what a HAS policy that places mixed plans sees. The single-type
    # ``plans`` on a cluster of one type.
    mixed_plans: tuple[marp.Plan, ...] = ()

    def ranked(self, mixed: bool) -> tuple[marp.Plan, ...]:
        """The plans a policy sees: with mixed plans (``mixed_plans``) or single-type only."""
        return self.mixed_plans if mixed else self.plans

    @property
    def runs_only_mixed(self) -> bool:
        """No single-type layout fits, but a mixed plan does (the job can run only over types)."""
        return not self.configs and any(p.mixed is not None for p in self.mixed_plans)


class ProfileBook:
    """Caches one ``JobProfile`` per (model, seq_len, global_batch) for a cluster, and the
    fastest layout per (job, type, count) that fits when the true peak is larger than MARP's
    prediction (``fastest_fitting``)."""

    def __init__(self, spec: ClusterSpec) -> None:
        per_type: dict[str, list[int]] = {}
        for g in spec.groups:
            try:
                name = marp.get_gpu(g.gpu).name
            except marp.MarpError as exc:
                raise SimError(f"cluster: unknown GPU type {g.gpu!r} (see `frenzy gpus`)") from exc
            per_type.setdefault(name, [0, 0])
            per_type[name][0] += g.count * g.gpus_per_node
            per_type[name][1] = max(per_type[name][1], g.gpus_per_node)
        self.pools = [marp.GpuPool(t, n, per) for t, (n, per) in sorted(per_type.items())]
        self._cache: dict[tuple[str, int, int], JobProfile] = {}
        self._fits: dict[tuple[str, int, int, str, float], dict[int, float]] = {}
        self._replans: dict[tuple[str, int, int, str, float], tuple[marp.Plan, ...]] = {}
        self._ladder: dict[tuple[str, int, int, str, float], dict[int, marp.Plan]] = {}
        self.memory = {p.gpu_type: marp.get_gpu(p.gpu_type).memory_bytes for p in self.pools}

    def get(self, job: TraceJob) -> JobProfile:
        key = (job.model, job.seq_len, job.global_batch)
        prof = self._cache.get(key)
        if prof is None:
            model = marp.get_model(job.model)
            recipe = job.recipe()
            ranked = marp.enumerate_plans(model, recipe, self.pools)
            truth = marp.enumerate_plans(model, recipe, self.pools, safety_margin=0.0, max_plans=None)
            configs = {(p.gpu_type, p.num_gpus): p.step_time_s for p in truth.plans}
            runnable = frozenset(p.gpu_type for p in self.pools if marp.get_gpu(p.gpu_type).supports(recipe.precision))
            by_config = {(p.gpu_type, p.num_gpus): p for p in truth.plans}
            mixed = tuple(ranked.plans)
            if len(self.pools) > 1:
                mixed = tuple(marp.enumerate_plans(model, recipe, self.pools, mixed=True).plans)
            prof = JobProfile(job.model, tuple(ranked.plans), configs, runnable, recipe, by_config, mixed)
            self._cache[key] = prof
        return prof

    def replan(self, job: TraceJob, safety_margin: float, mixed: bool = False) -> tuple[marp.Plan, ...]:
        """MARP's ranked plans for ``job`` on this cluster with ``safety_margin`` (cached), with
        mixed plans too when ``mixed`` (and the cluster has several types)."""
        margin = round(min(max(safety_margin, 0.0), 0.99), 6)
        mixed = mixed and len(self.pools) > 1
        key = (job.model, job.seq_len, job.global_batch, "*+" if mixed else "*", margin)
        hit = self._replans.get(key)
        if hit is None:
            hit = self._replans[key] = tuple(
                marp.enumerate_plans(marp.get_model(job.model), job.recipe(), self.pools, safety_margin=margin,
                                     mixed=mixed).plans  # fmt: skip
            )
        return hit

    def fastest_fitting(self, job: TraceJob, gpu_type: str, n: int, mem_factor: float) -> float | None:
        """Predicted seconds per step of the fastest layout on ``n`` GPUs of ``gpu_type`` whose
        *true* peak (MARP's prediction x ``mem_factor``) fits the GPU's memory; None if none does.

        A true peak of predicted x f fits memory M iff predicted <= M / f, i.e. MARP's own fit
        test with a safety margin of 1 - 1/f: exact for f >= 1. For f < 1 the layouts MARP
        predicts just above M (which would fit in truth) are not enumerated (MARP takes no
        negative margin), so this errs against the memory-blind policies that use it."""
        prof = self.get(job)
        if mem_factor <= 1.0:
            return prof.configs.get((gpu_type, n))
        margin = round(1.0 - 1.0 / mem_factor, 6)
        if margin >= 1.0:
            return None
        key = (job.model, job.seq_len, job.global_batch, gpu_type, margin)
        fits = self._fits.get(key)
        if fits is None:
            pool = [p for p in self.pools if p.gpu_type == gpu_type]
            plans = marp.enumerate_plans(marp.get_model(job.model), job.recipe(), pool,
                                         safety_margin=margin, max_plans=None).plans  # fmt: skip
            fits = self._fits[key] = {p.num_gpus: p.step_time_s for p in plans}
        return fits.get(n)

    # The safety margins whose best layout per count make a memory-blind start's candidates under
    # the independent truth: each margin's best layout at a count needs less memory than the last.
    LADDER_MARGINS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)

    def ladder(self, job: TraceJob, gpu_type: str, n: int) -> tuple[marp.Plan, ...]:
        """The layouts a memory-blind user's framework may try on ``n`` GPUs of ``gpu_type``: MARP's
        best layout at that count under each of ``LADDER_MARGINS`` (distinct layouts, the
        largest predicted peak first). Under the independent truth every layout has its own
        memory error, so a start runs the fastest of these that truly fits."""
        out: dict[marp.Layout, marp.Plan] = {}
        for margin in self.LADDER_MARGINS:
            key = (job.model, job.seq_len, job.global_batch, gpu_type, margin)
            fits = self._ladder.get(key)
            if fits is None:
                pool = [p for p in self.pools if p.gpu_type == gpu_type]
                plans = marp.enumerate_plans(marp.get_model(job.model), job.recipe(), pool,
                                             safety_margin=margin, max_plans=None).plans  # fmt: skip
                fits = self._ladder[key] = {p.num_gpus: p for p in plans}
            plan = fits.get(n)
            if plan is not None:
                out.setdefault(plan.layout, plan)
        return tuple(out.values())
