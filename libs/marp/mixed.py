"""Mixed plans: one job over several GPU types (issue 33), in two shapes.

* **Uneven data parallelism** (one stage, ``kind == "data"``): ranks of several types in one data-
  parallel (DDP / ZeRO / FSDP) group. Each type has its own local micro-batch ``b_g`` and accumulation
  count ``m_g``, chosen so that every rank ends its step at about the same time, with the global
  batch unchanged: sum over types of (ranks_g x b_g x m_g) = B (Cephalo, ICS 2025: uneven per-GPU
  batches). Under ZeRO-3 / FSDP every micro-step gathers the parameters with a collective, so all
  ranks run the same ``m`` and only ``b_g`` differs; under ZeRO 0-2 the ranks skip the gradient
  sync on all but their last micro-step, so ``m_g`` may differ too. Memory per type: every rank
  holds its full shard of the states (the shard is the group's, whatever the type), plus its own
  micro-batch's activations, so the smallest GPU sets what fits.
* **Pipeline stages per type** (``kind == "pipeline"``): stages in pipeline order, each on one GPU
  type (or a data-parallel group over several) with its own width, tensor parallelism and an uneven
  number of transformer blocks; the embeddings on the first stage, the head and the loss on the
  last (AMP, NeurIPS 2022: uneven layer-to-stage assignment; torchtitan's
  ``pipeline_parallel_module_fqns_per_model_part``; Megatron-LM's first / last stage layer counts).
  Memory per stage and type is ``marp.memory_stages.memory_for_stages``: the stage's own blocks,
  its rank's 1F1B micro-batches in flight, min(P - r, m).

Step time (docs/mixed-plans.md, "Planning a mixed plan"): a stage's micro-batch time t_s is its
slowest type's (``StepShape.parts_on``, the same per-GPU model as single-type plans); a boundary
between stages k, k+1 sends each rank's activations forward and their gradients back,
tau_k = 2 (b s h e / bw + latency), at the pair's inter-node bandwidth from the cluster file when
the stages sit on different nodes, else the node's intra-node link; a boundary is a pipeline stage
of its own. With m micro-batches, 1F1B takes sum(t_s) + sum(tau_k) + (m - 1) max(t_s, tau_k) (the
fill and drain pass every stage once, the steady state runs at the slowest), plus the slowest
stage's exposed gradient reduce and optimizer step. One stage: the slowest type's
m_g t_g + reduce + optimizer.

The planner's bounded search over pairs of types is ``marp.mixed_search.mixed_plans``. Pure numpy;
no I/O.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from marp import perf_rates as R
from marp.activations import element_bytes
from marp.errors import InvalidLayoutError
from marp.gpus import GpuType, MiB, get_gpu
from marp.memory import MemoryBreakdown, breakdown_at
from marp.memory_stages import memory_for_stages
from marp.models import ModelSpec
from marp.perf import StepShape
from marp.recipe import RECOMPUTE, LayoutGrid, TrainingRecipe
from marp.sizes import HOPPER, TE_STREAMS, runtime_reserve_bytes

MAX_TYPES = 4  # the types with the most aggregate compute the search pairs up ...
MAX_PAIRS = 3  # ... and of their pairs, those with the most (bench/marp_speed.py: 20 ms with mixed plans)
KEEP = 1  # candidates per pair and shape evaluated exactly
MAX_STAGES_PER_TYPE = 8
MAX_STAGES = 16
# Local micro-batches priced per type (memory and time); those between are interpolated: memory
# is convex in the micro-batch (a maximum of affine phases), so the chords over-estimate it.
LOCAL_MICRO_BATCHES: tuple[int, ...] = (1, 4, 16)
# PCIe 4.0 x16, per direction: a node whose cluster entry says intra_node_link: pcie.
PCIE_GBPS = 32.0
DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class TypeShare:
    """The ranks of one GPU type in one stage and what each of them runs and holds."""

    gpu_type: str
    gpus: int
    micro_batch: int  # samples per micro-batch on one data-parallel rank of this type
    grad_accum: int  # micro-batches per optimizer step
    memory: MemoryBreakdown
    gpu_memory_bytes: int
    micro_batch_s: float  # one micro-batch's forward + backward on one GPU
    busy_s: float  # seconds of a step this type computes

    @property
    def peak_bytes(self) -> int:
        return self.memory.total

    @property
    def headroom_bytes(self) -> int:
        return self.gpu_memory_bytes - self.memory.total

    def to_dict(self, step_s: float) -> dict[str, Any]:
        return {"gpu_type": self.gpu_type, "gpus": self.gpus, "micro_batch": self.micro_batch,
                "grad_accum": self.grad_accum, "peak_bytes": self.peak_bytes,
                "gpu_memory_bytes": self.gpu_memory_bytes, "headroom_bytes": self.headroom_bytes,
                "phase": self.memory.phase, "micro_batch_s": self.micro_batch_s, "busy_s": self.busy_s,
                "step_share": self.busy_s / step_s if step_s > 0 else 0.0}  # fmt: skip


@dataclass(frozen=True)
class MixedStage:
    """One pipeline stage: blocks ``first_layer`` .. ``last_layer`` (0-based, inclusive), ``tp``, its types."""

    index: int
    first_layer: int
    last_layer: int
    tp: int
    shares: tuple[TypeShare, ...]
    embeddings: bool
    head: bool

    @property
    def layers(self) -> int:
        return self.last_layer - self.first_layer + 1

    @property
    def num_gpus(self) -> int:
        return sum(s.gpus for s in self.shares)

    @property
    def dp(self) -> int:
        return self.num_gpus // self.tp

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.shares)

    @property
    def micro_batch_s(self) -> float:
        return max(s.micro_batch_s for s in self.shares)

    def fqns(self) -> list[str]:
        """torchtitan's module names of this stage (``pipeline_parallel_module_fqns_per_model_part``)."""
        names = ["tok_embeddings"] if self.embeddings else []
        names += [f"layers.{i}" for i in range(self.first_layer, self.last_layer + 1)]
        return names + (["norm", "output"] if self.head else [])

    def to_dict(self, step_s: float) -> dict[str, Any]:
        return {"stage": self.index, "layers": self.layers, "first_layer": self.first_layer,
                "last_layer": self.last_layer, "tp": self.tp, "dp": self.dp, "num_gpus": self.num_gpus,
                "embeddings": self.embeddings, "head": self.head, "peak_bytes": self.peak_bytes,
                "micro_batch_s": self.micro_batch_s, "module_fqns": self.fqns(),
                "types": [s.to_dict(step_s) for s in self.shares]}  # fmt: skip


@dataclass(frozen=True)
class MixedLayout:
    """A mixed plan's layout, memory and step time (``evaluate``)."""

    kind: str  # "data" (one stage, uneven data parallelism) | "pipeline"
    stages: tuple[MixedStage, ...]
    zero_stage: int
    recompute: str
    micro_batches: int  # pipeline: micro-batches per step (every stage); data: the most of any type
    link_s: tuple[float, ...]  # per boundary: seconds of one micro-batch's send + its gradient back
    link_kind: tuple[str, ...]  # per boundary: "intra" | "inter"
    step_time_s: float
    rectangular: bool  # every stage tp x dp alike: plain torch.distributed.pipelining / torchtitan
    notes: tuple[str, ...] = field(default=())

    @property
    def num_gpus(self) -> int:
        return sum(st.num_gpus for st in self.stages)

    @property
    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for st in self.stages:
            for s in st.shares:
                out[s.gpu_type] = out.get(s.gpu_type, 0) + s.gpus
        return out

    @property
    def label(self) -> str:
        """``4x A100-80GB + 16x L4``."""
        return " + ".join(f"{n}x {t}" for t, n in self.gpus_by_type.items())

    @property
    def type_key(self) -> str:
        """The GPU types, sorted and '+'-joined (a plan's ``gpu_type``: one key per combination)."""
        return "+".join(sorted(self.gpus_by_type))

    @property
    def tightest(self) -> TypeShare:
        return min((s for st in self.stages for s in st.shares), key=lambda s: s.headroom_bytes)

    def by_type(self) -> list[dict[str, Any]]:
        """The per-type sub-table: GPUs, layers (pipeline) or micro-batch (data), peak, step share."""
        rows: dict[str, dict[str, Any]] = {}
        for st in self.stages:
            for s in st.shares:
                r = rows.setdefault(s.gpu_type, {"gpu_type": s.gpu_type, "gpus": 0, "layers": 0, "stages": [],
                                                 "micro_batch": [], "grad_accum": [], "peak_bytes": 0,
                                                 "gpu_memory_bytes": s.gpu_memory_bytes, "busy_s": 0.0})  # fmt: skip
                r["gpus"] += s.gpus
                r["layers"] += st.layers if len(self.stages) > 1 else 0
                r["stages"].append(st.index)
                r["micro_batch"].append(s.micro_batch)
                r["grad_accum"].append(s.grad_accum)
                r["peak_bytes"] = max(r["peak_bytes"], s.peak_bytes)
                r["busy_s"] = max(r["busy_s"], s.busy_s)
        for r in rows.values():
            r["micro_batch"] = sorted(set(r["micro_batch"]))
            r["grad_accum"] = sorted(set(r["grad_accum"]))
            r["step_share"] = r["busy_s"] / self.step_time_s if self.step_time_s > 0 else 0.0
        return list(rows.values())

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "num_gpus": self.num_gpus, "gpus_by_type": self.gpus_by_type,
                "zero_stage": self.zero_stage, "recompute": self.recompute, "micro_batches": self.micro_batches,
                "step_time_s": self.step_time_s, "rectangular": self.rectangular,
                "links": [{"after_stage": i, "kind": k, "seconds": s}
                          for i, (k, s) in enumerate(zip(self.link_kind, self.link_s, strict=True))],
                "stages": [st.to_dict(self.step_time_s) for st in self.stages], "by_type": self.by_type(),
                "notes": list(self.notes)}  # fmt: skip


# ---- the request: what to evaluate -------------------------------------------------------------


@dataclass(frozen=True)
class StageRequest:
    """One stage to evaluate: ``layers`` blocks, ``tp``, and (GPU type, GPUs) groups in placement order."""

    layers: int
    groups: tuple[tuple[str, int], ...]
    tp: int = 1


@dataclass(frozen=True)
class PoolLinks:
    """What placement needs of one GPU type: GPUs per node and the links (``marp.plans.GpuPool``'s)."""

    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    inter_node_gbps: float | None = None  # GB/s per GPU; None: the generation's default
    intra_node_link: str | None = None  # "nvlink" | "pcie"; None: the GPU's own


@dataclass(frozen=True)
class _Row:
    """One (layout, stage, type) of an evaluation batch."""

    layout: int
    stage: int
    gpu: GpuType
    gpus: int
    tp: int
    pp: int
    dp: int
    zero: int
    mb: int
    ga: int
    rc: int
    layers: int
    first: bool
    last: bool
    dp_inter: bool
    ring_gbps: float  # the slowest inter-node link of the stage's data-parallel ring
    gpus_per_node: int


def _links_of(links: dict[str, PoolLinks] | None, name: str) -> PoolLinks:
    return (links or {}).get(name) or PoolLinks()


def _inter_gbps(gpu: GpuType, pl: PoolLinks, override: float | None) -> float:
    if override is not None:
        return override
    return pl.inter_node_gbps if pl.inter_node_gbps is not None else R.default_inter_node_gbps(gpu)


def _intra_gbps(gpu: GpuType, pl: PoolLinks) -> float:
    if pl.intra_node_link == "pcie" and gpu.intra_node_link != "pcie":
        return PCIE_GBPS
    return gpu.intra_node_gbps


def _gpu_delta(recipe: TrainingRecipe, gpu: GpuType) -> tuple[int, int]:
    """(runtime reserve, buffers) bytes a GPU type adds to a prediction made with gpu=None: the CUDA
    context of its class and Transformer Engine's larger Hopper workspaces. Both are constant over
    the phases, so adding them afterwards is exact (``memory_for_grid`` with the GPU gives the same)."""
    reserve = runtime_reserve_bytes(gpu, 2) - runtime_reserve_bytes(None, 2)
    te = TE_STREAMS * (32 - 4) * MiB if recipe.megatron_style and gpu.name in HOPPER else 0
    return reserve, te


def _memory_rows(model: ModelSpec, recipe: TrainingRecipe, cols: dict[str, NDArray[Any]],
                 gpus: list[GpuType]) -> dict[str, NDArray[np.int64]]:  # fmt: skip
    """Memory of every row (one call, gpu=None, then each row's GPU type added: ``_gpu_delta``)."""
    grid = LayoutGrid.broadcast(cols["tp"], cols["pp"], cols["dp"], cols["zero"], cols["mb"], cols["ga"], cols["rc"],
                                stage_layers=cols["layers"])  # fmt: skip
    mem = memory_for_stages(model, recipe, grid, None, cols["rank"], cols["first"], cols["last"])
    deltas = np.array([_gpu_delta(recipe, g) for g in gpus], dtype=np.int64).reshape(len(gpus), 2)
    res, te = deltas[cols["gpu"], 0], deltas[cols["gpu"], 1]
    mem["runtime_reserve"] = mem["runtime_reserve"] + res
    mem["buffers"] = mem["buffers"] + te
    mem["total"] = mem["total"] + res + te
    return mem


def _price(shape: StepShape, gpus: list[GpuType], row_gpu: NDArray[np.int64], ring: NDArray[np.float64],
           recipe: TrainingRecipe, mfu: float | None) -> dict[str, NDArray[np.float64]]:  # fmt: skip
    """``StepShape.parts_on`` of each row on its own GPU type (one call per type, over all rows)."""
    n = row_gpu.shape[0]
    out = {k: np.zeros(n) for k in ("micro_batch", "dp", "optimizer")}
    for gi, g in enumerate(gpus):
        sel = row_gpu == gi
        if not sel.any():
            continue
        parts = shape.parts_on(g, recipe.precision, mfu, ring)  # type: ignore[arg-type]
        for k in out:
            out[k] = np.where(sel, parts[k], out[k])
    return out


def _shape(model: ModelSpec, recipe: TrainingRecipe, c: dict[str, NDArray[Any]]) -> StepShape:
    shape = StepShape.of(model, recipe, c["tp"], c["pp"], c["dp"], c["zero"], c["mb"], c["ga"], False,
                         recompute=c["rc"], fp8=recipe.float8, compiled=recipe.compile, layers=c["layers"],
                         first=c["first"], last=c["last"])  # fmt: skip
    rails = np.clip(c["gpn"] // c["tp"], 1, np.maximum(c["dp"], 1)).astype(np.float64)
    return replace(shape, dp_inter=c["dp_inter"], dp_rails=rails)


_INT_COLS = ("tp", "pp", "dp", "zero", "mb", "ga", "rc", "layers", "rank", "gpn", "gpu")


def _columns(rows: list[_Row], gpus: list[GpuType]) -> dict[str, NDArray[Any]]:
    index = {g.name: i for i, g in enumerate(gpus)}
    cols: dict[str, NDArray[Any]] = {
        k: np.array([getattr(r, a) for r in rows], dtype=np.int64)
        for k, a in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("zero", "zero"), ("mb", "mb"), ("ga", "ga"),
                     ("rc", "rc"), ("layers", "layers"), ("rank", "stage"), ("gpn", "gpus_per_node"))
    }  # fmt: skip
    cols["gpu"] = np.array([index[r.gpu.name] for r in rows], dtype=np.int64)
    for k, a in (("first", "first"), ("last", "last"), ("dp_inter", "dp_inter")):
        cols[k] = np.array([getattr(r, a) for r in rows], dtype=bool)
    cols["ring"] = np.array([r.ring_gbps for r in rows], dtype=np.float64)
    return cols


def _concat(blocks: list[dict[str, NDArray[Any]]]) -> dict[str, NDArray[Any]]:
    return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}


# ---- exact evaluation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    stages: tuple[StageRequest, ...]
    micro_batch: dict[str, int]  # per GPU type; every stage's ranks of that type
    grad_accum: dict[str, int]  # per GPU type (pipeline: all equal)
    zero: int
    recompute: str


def _placement(req: _Request, links: dict[str, PoolLinks] | None) -> list[list[tuple[int, int]]]:
    """Per stage, per group: (first node index, last node index) of its GPUs, filling each type's
    nodes in pipeline order (stage 0 first)."""
    cursor: dict[str, int] = {}
    out = []
    for st in req.stages:
        spans = []
        for name, n in st.groups:
            gpn = _links_of(links, name).gpus_per_node
            start = cursor.get(name, 0)
            cursor[name] = start + n
            spans.append((start // gpn, (start + n - 1) // gpn))
        out.append(spans)
    return out


def evaluate(
    model: ModelSpec, recipe: TrainingRecipe, requests: list[_Request], links: dict[str, PoolLinks] | None = None,
    *, mfu: float | None = None, inter_node_gbps: float | None = None,
) -> list[MixedLayout]:  # fmt: skip
    """Memory and step time of mixed layouts (batched: one memory pass, one step-time shape)."""
    rows: list[_Row] = []
    known: dict[str, GpuType] = {}

    def gpu_of(name: str) -> GpuType:
        if name not in known:
            known[name] = get_gpu(name)
        return known[name]

    for li, req in enumerate(requests):
        P = len(req.stages)
        place = _placement(req, links)
        for si, st in enumerate(req.stages):
            dp = sum(n for _, n in st.groups) // st.tp
            types = {name for name, _ in st.groups}
            spans = place[si]
            multi_node = len(types) > 1 or any(a != b for a, b in spans) or len({a for a, _ in spans}) > 1
            ring = min(_inter_gbps(gpu_of(name), _links_of(links, name), inter_node_gbps) for name in types)
            gpn = min(_links_of(links, name).gpus_per_node for name in types)
            for name, n in st.groups:
                gpu = gpu_of(name)
                rows.append(_Row(
                    layout=li, stage=si, gpu=gpu, gpus=n, tp=st.tp, pp=P, dp=dp, zero=req.zero,
                    mb=req.micro_batch[name], ga=req.grad_accum[name], rc=RECOMPUTE.index(req.recompute),
                    layers=st.layers, first=si == 0, last=si == P - 1, dp_inter=multi_node and dp > 1,
                    ring_gbps=ring, gpus_per_node=gpn,
                ))  # fmt: skip
    if not rows:
        return []
    gpus = list({r.gpu.name: r.gpu for r in rows}.values())
    cols = _columns(rows, gpus)
    mem = _memory_rows(model, recipe, cols, gpus)
    parts = _price(_shape(model, recipe, cols), gpus, cols["gpu"], cols["ring"], recipe, mfu)
    e = element_bytes(recipe.policy)
    out: list[MixedLayout] = []
    at = 0
    for req in requests:
        P = len(req.stages)
        place = _placement(req, links)
        first_layer = 0
        stage_rows: list[list[int]] = []
        for st in req.stages:
            stage_rows.append(list(range(at, at + len(st.groups))))
            at += len(st.groups)
        t_mb = [max(float(parts["micro_batch"][i]) for i in idx) for idx in stage_rows]
        tails = [float(parts["dp"][i] + parts["optimizer"][i]) for idx in stage_rows for i in idx]
        link_s, link_kind = [], []
        for si in range(P - 1):
            a, b = req.stages[si], req.stages[si + 1]
            same_node = (len(a.groups) == 1 and len(b.groups) == 1 and a.groups[0][0] == b.groups[0][0]
                         and place[si][0][0] == place[si][0][1] == place[si + 1][0][0] == place[si + 1][0][1])
            mb = max(req.micro_batch[name] for name, _ in (*a.groups, *b.groups))
            nbytes = mb * recipe.seq_len * model.hidden * e
            if same_node:
                gpu = gpu_of(a.groups[0][0])
                bw = _intra_gbps(gpu, _links_of(links, gpu.name)) * 1e9 * R.INTRA_BW_EFF
                link_kind.append("intra")
            else:
                bw = min(_inter_gbps(gpu_of(n), _links_of(links, n), inter_node_gbps)
                         for n, _ in (*a.groups, *b.groups)) * 1e9 * R.INTER_BW_EFF  # fmt: skip
                link_kind.append("inter")
            link_s.append(2.0 * (nbytes / bw + R.P2P_LATENCY_S))
        if P == 1:
            busy = [float(parts["micro_batch"][i]) * rows[i].ga + float(parts["dp"][i] + parts["optimizer"][i])
                    for i in stage_rows[0]]  # fmt: skip
            step = max(busy)
            m = max(rows[i].ga for i in stage_rows[0])
        else:
            m = rows[stage_rows[0][0]].ga
            slow = max([*t_mb, *link_s])
            step = sum(t_mb) + sum(link_s) + (m - 1) * slow + max(tails)
            busy = [m * float(parts["micro_batch"][i]) for idx in stage_rows for i in idx]
        stages = []
        k = 0
        for si, (st, idx) in enumerate(zip(req.stages, stage_rows, strict=True)):
            shares = []
            for (name, n), i in zip(st.groups, idx, strict=True):
                gpu = rows[i].gpu
                shares.append(TypeShare(
                    gpu_type=name, gpus=n, micro_batch=rows[i].mb, grad_accum=rows[i].ga,
                    memory=breakdown_at(mem, i), gpu_memory_bytes=gpu.memory_bytes,
                    micro_batch_s=float(parts["micro_batch"][i]), busy_s=busy[k],
                ))  # fmt: skip
                k += 1
            stages.append(MixedStage(index=si, first_layer=first_layer, last_layer=first_layer + st.layers - 1,
                                     tp=st.tp, shares=tuple(shares), embeddings=si == 0, head=si == P - 1))  # fmt: skip
            first_layer += st.layers
        widths = {(st.tp, st.dp) for st in stages}
        out.append(MixedLayout(
            kind="data" if P == 1 else "pipeline", stages=tuple(stages), zero_stage=req.zero,
            recompute=req.recompute, micro_batches=m, link_s=tuple(link_s), link_kind=tuple(link_kind),
            step_time_s=step, rectangular=P == 1 or (len(widths) == 1 and all(len(st.shares) == 1 for st in stages)),
        ))  # fmt: skip
    return out


def evaluate_stages(
    model: ModelSpec, recipe: TrainingRecipe, stages: list[StageRequest], *,
    local_micro_batch: dict[str, int] | None = None, zero_stage: int = 0, recompute: str = "none",
    links: dict[str, PoolLinks] | None = None, mfu: float | None = None, inter_node_gbps: float | None = None,
) -> MixedLayout:  # fmt: skip
    """An explicit mixed layout (``frenzy predict --stage``): stages in pipeline order, each rank with
    ``recipe.micro_batch`` unless ``local_micro_batch`` names its type. A pipeline runs
    m = B / G micro-batches, G the samples one micro-batch carries through a stage (every stage's
    must agree); one stage over several types balances each type's accumulation count so the ranks
    end together (ZeRO 0-2; under ZeRO-3 all run the same count). Raises InvalidLayoutError naming
    ``layout.stage`` / ``layout.local_micro_batch`` when the layout cannot run the recipe."""
    local = {get_gpu(k).name: v for k, v in (local_micro_batch or {}).items()}
    stages = [replace(st, groups=tuple((get_gpu(n).name, c) for n, c in st.groups)) for st in stages]
    _check_stages(model, recipe, stages, local, zero_stage, recompute)
    names = [n for st in stages for n, _ in st.groups]
    unknown = sorted(set(local) - set(names))
    if unknown:
        raise InvalidLayoutError("layout.local_micro_batch", f"{', '.join(unknown)} runs no stage of this layout.",
                                 "name only the GPU types of the --stage flags.")  # fmt: skip
    base = recipe.micro_batch or 1
    mb = {n: local.get(n, base) for n in names}
    B = recipe.global_batch
    per_stage = [sum((c // st.tp) * mb[n] for n, c in st.groups) for st in stages]
    if len(set(per_stage)) > 1:
        raise InvalidLayoutError(
            "layout.stage", f"the stages carry different samples per micro-batch ({', '.join(map(str, per_stage))}: "
            "data-parallel ranks x micro batch); every stage must process the whole micro-batch.",
            "give the stages widths and --local-micro-batch values whose products agree.")  # fmt: skip
    G = per_stage[0]
    if len(stages) == 1 and len(set(names)) > 1 and zero_stage < 3:
        ga = _balance_fixed(model, recipe, stages[0], mb, zero_stage, recompute, links, mfu, inter_node_gbps)
    else:
        if B % G:
            raise InvalidLayoutError("layout.stage", f"the global batch {B} is not a multiple of the {G} samples "
                                     "one micro-batch carries through a stage.",
                                     "change --global-batch, the widths or --local-micro-batch.")  # fmt: skip
        ga = {n: B // G for n in names}
    req = _Request(tuple(stages), mb, ga, zero_stage, recompute)
    return evaluate(model, recipe, [req], links, mfu=mfu, inter_node_gbps=inter_node_gbps)[0]


def _check_stages(model: ModelSpec, recipe: TrainingRecipe, stages: list[StageRequest], local: dict[str, int],
                  zero: int, recompute: str) -> None:  # fmt: skip
    err = InvalidLayoutError
    if not stages:
        raise err("layout.stage", "give at least one stage.")
    if len(stages) > MAX_STAGES * 4:
        raise err("layout.stage", f"at most {MAX_STAGES * 4} stages, got {len(stages)}.")
    if model.experts or recipe.ep > 1 or recipe.pp_layers is not None:
        raise err("layout.stage", "mixed layouts cover dense models without a --pp-layers split.",
                  "drop --pp-layers (the stages give the split); mixture-of-experts models are not planned mixed yet.")
    if zero not in (0, 1, 2, 3):
        raise err("layout.zero_stage", f"must be 0-3, got {zero}.")
    if recompute not in RECOMPUTE:
        raise err("layout.recompute", f"must be one of {', '.join(RECOMPUTE)}, got {recompute!r}.")
    if len(stages) > 1 and zero > 1:
        raise err("layout.zero_stage", f"pipelined stages run with ZeRO 0 or 1 (Megatron and DeepSpeed do not "
                  f"pipeline sharded gradients or parameters), got {zero}.", "use --zero 0 or 1.")
    if recipe.policy == "fsdp-bf16" and (zero != 3 or len(stages) > 1):
        raise err("layout.stage", "fsdp-bf16 runs one stage with --zero 3 (FSDP under pipeline parallelism is not "
                  "modelled).", "give one --stage and --zero 3, or a master-* policy.")
    total = sum(st.layers for st in stages)
    if total != model.n_layers:
        raise err("layout.stage", f"the stages place {total} layers; {model.name} has {model.n_layers}.",
                  "give layer counts that sum to the model's layers.")
    for i, st in enumerate(stages):
        if st.layers < 1:
            raise err("layout.stage", f"stage {i} has {st.layers} layers; every stage needs at least one.")
        if st.tp < 1 or model.heads % st.tp or model.kv_heads % st.tp:
            raise err("layout.stage", f"stage {i}: tp {st.tp} must divide heads ({model.heads}) and kv_heads "
                      f"({model.kv_heads}).")
        seen = set()
        for name, n in st.groups:
            gpu = get_gpu(name)
            if name in seen:
                raise err("layout.stage", f"stage {i} names {name} twice; give its GPUs once.")
            seen.add(name)
            gpu.check_precision(recipe.precision)
            if recipe.float8:
                gpu.check_fp8()
            if n < 1 or n % st.tp:
                raise err("layout.stage", f"stage {i}: {n} {name} GPUs are not a multiple of tp {st.tp} (a tensor-"
                          "parallel group is one type, inside a node).")
    for name, v in local.items():
        if v < 1:
            raise err("layout.local_micro_batch", f"{name}={v}: must be >= 1.")


def _balance_fixed(model: ModelSpec, recipe: TrainingRecipe, st: StageRequest, mb: dict[str, int], zero: int,
                   recompute: str, links: dict[str, PoolLinks] | None, mfu: float | None,
                   inter_node_gbps: float | None) -> dict[str, int]:  # fmt: skip
    """Per-type accumulation counts of one stage over several types with fixed micro-batches, with
    sum(ranks x micro batch x count) = the global batch, the slowest type's step as short as it gets."""
    names = [n for n, _ in st.groups]
    probe = evaluate(model, recipe, [_Request((st,), mb, dict.fromkeys(names, 1), zero, recompute)], links, mfu=mfu,
                     inter_node_gbps=inter_node_gbps)[0]  # fmt: skip
    t = {s.gpu_type: s.micro_batch_s for s in probe.stages[0].shares}
    tail = {s.gpu_type: s.busy_s - s.micro_batch_s for s in probe.stages[0].shares}
    per = {n: (c // st.tp) * mb[n] for n, c in st.groups}  # samples per micro-step of all ranks of a type
    B = recipe.global_batch
    best: tuple[float, dict[str, int]] | None = None
    # Enumerate the first types' counts up to the whole batch; the last type takes the rest.
    ranges = [range(0, B // per[n] + 1) for n in names[:-1]]
    if math.prod(len(r) for r in ranges) > 200_000:
        raise InvalidLayoutError("layout.stage", "too many GPU types in one stage to balance; give at most three.")
    last = names[-1]
    for counts in itertools.product(*ranges):
        rest = B - sum(c * per[n] for c, n in zip(counts, names, strict=False))
        if rest < 0 or rest % per[last]:
            continue
        ga = dict(zip(names[:-1], counts, strict=True)) | {last: rest // per[last]}
        if any(v < 1 for v in ga.values()):
            continue
        step = max(ga[n] * t[n] + tail[n] for n in names)
        if best is None or step < best[0]:
            best = (step, ga)
    if best is None:
        raise InvalidLayoutError("layout.local_micro_batch", f"no accumulation counts make the global batch {B} "
                                 f"from {', '.join(f'{per[n]} samples of {n}' for n in names)} per micro-step.",
                                 "change --global-batch or --local-micro-batch.")  # fmt: skip
    return best[1]


__all__ = ["MixedLayout", "MixedStage", "PoolLinks", "StageRequest", "TypeShare", "evaluate", "evaluate_stages"]
