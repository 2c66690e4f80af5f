"""Step-time estimate of one layout (simple first version, used to rank plans).

step time = compute + tensor-parallel communication + data-parallel gradient sync,
with no overlap between them (a conservative simplification). The pieces:

* compute: training FLOPs per token 6N + 12 L h s (Kaplan et al. 2020, sec. 2.1; Narayanan
  et al. 2021 "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", eq. 3 without recomputation) divided by the GPUs' dense peak for the
  recipe precision times an assumed model-FLOPs utilisation (MFU 0.4). Full recomputation
  repeats the forward of the transformer layers: x 4/3 on their FLOPs (Narayanan eq. 3 has
  96 instead of 72). Pipelining adds the 1F1B bubble, x (1 + (p - 1) / m) (Narayanan eq. 1).
* TP: Megatron's f/g operators all-reduce b*s*h activations twice per layer in the forward
  and twice in the backward (Shoeybi et al. 2019, sec. 3), twice more when the forward is
  recomputed; each is a ring all-reduce over the intra-node link.
* DP: a ring all-reduce of the gradients, 2(n - 1)/n x bytes / bandwidth (Patarasuk & Yuan
  2009); ZeRO-1/2 reduce-scatter + all-gather move the same volume, ZeRO-3 1.5x (Rajbhandari
  et al. 2020, sec. 7). Intra-node link when the whole job fits in one node, else an assumed
  inter-node bandwidth (25 GB/s, 200 Gb/s InfiniBand / RoCE per GPU).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp.gpus import GpuType
from marp.memory import ELEMENT_BYTES, stage_param_counts, state_bytes_per_param
from marp.models import ModelSpec
from marp.recipe import Layout, TrainingRecipe

DEFAULT_MFU = 0.4
DEFAULT_INTER_NODE_GBPS = 25.0


def flops_per_token(model: ModelSpec, seq_len: int, recompute_full: bool = False) -> float:
    """Training (forward + backward) FLOPs per token; see the module docstring for sources."""
    layers = 6 * model.n_layers * model.layer_params() + 12 * model.n_layers * model.hidden * seq_len
    head = 6 * model.vocab * model.hidden  # LM head matmul, never recomputed
    return layers * (4 / 3 if recompute_full else 1.0) + head


def _ring_allreduce_s(
    nbytes: NDArray[np.float64], n: NDArray[np.int64], gbps: ArrayLike
) -> NDArray[np.float64]:
    """Ring all-reduce time: each rank sends and receives 2(n - 1)/n of the buffer."""
    return 2.0 * (n - 1) / n * nbytes / (np.asarray(gbps, dtype=np.float64) * 1e9)


def step_time_grid(
    model: ModelSpec,
    recipe: TrainingRecipe,
    gpu: GpuType,
    tp: ArrayLike,
    pp: ArrayLike,
    dp: ArrayLike,
    zero_stage: ArrayLike,
    micro_batch: ArrayLike,
    grad_accum: ArrayLike,
    recompute_full: ArrayLike,
    gpus_per_node: int = 8,
    mfu: float = DEFAULT_MFU,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> NDArray[np.float64]:
    """Estimated seconds per optimizer step for a grid of layouts (arguments broadcast)."""
    tp_, pp_, dp_, zs, mb, ga = np.broadcast_arrays(
        *(np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, zero_stage, micro_batch, grad_accum))
    )
    rc = np.broadcast_to(np.asarray(recompute_full, dtype=bool), tp_.shape)
    n_gpus = tp_ * pp_ * dp_
    peak = gpu.peak_tflops(recipe.precision) * 1e12
    s, h = recipe.seq_len, model.hidden
    e = ELEMENT_BYTES[recipe.precision]

    per_token = np.where(rc, flops_per_token(model, s, True), flops_per_token(model, s, False))
    compute = recipe.tokens_per_step * per_token / (n_gpus * peak * mfu)
    compute = compute * (1.0 + (pp_ - 1) / ga)  # 1F1B pipeline bubble

    layers = -(-model.n_layers // pp_)
    n_allreduce = np.where(rc, 6, 4)  # per layer and micro-batch: 2 fwd + 2 bwd (+ 2 recomputed fwd)
    tp_bytes = (mb * s * h * e).astype(np.float64)
    tp_time = ga * layers * n_allreduce * _ring_allreduce_s(tp_bytes, tp_, gpu.intra_node_gbps)

    first, _last, _layer, _vocab = stage_param_counts(model, tp_, pp_)
    _pb, gb, _ob = state_bytes_per_param(recipe.precision, recipe.optimizer)
    grad_bytes = (first * gb).astype(np.float64) * np.where(zs >= 3, 1.5, 1.0)
    bw = np.where(n_gpus <= gpus_per_node, gpu.intra_node_gbps, inter_node_gbps)
    dp_time = _ring_allreduce_s(grad_bytes, dp_, bw)
    return compute + tp_time + dp_time


def estimate_step_time(
    model: ModelSpec,
    recipe: TrainingRecipe,
    layout: Layout,
    gpu: GpuType,
    gpus_per_node: int = 8,
    mfu: float = DEFAULT_MFU,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> float:
    """Estimated seconds per optimizer step of one layout on ``gpu``."""
    grid = step_time_grid(
        model, recipe, gpu, [layout.tp], [layout.pp], [layout.dp], [layout.zero_stage],
        [layout.micro_batch], [layout.grad_accum], [layout.recompute == "full"],
        gpus_per_node, mfu, inter_node_gbps,
    )  # fmt: skip
    return float(grid[0])


__all__ = [
    "DEFAULT_INTER_NODE_GBPS",
    "DEFAULT_MFU",
    "estimate_step_time",
    "flops_per_token",
    "step_time_grid",
]
