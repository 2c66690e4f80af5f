"""Resource plans: enumerate every valid layout per GPU type, keep those that fit, rank them.

This is what the predictor service returns to the scheduler. For each GPU pool
the candidate layouts form a small grid (tp x micro-batch x dp x ZeRO stage x
recompute); ``memory_grid`` evaluates it in one vectorised pass, layouts above
the usable memory (total x (1 - safety margin)) are dropped, the rest get a
step-time estimate, and the best layout per (GPU type, GPU count) becomes a
plan. Plans are ranked by GPU-hours (cost), then fewer GPUs, then faster steps.
A GPU type with no fitting layout gets a one-line, numeric rejection reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from marp._check import check_int
from marp.errors import MarpError
from marp.gpus import GiB, GpuType, get_gpu, list_gpus
from marp.memory import FIELDS, MemoryBreakdown, check_seq_len, memory_grid
from marp.models import ModelSpec
from marp.perf import DEFAULT_INTER_NODE_GBPS, DEFAULT_MFU, step_time_grid
from marp.recipe import Layout, TrainingRecipe

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_MAX_GPUS = 64
MICRO_BATCH_CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class GpuPool:
    """``total_gpus`` GPUs of one type, ``gpus_per_node`` per node (TP groups stay inside a node)."""

    gpu_type: str
    total_gpus: int
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_type", get_gpu(self.gpu_type).name)  # canonical name
        check_int(self.total_gpus, "pools.total_gpus", MarpError)
        check_int(self.gpus_per_node, "pools.gpus_per_node", MarpError)


@dataclass(frozen=True)
class Plan:
    """One ranked way to run the job: a GPU type, a layout, its memory and its cost."""

    gpu_type: str
    layout: Layout
    memory: MemoryBreakdown
    step_time_s: float
    tokens_per_s: float
    gpu_hours: float
    headroom_bytes: int
    rank: int

    @property
    def num_gpus(self) -> int:
        return self.layout.num_gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "gpu_type": self.gpu_type, "num_gpus": self.num_gpus,
            "layout": self.layout.to_dict(), "memory": self.memory.to_dict(),
            "step_time_s": float(self.step_time_s), "tokens_per_s": float(self.tokens_per_s),
            "gpu_hours": float(self.gpu_hours), "headroom_bytes": int(self.headroom_bytes),
        }  # fmt: skip


@dataclass
class PlanSet:
    """Ranked plans (best first) and one line per GPU type that could not hold the job."""

    plans: list[Plan] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    def to_dict(self) -> dict[str, Any]:
        return {"plans": [p.to_dict() for p in self.plans], "rejected": list(self.rejected)}


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def _candidate_grid(model: ModelSpec, recipe: TrainingRecipe, pool: GpuPool) -> dict[str, NDArray[np.int64]]:
    """Every valid layout for the pool, as parallel arrays (pp = 1 for now)."""
    cap = pool.total_gpus if recipe.max_gpus is None else min(pool.total_gpus, recipe.max_gpus)
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= min(pool.gpus_per_node, cap)
           and model.heads % t == 0 and model.kv_heads % t == 0]  # fmt: skip
    if recipe.micro_batch is not None:
        mbs = [recipe.micro_batch]
    else:
        mbs = [m for m in MICRO_BATCH_CANDIDATES if recipe.global_batch % m == 0]
    recomputes = (0, 1) if recipe.allow_recompute else (0,)
    rows: list[tuple[int, int, int, int, int, int]] = []
    for t in tps:
        for m in mbs:
            per_replica = recipe.global_batch // m  # = dp x grad_accum
            for d in range(1, cap // t + 1):
                if per_replica % d:
                    continue
                # ZeRO shards over the dp group: a stage > 0 only means something when dp > 1.
                for z in (z for z in recipe.zero_stages if d > 1 or z == 0):
                    for r in recomputes:
                        rows.append((t, d, z, m, per_replica // d, r))
    arr = np.array(rows, dtype=np.int64).reshape(-1, 6)
    return {
        "tp": arr[:, 0],
        "dp": arr[:, 1],
        "zero": arr[:, 2],
        "mb": arr[:, 3],
        "ga": arr[:, 4],
        "rc": arr[:, 5],
    }


def _rejection(
    gpu: GpuType, grid: dict[str, NDArray[np.int64]], mem: dict[str, NDArray[np.int64]], margin: float
) -> str:
    i = int(np.argmin(mem["total"]))
    usable = gpu.memory_bytes * (1.0 - margin)
    return (
        f"{gpu.name}: smallest per-GPU need {_gib(mem['total'][i])} "
        f"(tp={grid['tp'][i]}, dp={grid['dp'][i]}, zero {grid['zero'][i]}, micro_batch {grid['mb'][i]}, "
        f"recompute {'full' if grid['rc'][i] else 'none'}) > {_gib(usable)} usable "
        f"({_gib(gpu.memory_bytes)} x {1.0 - margin:.2f})"
    )


def enumerate_plans(
    model: ModelSpec,
    recipe: TrainingRecipe,
    pools: list[GpuPool] | None = None,
    safety_margin: float = 0.05,
    max_plans: int | None = 50,
    *,
    mfu: float = DEFAULT_MFU,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> PlanSet:
    """Ranked plans that fit, over ``pools`` (None: every catalog GPU type, 8 per node, 64 max).

    A layout is kept when its predicted per-GPU total is <= memory x (1 - safety_margin).
    Only the best layout per (GPU type, GPU count) is kept so the list stays diverse; the
    ranking is GPU-hours, then GPU count, then step time. ``rejected`` has one line per GPU
    type without any fitting layout; when no type fits, ``plans`` is empty.
    """
    if (
        isinstance(safety_margin, bool)
        or not isinstance(safety_margin, int | float)
        or not 0.0 <= safety_margin < 1.0
    ):
        raise MarpError("safety_margin", f"must be in [0, 1), got {safety_margin!r}.")
    if max_plans is not None:
        check_int(max_plans, "max_plans", MarpError)
    if not 0.0 < mfu <= 1.0:
        raise MarpError("mfu", f"must be in (0, 1], got {mfu!r}.")
    if not inter_node_gbps > 0.0:
        raise MarpError("inter_node_gbps", f"must be > 0, got {inter_node_gbps!r}.")
    check_seq_len(model, recipe)
    if pools is None:
        pools = [GpuPool(g.name, DEFAULT_MAX_GPUS, DEFAULT_GPUS_PER_NODE) for g in list_gpus()]

    candidates: list[tuple[tuple[float, int, float, int, int, int], Plan]] = []
    rejected: list[str] = []
    for pool in pools:
        if not isinstance(pool, GpuPool):
            raise MarpError("pools", f"must be a list of GpuPool, got {type(pool).__name__}.")
        gpu = get_gpu(pool.gpu_type)
        if not gpu.supports(recipe.precision):
            rejected.append(f"{gpu.name}: no {recipe.precision} support (use precision 'fp16' or 'fp32')")
            continue
        grid = _candidate_grid(model, recipe, pool)
        if grid["tp"].size == 0:
            rejected.append(
                f"{gpu.name}: no valid layout on {pool.total_gpus} GPU(s) (global batch {recipe.global_batch}, "
                f"zero stages {list(recipe.zero_stages)}, max_gpus {recipe.max_gpus})"
            )
            continue
        pp = np.ones_like(grid["tp"])
        mem = memory_grid(model, recipe, grid["tp"], pp, grid["dp"], grid["zero"], grid["mb"], grid["ga"],
                          grid["rc"].astype(bool), gpu)  # fmt: skip
        usable = gpu.memory_bytes * (1.0 - safety_margin)
        fits = np.flatnonzero(mem["total"] <= usable)
        if fits.size == 0:
            rejected.append(_rejection(gpu, grid, mem, safety_margin))
            continue
        sub = {k: v[fits] for k, v in grid.items()}
        step = step_time_grid(model, recipe, gpu, sub["tp"], 1, sub["dp"], sub["zero"], sub["mb"], sub["ga"],
                              sub["rc"].astype(bool), pool.gpus_per_node, mfu, inter_node_gbps)  # fmt: skip
        n_gpus = sub["tp"] * sub["dp"]
        hours = n_gpus * step * recipe.train_steps / 3600.0
        headroom = gpu.memory_bytes - mem["total"][fits]
        # Best layout per GPU count: fewest GPU-hours (= fastest step at equal count); ties ->
        # more headroom, lower ZeRO stage, no recompute. np.lexsort: last key is primary.
        order = np.lexsort((sub["rc"], sub["zero"], -headroom, step, hours, n_gpus))
        seen: set[int] = set()
        for j in order:
            n = int(n_gpus[j])
            if n in seen:
                continue
            seen.add(n)
            i = fits[j]
            layout = Layout(
                tp=int(grid["tp"][i]), pp=1, dp=int(grid["dp"][i]), zero_stage=int(grid["zero"][i]),
                micro_batch=int(grid["mb"][i]), grad_accum=int(grid["ga"][i]),
                recompute="full" if grid["rc"][i] else "none",
            )  # fmt: skip
            memory = MemoryBreakdown(**{k: int(mem[k][i]) for k in FIELDS})
            plan = Plan(
                gpu_type=gpu.name, layout=layout, memory=memory, step_time_s=float(step[j]),
                tokens_per_s=recipe.tokens_per_step / float(step[j]), gpu_hours=float(hours[j]),
                headroom_bytes=int(headroom[j]), rank=0,
            )  # fmt: skip
            key = (plan.gpu_hours, plan.num_gpus, plan.step_time_s, -plan.headroom_bytes,
                   layout.zero_stage, int(layout.recompute == "full"))  # fmt: skip
            candidates.append((key, plan))

    best: dict[tuple[str, int], tuple[tuple[float, int, float, int, int, int], Plan]] = {}
    for key, plan in candidates:
        slot = (plan.gpu_type, plan.num_gpus)
        if slot not in best or key < best[slot][0]:
            best[slot] = (key, plan)
    ranked = sorted(best.values(), key=lambda kp: (kp[0], kp[1].gpu_type))
    if max_plans is not None:
        ranked = ranked[:max_plans]
    plans = [_with_rank(plan, r) for r, (_, plan) in enumerate(ranked, start=1)]
    return PlanSet(plans=plans, rejected=rejected)


def _with_rank(plan: Plan, rank: int) -> Plan:
    return Plan(plan.gpu_type, plan.layout, plan.memory, plan.step_time_s, plan.tokens_per_s,
                plan.gpu_hours, plan.headroom_bytes, rank)  # fmt: skip


__all__ = ["DEFAULT_GPUS_PER_NODE", "DEFAULT_MAX_GPUS", "GpuPool", "Plan", "PlanSet", "enumerate_plans"]
