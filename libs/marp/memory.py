"""Per-GPU peak training memory of one layout: ``predict_memory`` and its vectorised twin.

The peak is taken over the three phases of a training step (memory-notes D.1: each phase wins
in some configuration), not as a sum of maxima:

* A, forward end + loss: model states, every saved activation of the micro-batches in flight,
  and the loss's logits at their largest (the start of the loss backward);
* B, backward: the activations still saved, the gradients produced so far, and the transients
  of recomputation and of the activation gradients;
* C, optimizer step: model states plus the optimizer's temporaries (foreach AdamW: one
  state-sized buffer of the local shard, memory-notes D.3).

Terms and sources:

* model states by precision policy and optimizer (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1
  and Fig. 1 for the sharding of optimizer states / gradients / parameters over the DP group,
  which includes the context-parallel ranks: dp x cp, as FSDP2 and Megatron shard;
  memory-notes D.2 for the per-policy bytes), sharded over TP by Megatron-LM (Shoeybi et al.
  2019, sec. 3) and over pipeline stages by layers;
* activations per layer from ``marp.activations`` (Korthikanti et al. 2022), divided by TP
  (and fully, with sequence parallelism, eq. 4), by CP (tokens per rank), multiplied by the
  micro-batches in flight on the stage (1F1B: min(pp - rank, m); interleaved 1F1B: Megatron-LM's
  warm-up count (pp - rank - 1) x 2 + (vpp - 1) x pp chunk passes, Narayanan et al. 2021 sec. 2.2);
* logits of the loss, by loss implementation (memory-notes D.5);
* buffers: FSDP / ZeRO-3 gathered parameters and unsharded gradients, PyTorch DDP's gradient
  buckets, autocast's weight copies, Transformer Engine's cuBLAS workspaces;
* allocator: reserved = allocated + the caching allocator's fragmentation of the freed-and-
  reallocated (dynamic) bytes; device (what nvidia-smi shows) = reserved + CUDA context + NCCL.

All arithmetic runs on numpy arrays over a ``LayoutGrid`` (one function per term, in
``marp.memory_terms``, over the sizes of ``marp.sizes``) so the planner evaluates a whole grid of
layouts at once; ``predict_memory`` is the same code on a one-element grid, so the two paths
cannot disagree. This module is the public face: ``predict_memory``, ``memory_grid``,
``MemoryBreakdown``, layout validation, and the sizes' names re-exported for callers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp.activations import layer_coefficients
from marp.errors import InvalidLayoutError, InvalidRecipeError, MarpError
from marp.gpus import GiB, GpuType, get_gpu
from marp.memory_terms import FIELDS, PHASES, STAGES, memory_for_grid
from marp.models import ModelSpec
from marp.recipe import Layout, LayoutGrid, TrainingRecipe, balanced_split, canonical_precision
from marp.sizes import (
    CONTEXT_BYTES,
    CONTEXT_BYTES_DEFAULT,
    FRAGMENTATION,
    HOPPER,
    NCCL_BYTES,
    RECOMPUTE_CODE,
    TE_STREAMS,
    model_state_bytes,
    runtime_reserve_bytes,
    stage_param_counts,
    state_bytes_per_param,
)

# Back-compat: bytes per activation element by the historical precision names.
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes on one GPU at its peak phase, by component.

    ``total`` (= ``device_bytes``) is what nvidia-smi would show: ``peak_allocated`` (live tensors
    at the peak: parameters, gradients, optimizer states, activations, logits, buffers,
    transients) + ``fragmentation`` (= ``reserved_bytes``, what the caching allocator holds) +
    ``runtime_reserve`` (CUDA context, NCCL). ``phase`` names the phase that sets the peak.
    """

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    logits: int
    runtime_reserve: int
    buffers: int = 0
    transient: int = 0
    fragmentation: int = 0
    phase: str = ""

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"MemoryBreakdown.{name} must be a non-negative int, got {value!r}.")
            object.__setattr__(self, name, int(value))
        if self.phase not in ("", *PHASES):
            raise ValueError(f"MemoryBreakdown.phase must be one of {PHASES}, got {self.phase!r}.")

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in FIELDS)

    @property
    def peak_allocated(self) -> int:
        return self.total - self.fragmentation - self.runtime_reserve

    @property
    def reserved(self) -> int:
        return self.peak_allocated + self.fragmentation

    @property
    def device(self) -> int:
        return self.total

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in FIELDS}
        out["total"] = self.total
        out["peak_allocated"] = self.peak_allocated
        out["reserved"] = self.reserved
        out["phase"] = self.phase
        return out


# ---- activations (back-compat helpers over marp.activations) -----------------------------------


def _policy_of(precision: str) -> str:
    policy = canonical_precision(precision)
    return "pure-bf16" if policy.startswith("master-") else policy


def layer_activation_parts(
    model: ModelSpec, seq_len: int, precision: str = "bf16", flash_attention: bool = True,
    dropout: float | None = None,
) -> tuple[float, float]:
    """(replicated, tensor-parallel) activation bytes of one layer for ONE sequence (no recompute)."""
    c = layer_coefficients(model, _policy_of(precision), flash_attention,
                           model.dropout if dropout is None else dropout)  # fmt: skip
    return seq_len * c.rep, seq_len * (c.par + c.dispatch) + seq_len * seq_len * c.score


def layer_activation_bytes(
    model: ModelSpec, seq_len: int, micro_batch: int, precision: str = "bf16",
    flash_attention: bool = True, tp: int = 1,
) -> float:
    """Activation bytes one transformer layer keeps for the backward pass (no recomputation)."""
    rep, par = layer_activation_parts(model, seq_len, precision, flash_attention)
    return micro_batch * (rep + par / tp)


# ---- the public entry points -------------------------------------------------------------------


def check_seq_len(model: ModelSpec, recipe: TrainingRecipe) -> None:
    """Learned position embeddings cannot go past max_positions (RoPE can be extended)."""
    if model.pos_emb == "learned" and recipe.seq_len > model.max_positions:
        raise InvalidRecipeError(
            "recipe.seq_len",
            f"seq_len {recipe.seq_len} exceeds {model.name}'s {model.max_positions} learned positions.",
            f"use seq_len <= {model.max_positions}.",
        )


def memory_grid(
    model: ModelSpec,
    recipe: TrainingRecipe,
    tp: ArrayLike,
    pp: ArrayLike,
    dp: ArrayLike,
    zero_stage: ArrayLike,
    micro_batch: ArrayLike,
    grad_accum: ArrayLike,
    recompute_full: ArrayLike,
    gpu: GpuType | None = None,
    *,
    recompute: ArrayLike | None = None,
    sp: ArrayLike = False,
    cp: ArrayLike = 1,
    vpp: ArrayLike = 1,
    ep: ArrayLike = 1,
    shard: ArrayLike | None = None,
    etp: ArrayLike | None = None,
    stage_layers: ArrayLike = 0,
    chunk_layers: ArrayLike = 0,
    stage: str = "max",
) -> dict[str, NDArray[np.int64]]:
    """Memory terms (int64 arrays: every FIELDS entry, "total", "peak_allocated", "reserved",
    "phase" as an index into PHASES, "stage" 0 first / 1 last) for a grid of layouts.

    Layout arguments broadcast against each other; ``recompute`` (codes of RECOMPUTE_CODE)
    overrides the boolean ``recompute_full``; ``stage_layers`` / ``chunk_layers`` carry an uneven
    pipeline split's maxima (``marp.recipe.split_maxima``; 0: even); ``etp`` None is tp. Each layout must be a valid ``Layout`` (LayoutGrid
    checks); its fit with the model and the recipe is the caller's (predict_memory validates,
    enumerate_plans only generates valid layouts).
    """
    rc = (np.asarray(recompute, dtype=np.int64) if recompute is not None
          else np.where(np.asarray(recompute_full, dtype=bool), RECOMPUTE_CODE["full"], 0))  # fmt: skip
    grid = LayoutGrid.broadcast(tp, pp, dp, zero_stage, micro_batch, grad_accum, rc, sp=sp, cp=cp, vpp=vpp, ep=ep,
                                shard=shard, etp=etp, stage_layers=stage_layers, chunk_layers=chunk_layers)  # fmt: skip
    return memory_for_grid(model, recipe, grid, gpu, stage)


def check_split_covers(model: ModelSpec, split: tuple[int, ...], field: str,
                       err: type[MarpError] = InvalidLayoutError) -> None:  # fmt: skip
    """A pipeline split must place every transformer layer of the model exactly once."""
    if sum(split) != model.n_layers:
        raise err(field, f"the split {','.join(map(str, split))} places {sum(split)} layers; "
                                 f"{model.name} has {model.n_layers}.", "give layer counts that sum to the model's layers.")


def check_pp_split(model: ModelSpec, recipe: TrainingRecipe, layout: Layout) -> None:
    """The layout's split covers the model and is the recipe's, when the recipe fixes one."""
    if recipe.pp_layers is not None and layout.pp_layers != recipe.pp_layers:
        raise InvalidLayoutError("layout.pp_layers", f"the recipe fixes the pipeline split {list(recipe.pp_layers)}, "
                                 f"the layout has {layout.pp_layers}.", "give the layout the recipe's split.")
    if layout.pp_layers is not None:
        check_split_covers(model, layout.pp_layers, "layout.pp_layers")


def validate_layout(model: ModelSpec, recipe: TrainingRecipe, layout: Layout) -> None:
    """Raise InvalidLayoutError / InvalidRecipeError when the layout cannot run the job."""
    check_seq_len(model, recipe)
    if model.heads % layout.tp or model.kv_heads % layout.tp:
        raise InvalidLayoutError(
            "layout.tp",
            f"tp {layout.tp} must divide both heads ({model.heads}) and kv_heads ({model.kv_heads}).",
            "Megatron shards attention by heads; pick a tp that divides both.",
        )
    if layout.pp > model.n_layers:
        raise InvalidLayoutError(
            "layout.pp", f"pp {layout.pp} exceeds the model's {model.n_layers} layers.", "use pp <= n_layers."
        )
    check_pp_split(model, recipe, layout)
    if layout.vpp > 1 and layout.pp_layers is None and model.n_layers % (layout.pp * layout.vpp):
        try:  # uneven virtual stages: torchtitan's / Megatron's balanced split (with_default_split)
            balanced_split(model.n_layers, layout.pp * layout.vpp)
        except ValueError as exc:
            raise InvalidLayoutError("layout.vpp", f"pp {layout.pp} x vpp {layout.vpp}: {exc}",
                                     "use fewer (virtual) pipeline stages.") from None  # fmt: skip
    if layout.vpp > 1 and layout.grad_accum % layout.pp:
        raise InvalidLayoutError(
            "layout.vpp", f"interleaved 1F1B needs the micro-batch count ({layout.grad_accum}) to be a "
            f"multiple of pp ({layout.pp}).", "raise the global batch or lower the micro batch.",
        )
    if layout.samples_per_step != recipe.global_batch:
        raise InvalidLayoutError(
            "layout.grad_accum",
            f"dp {layout.dp} x micro_batch {layout.micro_batch} x grad_accum {layout.grad_accum} = "
            f"{layout.samples_per_step} sequences per step, but the recipe's global batch is {recipe.global_batch}.",
            "choose dp, micro_batch and grad_accum whose product is the global batch.",
        )
    if layout.cp > 1 and not recipe.flash_attention:
        raise InvalidLayoutError("layout.cp", "context parallelism needs flash attention (ring attention).",
                                 "use --attention flash or cp 1.")  # fmt: skip
    if layout.cp > 1 and recipe.seq_len % (2 * layout.cp):
        raise InvalidLayoutError("layout.cp", f"seq_len {recipe.seq_len} must be a multiple of 2 x cp "
                                 f"({2 * layout.cp}) for load-balanced context parallelism.")  # fmt: skip
    if layout.sp and layout.tp == 1:
        raise InvalidLayoutError("layout.sp", "sequence parallelism needs tensor parallelism (tp > 1).",
                                 "drop --sequence-parallel or use tp > 1.")  # fmt: skip
    if layout.ep > 1 and not model.experts:
        raise InvalidLayoutError("layout.ep", f"ep {layout.ep} needs a mixture-of-experts model.", "use ep 1.")
    if model.experts and model.experts % layout.ep:
        raise InvalidLayoutError("layout.ep", f"ep {layout.ep} must divide the {model.experts} experts.")
    if layout.etp is not None and not model.experts:
        raise InvalidLayoutError("layout.etp", f"etp {layout.etp} needs a mixture-of-experts model.",
                                 "leave expert tensor parallelism unset for a dense model.")  # fmt: skip
    if recipe.etp is not None and layout.expert_tp != recipe.etp:
        raise InvalidLayoutError("layout.etp", f"the recipe fixes etp {recipe.etp}, the layout has {layout.expert_tp}.")
    if recipe.policy == "fsdp-bf16" and layout.zero_stage != 3:
        raise InvalidLayoutError("layout.zero_stage", "the fsdp-bf16 policy shards parameters (FSDP2): "
                                 f"it needs zero stage 3, got {layout.zero_stage}.", "use --zero 3.")  # fmt: skip


def with_default_split(model: ModelSpec, layout: Layout) -> Layout:
    """The layout with the split it runs with: interleaved virtual stages that do not divide the
    model's layers get torchtitan's and Megatron's balanced split (``marp.recipe.balanced_split``:
    the embedding and the head count one layer each) where no split is given; else unchanged.
    Before issue 36 such a layout was refused ("pp x vpp that divides them")."""
    if layout.vpp > 1 and layout.pp_layers is None and model.n_layers % (layout.pp * layout.vpp):
        return replace(layout, pp_layers=balanced_split(model.n_layers, layout.pp * layout.vpp))
    return layout


def predict_memory(
    model: ModelSpec, recipe: TrainingRecipe, layout: Layout, gpu: GpuType | str | None = None,
    stage: str = "max",
) -> MemoryBreakdown:
    """Predicted peak training memory of one GPU under ``layout``.

    ``stage`` picks the pipeline stage: "first", "last" or "max" (the worse of the two; middle
    stages lie between). ``gpu`` changes the runtime reserve (None: the default 1 GiB context)
    and Transformer Engine's workspace size; a GPU that cannot run the recipe's precision (V100
    and bf16) is refused. The layout must match the recipe (dp x micro_batch x grad_accum = global
    batch) and the model (tp divides heads and kv_heads, pp <= layers).
    """
    if isinstance(gpu, str):
        gpu = get_gpu(gpu)
    if gpu is not None:
        gpu.check_precision(recipe.precision)
        if recipe.float8:
            gpu.check_fp8()
    validate_layout(model, recipe, layout)
    layout = with_default_split(model, layout)
    return breakdown_at(memory_for_grid(model, recipe, LayoutGrid.of(layout), gpu, stage), 0)


def breakdown_at(grid: dict[str, NDArray[np.int64]], index: int) -> MemoryBreakdown:
    """The MemoryBreakdown of one element of a ``memory_grid`` result."""
    return MemoryBreakdown(**{k: int(grid[k][index]) for k in FIELDS}, phase=PHASES[int(grid["phase"][index])])


def describe(breakdown: MemoryBreakdown) -> dict[str, Any]:
    """Human-friendly GiB view of a breakdown (for logs and the CLI)."""
    return {k: (round(v / GiB, 2) if isinstance(v, int) else v) for k, v in breakdown.to_dict().items()}


__all__ = [
    "CONTEXT_BYTES", "CONTEXT_BYTES_DEFAULT", "ELEMENT_BYTES", "FIELDS", "FRAGMENTATION", "HOPPER",
    "NCCL_BYTES", "PHASES", "RECOMPUTE_CODE", "STAGES", "TE_STREAMS", "MemoryBreakdown", "breakdown_at",
    "check_pp_split", "check_seq_len", "check_split_covers", "layer_activation_bytes", "layer_activation_parts", "memory_for_grid", "memory_grid",
    "model_state_bytes", "predict_memory", "runtime_reserve_bytes", "stage_param_counts",
    "state_bytes_per_param", "validate_layout", "with_default_split",
]  # fmt: skip
