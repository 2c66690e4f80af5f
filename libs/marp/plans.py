"""Resource plans: enumerate every valid layout per GPU type, keep those that fit, rank them.

This is what the predictor service returns to the scheduler. For each GPU pool
the candidate layouts form a small grid (tp x micro-batch x dp x ZeRO stage x
recompute); ``memory_grid`` evaluates it in one vectorised pass, layouts above
the usable memory (total x (1 - safety margin)) are dropped, the rest get a
step-time estimate, and the best layout per (GPU type, GPU count) becomes a
plan. Plans are ranked by estimated completion time (default) or by GPU-hours.
A GPU type with no fitting layout gets a one-line, numeric rejection reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from marp._check import check_int
from marp.errors import InvalidRecipeError, MarpError
from marp.gpus import GiB, GpuType, get_gpu, list_gpus
from marp.memory import MemoryBreakdown, breakdown_at, check_seq_len, check_split_covers, memory_grid
from marp.mixed import MixedLayout, PoolLinks
from marp.mixed_search import mixed_plans
from marp.models import ModelSpec
from marp.perf import DEFAULT_INTER_NODE_GBPS, StepShape, flops_per_token, sustained_flops
from marp.recipe import Layout, TrainingRecipe, split_maxima
from marp.sizes import CONTEXT_BYTES, CONTEXT_BYTES_DEFAULT, HOPPER

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_MAX_GPUS = 64
MICRO_BATCH_CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class GpuPool:
    """``total_gpus`` GPUs of one type, ``gpus_per_node`` per node (TP groups stay inside a node)."""

    gpu_type: str
    total_gpus: int
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    inter_node_gbps: float | None = None  # GB/s per GPU between nodes; None: the generation's default
    # "nvlink" | "pcie" (the cluster file's); None: the GPU's own. Only mixed plans' stage boundaries
    # inside a node read it (marp.mixed); collectives keep the GPU catalog's link.
    intra_node_link: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_type", get_gpu(self.gpu_type).name)  # canonical name
        check_int(self.total_gpus, "pools.total_gpus", MarpError)
        check_int(self.gpus_per_node, "pools.gpus_per_node", MarpError)
        _check_gbps(self.inter_node_gbps, "pools.inter_node_gbps")
        if self.intra_node_link not in (None, "nvlink", "pcie"):
            raise MarpError("pools.intra_node_link", f"must be nvlink or pcie, got {self.intra_node_link!r}.")


@dataclass(frozen=True)
class Plan:
    """One ranked way to run the job: a GPU type, a layout, its memory, speed and cost.

    ``explanation`` says why this plan and not a better-ranked layout of the same GPU type
    (the best such layout that did not fit, with its need against the usable memory).
    """

    gpu_type: str
    layout: Layout
    memory: MemoryBreakdown
    step_time_s: float
    tokens_per_s: float
    gpu_hours: float
    headroom_bytes: int
    rank: int
    completion_s: float = 0.0
    explanation: str = ""
    # A plan over several GPU types (marp.mixed): its stages, per-type shares and links. Then
    # ``gpu_type`` is the types '+'-joined, ``layout`` only a summary (the first stage's tp and dp,
    # pp = the stages, their layer split), ``memory`` / ``headroom_bytes`` the tightest rank's.
    mixed: MixedLayout | None = None

    @property
    def num_gpus(self) -> int:
        return self.mixed.num_gpus if self.mixed is not None else self.layout.num_gpus

    @property
    def gpus_by_type(self) -> dict[str, int]:
        """GPU type -> GPUs (one entry for a single-type plan)."""
        return self.mixed.gpus_by_type if self.mixed is not None else {self.gpu_type: self.num_gpus}

    @property
    def label(self) -> str:
        """``8x H100-80GB`` or ``4x A100-80GB + 16x L4``."""
        return " + ".join(f"{n}x {t}" for t, n in self.gpus_by_type.items())

    def to_dict(self) -> dict[str, Any]:
        out = {
            "rank": self.rank, "gpu_type": self.gpu_type, "num_gpus": self.num_gpus,
            "gpus_by_type": self.gpus_by_type,
            "layout": self.layout.to_dict(), "memory": self.memory.to_dict(),
            "step_time_s": float(self.step_time_s), "tokens_per_s": float(self.tokens_per_s),
            "gpu_hours": float(self.gpu_hours), "completion_s": float(self.completion_s),
            "headroom_bytes": int(self.headroom_bytes), "explanation": self.explanation,
        }  # fmt: skip
        if self.mixed is not None:
            out["mixed"] = self.mixed.to_dict()
        return out


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


RANK_BY: tuple[str, ...] = ("time", "gpu_hours")
# Ranking by time: plans within this fraction of the fastest completion count as equally fast and
# are ordered by GPU-hours, so a negligible speed-up never buys more GPUs (Sia and Pollux weigh
# goodput per GPU for the same reason). docs/marp.md, "Ranking".
DEFAULT_TIME_MARGIN = 0.05
# Ranking by time: a plan must pay for its GPUs. Its scaling efficiency is the fewest GPU-hours of
# any plan of its GPU type over its own (1.0 for the cheapest; 8 GPUs at 2x the speed of 1: 0.25).
# Plans below this efficiency rank after every plan that reaches it, so a job whose step is bound by
# fixed costs (kernel launches, the optimizer step, the per-step constant) stays on few GPUs, while
# a big job, whose plans scale at 0.8-1.0 in the model, still gets the wide ones. A policy choice,
# not a measured constant: each GPU beyond the cheapest plan's must deliver at least 70 % of its
# linear share of speed (Pollux and Sia weigh goodput per GPU for the same reason). 0 turns it off.
# docs/marp.md, "Ranking".
DEFAULT_MIN_SCALING_EFF = 0.7


def _check_gbps(value: float | None, field: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise MarpError(field, f"must be a positive finite number of GB/s per GPU, got {value!r}.")


_RC_NAMES = ("none", "selective", "full", "op-sac")


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _candidate_grid(model: ModelSpec, recipe: TrainingRecipe, cap: int, gpus_per_node: int) -> dict[str, NDArray[np.int64]]:
    """Every valid layout on at most ``cap`` GPUs, as parallel arrays, built with numpy.

    TP divides heads and kv_heads and stays inside a node; PP divides the layers (at most 16
    stages); DP divides the sequences per replica; ZeRO > 0 only with DP > 1, and with PP only
    ZeRO <= 1 (Megatron and DeepSpeed do not pipeline with sharded gradients / parameters);
    selective recompute only where it saves memory (materialised attention scores).
    """
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= min(gpus_per_node, cap)
           and model.heads % t == 0 and model.kv_heads % t == 0]  # fmt: skip
    pps = _divisors(model.n_layers, 16) if recipe.pp_layers is None else _split_pps(recipe.pp_layers)
    if recipe.micro_batch is not None:
        mbs = [recipe.micro_batch]
    else:
        mbs = [m for m in MICRO_BATCH_CANDIDATES if recipe.global_batch % m == 0]
    rcs = [0]
    if recipe.allow_recompute:
        rcs += [2] + ([1] if not recipe.flash_attention else [])
    fsdp = recipe.policy == "fsdp-bf16"
    zeros = (3,) if fsdp else recipe.zero_stages
    blocks = []
    eps = expert_parallel_degrees(model, recipe)
    for m in mbs:
        per_replica = recipe.global_batch // m
        dps = np.array([d for d in _divisors(per_replica, cap) if d % eps[0] == 0], dtype=np.int64)
        t, p, d, z, r, e = np.meshgrid(np.array(tps, dtype=np.int64), np.array(pps, dtype=np.int64), dps,
                                       np.array(zeros, dtype=np.int64), np.array(rcs, dtype=np.int64),
                                       np.array(eps, dtype=np.int64), indexing="ij")  # fmt: skip
        t, p, d, z, r, e = (x.ravel() for x in (t, p, d, z, r, e))
        ok = (t * p * d <= cap) & ((d > 1) | (z == 0) | fsdp) & ((p == 1) | (z <= 1)) & (d % e == 0)
        if recipe.min_gpus is not None:
            ok &= t * p * d >= recipe.min_gpus
        if fsdp:
            ok &= p == 1
        blocks.append(np.stack([t[ok], p[ok], d[ok], z[ok], np.full(int(ok.sum()), m), per_replica // d[ok], r[ok],
                                e[ok]]))  # fmt: skip
    arr = np.concatenate(blocks, axis=1) if blocks else np.zeros((8, 0), dtype=np.int64)
    grid = {"tp": arr[0], "pp": arr[1], "dp": arr[2], "zero": arr[3], "mb": arr[4], "ga": arr[5], "rc": arr[6]}
    if len(eps) > 1:
        grid["ep"] = arr[7]  # a dense model's grid carries no ep array: memory_grid's default 1
    if recipe.etp is not None:
        # The experts' grid (etp x ep) runs on the same tp x dp GPUs of a stage.
        keep = (grid["tp"] * grid["dp"]) % (recipe.etp * arr[7]) == 0
        grid = {k: v[keep] for k, v in grid.items()}
    return _with_split(grid, recipe.pp_layers)


# Expert-parallel degrees the planner tries for a MoE job that does not fix one: powers of two
# (the experts of every published MoE are a power of two, or a multiple of one), as Megatron's and
# torchtitan's MoE recipes use, up to 64 (DeepSeek-V3 trained with ep 64; DeepSeek-AI 2024, sec. 3.2).
EP_CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def expert_parallel_degrees(model: ModelSpec, recipe: TrainingRecipe) -> list[int]:
    """The ep values the planner enumerates: the job's own when it sets one (ep > 1) or the model is
    dense; for a MoE model otherwise every candidate that divides its experts (ep must also divide
    dp, which the grid checks per layout). ep lowers the experts' weights, gradients and optimizer
    states per GPU; the step-time model does not price the token all-to-all, so layouts that differ
    only in ep tie on time and rank by headroom (the largest ep that the dp allows)."""
    if recipe.ep > 1 or not model.experts:
        return [recipe.ep]
    return [e for e in EP_CANDIDATES if model.experts % e == 0]


def _split_pps(split: tuple[int, ...]) -> list[int]:
    """Pipeline degrees a fixed split of len(split) (virtual) stages can run on: pp x vpp = len,
    interleaving (vpp > 1) only with pp > 1."""
    n = len(split)
    return [p for p in _divisors(n, n) if p > 1 or n == 1]


def _with_split(grid: dict[str, NDArray[np.int64]], split: tuple[int, ...] | None) -> dict[str, NDArray[np.int64]]:
    """The grid with each layout's vpp and its split's maxima (``stage``, ``chunk``; 0: even split).
    A fixed split sets vpp = len(split) / pp and keeps only the interleaved layouts whose micro-
    batch count is a multiple of pp (Megatron's interleaved schedule needs it)."""
    if split is None:
        return grid  # vpp 1, an even split: memory_grid's defaults
    pp = grid["pp"]
    vpp = len(split) // np.maximum(pp, 1)
    maxima = {p: split_maxima(split, p) for p in np.unique(pp).tolist()}
    stage = np.array([maxima[p][0] for p in pp.tolist()], dtype=np.int64)
    keep = (vpp == 1) | (grid["ga"] % pp == 0)
    out = {k: v[keep] for k, v in grid.items()}
    out.update(vpp=vpp[keep], stage=stage[keep], chunk=np.full(int(keep.sum()), max(split), dtype=np.int64))
    return out


def _lex_argmin(keys: tuple[NDArray, ...], idx: NDArray[np.int64]) -> int | None:
    """Index (among ``idx``) of the smallest row by ``keys`` (least significant first), as
    np.lexsort would rank it first, in O(len(keys) x len(idx)) instead of a sort."""
    if idx.size == 0:
        return None
    for k in reversed(keys):
        vals = k[idx]
        idx = idx[vals == vals.min()]
        if idx.size == 1:
            break
    return int(idx[0])


def _layout_at(grid: dict[str, NDArray[np.int64]], i: int, megatron: bool, ep: int = 1,
               split: tuple[int, ...] | None = None, etp: int | None = None) -> Layout:  # fmt: skip
    tp = int(grid["tp"][i])
    if "ep" in grid:
        ep = int(grid["ep"][i])  # enumerated (expert_parallel_degrees)
    # (a row of the grid memory_grid has validated by Layout's rules: not checked again)
    return Layout.of_valid(
        tp=tp, pp=int(grid["pp"][i]), dp=int(grid["dp"][i]), zero_stage=int(grid["zero"][i]),
        micro_batch=int(grid["mb"][i]), grad_accum=int(grid["ga"][i]),
        recompute=_RC_NAMES[int(grid["rc"][i])], sp=megatron and tp > 1, ep=ep,  # type: ignore[arg-type]
        vpp=int(grid["vpp"][i]) if "vpp" in grid else 1, pp_layers=split, etp=etp,
    )  # fmt: skip


def _describe(lay: Layout) -> str:
    vpp = f" vpp={lay.vpp}" if lay.vpp > 1 else ""
    return (f"tp={lay.tp} pp={lay.pp}{vpp} dp={lay.dp} zero {lay.zero_stage} micro_batch {lay.micro_batch} "
            f"recompute {lay.recompute}")  # fmt: skip


def _memory_class(gpu: GpuType) -> tuple[int, bool]:
    """GPUs whose memory prediction is identical: same context bytes and TE workspace size."""
    return (CONTEXT_BYTES.get(gpu.name, CONTEXT_BYTES_DEFAULT), gpu.name in HOPPER)


def enumerate_plans(
    model: ModelSpec,
    recipe: TrainingRecipe,
    pools: list[GpuPool] | None = None,
    safety_margin: float = 0.05,
    max_plans: int | None = 50,
    *,
    mfu: float | None = None,
    inter_node_gbps: float | None = DEFAULT_INTER_NODE_GBPS,
    rank_by: str = "time",
    time_margin: float = DEFAULT_TIME_MARGIN,
    min_scaling_eff: float = DEFAULT_MIN_SCALING_EFF, mixed: bool = False,
) -> PlanSet:
    """Ranked plans that fit, over ``pools`` (None: every catalog GPU type, 8 per node, 64 max).

    A layout is kept when its predicted device bytes (``MemoryBreakdown.total``) are at most
    memory x (1 - safety_margin). The best layout per (GPU type, GPU count) becomes a plan, so
    the list stays diverse. ``rank_by`` "time" (default) ranks by estimated completion time
    (train_steps x step time), except that the plans within ``time_margin`` (default 5 %) of the
    fastest completion come first ordered by GPU-hours (a negligible speed-up does not buy GPUs),
    and plans below ``min_scaling_eff`` (default 0.7: the fewest GPU-hours of a plan of the same GPU
    type over the plan's own) rank after all others (GPUs that barely speed the job up are not
    bought); "gpu_hours" by GPU-hours, then GPU count, then time. ``inter_node_gbps`` (GB/s per GPU)
    overrides every pool's own value and the GPU generation's default. ``rejected`` has one line per GPU type without any fitting layout, with the need and
    the memory; when no type fits, a last line names the nearest plan that would fit (more GPUs).
    ``mixed`` also ranks plans over two GPU types at a time (``_mixed_candidates``; off by default).
    """
    _check_options(safety_margin, max_plans, mfu, inter_node_gbps, time_margin, min_scaling_eff, rank_by)
    _check_recipe(model, recipe)
    if pools is None:
        pools = [GpuPool(g.name, DEFAULT_MAX_GPUS, DEFAULT_GPUS_PER_NODE) for g in list_gpus()]
    search = _PoolSearch(model, recipe, safety_margin, mfu, inter_node_gbps, rank_by)
    candidates: list[tuple[tuple[float, ...], Plan]] = []
    rejected: list[str] = []
    for pool in pools:
        found = search.candidates_on(pool)
        if isinstance(found, str):
            rejected.append(found)
        else:
            candidates += found

    candidates += _mixed_candidates(model, recipe, pools, candidates, safety_margin, mfu, inter_node_gbps, rank_by, mixed)
    if rank_by == "time" and candidates:
        candidates = _rank_by_time(candidates, time_margin, min_scaling_eff)
    ranked = sorted(candidates, key=lambda kp: (kp[0], kp[1].gpu_type))
    if max_plans is not None:
        ranked = ranked[:max_plans]
    plans = [replace(plan, rank=r) for r, (_, plan) in enumerate(ranked, start=1)]
    if not plans and rejected and (recipe.max_gpus is not None or any(p.total_gpus < 1024 for p in pools)):
        rejected.append(_nearest_fit_line(model, recipe, pools, safety_margin, mfu, inter_node_gbps))
    return PlanSet(plans=plans, rejected=rejected)


def _check_options(safety_margin: float, max_plans: int | None, mfu: float | None, inter_node_gbps: float | None,
                   time_margin: float, min_scaling_eff: float, rank_by: str) -> None:  # fmt: skip
    """``enumerate_plans``' own arguments: MarpError naming the first one out of range."""
    if isinstance(safety_margin, bool) or not isinstance(safety_margin, int | float) or not 0.0 <= safety_margin < 1.0:
        raise MarpError("safety_margin", f"must be in [0, 1), got {safety_margin!r}.")
    if max_plans is not None:
        check_int(max_plans, "max_plans", MarpError)
    if mfu is not None and not 0.0 < mfu <= 1.0:
        raise MarpError("mfu", f"must be in (0, 1], got {mfu!r}.")
    _check_gbps(inter_node_gbps, "inter_node_gbps")
    if isinstance(time_margin, bool) or not isinstance(time_margin, int | float) or not 0.0 <= time_margin < 1.0:
        raise MarpError("time_margin", f"must be in [0, 1), got {time_margin!r}.")
    if (isinstance(min_scaling_eff, bool) or not isinstance(min_scaling_eff, int | float)
            or not 0.0 <= min_scaling_eff <= 1.0):  # fmt: skip
        raise MarpError("min_scaling_eff", f"must be in [0, 1], got {min_scaling_eff!r}.")
    if rank_by not in RANK_BY:
        raise MarpError("rank_by", f"must be one of {', '.join(RANK_BY)}, got {rank_by!r}.")


def _check_recipe(model: ModelSpec, recipe: TrainingRecipe) -> None:
    """What the planner refuses of a recipe for this model (InvalidRecipeError naming the field):
    the sequence length, expert parallelism without experts, a pipeline split that does not cover
    the layers or pipelines an fsdp-bf16 job."""
    check_seq_len(model, recipe)
    if recipe.ep > 1 and (not model.experts or model.experts % recipe.ep):
        raise InvalidRecipeError(
            "recipe.ep",
            f"ep {recipe.ep} needs a mixture-of-experts model whose experts it divides "
            f"({model.name} has {model.experts or 'no'} experts).",
            "use ep 1, or a divisor of the expert count.",
        )
    if recipe.etp is not None and not model.experts:
        raise InvalidRecipeError("recipe.etp", f"etp {recipe.etp} needs a mixture-of-experts model ({model.name} "
                                 "has no experts).", "leave expert tensor parallelism unset.")  # fmt: skip
    split = recipe.pp_layers
    if split is not None:
        check_split_covers(model, split, "recipe.pp_layers", InvalidRecipeError)
        if recipe.policy == "fsdp-bf16":
            # FSDP2 under PP keeps parameters gathered from a micro-batch's forward to its backward
            # (torchtitan: reshard_after_forward=False), which the memory model does not charge yet.
            raise InvalidRecipeError("recipe.pp_layers", "the planner does not pipeline fsdp-bf16 jobs (FSDP "
                                     "under pipeline parallelism is not modelled yet).",
                                     "predict the layout in single-layout mode, or use a master-* policy.")


def _rank_key(plan: Plan, rank_by: str) -> tuple[float, ...]:
    """A plan's sort key, before ``_rank_by_time`` re-keys the time ranking."""
    if rank_by == "time":
        return (plan.completion_s, plan.gpu_hours, float(plan.num_gpus), -float(plan.headroom_bytes))
    return (plan.gpu_hours, float(plan.num_gpus), plan.completion_s, -float(plan.headroom_bytes))


class _PoolSearch:
    """One ``enumerate_plans`` call's walk over its pools. The layout grid and the step time's GPU-
    independent part depend on a pool's size only, the memory prediction on its size and memory
    class (``_memory_class``): each is computed once and shared by the pools that agree."""

    def __init__(self, model: ModelSpec, recipe: TrainingRecipe, safety_margin: float, mfu: float | None,
                 inter_node_gbps: float | None, rank_by: str) -> None:  # fmt: skip
        self.model, self.recipe, self.safety_margin = model, recipe, safety_margin
        self.mfu, self.inter_node_gbps, self.rank_by = mfu, inter_node_gbps, rank_by
        self.megatron = recipe.megatron_style
        self.grids: dict[tuple[int, int], dict[str, NDArray[np.int64]]] = {}
        self.shapes: dict[tuple[int, int], StepShape] = {}  # the step time's GPU-independent part, per grid
        self.mems: dict[tuple[tuple[int, int], tuple[int, bool]], dict[str, NDArray[np.int64]]] = {}

    def _layout(self, grid: dict[str, NDArray[np.int64]], i: int) -> Layout:
        recipe = self.recipe
        return _layout_at(grid, i, self.megatron, recipe.ep, recipe.pp_layers, recipe.etp)

    def candidates_on(self, pool: GpuPool) -> list[tuple[tuple[float, ...], Plan]] | str:
        """The best fitting layout per GPU count on ``pool``, as ranking candidates, or the line
        that says why the pool's GPU type holds none."""
        model, recipe = self.model, self.recipe
        if not isinstance(pool, GpuPool):
            raise MarpError("pools", f"must be a list of GpuPool, got {type(pool).__name__}.")
        gpu = get_gpu(pool.gpu_type)
        if not gpu.supports(recipe.precision):
            return f"{gpu.name}: no {recipe.precision} support (use an fp16 or fp32 precision policy)"
        if recipe.float8 and not gpu.supports_fp8:
            return f"{gpu.name}: no fp8 support for float8 linears (drop float8 for this GPU type)"
        cap = pool.total_gpus if recipe.max_gpus is None else min(pool.total_gpus, recipe.max_gpus)
        gkey = (cap, pool.gpus_per_node)
        if gkey not in self.grids:
            self.grids[gkey] = _candidate_grid(model, recipe, cap, pool.gpus_per_node)
        grid = self.grids[gkey]
        if grid["tp"].size == 0:
            return (
                f"{gpu.name}: no valid layout on {pool.total_gpus} GPU(s) (global batch {recipe.global_batch}, "
                f"zero stages {list(recipe.zero_stages)}, max_gpus {recipe.max_gpus}"
                + (f", min_gpus {recipe.min_gpus}" if recipe.min_gpus is not None else "") + ")"
            )
        mem = self._memory(gkey, grid, gpu)
        usable = gpu.memory_bytes * (1.0 - self.safety_margin)
        fit_mask = mem["total"] <= usable
        if not fit_mask.any():
            i = int(np.argmin(mem["total"]))
            return (
                f"{gpu.name}: needs at least {_gib(mem['total'][i])} per GPU "
                f"({_describe(self._layout(grid, i))}) > {_gib(usable)} usable "
                f"({_gib(gpu.memory_bytes)} x {1.0 - self.safety_margin:.2f})"
            )
        if gkey not in self.shapes:
            self.shapes[gkey] = StepShape.of(
                model, recipe, grid["tp"], grid["pp"], grid["dp"], grid["zero"], grid["mb"], grid["ga"], False,
                pool.gpus_per_node, recompute=grid["rc"], vpp=grid.get("vpp", 1), fp8=recipe.float8,
                compiled=recipe.compile)  # fmt: skip
        gbps = self.inter_node_gbps if self.inter_node_gbps is not None else pool.inter_node_gbps
        step = self.shapes[gkey].seconds_on(gpu, recipe.precision, self.mfu, gbps)
        return self._best_per_count(gpu, grid, mem, fit_mask, usable, step)

    def _memory(self, gkey: tuple[int, int], grid: dict[str, NDArray[np.int64]],
                gpu: GpuType) -> dict[str, NDArray[np.int64]]:  # fmt: skip
        """Every layout's predicted memory on ``gpu`` (shared by the GPU types of its memory class)."""
        mkey = (gkey, _memory_class(gpu))
        if mkey not in self.mems:
            model, recipe = self.model, self.recipe
            sp = (grid["tp"] > 1) & self.megatron
            self.mems[mkey] = memory_grid(model, recipe, grid["tp"], grid["pp"], grid["dp"], grid["zero"], grid["mb"],
                                          grid["ga"], False, gpu, recompute=grid["rc"], sp=sp,
                                          ep=grid.get("ep", recipe.ep), vpp=grid.get("vpp", 1),
                                          stage_layers=grid.get("stage", 0), chunk_layers=grid.get("chunk", 0),
                                          etp=recipe.etp)  # fmt: skip
        return self.mems[mkey]

    def _best_per_count(self, gpu: GpuType, grid: dict[str, NDArray[np.int64]], mem: dict[str, NDArray[np.int64]],
                        fit_mask: NDArray[np.bool_], usable: float,
                        step: NDArray[np.float64]) -> list[tuple[tuple[float, ...], Plan]]:  # fmt: skip
        """The best-ranked fitting layout per GPU count as a plan, each explained: its headroom, and
        the better-ranked layout that did not fit, if any."""
        recipe = self.recipe
        n_gpus = grid["tp"] * grid["pp"] * grid["dp"]
        completion = step * recipe.train_steps
        hours = n_gpus * completion / 3600.0
        headroom = gpu.memory_bytes - mem["total"]
        # Rank keys, least significant first (np.lexsort's convention).
        if self.rank_by == "time":
            keys = (grid["rc"], grid["zero"], -headroom, n_gpus, hours, completion)
        else:
            keys = (grid["rc"], grid["zero"], -headroom, completion, n_gpus, hours)
        # Sort only the layouts that fit (often a small share); of the rest only the
        # best-ranked one matters (for the explanation), found by a lexicographic argmin.
        fit_idx = np.flatnonzero(fit_mask)
        fit_order = fit_idx[np.lexsort(tuple(k[fit_idx] for k in keys))]
        # The best fitting layout per GPU count, in rank order: the first position of
        # each distinct count (a Python walk over every layout was most of the time).
        _, first = np.unique(n_gpus[fit_order], return_index=True)
        first.sort()
        best_unfit = _lex_argmin(keys, np.flatnonzero(~fit_mask))
        unfit_key = tuple(float(k[best_unfit]) for k in reversed(keys)) if best_unfit is not None else None
        out = []
        for j in fit_order[first].tolist():
            why = f"{_gib(headroom[j])} headroom"
            if unfit_key is not None and unfit_key < tuple(float(k[j]) for k in reversed(keys)):
                why += (f"; better-ranked {_describe(self._layout(grid, best_unfit))} on "
                        f"{int(n_gpus[best_unfit])} GPUs rejected: needs {_gib(mem['total'][best_unfit])} "
                        f"> {_gib(usable)} usable")  # fmt: skip
            plan = Plan(
                gpu_type=gpu.name, layout=self._layout(grid, j), memory=breakdown_at(mem, j),
                step_time_s=float(step[j]), tokens_per_s=recipe.tokens_per_step / float(step[j]),
                gpu_hours=float(hours[j]), headroom_bytes=int(headroom[j]), rank=0, completion_s=float(completion[j]),
                explanation=why,
            )  # fmt: skip
            out.append((_rank_key(plan, self.rank_by), plan))
        return out


def _rank_by_time(candidates: list[tuple[tuple[float, ...], Plan]], time_margin: float,
                  min_eff: float) -> list[tuple[tuple[float, ...], Plan]]:  # fmt: skip
    """Sort keys for ranking by time: plans that pay for their GPUs (scaling efficiency at least
    ``min_eff`` against the fewest GPU-hours of their GPU type) first; among them those within
    ``time_margin`` of the fastest by GPU-hours, the rest by completion; the others last, by
    completion, each with a line in its explanation that says why."""
    cheapest: dict[str, Plan] = {}
    for _, plan in candidates:
        if plan.gpu_type not in cheapest or plan.gpu_hours < cheapest[plan.gpu_type].gpu_hours:
            cheapest[plan.gpu_type] = plan
    # A mixed plan (marp.mixed, gpu_type "A100-80GB+L4") pays for its GPUs against the cheapest plan
    # of its own key and of each type it mixes: 8 L4 beside 2 A100 for a 10 % faster step are not
    # worth 5x the GPU-hours of the 2 A100 alone (issue 33: the simulator measured frenzy at 1.96x
    # the JCT of frenzy-single-type while mixed plans were only compared among themselves).
    for _, plan in candidates:
        if plan.mixed is not None:
            for t in plan.gpus_by_type:
                low = cheapest.get(t)
                if low is not None and low.gpu_hours < cheapest[plan.gpu_type].gpu_hours:
                    cheapest[plan.gpu_type] = low

    def efficiency(plan: Plan) -> float:
        return cheapest[plan.gpu_type].gpu_hours / plan.gpu_hours if plan.gpu_hours > 0 else 1.0

    # The relative tolerance keeps a plan at exactly the bar (and the cheapest, at 1.0) on its side.
    pays = [kp for kp in candidates if efficiency(kp[1]) >= min_eff * (1.0 - 1e-9)]
    fastest = min(plan.completion_s for _, plan in pays)
    limit = fastest * (1.0 + time_margin)
    out: list[tuple[tuple[float, ...], Plan]] = []
    for key, plan in candidates:
        eff = efficiency(plan)
        if eff < min_eff * (1.0 - 1e-9):
            low = cheapest[plan.gpu_type]
            why = (f"{plan.explanation}; scaling efficiency {eff:.2f} < {min_eff:.2f} (GPU-hours against "
                   f"{low.num_gpus} {low.gpu_type}: {low.gpu_hours:.3g}): ranked after the plans that pay for their GPUs")
            out.append(((2.0, *key), replace(plan, explanation=why)))
        elif plan.completion_s <= limit:
            # Near-fastest: fewest GPU-hours first (a negligible speed-up does not buy GPUs).
            out.append(((0.0, plan.gpu_hours, float(plan.num_gpus), plan.completion_s), plan))
        else:
            out.append(((1.0, *key), plan))
    return out


def _mixed_candidates(
    model: ModelSpec, recipe: TrainingRecipe, pools: list[GpuPool], singles: list[tuple[tuple[float, ...], Plan]],
    safety_margin: float, mfu: float | None, inter_node_gbps: float | None, rank_by: str, mixed: bool = True,
) -> list[tuple[tuple[float, ...], Plan]]:  # fmt: skip
    """The mixed plans (``marp.mixed_search.mixed_plans``: uneven data parallelism, pipeline stages per
    type) as ranking candidates, the best per set of GPU counts by type and shape, with the single-type
    plans' keys; none unless ``mixed`` (``enumerate_plans``' default: the predictor service's wire
    format has no field for them yet)."""
    if not mixed:
        return []
    best_step = min((p.step_time_s for _, p in singles), default=None)
    flop_step = flops_per_token(model, recipe.seq_len) * recipe.tokens_per_step
    rates = {t: sustained_flops(get_gpu(t), recipe.precision, mfu, recipe.float8) for t in {p.gpu_type for _, p in singles}}
    eff = max((flop_step / (p.step_time_s * p.num_gpus * rates[p.gpu_type]) for _, p in singles), default=None)
    by_type: dict[str, tuple[str, int, PoolLinks]] = {}
    for pool in pools:  # one entry per type (pools of one type add up)
        name, total, pl = by_type.get(pool.gpu_type, (pool.gpu_type, 0, None))  # type: ignore[arg-type]
        by_type[pool.gpu_type] = (name, total + pool.total_gpus,
                                  pl or PoolLinks(pool.gpus_per_node, pool.inter_node_gbps, pool.intra_node_link))
    layouts, _ = mixed_plans(model, recipe, list(by_type.values()), best_step, eff, safety_margin=safety_margin,
                             mfu=mfu, inter_node_gbps=inter_node_gbps)  # fmt: skip
    best: dict[tuple[Any, ...], MixedLayout] = {}
    for lay in layouts:
        k = (lay.kind, tuple(lay.gpus_by_type.items()))
        if k not in best or lay.step_time_s < best[k].step_time_s:
            best[k] = lay
    out = []
    for lay in best.values():
        plan = mixed_plan(lay, recipe)
        out.append((_rank_key(plan, rank_by), plan))
    return out


def mixed_plan(lay: MixedLayout, recipe: TrainingRecipe, rank: int = 0) -> Plan:
    """A Plan of a mixed layout (``marp.mixed``): the summary layout, the tightest rank's memory."""
    st0 = lay.stages[0]
    layout = Layout.of_valid(tp=st0.tp, pp=len(lay.stages), dp=st0.dp, zero_stage=lay.zero_stage,
                             micro_batch=st0.shares[0].micro_batch, grad_accum=lay.micro_batches,
                             recompute=lay.recompute,
                             pp_layers=tuple(st.layers for st in lay.stages) if len(lay.stages) > 1 else None)
    tight = lay.tightest
    completion = lay.step_time_s * recipe.train_steps
    if lay.kind == "data":
        how = "uneven data parallelism: " + ", ".join(
            f"{s.gpus}x {s.gpu_type} micro batch {s.micro_batch} x {s.grad_accum}" for s in st0.shares)
    else:
        how = f"{len(lay.stages)} pipeline stages: " + ", ".join(
            f"{st.layers} layers on {st.num_gpus}x {st.shares[0].gpu_type}" for st in lay.stages)
    why = (f"mixed plan, {how}; {_gib(tight.headroom_bytes)} headroom on the tightest ({tight.gpu_type})"
           + ("" if lay.rectangular else "; stages of unequal width need a runtime that re-splits micro-batches"))
    return Plan(gpu_type=lay.type_key, layout=layout, memory=tight.memory, step_time_s=lay.step_time_s,
                tokens_per_s=recipe.tokens_per_step / lay.step_time_s, gpu_hours=lay.num_gpus * completion / 3600.0,
                headroom_bytes=tight.headroom_bytes, rank=rank, completion_s=completion, explanation=why,
                mixed=lay)  # fmt: skip


def _nearest_fit(
    model: ModelSpec, recipe: TrainingRecipe, pools: list[GpuPool], margin: float, mfu: float | None,
    inter_node_gbps: float | None,
) -> Plan | None:
    """The fewest-GPU plan on the pools' GPU types if up to 1,024 GPUs of each were available."""
    wide = [GpuPool(p.gpu_type, 1024, p.gpus_per_node, p.inter_node_gbps) for p in pools]
    relaxed = replace(recipe, max_gpus=None)
    found = enumerate_plans(model, relaxed, wide, margin, None, mfu=mfu, inter_node_gbps=inter_node_gbps,
                            rank_by="gpu_hours").plans  # fmt: skip
    return min(found, key=lambda p: (p.num_gpus, p.gpu_hours)) if found else None


def _nearest_fit_line(model: ModelSpec, recipe: TrainingRecipe, pools: list[GpuPool], margin: float,
                      mfu: float | None, inter_node_gbps: float | None) -> str:  # fmt: skip
    """The last rejection line when no GPU type fits: the nearest plan that would (more GPUs), or
    what to change when not even 1,024 GPUs of a type would hold the job."""
    nearest = _nearest_fit(model, recipe, pools, margin, mfu, inter_node_gbps)
    if nearest is not None:
        return (f"nearest plan that would fit: {nearest.gpu_type} x {nearest.num_gpus} "
                f"({_describe(nearest.layout)}), {_gib(nearest.memory.total)} per GPU")  # fmt: skip
    return ("no plan would fit even with 1024 GPUs of these types; lower the micro batch or "
            "the sequence length, or use GPUs with more memory")  # fmt: skip


__all__ = ["DEFAULT_GPUS_PER_NODE", "DEFAULT_MAX_GPUS", "DEFAULT_MIN_SCALING_EFF", "DEFAULT_TIME_MARGIN", "RANK_BY", "GpuPool", "Plan", "PlanSet", "enumerate_plans", "mixed_plan"]
