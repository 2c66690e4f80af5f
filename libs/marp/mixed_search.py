"""The planner's search for mixed plans (``marp.mixed``): bounded, vectorised.

The ``MAX_TYPES`` types with the most aggregate compute, two at a time; a pair only when its
compute could beat the best single-type plan; the ``MAX_PAIRS`` pairs with the most compute. For
each pair a few candidate shapes (uneven data parallelism; rectangular pipelines with stages per
type), all priced in one memory pass and one step-time pass; a pipeline's layer split is solved in
closed form (water-filling each stage's time against a memory cap from a chord of its memory,
which is convex in the layer count); the best ``KEEP`` per pair and shape evaluated exactly
(``marp.mixed.evaluate``). Pure numpy; no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from marp import perf_rates as R
from marp.activations import element_bytes
from marp.gpus import GpuType, get_gpu
from marp.mixed import (
    KEEP,
    LOCAL_MICRO_BATCHES,
    MAX_PAIRS,
    MAX_STAGES,
    MAX_STAGES_PER_TYPE,
    MAX_TYPES,
    MixedLayout,
    PoolLinks,
    StageRequest,
    _concat,
    _inter_gbps,
    _intra_gbps,
    _memory_rows,
    _price,
    _Request,
    _shape,
    evaluate,
)
from marp.models import ModelSpec
from marp.perf import flops_per_token, sustained_flops
from marp.recipe import RECOMPUTE, TrainingRecipe


@dataclass(frozen=True)
class MixedSearch:
    """What the search looked at (for the bench and the tests)."""

    pairs: int = 0
    candidates: int = 0
    rows: int = 0
    evaluated: int = 0
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Type:
    gpu: GpuType
    total: int
    links: PoolLinks
    rate: float  # sustained FLOP/s of one GPU
    inter: float  # GB/s per GPU between nodes
    intra: float  # GB/s per GPU inside a node (stage boundaries)


def _tps(model: ModelSpec, limit: int) -> list[int]:
    return [t for t in (1, 2, 4, 8) if t <= limit and model.heads % t == 0 and model.kv_heads % t == 0]


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def mixed_plans(
    model: ModelSpec, recipe: TrainingRecipe, pools: list[tuple[str, int, PoolLinks]], best_single_s: float | None,
    single_eff: float | None, *, safety_margin: float = 0.05, mfu: float | None = None,
    inter_node_gbps: float | None = None, max_types: int = MAX_TYPES, max_pairs: int = MAX_PAIRS, keep: int = KEEP,
) -> tuple[list[MixedLayout], MixedSearch]:  # fmt: skip
    """Mixed layouts that fit, over pairs of ``pools`` ((GPU type, GPUs, links)): the bounded search of
    the module docstring. ``best_single_s`` (the fastest single-type step, None: none fits) and
    ``single_eff`` (the best achieved share of sustained FLOP/s of any single-type plan) prune pairs
    whose whole compute, at that efficiency, could not beat it."""
    if model.experts or recipe.ep > 1 or recipe.pp_layers is not None or recipe.etp is not None:
        return [], MixedSearch(skipped=("mixed plans cover dense models without a fixed pipeline split",))
    types: list[_Type] = []
    for name, total, pl in pools:
        gpu = get_gpu(name)
        if total < 1 or not gpu.supports(recipe.precision) or (recipe.float8 and not gpu.supports_fp8):
            continue
        cap = total if recipe.max_gpus is None else min(total, recipe.max_gpus)
        types.append(_Type(gpu, cap, pl, sustained_flops(gpu, recipe.precision, mfu, recipe.float8),
                           _inter_gbps(gpu, pl, inter_node_gbps), _intra_gbps(gpu, pl)))  # fmt: skip
    if len(types) < 2:
        return [], MixedSearch()
    types.sort(key=lambda t: (-t.total * t.rate, t.gpu.name))
    types = types[:max_types]
    flop_step = flops_per_token(model, recipe.seq_len) * recipe.tokens_per_step
    eff = min(max(single_eff or 1.0, 1e-3), 1.0)
    pairs = [(i, j) for i, j in itertools.combinations(range(len(types)), 2)
             if best_single_s is None
             or flop_step / (eff * (types[i].total * types[i].rate + types[j].total * types[j].rate)) < best_single_s]
    if recipe.max_gpus is not None:
        pairs = [(i, j) for i, j in pairs if recipe.max_gpus >= 2]
    pairs = sorted(pairs, key=lambda p: -(types[p[0]].total * types[p[0]].rate + types[p[1]].total * types[p[1]].rate))
    pairs = pairs[:max_pairs]
    if not pairs:
        return [], MixedSearch()
    rcs = [0] + ([RECOMPUTE.index("full")] + ([] if recipe.flash_attention else [RECOMPUTE.index("selective")])
                 if recipe.allow_recompute else [])  # fmt: skip
    data = _DataSearch(model, recipe, types, pairs, rcs)
    pipe = _PipeSearch(model, recipe, types, pairs, rcs)
    blocks = [b for b in (data.cols, pipe.cols) if b is not None]
    if not blocks:
        return [], MixedSearch(pairs=len(pairs))
    cols = _concat(blocks)
    gpus = [t.gpu for t in types]
    mem = _memory_rows(model, recipe, cols, gpus)["total"].astype(np.float64)
    parts = _price(_shape(model, recipe, cols), gpus, cols["gpu"], cols["ring"], recipe, mfu)
    usable = np.array([g.memory_bytes * (1.0 - safety_margin) for g in gpus])[cols["gpu"]]
    nd = data.n_rows
    requests = data.solve(mem[:nd], usable[:nd], {k: v[:nd] for k, v in parts.items()}, keep)
    requests += pipe.solve(mem[nd:], usable[nd:], {k: v[nd:] for k, v in parts.items()}, keep)
    links = {t.gpu.name: t.links for t in types}
    layouts = evaluate(model, recipe, requests, links, mfu=mfu, inter_node_gbps=inter_node_gbps)
    fits = [lay for lay in layouts
            if all(s.peak_bytes <= s.gpu_memory_bytes * (1.0 - safety_margin) for st in lay.stages for s in st.shares)]
    if recipe.max_gpus is not None:
        fits = [lay for lay in fits if lay.num_gpus <= recipe.max_gpus]
    return fits, MixedSearch(pairs=len(pairs), candidates=data.count + pipe.count, rows=int(cols["tp"].size),
                             evaluated=len(layouts))  # fmt: skip


def _top_per_pair(pair: NDArray[np.int64], score: NDArray[np.float64], gpus: NDArray[np.int64], keep: int) -> list[int]:
    """Indices of the ``keep`` best finite scores per pair (fewer GPUs first among equal)."""
    order = np.lexsort((gpus, score))
    out: list[int] = []
    taken: dict[int, int] = {}
    for i in order.tolist():
        if not np.isfinite(score[i]):
            break
        p = int(pair[i])
        if taken.get(p, 0) < keep:
            taken[p] = taken.get(p, 0) + 1
            out.append(i)
    return out


# ---- shape 1: uneven data parallelism -------------------------------------------------------------


class _DataSearch:
    """One stage over both types of a pair. Candidates: tp (common; a TP group is one type inside a
    node) x ZeRO (the highest of 0-2 allowed, and 3) x recompute, with every GPU of both pools (at
    most one rank per sample). Rows: each type at each local micro-batch 1, 2, 4, 8, 16."""

    def __init__(self, model: ModelSpec, recipe: TrainingRecipe, types: list[_Type], pairs: list[tuple[int, int]],
                 rcs: list[int]) -> None:  # fmt: skip
        self.model, self.recipe, self.types = model, recipe, types
        B, L = recipe.global_batch, model.n_layers
        allowed = (3,) if recipe.policy == "fsdp-bf16" else tuple(recipe.zero_stages)
        low = [z for z in allowed if z <= 2]
        zeros = ([max(low)] if low else []) + ([3] if 3 in allowed else [])
        self.mbs = np.array((recipe.micro_batch,) if recipe.micro_batch else LOCAL_MICRO_BATCHES, dtype=np.int64)
        cands = []
        for pi, (i, j) in enumerate(pairs):
            a, b = types[i], types[j]
            for tp in _tps(model, min(a.links.gpus_per_node, b.links.gpus_per_node)):
                da, db = a.total // tp, b.total // tp
                if da < 1 or db < 1:
                    continue
                if da + db > B:  # every rank needs a sample
                    da, db = max(1, da * B // (da + db)), max(1, db * B // (da + db))
                    if da + db > B:
                        continue
                for zero, rc in itertools.product(zeros, rcs):
                    cands.append((pi, i, j, tp, da, db, zero, rc))
        self.count = len(cands)
        self.cols: dict[str, NDArray[Any]] | None = None
        self.n_rows = 0
        if not cands:
            return
        c = np.array(cands, dtype=np.int64)
        self.c = c
        C, M = len(cands), self.mbs.size
        shape = (C, 2, M)

        def full(x: Any) -> NDArray[Any]:
            return np.broadcast_to(x, shape).ravel()

        gpu = np.stack([c[:, 1], c[:, 2]], axis=1)[:, :, None]
        gpn = np.array([t.links.gpus_per_node for t in types])
        inter = np.array([t.inter for t in types])
        ring = np.minimum(inter[c[:, 1]], inter[c[:, 2]])
        self.cols = {
            "tp": full(c[:, 3, None, None]), "pp": full(1), "dp": full((c[:, 4] + c[:, 5])[:, None, None]),
            "zero": full(c[:, 6, None, None]), "mb": full(self.mbs[None, None, :]), "ga": full(2),
            "rc": full(c[:, 7, None, None]), "layers": full(L), "rank": full(0), "gpu": full(gpu),
            "gpn": full(np.minimum(gpn[c[:, 1]], gpn[c[:, 2]])[:, None, None]),
            "first": full(True), "last": full(True), "dp_inter": full(True), "ring": full(ring[:, None, None]),
        }  # fmt: skip
        self.n_rows = C * 2 * M

    def solve(self, mem: NDArray[np.float64], usable: NDArray[np.float64], parts: dict[str, NDArray[np.float64]],
              keep: int) -> list[_Request]:  # fmt: skip
        if self.cols is None:
            return []
        c, M = self.c, self.mbs.size
        C = c.shape[0]
        mem3 = mem.reshape(C, 2, M)
        cap = usable.reshape(C, 2, M)[:, :, 0]
        t = parts["micro_batch"].reshape(C, 2, M)
        tail = (parts["dp"] + parts["optimizer"]).reshape(C, 2, M)
        # Every micro-batch up to the largest priced, its memory on the chords between priced ones.
        bs = np.arange(1, int(self.mbs.max()) + 1)
        if M > 1:
            weights = np.stack([np.interp(bs, self.mbs, unit) for unit in np.eye(M)], axis=1)  # (bs, M)
            mem_b, t_b = mem3 @ weights.T, t @ weights.T
        else:
            bs = self.mbs
            mem_b, t_b = mem3, t
        fit = mem_b <= cap[:, :, None]
        ok = fit[:, :, 0].all(axis=1)
        top = np.maximum(np.where(fit, np.arange(bs.size)[None, None, :], -1).max(axis=2), 0)
        rows = np.arange(C)[:, None]
        bmax = bs[top]
        rate = bmax / t_b[rows, np.arange(2)[None, :], top]  # samples per second per rank
        d = c[:, 4:6]
        est = self.recipe.global_batch / (d * rate).sum(axis=1) + tail.max(axis=(1, 2))
        est = np.where(ok, est, np.inf)
        out = []
        for ci in _top_per_pair(c[:, 0], est, (d.sum(axis=1) * c[:, 3]), keep):
            types = [(int(bmax[ci, k]), dict(zip(self.mbs.tolist(), t[ci, k].tolist(), strict=True)),
                      dict(zip(self.mbs.tolist(), tail[ci, k].tolist(), strict=True))) for k in range(2)]
            best = _split_two(self.recipe.global_batch, (int(d[ci, 0]), int(d[ci, 1])), types, int(c[ci, 6]) >= 3)
            if best is None:
                continue
            _, mb, ga = best
            names = (self.types[int(c[ci, 1])].gpu.name, self.types[int(c[ci, 2])].gpu.name)
            tp = int(c[ci, 3])
            st = StageRequest(layers=self.model.n_layers, tp=tp,
                              groups=((names[0], int(d[ci, 0]) * tp), (names[1], int(d[ci, 1]) * tp)))
            out.append(_Request((st,), dict(zip(names, mb, strict=True)), dict(zip(names, ga, strict=True)),
                                int(c[ci, 6]), RECOMPUTE[int(c[ci, 7])]))  # fmt: skip
        return out


def _split_two(B: int, d: tuple[int, int], types: list[tuple[int, dict[int, float], dict[int, float]]],
               common: bool) -> tuple[float, tuple[int, int], tuple[int, int]] | None:  # fmt: skip
    """The local micro-batches and counts of two types (d ranks each) that make B samples and end
    their step soonest: b_g <= the largest that fits, d_a b_a m_a + d_b b_b m_b = B (``common``:
    m_a = m_b, ZeRO-3). Vectorised over b_a x b_b x m_a around the balance point."""
    (ba_max, ta, taila), (bb_max, tb, tailb) = types
    da, db = d
    bas = np.arange(1, ba_max + 1) if len(ta) > 1 else np.array(list(ta))
    bbs = np.arange(1, bb_max + 1) if len(tb) > 1 else np.array(list(tb))
    t_a, tl_a = _interp(ta, bas), _interp(taila, bas)
    t_b, tl_b = _interp(tb, bbs), _interp(tailb, bbs)
    if common:
        ms = np.array([m for m in range(1, B + 1) if B % m == 0 and B // m >= da + db])
        if ms.size == 0:
            return None
        MA, BA, BB = np.meshgrid(ms, bas, bbs, indexing="ij")
        ok = da * BA + db * BB == B // MA
        MB = MA
    else:
        # m_a near the balance point (type a's share of B at the two rates), the rest follows.
        ra = bas / t_a
        rb = bbs / t_b
        share = (da * ra[:, None]) / (da * ra[:, None] + db * rb[None, :])
        base = np.floor(share * B / da / bas[:, None]).astype(np.int64)
        offs = np.arange(-4, 6)
        MA = np.maximum(base[None, :, :] + offs[:, None, None], 1)
        BA = np.broadcast_to(bas[None, :, None], MA.shape)
        BB = np.broadcast_to(bbs[None, None, :], MA.shape)
        rest = B - da * BA * MA
        ok = (rest > 0) & (rest % (db * BB) == 0)
        MB = np.where(ok, rest // (db * BB), 1)
    if not ok.any():
        return None
    ia, ib = np.searchsorted(bas, BA), np.searchsorted(bbs, BB)
    step = np.where(ok, np.maximum(t_a[ia] * MA + tl_a[ia], t_b[ib] * MB + tl_b[ib]), np.inf)
    # Fastest; among equal, the fewest micro-steps (larger micro-batches).
    flat = int(np.lexsort(((MA + MB).ravel(), step.ravel()))[0])
    i = np.unravel_index(flat, step.shape)
    return float(step[i]), (int(BA[i]), int(BB[i])), (int(MA[i]), int(MB[i]))


def _interp(table: dict[int, float], b: NDArray[np.int64]) -> NDArray[np.float64]:
    """A micro-batch's time at local micro-batches ``b`` (at most the largest priced) from the priced
    ones (1, 2, 4, 8, 16): linear between neighbours (the time is affine in b but for the small-GEMM
    terms)."""
    keys = sorted(table)
    return np.interp(b, keys, [table[k] for k in keys])


# ---- shape 2: pipeline stages per type ------------------------------------------------------------


class _PipeSearch:
    """Rectangular pipelines over a pair (every stage tp x d GPUs, as torch.distributed.pipelining's
    mesh needs): P_x stages on one type, then P_y on the other, as many as each pool holds (at most
    8 a type, 16 in all). Candidates: tp x d (the widest power of two and half of it) x recompute x
    which type goes first; one local micro-batch (1, or more for short sequences). Rows: four stage
    kinds per candidate (the first stage, the first type's others charged its lowest rank, the second
    type's first, the last stage), each at 1 and at L layers: memory is convex in the layer count
    (a maximum of affine phases), so the chord between them bounds it; the time is near-linear."""

    def __init__(self, model: ModelSpec, recipe: TrainingRecipe, types: list[_Type], pairs: list[tuple[int, int]],
                 rcs: list[int]) -> None:  # fmt: skip
        self.model, self.recipe, self.types = model, recipe, types
        self.cols: dict[str, NDArray[Any]] | None = None
        self.n_rows = 0
        self.count = 0
        zeros = [z for z in recipe.zero_stages if z <= 1]
        if recipe.policy == "fsdp-bf16" or not zeros:
            return
        B, L = recipe.global_batch, model.n_layers
        want = recipe.micro_batch or max(1, min(16, 4096 // recipe.seq_len))
        cands = []
        for pi, (i, j) in enumerate(pairs):
            a, b = types[i], types[j]
            for tp in _tps(model, min(a.links.gpus_per_node, b.links.gpus_per_node)):
                if min(a.total, b.total) < tp:
                    continue
                d_top = _pow2_floor(min(a.total, b.total) // tp)
                for d in sorted({d_top, max(d_top // 2, 1)}, reverse=True):
                    pa = min(a.total // (tp * d), MAX_STAGES_PER_TYPE)
                    pb = min(b.total // (tp * d), MAX_STAGES_PER_TYPE)
                    while pa + pb > min(MAX_STAGES, L):
                        pa, pb = (pa - 1, pb) if pa >= pb else (pa, pb - 1)
                    if pa < 1 or pb < 1:
                        continue
                    mb = want
                    while mb > 1 and B % (d * mb):
                        mb //= 2
                    if B % (d * mb):
                        continue
                    zero = max(zeros) if d > 1 else min(zeros)
                    for rc in rcs:
                        cands.append((pi, i, j, pa, pb, tp, d, mb, B // (d * mb), zero, rc))
                        cands.append((pi, j, i, pb, pa, tp, d, mb, B // (d * mb), zero, rc))
        self.count = len(cands)
        if not cands:
            return
        c = np.array(cands, dtype=np.int64)
        self.c = c
        C = c.shape[0]
        gx, gy, px, py = c[:, 1], c[:, 2], c[:, 3], c[:, 4]
        P = px + py
        # Kinds (C, 4): gpu, rank, first, last.
        k_gpu = np.stack([gx, gx, gy, gy], axis=1)
        k_rank = np.stack([np.zeros(C, np.int64), np.minimum(1, P - 1), px, P - 1], axis=1)
        k_first = np.stack([np.ones(C, bool), np.zeros(C, bool), np.zeros(C, bool), np.zeros(C, bool)], axis=1)
        k_last = np.stack([P == 1, np.zeros(C, bool), py == 1, np.ones(C, bool)], axis=1)
        shape = (C, 4, 2)

        def full(x: Any) -> NDArray[Any]:
            return np.broadcast_to(x, shape).ravel()

        gpn = np.array([t.links.gpus_per_node for t in types])
        inter = np.array([t.inter for t in types])
        tp, d = c[:, 5, None, None], c[:, 6, None, None]
        self.cols = {
            "tp": full(tp), "pp": full(P[:, None, None]), "dp": full(d), "zero": full(c[:, 9, None, None]),
            "mb": full(c[:, 7, None, None]), "ga": full(c[:, 8, None, None]), "rc": full(c[:, 10, None, None]),
            "layers": full(np.array([1, L])[None, None, :]), "rank": full(k_rank[:, :, None]),
            "gpu": full(k_gpu[:, :, None]), "gpn": full(gpn[k_gpu][:, :, None]), "first": full(k_first[:, :, None]),
            "last": full(k_last[:, :, None]), "dp_inter": full((tp * d > gpn[k_gpu][:, :, None]) & (d > 1)),
            "ring": full(inter[k_gpu][:, :, None]),
        }  # fmt: skip
        self.n_rows = C * 8

    def solve(self, mem: NDArray[np.float64], usable: NDArray[np.float64], parts: dict[str, NDArray[np.float64]],
              keep: int) -> list[_Request]:  # fmt: skip
        if self.cols is None:
            return []
        model, recipe, types, c = self.model, self.recipe, self.types, self.c
        L, C = model.n_layers, c.shape[0]
        m = mem.reshape(C, 4, 2)
        t = parts["micro_batch"].reshape(C, 4, 2)
        tail = (parts["dp"] + parts["optimizer"]).reshape(C, 4, 2)[:, :, 1].max(axis=1)
        cap = usable.reshape(C, 4, 2)[:, :, 0]
        chord = np.maximum((m[:, :, 1] - m[:, :, 0]) / max(L - 1, 1), 1.0)
        k_nmax = np.where(m[:, :, 0] > cap, 0.0, np.minimum(L, 1 + np.floor((cap - m[:, :, 0]) / chord)))
        k_slope = np.maximum((t[:, :, 1] - t[:, :, 0]) / max(L - 1, 1), 1e-12)
        k_const = t[:, :, 0] - k_slope
        px, py = c[:, 3], c[:, 4]
        P = px + py
        S = int(P.max())
        s = np.arange(S)[None, :]
        kind = np.where(s == 0, 0, np.where(s < px[:, None], 1, np.where((s == P[:, None] - 1) & (py[:, None] > 1),
                                                                          3, 2)))  # fmt: skip
        real = s < P[:, None]
        nmax = np.take_along_axis(k_nmax, kind, axis=1)
        slope = np.take_along_axis(k_slope, kind, axis=1)
        const = np.take_along_axis(k_const, kind, axis=1)
        n, feasible = _water_fill(L, nmax, slope, const, real)
        stage_t = np.where(real, const + slope * n, 0.0)
        # Boundaries: after stage s (s < P - 1); between the types at s = P_x - 1.
        e = element_bytes(recipe.policy)
        gpn = np.array([tt.links.gpus_per_node for tt in types])
        inter = np.array([tt.inter for tt in types])
        intra = np.array([tt.intra for tt in types])
        sb = np.arange(max(S - 1, 1))[None, :]
        cross = sb == (px[:, None] - 1)
        own = np.where(sb < px[:, None], c[:, 1:2], c[:, 2:3])  # the boundary's type when not crossing
        size = (c[:, 5] * c[:, 6])[:, None]
        same_node = ~cross & (2 * size <= gpn[own])
        bw = np.where(same_node, intra[own] * 1e9 * R.INTRA_BW_EFF,
                      np.where(cross, np.minimum(inter[c[:, 1:2]], inter[c[:, 2:3]]), inter[own]) * 1e9 * R.INTER_BW_EFF)
        nbytes = (c[:, 7] * recipe.seq_len * model.hidden * e)[:, None]
        link = np.where(sb < (P[:, None] - 1), 2.0 * (nbytes / bw + R.P2P_LATENCY_S), 0.0)
        slowest = np.maximum(stage_t.max(axis=1), link.max(axis=1))
        est = stage_t.sum(axis=1) + link.sum(axis=1) + (c[:, 8] - 1) * slowest + tail
        est = np.where(feasible, est, np.inf)
        out = []
        for ci in _top_per_pair(c[:, 0], est, P * c[:, 5] * c[:, 6], keep):
            gxn, gyn = types[int(c[ci, 1])].gpu.name, types[int(c[ci, 2])].gpu.name
            width = int(c[ci, 5] * c[ci, 6])
            stages = tuple(StageRequest(layers=int(n[ci, k]), tp=int(c[ci, 5]),
                                        groups=((gxn if k < px[ci] else gyn, width),)) for k in range(int(P[ci])))
            names = (gxn, gyn)
            out.append(_Request(stages, dict.fromkeys(names, int(c[ci, 7])), dict.fromkeys(names, int(c[ci, 8])),
                                int(c[ci, 9]), RECOMPUTE[int(c[ci, 10])]))  # fmt: skip
        return out


def _water_fill(L: int, nmax: NDArray[np.float64], slope: NDArray[np.float64], const: NDArray[np.float64],
                real: NDArray[np.bool_]) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:  # fmt: skip
    """Per candidate, layers per stage (each >= 1, <= its cap, summing to L) that minimise the slowest
    stage's time const + slope x layers: bisection on that time, vectorised over candidates; the
    excess of the last step taken back from the slowest stages. Returns (layers, feasible)."""
    feasible = (np.where(real, nmax, 0).sum(axis=1) >= L) & np.all(~real | (nmax >= 1), axis=1)
    lo = np.where(real, const + slope, -np.inf).max(axis=1)
    hi = np.maximum(np.where(real, const + slope * np.minimum(nmax, L), -np.inf).max(axis=1), lo)

    def layers_at(T: NDArray[np.float64]) -> NDArray[np.float64]:
        k = np.floor((T[:, None] - const) / slope + 1e-9)
        return np.where(real, np.clip(k, 0, nmax), 0.0)

    for _ in range(24):
        mid = (lo + hi) / 2
        enough = layers_at(mid).sum(axis=1) >= L
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    n = layers_at(hi)
    feasible &= (n.sum(axis=1) >= L) & np.all(~real | (n >= 1), axis=1)
    excess = np.where(feasible, n.sum(axis=1) - L, 0.0)
    # Take the excess back, slowest stage first (every stage is within the bound already).
    t = np.where(real, const + slope * n, -np.inf)
    order = np.argsort(-t, axis=1)
    rows = np.arange(n.shape[0])
    for k in range(n.shape[1]):
        s = order[:, k]
        take = np.minimum(excess, np.where(real[rows, s], n[rows, s] - 1, 0))
        n[rows, s] -= take
        excess -= take
    return n, feasible


__all__ = ["MixedSearch", "mixed_plans"]
