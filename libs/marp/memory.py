"""Per-GPU peak training memory of one layout: ``predict_memory`` and its vectorised twin.

The prediction is a sum of six terms (``MemoryBreakdown``), each from a cited
formula:

* model states -- parameters, gradients, optimizer states -- in bytes per
  parameter of the precision / optimizer policy, sharded over the data-parallel
  group by the ZeRO stage (Rajbhandari et al. 2020, sec. 5, Fig. 1:
  (2 + 2 + K)Psi, K = 12 for mixed-precision Adam), over the tensor-parallel
  group by Megatron-LM (Shoeybi et al. 2019), over pipeline stages by layers;
* activations -- per transformer layer from Korthikanti et al. 2022 ("Reducing
  Activation Recomputation in Large Transformer Models", sec. 4, eq. 1-2),
  generalised to SwiGLU / GQA / RoPE / RMSNorm / flash attention with the
  coefficients measured in /work/shared/reference/memory-notes.md (B.5);
* logits -- the LM head output plus the fp32 log-softmax kept for the loss
  (memory-notes D.5);
* runtime reserve -- CUDA context, cuBLAS workspaces and NCCL buffers.

Assumptions (first version): Megatron-style mixed precision (half-precision
working weights and activations, fp32 master weights inside the optimizer);
tensor parallelism *without* sequence parallelism (the conservative case:
norm and dropout activations are replicated); the 1F1B pipeline schedule; fused
optimizers (no foreach transient); the peak is taken as the sum of the terms at
the end of the forward pass, not as the max over phases.

All arithmetic runs on numpy arrays so the planner evaluates a whole grid of
layouts at once; ``predict_memory`` is the same code on a one-element grid, so
the two paths cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp.errors import InvalidLayoutError, InvalidRecipeError
from marp.gpus import GiB, GpuType, MiB, get_gpu
from marp.models import ModelSpec
from marp.recipe import Layout, TrainingRecipe

FIELDS: tuple[str, ...] = (
    "parameters", "gradients", "optimizer_states", "activations", "logits", "runtime_reserve",
)  # fmt: skip

# Runtime reserve (per GPU). memory-notes D.6: the CUDA context costs 0.3-1.4 GiB as seen by
# nvidia-smi (1343 MiB measured on the HF V100 setup). We reserve 1 GiB for context + cuBLAS /
# cuDNN workspaces on every GPU, the measured 1343 MiB on V100s, and 512 MiB more for NCCL
# communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers, for the TP and DP groups)
# whenever the job spans more than one GPU. Allocator fragmentation is left to the planner's
# safety margin (memory-notes D.6: max_reserved is 2-10 % above max_allocated).
CONTEXT_BYTES_DEFAULT = 1 * GiB
CONTEXT_BYTES: dict[str, int] = {"V100-16GB": 1343 * MiB, "V100-32GB": 1343 * MiB}
NCCL_BYTES = 512 * MiB

# Bytes per activation element: mixed fp16/bf16 keeps activations in half precision
# (Megatron-style), fp32 in single precision.
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted peak bytes on one GPU, by component. ``total`` is their sum."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    logits: int
    runtime_reserve: int

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"MemoryBreakdown.{name} must be a non-negative int, got {value!r}.")
            object.__setattr__(self, name, int(value))

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in FIELDS)

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states

    def to_dict(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in FIELDS}
        out["total"] = self.total
        return out


# ---- model states ------------------------------------------------------------------------------


def state_bytes_per_param(precision: str, optimizer: str) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter, before any sharding.

    ZeRO paper (Rajbhandari et al. 2020, sec. 3.1): mixed-precision Adam keeps fp16 params
    (2) and grads (2) plus fp32 master params, momentum and variance (K = 12): 16 B/param.
    fp32 Adam: params 4, grads 4, momentum + variance 8: also 16. SGD with momentum keeps
    one fp32 buffer: fp32 4 + 4 + 4; mixed 2 + 2 + (4 master + 4 momentum).
    """
    if precision not in ELEMENT_BYTES:
        raise InvalidRecipeError("recipe.precision", f"unknown precision {precision!r}.")
    mixed = precision != "fp32"
    if optimizer in ("adam", "adamw"):
        return (2, 2, 12) if mixed else (4, 4, 8)
    if optimizer == "sgd":
        return (2, 2, 8) if mixed else (4, 4, 4)
    raise InvalidRecipeError("recipe.optimizer", f"unknown optimizer {optimizer!r}.")


def model_state_bytes(
    n_params: int, precision: str, optimizer: str, zero_stage: int, dp: int
) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states) bytes of ``n_params`` on one rank of a dp group.

    ZeRO (Rajbhandari et al. 2020, Fig. 1): stage 1 (P_os) gives 2Psi + 2Psi + K Psi/Nd,
    stage 2 (P_os+g) 2Psi + (2 + K)Psi/Nd, stage 3 (P_os+g+p) (2 + 2 + K)Psi/Nd. Shards round up.
    """
    p, g, o = state_bytes_per_param(precision, optimizer)
    p_div = dp if zero_stage >= 3 else 1
    g_div = dp if zero_stage >= 2 else 1
    o_div = dp if zero_stage >= 1 else 1
    return (-(-n_params * p // p_div), -(-n_params * g // g_div), -(-n_params * o // o_div))


# ---- activations -------------------------------------------------------------------------------


def _norm_activation_coef(model: ModelSpec, e: int) -> int:
    """Bytes per (token x hidden) element kept by one norm *and* the linear it feeds.

    LayerNorm: its input and its output (the next linear's input), e each -- Korthikanti
    sec. 4.1 counts 2sbh + 2sbh per norm. HF RMSNorm upcasts to fp32 and keeps that copy (4)
    plus the normalised half-precision tensor multiplied by the weight (e), then its output
    feeds the linear (e): 4 + 2e, measured in memory-notes B.5 (Llama-style rows).
    """
    if model.norm == "layernorm":
        return 2 * e
    return max(4, e) + 2 * e


def layer_activation_parts(
    model: ModelSpec, seq_len: int, precision: str = "bf16", flash_attention: bool = True
) -> tuple[int, int]:
    """(replicated, tensor-parallel) activation bytes of one transformer layer for ONE sequence
    (micro-batch 1, tp 1). A layer at micro-batch b and TP degree t keeps b(rep + par / t).

    Korthikanti et al. 2022, sec. 4.1 (fp16, GPT, dropout) gives sbh(34 + 5as/h); under TP
    without sequence parallelism sbh(10 + 24/t + 5as/(ht)) (eq. 2). Term by term, with
    e bytes per element, g = kv_heads / heads, f = ffn:
      replicated: 2 norms (input + output, see _norm_activation_coef) + 2 hidden-dropout masks (1 B);
      parallel:   Q, K, V (e(1 + 2g)); attention output fed to the out-projection (e);
                  scores: softmax output e*as/h, plus dropout mask (1) and dropout output (e)
                  when dropout is on -- or, with flash attention (Dao et al. 2022), none of
                  them, only the fp32 log-sum-exp (4a/h);
                  MLP: GeLU input and output (2e f/h; 8 + 8 at f = 4h), or for SwiGLU gate,
                  SiLU(gate), up and their product (4e f/h).
      RoPE (Su et al. 2021) keeps one more copy of the rotated Q and K: e(1 + g) (measured,
      memory-notes B.5: 50.3 sbh for the Llama-style MHA row vs 45.8 with kv = 4).
    For GPT-2 (LayerNorm, GeLU, f = 4h, MHA, dropout) this is exactly 34 + 5as/h without flash
    and 34 + 4a/h (log-sum-exp) with flash.
    """
    s, h, a = seq_len, model.hidden, model.heads
    e = ELEMENT_BYTES[precision]
    kv = model.kv_dim
    dropout = model.dropout > 0.0
    replicated = s * h * (2 * _norm_activation_coef(model, e) + (2 if dropout else 0))
    parallel = s * e * (h + 2 * kv)  # Q, K, V
    if model.pos_emb == "rope":
        parallel += s * e * (h + kv)  # rotated Q and K kept besides the projections
    parallel += s * e * h  # attention output, input of the out-projection
    if flash_attention:
        parallel += 4 * a * s  # fp32 log-sum-exp per (head, query)
    else:
        parallel += e * a * s * s  # softmax output
        if dropout:
            parallel += (1 + e) * a * s * s  # dropout mask + dropout output
    mlp_tensors = 4 if model.mlp == "swiglu" else 2
    parallel += s * mlp_tensors * e * model.ffn
    return replicated, parallel


def layer_activation_bytes(
    model: ModelSpec,
    seq_len: int,
    micro_batch: int,
    precision: str = "bf16",
    flash_attention: bool = True,
    tp: int = 1,
) -> float:
    """Activation bytes one transformer layer keeps for the backward pass (no recomputation)."""
    rep, par = layer_activation_parts(model, seq_len, precision, flash_attention)
    return micro_batch * (rep + par / tp)


# ---- the vectorised kernel ---------------------------------------------------------------------


def _ceil_div(a: NDArray[np.int64], b: NDArray[np.int64]) -> NDArray[np.int64]:
    return -(-a // b)


def runtime_reserve_bytes(gpu: GpuType | None, num_gpus: int) -> int:
    """CUDA context (+ workspaces) per GPU, plus NCCL buffers when the job has several GPUs."""
    context = CONTEXT_BYTES.get(gpu.name, CONTEXT_BYTES_DEFAULT) if gpu is not None else CONTEXT_BYTES_DEFAULT
    return context + (NCCL_BYTES if num_gpus > 1 else 0)


def check_seq_len(model: ModelSpec, recipe: TrainingRecipe) -> None:
    """Learned position embeddings cannot go past max_positions (RoPE can be extended)."""
    if model.pos_emb == "learned" and recipe.seq_len > model.max_positions:
        raise InvalidRecipeError(
            "recipe.seq_len",
            f"seq_len {recipe.seq_len} exceeds {model.name}'s {model.max_positions} learned positions.",
            f"use seq_len <= {model.max_positions}.",
        )


def stage_param_counts(
    model: ModelSpec, tp: ArrayLike, pp: ArrayLike
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Parameters on one TP rank of the first and of the last pipeline stage.

    Returns (first_stage, last_stage, one_layer, vocab_matrix), all per TP rank. Megatron-LM:
    layers split evenly over stages (we give every stage the rounded-up share, the worst case);
    TP shards column/row-parallel weights and replicates norms and row-parallel biases
    (Shoeybi et al. 2019, sec. 3); the embedding and LM head are vocab-parallel, ceil(V / t)
    rows each; learned position embeddings are replicated. With pp = 1 both stages are the
    whole model; with pipelining a tied head keeps its own copy of the word embeddings on the
    last stage (Megatron's shared-embedding all-reduce).
    """
    tp_, pp_ = np.broadcast_arrays(np.asarray(tp, dtype=np.int64), np.asarray(pp, dtype=np.int64))
    sharded, replicated = model.layer_params_split()
    layers = _ceil_div(np.full_like(pp_, model.n_layers), pp_)
    layer_local = _ceil_div(np.full_like(tp_, sharded), tp_) + replicated
    vocab_local = _ceil_div(np.full_like(tp_, model.vocab), tp_) * model.hidden
    single = pp_ == 1
    head_local = np.where(single & model.tied_embeddings, 0, vocab_local)
    embeddings = vocab_local + model.position_params()
    head = head_local + model.norm_params()  # LM head + final norm
    first = layers * layer_local + embeddings + np.where(single, head, 0)
    last = layers * layer_local + head + np.where(single, embeddings, 0)
    return first, last, layer_local, vocab_local


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
) -> dict[str, NDArray[np.int64]]:
    """Memory terms (int64 arrays, one per FIELDS entry plus "total") for a grid of layouts.

    The layout arguments broadcast against each other; the caller guarantees they are valid
    (predict_memory validates, enumerate_plans only generates valid ones).
    """
    tp_, pp_, dp_, zs, mb, ga = (
        np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, zero_stage, micro_batch, grad_accum)
    )
    rc = np.asarray(recompute_full, dtype=bool)
    tp_, pp_, dp_, zs, mb, ga, rc = np.broadcast_arrays(tp_, pp_, dp_, zs, mb, ga, rc)
    s, h = recipe.seq_len, model.hidden
    e = ELEMENT_BYTES[recipe.precision]
    pb, gb, ob = state_bytes_per_param(recipe.precision, recipe.optimizer)

    first_params, last_params, layer_local, vocab_local = stage_param_counts(model, tp_, pp_)
    layers = _ceil_div(np.full_like(pp_, model.n_layers), pp_)
    single = pp_ == 1

    zero3 = (zs >= 3) & (dp_ > 1)
    # ZeRO-3 / FSDP gathers whole modules for compute: the current and the prefetched one in the
    # working precision, plus one module's unsharded gradients before the reduce-scatter
    # (memory-notes D.2, FSDP row). The biggest module is a layer or the vocab matrix.
    gather_unit = np.maximum(layer_local, vocab_local)

    def states(n: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        p = n * pb / np.where(zs >= 3, dp_, 1) + np.where(zero3, 2 * gather_unit * pb, 0)
        g = n * gb / np.where(zs >= 2, dp_, 1) + np.where(zero3, gather_unit * gb, 0)
        o = n * ob / np.where(zs >= 1, dp_, 1)
        return p, g, o

    # -- activations ----------------------------------------------------------------------------
    rep, par = layer_activation_parts(model, s, recipe.precision, recipe.flash_attention)
    layer_full = mb * (rep + par / tp_)  # Korthikanti eq. 2 generalised, per micro-batch
    # Full recomputation keeps only each layer's input (e * sbh, replicated across TP; Korthikanti
    # sec. 4.2: 2sbhL) plus one layer's full activations while that layer is recomputed.
    layer_input = mb * s * h * e
    per_mb_layers = np.where(rc, layers * layer_input, layers * layer_full)
    recompute_extra = np.where(rc, layer_full, 0.0)
    embed_mask = mb * s * h * (1 if model.dropout > 0.0 else 0)  # embedding dropout mask
    final_norm = mb * s * h * _norm_activation_coef(model, e)  # final norm in + out (head input)
    in_flight_first = np.where(single, 1, np.minimum(pp_, ga))
    act_first = in_flight_first * (per_mb_layers + embed_mask) + recompute_extra
    act_first = act_first + np.where(single, final_norm, 0)
    act_last = per_mb_layers + recompute_extra + final_norm + np.where(single, embed_mask, 0)

    # -- logits: b*s*V/t x (e for the logits + 4 for the fp32 log-softmax kept for backward) ---
    # (memory-notes D.5, PyTorch cross-entropy on upcast logits). Only the last stage has them.
    logits = mb * s * _ceil_div(np.full_like(tp_, model.vocab), tp_) * (e + 4)
    logits_first = np.where(single, logits, 0)

    reserve = np.where(tp_ * pp_ * dp_ > 1, runtime_reserve_bytes(gpu, 2), runtime_reserve_bytes(gpu, 1))

    def pack(
        n_params: NDArray[np.int64], act: NDArray[np.float64], lg: NDArray[np.int64]
    ) -> dict[str, NDArray[np.int64]]:
        p, g, o = states(n_params)
        out = {
            "parameters": np.ceil(p), "gradients": np.ceil(g), "optimizer_states": np.ceil(o),
            "activations": np.ceil(act), "logits": np.ceil(lg), "runtime_reserve": reserve,
        }  # fmt: skip
        ints = {k: np.asarray(v).astype(np.int64) for k, v in out.items()}
        ints["total"] = np.sum([ints[k] for k in FIELDS], axis=0, dtype=np.int64)
        return ints

    # Two candidate worst stages: the first (embeddings; min(pp, m) micro-batches in flight under
    # 1F1B, Narayanan et al. 2021 sec. 2.2) and the last (final norm, head, logits; one micro-batch
    # in flight). With pp = 1 both are the whole model and agree.
    first = pack(first_params, act_first, logits_first)
    last = pack(last_params, act_last, logits)
    worst_is_last = last["total"] > first["total"]
    return {k: np.where(worst_is_last, last[k], first[k]) for k in (*FIELDS, "total")}


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
    if layout.samples_per_step != recipe.global_batch:
        raise InvalidLayoutError(
            "layout.grad_accum",
            f"dp {layout.dp} x micro_batch {layout.micro_batch} x grad_accum {layout.grad_accum} = "
            f"{layout.samples_per_step} sequences per step, but the recipe's global batch is {recipe.global_batch}.",
            "choose dp, micro_batch and grad_accum whose product is the global batch.",
        )


def predict_memory(
    model: ModelSpec, recipe: TrainingRecipe, layout: Layout, gpu: GpuType | str | None = None
) -> MemoryBreakdown:
    """Predicted peak training memory of one GPU (the worst pipeline stage) under ``layout``.

    ``gpu`` only changes the runtime reserve (None: the default 1 GiB context). The layout
    must match the recipe (dp x micro_batch x grad_accum = global batch) and the model
    (tp divides heads and kv_heads, pp <= layers).
    """
    if isinstance(gpu, str):
        gpu = get_gpu(gpu)
    validate_layout(model, recipe, layout)
    grid = memory_grid(
        model, recipe, [layout.tp], [layout.pp], [layout.dp], [layout.zero_stage],
        [layout.micro_batch], [layout.grad_accum], [layout.recompute == "full"], gpu,
    )  # fmt: skip
    return MemoryBreakdown(**{k: int(grid[k][0]) for k in FIELDS})


def breakdown_at(grid: dict[str, NDArray[np.int64]], index: int) -> MemoryBreakdown:
    """The MemoryBreakdown of one element of a ``memory_grid`` result."""
    return MemoryBreakdown(**{k: int(grid[k][index]) for k in FIELDS})


def describe(breakdown: MemoryBreakdown) -> dict[str, Any]:
    """Human-friendly GiB view of a breakdown (for logs and the CLI)."""
    return {k: round(v / GiB, 2) for k, v in breakdown.to_dict().items()}


__all__ = [
    "CONTEXT_BYTES", "CONTEXT_BYTES_DEFAULT", "ELEMENT_BYTES", "FIELDS", "NCCL_BYTES",
    "MemoryBreakdown", "breakdown_at", "check_seq_len", "layer_activation_bytes",
    "layer_activation_parts", "memory_grid", "model_state_bytes", "predict_memory",
    "runtime_reserve_bytes", "stage_param_counts", "state_bytes_per_param", "validate_layout",
]  # fmt: skip
