"""Step-time model: seconds per optimizer step of a layout, for ranking plans.

* Compute. Training FLOPs per token = 6 x (active) parameters in matmuls + 12 x layers x hidden
  x seq_len for the attention scores (Kaplan et al. 2020, sec. 2.1; Narayanan et al. 2021, eq. 3,
  which also gives the x 4/3 on the layers' FLOPs for full recomputation: 96 instead of 72).
  Selective recompute repeats only the attention-score FLOPs.
* Sustained throughput per GPU type: not the datasheet peak but measured training speed. The
  A100 anchor runs at 50 % of its 312 TFLOPS dense bf16 peak (Narayanan et al. 2021, Table 1:
  44-52 % for GPT models on A100s); every other type is the anchor times its measured speed
  ratio to an A100-80GB-SXM in Lambda's PyTorch BERT-large fp16 training benchmark
  (github.com/lambdal/deeplearning-benchmark @ aa5addb, pytorch-train-throughput-fp16.csv, as
  quoted in ../shared/reference/schedulers.md sec. 7.1): V100 0.38, A10 0.28, RTX 4090 0.61,
  A100 80GB SXM 1.00, H100 SXM 2.05, H200 2.31. T4 from Sia's measured BERT profiles (A100 40GB
  is 4.5-5.2x a T4, schedulers.md sec. 7.2: 0.21). Types with no published measurement (A10G,
  L4, L40S) use their peak ratio to the A100 times the A10's measured-to-peak efficiency
  (0.28 / (125 / 312) = 0.70), the nearest PCIe data-centre part. fp32 runs at 50 % of the
  fp32 peak. An explicit ``mfu`` overrides all this with peak x mfu.
* TP: Megatron's f/g operators all-reduce b x s x h activations twice per layer in the forward
  and twice in the backward (Shoeybi et al. 2019, sec. 3; sequence parallelism replaces each by
  an all-gather + reduce-scatter of the same volume, Korthikanti et al. 2022 sec. 4.2.2), twice
  more when the forward is recomputed; ring all-reduces over the intra-node link.
* DP: ring all-reduce of the gradients (Patarasuk & Yuan 2009) in the alpha-beta-gamma form
  2(n-1) alpha + 2(n-1)/n B / beta + (n-1)/n B gamma (Thakur et al. 2005), with GenModel's incast
  term for reductions that cross nodes: when k nodes send into one NIC at once the receiver is the
  bottleneck; we charge (k-1)/k x B/n x INCAST per extra node-level hop (an assumption, not
  calibrated). ZeRO-1/2 reduce-scatter + all-gather move the same volume, ZeRO-3 1.5x
  (Rajbhandari et al. 2020, sec. 7). Intra-node link when the DP group fits in one node, else
  the inter-node bandwidth. Gradients travel in the policy's gradient dtype (fp32 for master-*).
* PP: the (interleaved) 1F1B bubble, x (1 + (p - 1) / (m v)) (Narayanan et al. 2021, eq. 1 and
  sec. 2.2.2), plus point-to-point sends of b x s x h activations between stages.
Ignored: overlap of communication with compute (so times are upper bounds), context-parallel
ring exchanges (overlapped with attention), kernel-launch overheads, stragglers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp.activations import element_bytes
from marp.gpus import GpuType
from marp.models import ModelSpec
from marp.recipe import Layout, TrainingRecipe, compute_dtype
from marp.sizes import RECOMPUTE_CODE, stage_param_counts, state_bytes_per_param

DEFAULT_MFU = 0.4  # historical constant; None (the default of the functions) means "calibrated"
DEFAULT_INTER_NODE_GBPS = 25.0  # 200 Gb/s InfiniBand / RoCE per GPU
ANCHOR_MFU = 0.5
ANCHOR_PEAK_TFLOPS = 312.0  # A100 dense bf16
ALPHA_INTRA_S = 5e-6  # NCCL per-step latency inside a node (NVLink / PCIe)
ALPHA_INTER_S = 15e-6  # ... and across nodes (InfiniBand)
INCAST = 0.1
SPEED_VS_A100: dict[str, float] = {
    "V100-16GB": 0.38, "V100-32GB": 0.38, "A10": 0.28, "RTX-4090": 0.61, "A100-40GB": 1.00,
    "A100-80GB": 1.00, "H100-80GB": 2.05, "H200": 2.31, "T4": 0.21,
}  # fmt: skip
PCIE_EFFICIENCY = 0.28 / (125.0 / 312.0)


def sustained_flops(gpu: GpuType, precision: str, mfu: float | None = None) -> float:
    """Sustained training FLOP/s of one GPU for a precision policy (see the module docstring).

    A GPU that cannot run the policy's matmul dtype (V100 and bf16) is refused
    (UnsupportedPrecisionError naming both) rather than given zero speed.
    """
    gpu.check_precision(precision)
    dtype = compute_dtype(precision)
    if mfu is not None:
        return gpu.peak_tflops(precision) * 1e12 * mfu
    if dtype == "fp32":
        return gpu.fp32_tflops * 1e12 * ANCHOR_MFU
    ratio = SPEED_VS_A100.get(gpu.name)
    if ratio is None:
        ratio = gpu.peak_tflops(precision) / ANCHOR_PEAK_TFLOPS * PCIE_EFFICIENCY
    return ANCHOR_PEAK_TFLOPS * 1e12 * ANCHOR_MFU * ratio


def flops_per_token(model: ModelSpec, seq_len: int, recompute_full: bool = False) -> float:
    """Training (forward + backward) FLOPs per token; see the module docstring for sources."""
    dense = 6 * model.n_layers * model.active_layer_params()
    attn = 12 * model.n_layers * model.hidden * seq_len
    head = 6 * model.vocab * model.hidden if model.head == "lm" else 0  # LM head matmul, never recomputed
    return (dense + attn) * (4 / 3 if recompute_full else 1.0) + head


def _ring_allreduce_s(
    nbytes: NDArray[np.float64], n: NDArray[np.int64], gbps: ArrayLike, alpha: ArrayLike = 0.0
) -> NDArray[np.float64]:
    """Ring all-reduce: 2(n-1) latency steps; each rank sends and receives 2(n-1)/n of the buffer."""
    n_f = n.astype(np.float64)
    return np.where(n > 1, 2.0 * (n_f - 1) * np.asarray(alpha)
                    + 2.0 * (n_f - 1) / n_f * nbytes / (np.asarray(gbps, dtype=np.float64) * 1e9), 0.0)  # fmt: skip


@dataclass(frozen=True)
class StepShape:
    """The GPU-independent part of the step time of a grid of layouts: FLOPs, bytes and group sizes.

    ``step_time_grid`` is ``StepShape.of(...)`` priced on one GPU type (``seconds_on``); the
    planner builds the shape once per layout grid and prices it on every GPU type.
    """

    flop: NDArray[np.float64]  # FLOPs one GPU runs per step, bubble included
    tp_n: NDArray[np.int64]
    tp_bytes: NDArray[np.float64]  # one TP collective's buffer
    tp_count: NDArray[np.float64]  # TP collectives per step
    p2p_bytes: NDArray[np.float64]  # pipeline sends per step (0 without PP)
    p2p_inter: NDArray[np.bool_]  # ... across nodes
    dp_n: NDArray[np.int64]
    grad_bytes: NDArray[np.float64]
    dp_inter: NDArray[np.bool_]  # the DP group spans nodes
    nodes: NDArray[np.float64]

    @classmethod
    def of(
        cls, model: ModelSpec, recipe: TrainingRecipe, tp: ArrayLike, pp: ArrayLike, dp: ArrayLike,
        zero_stage: ArrayLike, micro_batch: ArrayLike, grad_accum: ArrayLike, recompute_full: ArrayLike,
        gpus_per_node: int = 8, *, recompute: ArrayLike | None = None, cp: ArrayLike = 1, vpp: ArrayLike = 1,
    ) -> StepShape:
        rc_in = (np.asarray(recompute, dtype=np.int64) if recompute is not None
                 else np.where(np.asarray(recompute_full, dtype=bool), RECOMPUTE_CODE["full"], 0))  # fmt: skip
        tp_, pp_, dp_, zs, mb, ga, rc, cp_, vpp_ = np.broadcast_arrays(
            *(np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, zero_stage, micro_batch, grad_accum, rc_in, cp, vpp))
        )
        n_gpus = tp_ * pp_ * dp_ * cp_
        s, h = recipe.seq_len, model.hidden
        e = element_bytes(recipe.policy)
        full = rc == RECOMPUTE_CODE["full"]
        selective = rc == RECOMPUTE_CODE["selective"]
        sac = rc == RECOMPUTE_CODE["op-sac"]

        per_token = np.where(full | sac, flops_per_token(model, s, True), flops_per_token(model, s, False))
        per_token = per_token + np.where(selective, 4 * model.n_layers * model.hidden * s, 0.0)
        flop = recipe.tokens_per_step * per_token / n_gpus
        flop = flop * (1.0 + (pp_ - 1) / (ga * vpp_))  # (interleaved) 1F1B bubble

        layers = -(-model.n_layers // pp_)
        n_collectives = np.where(full | sac, 6, 4)  # per layer and micro-batch: 2 fwd + 2 bwd (+ 2 recomputed)
        tp_bytes = (mb * s / cp_ * h * e).astype(np.float64)
        p2p_bytes = np.where(pp_ > 1, 2.0 * ga * vpp_ * tp_bytes / tp_, 0.0)

        first, _last, _layer, _vocab = stage_param_counts(model, tp_, pp_)
        _pb, gb, _ob = state_bytes_per_param(recipe.policy, recipe.optimizer)
        trainable = first if recipe.finetune == "full" else first * 0.01  # adapters: a sliver of the model
        grad_bytes = (trainable * gb).astype(np.float64) * np.where(zs >= 3, 1.5, 1.0)
        return cls(
            flop=flop, tp_n=tp_, tp_bytes=tp_bytes, tp_count=(ga * layers * n_collectives).astype(np.float64),
            p2p_bytes=p2p_bytes, p2p_inter=n_gpus > gpus_per_node, dp_n=dp_, grad_bytes=grad_bytes,
            dp_inter=tp_ * dp_ * cp_ > gpus_per_node, nodes=np.maximum(np.ceil(n_gpus / gpus_per_node), 1),
        )  # fmt: skip

    def seconds_on(
        self, gpu: GpuType, precision: str, mfu: float | None = None, inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
    ) -> NDArray[np.float64]:
        """Seconds per optimizer step of every layout of the shape on ``gpu``."""
        compute = self.flop / sustained_flops(gpu, precision, mfu)
        tp_time = self.tp_count * _ring_allreduce_s(self.tp_bytes, self.tp_n, gpu.intra_node_gbps, ALPHA_INTRA_S)
        p2p = self.p2p_bytes / (np.where(self.p2p_inter, inter_node_gbps, gpu.intra_node_gbps) * 1e9)
        dp_, grad_bytes = self.dp_n, self.grad_bytes
        bw = np.where(self.dp_inter, inter_node_gbps, gpu.intra_node_gbps)
        alpha = np.where(self.dp_inter, ALPHA_INTER_S, ALPHA_INTRA_S)
        dp_time = _ring_allreduce_s(grad_bytes, dp_, bw, alpha)
        # gamma: the reduction reads two buffers and writes one per received chunk (memory-access term)
        dp_time = dp_time + np.where(dp_ > 1, (dp_ - 1) / dp_ * grad_bytes * 3 / (gpu.mem_bw_gbps * 1e9), 0.0)
        nodes = self.nodes
        dp_time = dp_time + np.where(self.dp_inter, INCAST * (nodes - 1) / nodes * grad_bytes / dp_
                                     / (inter_node_gbps * 1e9), 0.0)  # fmt: skip
        return compute + tp_time + p2p + dp_time


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
    mfu: float | None = None,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
    *,
    recompute: ArrayLike | None = None,
    sp: ArrayLike = False,
    cp: ArrayLike = 1,
    vpp: ArrayLike = 1,
) -> NDArray[np.float64]:
    """Estimated seconds per optimizer step for a grid of layouts (arguments broadcast)."""
    shape = StepShape.of(model, recipe, tp, pp, dp, zero_stage, micro_batch, grad_accum, recompute_full,
                         gpus_per_node, recompute=recompute, cp=cp, vpp=vpp)  # fmt: skip
    return shape.seconds_on(gpu, recipe.precision, mfu, inter_node_gbps)


def estimate_step_time(
    model: ModelSpec,
    recipe: TrainingRecipe,
    layout: Layout,
    gpu: GpuType,
    gpus_per_node: int = 8,
    mfu: float | None = None,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> float:
    """Estimated seconds per optimizer step of one layout on ``gpu``."""
    grid = step_time_grid(
        model, recipe, gpu, [layout.tp], [layout.pp], [layout.dp], [layout.zero_stage],
        [layout.micro_batch], [layout.grad_accum], [False], gpus_per_node, mfu, inter_node_gbps,
        recompute=[RECOMPUTE_CODE[layout.recompute]], sp=[layout.sp], cp=[layout.cp], vpp=[layout.vpp],
    )  # fmt: skip
    return float(grid[0])


__all__ = [
    "ANCHOR_MFU", "DEFAULT_INTER_NODE_GBPS", "DEFAULT_MFU", "SPEED_VS_A100", "StepShape", "estimate_step_time",
    "flops_per_token", "step_time_grid", "sustained_flops",
]  # fmt: skip
