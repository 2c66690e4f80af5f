"""`frenzy predict`'s answers when a job does not fit: what to change, each change checked with MARP.

Single-layout mode (``single_fixes``): from the layout that does not fit, one change at a time
along each way of saving memory -- a higher ZeRO stage, recomputation, a smaller micro batch at
the same global batch, more tensor or pipeline parallelism (on the same GPUs where dp divides by
the factor), a GPU type with more memory -- the least drastic step that fits. When no single
change does, pairs of them.
Ranked mode (``ranked_fixes``): which of the user's own limits (GPU types, --max-gpus,
--micro-batch, no recomputation) kept every plan out, by planning again without each.
Also the single layout's readable table (``single_table``). Pure over MARP: no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

import marp

GiB = 1024**3
MiB = 1024**2
# The recomputation ladder, least recomputed first (op-sac recomputes less than full).
RECOMPUTE_LADDER = ("none", "selective", "op-sac", "full")
MAX_TP = 8  # tensor parallelism stays inside a node (NVLink); 8 GPUs a node
FACTORS = (2, 4, 8)
PAIR_FIXES_SHOWN = 3
# The planner's safety margin (marp.enumerate_plans keeps 5 % of a GPU free): a step that fits only
# without it is offered when nothing roomier does, marked tight.
SAFETY_MARGIN = 0.05


@dataclass(frozen=True)
class Knobs:
    """One candidate: the user's layout with these changes (None / 1: unchanged)."""

    zero: int | None = None
    recompute: str | None = None
    micro_batch: int | None = None
    tp_factor: int = 1
    sp: bool | None = None
    pp_factor: int = 1
    gpu: str | None = None


@dataclass(frozen=True)
class Fix:
    """A checked change: the flags to type and what MARP predicts with them."""

    flags: tuple[str, ...]
    device_bytes: int
    gpu: str
    gpu_memory_bytes: int
    num_gpus: int
    step_time_s: float
    paired: bool = False  # two changes at once (no single one fits)

    def to_dict(self) -> dict[str, Any]:
        return {"flags": " ".join(self.flags), "device_bytes": self.device_bytes, "gpu": self.gpu,
                "gpu_memory_bytes": self.gpu_memory_bytes, "headroom_bytes": self.gpu_memory_bytes - self.device_bytes,
                "num_gpus": self.num_gpus, "step_time_s": self.step_time_s, "paired": self.paired}  # fmt: skip

    @property
    def tight(self) -> bool:
        """Fits, but inside the planner's safety margin."""
        return self.device_bytes > self.gpu_memory_bytes * (1.0 - SAFETY_MARGIN)

    def line(self) -> str:
        free = (self.gpu_memory_bytes - self.device_bytes) / GiB
        tight = f", tight: under the planner's {SAFETY_MARGIN:.0%} margin" if self.tight else ""
        return (f"{' '.join(self.flags)}: {self.device_bytes / GiB:.1f} GiB per GPU on {self.gpu} ({free:.1f} GiB "
                f"free{tight}), {self.num_gpus} GPUs, {self.step_time_s:.3f} s a step")  # fmt: skip


def over_text(device_bytes: int, gpu: marp.GpuType) -> str:
    """``"this layout needs 79.7 GiB per GPU; H100-80GB has 79.6 GiB (87.5 MiB over)"``."""
    over = device_bytes - gpu.memory_bytes
    amount = f"{over / GiB:.1f} GiB" if over >= GiB else f"{over / MiB:.1f} MiB"
    return (f"this layout needs {device_bytes / GiB:.1f} GiB per GPU; {gpu.name} has "
            f"{gpu.memory_bytes / GiB:.1f} GiB ({amount} over)")  # fmt: skip


class _Search:
    """Evaluates candidates around one layout (each at most once)."""

    def __init__(self, spec: marp.ModelSpec, recipe: marp.TrainingRecipe, layout: marp.Layout, gpu: marp.GpuType,
                 stage: str, explicit_global_batch: bool, inter_node_gbps: float | None) -> None:  # fmt: skip
        self.spec, self.recipe, self.layout, self.gpu, self.stage = spec, recipe, layout, gpu, stage
        self.explicit_gb = explicit_global_batch
        self.inter_node_gbps = inter_node_gbps
        self._seen: dict[Knobs, Fix | None] = {}

    def directions(self) -> list[list[Knobs]]:
        """Each way of saving memory, its steps least drastic first."""
        lay, out = self.layout, []
        if lay.dp * lay.cp > 1:  # ZeRO shards over the data-parallel (x context-parallel) group
            out.append([Knobs(zero=z) for z in range(lay.zero_stage + 1, 4)])
        if lay.recompute in RECOMPUTE_LADDER:
            out.append([Knobs(recompute=r) for r in RECOMPUTE_LADDER[RECOMPUTE_LADDER.index(lay.recompute) + 1:]])
        out.append([Knobs(micro_batch=m) for m in range(lay.micro_batch - 1, 0, -1) if lay.micro_batch % m == 0])
        tps = []
        for k in FACTORS:
            if lay.tp * k <= MAX_TP:
                tps.append(Knobs(tp_factor=k))
                if not lay.sp:
                    tps.append(Knobs(tp_factor=k, sp=True))
        out.append(tps)
        if lay.pp_layers is None:  # a given split names its stages: more stages need a new one
            out.append([Knobs(pp_factor=k) for k in FACTORS if lay.pp * k <= self.spec.n_layers])
        bigger = sorted((g for g in marp.list_gpus() if g.memory_bytes > self.gpu.memory_bytes),
                        key=lambda g: (g.memory_bytes, g.name))  # fmt: skip
        out.append([Knobs(gpu=g.name) for g in bigger])
        return [d for d in out if d]

    def check(self, knobs: Knobs) -> Fix | None:
        """The fix these changes make, when valid and it fits; None otherwise."""
        if knobs not in self._seen:
            self._seen[knobs] = self._check(knobs)
        return self._seen[knobs]

    def _check(self, k: Knobs) -> Fix | None:
        lay, recipe = self.layout, self.recipe
        gb = recipe.global_batch
        factor = k.tp_factor * k.pp_factor
        dp = lay.dp // math.gcd(lay.dp, factor)  # the same GPUs where dp gives them up, else more
        mb = k.micro_batch or lay.micro_batch
        if gb % (dp * mb):
            return None
        try:
            gpu = marp.get_gpu(k.gpu) if k.gpu else self.gpu
            rec = replace(recipe, micro_batch=mb) if mb != lay.micro_batch else recipe
            new = replace(lay, zero_stage=lay.zero_stage if k.zero is None else k.zero,
                          recompute=k.recompute or lay.recompute, micro_batch=mb, grad_accum=gb // (dp * mb),
                          tp=lay.tp * k.tp_factor, pp=lay.pp * k.pp_factor, dp=dp,
                          sp=lay.sp if k.sp is None else k.sp)  # fmt: skip
            mem = marp.predict_memory(self.spec, rec, new, gpu, stage=self.stage)
            if mem.device > gpu.memory_bytes:
                return None
            step = marp.estimate_step_time(self.spec, rec, new, gpu, inter_node_gbps=self.inter_node_gbps,
                                           fp8=rec.float8, compiled=rec.compile)  # fmt: skip
        except (marp.MarpError, ValueError):
            return None  # this change is not a layout MARP (or the framework) can run
        return Fix(self._flags(new, gpu), mem.device, gpu.name, gpu.memory_bytes, new.num_gpus, float(step))

    def _flags(self, new: marp.Layout, gpu: marp.GpuType) -> tuple[str, ...]:
        lay, flags = self.layout, []
        for flag, old, value in (("--tp", lay.tp, new.tp), ("--pp", lay.pp, new.pp), ("--dp", lay.dp, new.dp),
                                 ("--zero", lay.zero_stage, new.zero_stage),
                                 ("--micro-batch", lay.micro_batch, new.micro_batch),
                                 ("--recompute", lay.recompute, new.recompute)):  # fmt: skip
            if old != value:
                flags += [flag, str(value)]
        if new.sp and not lay.sp:
            flags.append("--sequence-parallel")
        if gpu.name != self.gpu.name:
            flags += ["--gpu", gpu.name]
        # The global batch defaults to dp x micro batch: name it when that default would change it.
        if not self.explicit_gb and new.dp * new.micro_batch != self.recipe.global_batch:
            flags += ["--global-batch", str(self.recipe.global_batch)]
        return tuple(flags)


def single_fixes(
    spec: marp.ModelSpec, recipe: marp.TrainingRecipe, layout: marp.Layout, gpu: marp.GpuType, stage: str,
    explicit_global_batch: bool, inter_node_gbps: float | None = None,
) -> list[Fix]:  # fmt: skip
    """Checked changes that make a layout that does not fit fit: the least drastic step of each
    way of saving memory that fits on its own (with the planner's margin when one does); when none
    does, the best few pairs (least GPU time a step first). Empty when nothing tried fits."""
    search = _Search(spec, recipe, layout, gpu, stage, explicit_global_batch, inter_node_gbps)
    directions = search.directions()
    fixes = [fix for d in directions if (fix := _pick(search.check(k) for k in d)) is not None]
    if fixes:
        return fixes
    pairs: list[Fix] = []
    for a, b in itertools.combinations(directions, 2):
        combos = sorted(itertools.product(enumerate(a), enumerate(b)), key=lambda p: p[0][0] + p[1][0])
        fix = _pick(search.check(_merge(ka, kb)) for (_, ka), (_, kb) in combos)
        if fix is not None:
            pairs.append(replace(fix, paired=True))
    pairs.sort(key=lambda f: (f.step_time_s * f.num_gpus, len(f.flags)))
    return pairs[:PAIR_FIXES_SHOWN]


def _pick(fixes: Iterable[Fix | None]) -> Fix | None:
    """The first (least drastic) fix with the planner's margin, else the first that fits at all."""
    fitting = [f for f in fixes if f is not None]
    return next((f for f in fitting if not f.tight), fitting[0] if fitting else None)


def _merge(a: Knobs, b: Knobs) -> Knobs:
    """Two changes along different directions (each sets fields the other leaves alone)."""
    return Knobs(zero=a.zero if a.zero is not None else b.zero, recompute=a.recompute or b.recompute,
                 micro_batch=a.micro_batch or b.micro_batch, tp_factor=a.tp_factor * b.tp_factor,
                 sp=a.sp if a.sp is not None else b.sp, pp_factor=a.pp_factor * b.pp_factor,
                 gpu=a.gpu or b.gpu)  # fmt: skip


def single_fix_text(device_bytes: int, gpu: marp.GpuType, fixes: list[Fix]) -> str:
    """The error of a layout that does not fit: by how much, then "To fix:" with the checked changes."""
    head = over_text(device_bytes, gpu) + "."
    if not fixes:
        return (f"{head}\nTo fix: no single change or pair of changes tried here fits (ZeRO stage, --recompute, "
                "--micro-batch, --tp, --pp, --gpu); drop the layout flags (--dp/--tp/--pp/--zero/--gpu) and give "
                "--global-batch to see the ranked plans that fit, or lower --seq-len.")  # fmt: skip
    paired = any(f.paired for f in fixes)
    how = "no single change fits; each of these pairs does" if paired else "any one of these changes fits"
    lines = "\n".join(f"  {f.line()}" for f in fixes)
    return f"{head}\nTo fix: {how} (each checked with MARP; add to the command):\n{lines}"


def single_table(prediction: dict[str, Any]) -> Group:
    """The single-layout prediction as a person reads it: the memory terms that add up to the
    device total, and the step time."""
    p, lay, rec = prediction, prediction["layout"], prediction["recipe"]
    b = p["breakdown"]
    head = Text.assemble(
        (p["model"], "bold"), f" ({p['parameters'] / 1e9:.2f} B parameters) on {lay['num_gpus']} x {p['gpu']}: "
        f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']}" + (f" cp {lay['cp']}" if lay["cp"] > 1 else "")
        + (f" vpp {lay['vpp']}" if lay["vpp"] > 1 else "") + (" sp" if lay["sp"] else "")
        + f", ZeRO {lay['zero_stage']}, micro batch {lay['micro_batch']} x {lay['grad_accum']} accumulated, "
        f"recompute {lay['recompute']}; seq {rec['seq_len']}, global batch {rec['global_batch']}, "
        f"{rec['precision']}, {rec['optimizer']}",
    )  # fmt: skip
    where = f"pipeline stage {p['stage']}, " if lay["pp"] > 1 else ""
    table = Table(title=f"Memory per GPU ({where}peak in {p['phase']})", title_justify="left")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    table.add_column("bytes", justify="right")

    def row(name: str, value: int, bold: bool = False) -> None:
        cells = (name, f"{value / GiB:.2f}", f"{value:,}")
        table.add_row(*(f"[bold]{c}[/]" for c in cells) if bold else cells)

    for name in ("parameters", "gradients", "optimizer_states", "activations", "logits", "buffers", "transient"):
        row(name.replace("_", " "), b.get(name, 0))
    extra = sorted(set(b) - {"parameters", "gradients", "optimizer_states", "activations", "logits", "buffers",
                             "transient", "fragmentation", "runtime_reserve"})  # fmt: skip
    for name in extra:  # a term MARP adds later still shows (the JSON's breakdown is the contract)
        row(name.replace("_", " "), b[name])
    row("peak allocated (live tensors)", p["peak_allocated_bytes"], bold=True)
    row("allocator fragmentation", b.get("fragmentation", 0))
    row("peak reserved (torch.cuda.max_memory_reserved)", p["reserved_bytes"], bold=True)
    row("runtime reserve (CUDA context, NCCL)", b.get("runtime_reserve", 0))
    row("device total (nvidia-smi)", p["device_bytes"], bold=True)
    row(f"{p['gpu']} memory", p["gpu_memory_bytes"])
    row("headroom" if p["headroom_bytes"] >= 0 else "over by", abs(p["headroom_bytes"]))
    verdict = Text("fits", "green") if p["fits"] else Text("does not fit", "bold red")
    tail = Text.assemble(verdict, f"; step {p['step_time_s']:.3f} s, {p['tokens_per_s']:,.0f} tokens/s "
                                  "(--json for the full prediction)")  # fmt: skip
    return Group(head, table, tail)


def mixed_table(mixed: dict[str, Any], title: str, by_type: bool = True) -> Table:
    """A mixed plan's sub-table (``marp.mixed.MixedLayout.to_dict``): per GPU type its GPUs, layers
    (pipeline) or micro batch x accumulation (one stage), peak GiB and share of the step it computes;
    ``by_type`` False: one row per stage and type, in pipeline order, with the links after it."""
    table = Table(title=f"{title}: step {mixed['step_time_s']:.3f} s, {mixed['kind']}", title_justify="left")
    if by_type:
        for col, just in (("GPU", "left"), ("GPUs", "right"), ("stages", "right"), ("layers", "right"),
                          ("micro batch x accum", "right"), ("peak GiB", "right"), ("of GiB", "right"),
                          ("step share", "right")):  # fmt: skip
            table.add_column(col, justify=just)
        for r in mixed["by_type"]:
            stages = r["stages"]
            table.add_row(r["gpu_type"], str(r["gpus"]), f"{min(stages)}-{max(stages)}" if len(stages) > 1
                          else str(stages[0]), str(r["layers"]) if mixed["kind"] == "pipeline" else "all",
                          "/".join(map(str, r["micro_batch"])) + " x " + "/".join(map(str, r["grad_accum"])),
                          f"{r['peak_bytes'] / GiB:.1f}", f"{r['gpu_memory_bytes'] / GiB:.1f}",
                          f"{r['step_share']:.0%}")  # fmt: skip
        return table
    for col, just in (("stage", "right"), ("layers", "right"), ("GPU", "left"), ("GPUs", "right"), ("TP", "right"),
                      ("DP", "right"), ("micro batch x accum", "right"), ("peak GiB", "right"), ("of GiB", "right"),
                      ("micro-batch s", "right"), ("link after", "left")):  # fmt: skip
        table.add_column(col, justify=just)
    links = {link["after_stage"]: link for link in mixed["links"]}
    for st in mixed["stages"]:
        for k, t in enumerate(st["types"]):
            link = links.get(st["stage"]) if k == len(st["types"]) - 1 else None
            marks = ("emb " if st["embeddings"] else "") + ("head" if st["head"] else "")
            table.add_row(str(st["stage"]), f"{st['layers']} ({st['first_layer']}-{st['last_layer']}) {marks}".strip(),
                          t["gpu_type"], str(t["gpus"]), str(st["tp"]), str(st["dp"]),
                          f"{t['micro_batch']} x {t['grad_accum']}", f"{t['peak_bytes'] / GiB:.1f}",
                          f"{t['gpu_memory_bytes'] / GiB:.1f}", f"{t['micro_batch_s']:.3f}",
                          f"{link['kind']} {link['seconds'] * 1e3:.1f} ms" if link else "")  # fmt: skip
    return table


def ranked_fixes(attempt: Callable[[dict[str, Any]], str | None], *, restricted_types: str | None,
                 max_gpus: int, micro_batch: int, recompute_forbidden: bool, seq_len: int) -> list[str]:  # fmt: skip
    """Which of the user's limits kept every plan out: ``attempt(overrides)`` plans again with
    ``{"all_gpu_types": True}``, ``{"max_gpus": 0}``, ``{"micro_batch": 0}``,
    ``{"allow_recompute": True}`` or ``{"seq_len": n}`` and names the best plan, or None.
    ``restricted_types`` is the flag that chose the GPU types (``--gpu-type``/``--cluster``), if any."""
    relax: list[tuple[str, dict[str, Any]]] = []
    if restricted_types:
        relax.append((f"drop {restricted_types} (plan over every GPU type)", {"all_gpu_types": True}))
    if max_gpus:
        relax.append(("drop --max-gpus", {"max_gpus": 0}))
    if micro_batch:
        relax.append(("--micro-batch 0 (the planner chooses)", {"micro_batch": 0}))
    if recompute_forbidden:
        relax.append(("allow recomputation (drop --no-recompute / --recompute none)", {"allow_recompute": True}))
    found: list[str] = []
    for size in range(1, len(relax) + 1):  # the fewest limits to lift first
        for subset in itertools.combinations(relax, size):
            overrides = {k: v for _, ov in subset for k, v in ov.items()}
            if (best := _try(attempt, overrides)) is not None:
                found.append(f"{' and '.join(label for label, _ in subset)}: {best}")
        if found:
            return found
    every = {k: v for _, ov in relax for k, v in ov.items()}
    shorter = seq_len // 2
    while shorter >= 128 and not found:  # the job itself is too big: a shorter sequence changes it, so last
        if (best := _try(attempt, {**every, "seq_len": shorter})) is not None:
            found.append(" and ".join([f"--seq-len {shorter}", *(label for label, _ in relax)]) + f": {best}")
        shorter //= 2
    return found


def _try(attempt: Callable[[dict[str, Any]], str | None], overrides: dict[str, Any]) -> str | None:
    try:
        return attempt(overrides)
    except (marp.MarpError, ValueError):
        return None


def ranked_fix_text(found: list[str]) -> str:
    if not found:
        return ("To fix: nothing tried here fits (every GPU type, no GPU limit, the planner's micro batch, "
                "recomputation, down to --seq-len 128): the model's own states outgrow every plan; train "
                "adapters instead (--finetune lora or qlora) or plan for a cluster with more GPUs.")  # fmt: skip
    return ("To fix: any one of these is enough (each checked with MARP; the best plan it gets):\n"
            + "\n".join(f"  {line}" for line in found))  # fmt: skip


def plan_text(gpu_type: str, num_gpus: int, tp: int, pp: int, dp: int, zero: int, micro_batch: int,
              recompute: str) -> str:  # fmt: skip
    rc = f" recompute {recompute}" if recompute and recompute != "none" else ""
    return f"{num_gpus} x {gpu_type} (tp {tp} pp {pp} dp {dp}, ZeRO {zero}, micro batch {micro_batch}{rc})"


__all__ = ["Fix", "mixed_table", "over_text", "plan_text", "ranked_fix_text", "ranked_fixes", "single_fix_text", "single_fixes",
           "single_table"]
