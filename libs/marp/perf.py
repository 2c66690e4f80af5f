"""Step-time model: seconds per optimizer step of a layout, for ranking plans.

A step is priced per GPU on the bottleneck pipeline stage (the last: it also runs the LM head),
one micro-batch at a time, then assembled (docs/marp.md, "Speed model"):

* Matmuls: 6 x (active) layer parameters per token, 2 forward + 4 backward (Kaplan et al. 2020,
  sec. 2.1), split over TP; the LM head 6 V h. Recomputation repeats forward matmuls: full all of
  them (x 8/6; Narayanan et al. 2021, eq. 3), op-SAC every other one (x 7/6), selective only the
  attention core (Korthikanti et al. 2022, sec. 5). Priced at the GPU's achievable GEMM rate
  (``marp.perf_rates.MATMUL_EFF``), float8 at ``FP8_MATMUL_EFF`` of the fp8 peak.
* Attention: causal flash attention, 2 s^2 h per layer forward and 2.5x that backward (the
  forward's two matmuls, the backward's five), split over TP and CP, at the GPU's flash rate;
  eager attention runs the full s^2 score matmuls at the GEMM rate plus the softmax traffic.
* Memory-bound work: norms, residuals, activations, casts and the fp32 cross-entropy as bytes
  through HBM (``ELEM_PASSES_*``), at 80 % of the datasheet bandwidth.
* Launch floor: a micro-batch takes at least its kernels' CPU launch time (small models).
* TP: 8 collectives of b s h bytes per layer and micro-batch (2 forward + 2 backward all-reduces,
  or SP's all-gather / reduce-scatter pairs, Shoeybi et al. 2019 sec. 3, Korthikanti et al. 2022
  sec. 4.2.2), 12 with full recompute, on the critical path over the intra-node link.
* CP: ring attention passes K and V around the cp ranks (Liu et al. 2023, Ring Attention), 3 x
  (cp - 1) chunks per layer forward + backward, hidden behind the attention compute.
* FSDP (ZeRO-3): per micro-batch an all-gather of the stage's parameters in the forward, again in
  the backward, and a reduce-scatter of the gradients (Zhao et al. 2023), overlapped with the
  micro-batch's compute (``OVERLAP``); the first layer's gather and the last reduce stay exposed.
* DP (ZeRO 0-2): the gradient all-reduce (or reduce-scatter + parameter all-gather, the same
  volume; Rajbhandari et al. 2020 sec. 7) once per step, overlapped with the last micro-batch's
  backward (and the gather with the next forward).
* PP: the (interleaved) 1F1B bubble, (p - 1) / v extra micro-batch slots (Narayanan et al. 2021,
  eq. 1 and sec. 2.2.2), plus a send latency per micro-batch and chunk.
* Fixed: optimizer step (Adam's state traffic over the local parameters) and a per-step constant.

Collectives are rings: (n-1)/n of the buffer per rank and direction for an all-gather or a
reduce-scatter, twice that for an all-reduce (Patarasuk & Yuan 2009), at NCCL's bus bandwidth
(``INTRA_BW_EFF`` of NVLink / PCIe, ``INTER_BW_EFF`` of the NIC) with a per-hop latency. The
inter-node bandwidth per GPU defaults to the GPU generation's reference cluster
(``marp.perf_rates.default_inter_node_gbps``: 50 GB/s for H100/H200/B200, 25 for A100) and is
overridden by the cluster file or ``--inter-node-gbps``. An explicit ``mfu`` replaces the
compute model by model FLOPs / (peak x mfu) and keeps everything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp import perf_rates as R
from marp.activations import element_bytes
from marp.gpus import GpuType
from marp.models import ModelSpec
from marp.recipe import Layout, TrainingRecipe, compute_dtype
from marp.sizes import HOPPER, RECOMPUTE_CODE, stage_param_counts, state_bytes_per_param

DEFAULT_MFU = 0.4  # historical constant; None (the default of the functions) means "calibrated"
# None: the GPU generation's default (marp.perf_rates.default_inter_node_gbps); kept as a name so
# callers that pass "the default" explicitly keep working.
DEFAULT_INTER_NODE_GBPS: float | None = None


def sustained_flops(gpu: GpuType, precision: str, mfu: float | None = None, fp8: bool = False) -> float:
    """Achievable matmul FLOP/s of one GPU for a precision policy (large GEMMs; see perf_rates).

    A GPU that cannot run the policy's matmul dtype (V100 and bf16) is refused
    (UnsupportedPrecisionError naming both) rather than given zero speed.
    """
    gpu.check_precision(precision)
    if mfu is not None:
        return gpu.peak_tflops(precision) * 1e12 * mfu
    if fp8 and gpu.supports_fp8:
        return gpu.fp8_tflops * 1e12 * R.FP8_MATMUL_EFF
    if compute_dtype(precision) == "fp32":
        return gpu.fp32_tflops * 1e12 * R.matmul_eff(gpu)
    return gpu.peak_tflops(precision) * 1e12 * R.matmul_eff(gpu)


def flops_per_token(model: ModelSpec, seq_len: int, recompute_full: bool = False) -> float:
    """Model FLOPs per token, forward + backward (Narayanan et al. 2021, eq. 3 convention: 6N for
    the matmuls plus 12 L h s for non-causal attention scores; x 4/3 on the layers with full
    recomputation). The unit MFU figures are quoted in; the speed model itself counts causal work."""
    dense = 6 * model.n_layers * model.active_layer_params()
    attn = 12 * model.n_layers * model.hidden * seq_len
    head = 6 * model.vocab * model.hidden if model.head == "lm" else 0  # LM head matmul, never recomputed
    return (dense + attn) * (4 / 3 if recompute_full else 1.0) + head


def _f(x: ArrayLike) -> NDArray[np.float64]:
    return np.asarray(x, dtype=np.float64)


def _exposed(comm: NDArray[np.float64], window: NDArray[np.float64]) -> NDArray[np.float64]:
    """Time a collective adds when it overlaps ``window`` seconds of compute: what does not fit
    under ``OVERLAP`` of the window, plus ``INTERFERENCE`` of the hidden part (NCCL's kernels take
    SMs and memory bandwidth from the compute they run beside)."""
    hidden = np.minimum(comm, R.OVERLAP * window)
    return comm - hidden + R.INTERFERENCE * hidden


@dataclass(frozen=True)
class StepShape:
    """The GPU-independent part of the step time of a grid of layouts: FLOPs, bytes, group sizes.

    ``step_time_grid`` is ``StepShape.of(...)`` priced on one GPU type (``seconds_on``); the
    planner builds the shape once per layout grid and prices it on every GPU type. Quantities
    ending in ``_mb`` are per micro-batch on one GPU of the bottleneck stage.
    """

    mm_flop_mb: NDArray[np.float64]
    attn_flop_mb: NDArray[np.float64]  # flash attention (0 when eager: its matmuls are in mm)
    elem_bytes_mb: NDArray[np.float64]
    launches_mb: NDArray[np.float64]
    model_flop_mb: NDArray[np.float64]  # Narayanan eq. 3 FLOPs (for an explicit mfu)
    n_mb: NDArray[np.float64]  # micro-batches per step (grad accumulation)
    bubble: NDArray[np.float64]  # extra micro-batch slots of the 1F1B schedule
    p2p_count: NDArray[np.float64]  # pipeline sends per step on the critical path
    tp_n: NDArray[np.int64]
    tp_bytes_mb: NDArray[np.float64]  # bus bytes of the TP collectives (already x (n-1)/n)
    tp_hops_mb: NDArray[np.float64]
    cp_bytes_mb: NDArray[np.float64]
    cp_inter: NDArray[np.bool_]
    shard_n: NDArray[np.int64]  # FSDP / DP group (dp x cp)
    fsdp_bytes_mb: NDArray[np.float64]  # 0 unless ZeRO-3
    layers: NDArray[np.float64]
    dp_bytes: NDArray[np.float64]  # per step, 0 for ZeRO-3 (inside fsdp_bytes_mb)
    dp_inter: NDArray[np.bool_]
    dp_rails: NDArray[np.float64]  # members of the DP (FSDP) group per node: NICs it uses at once
    dp_tail_bytes: NDArray[np.float64]  # the part of dp_bytes reduced after the backward ends (exposed)
    opt_params: NDArray[np.float64]
    fp8: bool = False
    fused: bool = False  # Megatron / Transformer Engine or compiled kernels

    @classmethod
    def of(
        cls, model: ModelSpec, recipe: TrainingRecipe, tp: ArrayLike, pp: ArrayLike, dp: ArrayLike,
        zero_stage: ArrayLike, micro_batch: ArrayLike, grad_accum: ArrayLike, recompute_full: ArrayLike,
        gpus_per_node: int = 8, *, recompute: ArrayLike | None = None, cp: ArrayLike = 1, vpp: ArrayLike = 1,
        sp: ArrayLike | None = None, fp8: bool = False, compiled: bool = False, layers: ArrayLike | None = None,
        first: ArrayLike | None = None, last: ArrayLike | None = None,
    ) -> StepShape:
        """The shape of a grid of layouts. By default it is priced on the bottleneck stage (the
        last, an even split's rounded-up share of the layers, with the head). ``layers`` (with
        ``first`` / ``last``, bools) prices one given stage instead: exactly that many blocks, the
        embeddings where ``first``, the head and the loss where ``last`` (a mixed plan's stage,
        ``marp.mixed``; with pp 1 the stage holds the whole model)."""
        rc_in = (np.asarray(recompute, dtype=np.int64) if recompute is not None
                 else np.where(np.asarray(recompute_full, dtype=bool), RECOMPUTE_CODE["full"], 0))  # fmt: skip
        tp_, pp_, dp_, zs, mb, ga, rc, cp_, vpp_ = np.broadcast_arrays(
            *(np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, zero_stage, micro_batch, grad_accum, rc_in, cp, vpp))
        )
        sp_ = (tp_ > 1) & (recipe.megatron_style if sp is None else np.asarray(sp, dtype=bool))
        s, h, V = recipe.seq_len, model.hidden, model.vocab
        e = element_bytes(recipe.policy)
        full = rc == RECOMPUTE_CODE["full"]
        selective = rc == RECOMPUTE_CODE["selective"]
        sac = rc == RECOMPUTE_CODE["op-sac"]
        fp8 = bool(fp8 or getattr(recipe, "float8", False))
        compiled = bool(compiled or getattr(recipe, "compile", False))
        fused = recipe.fused_kernels or compiled
        flash = recipe.flash_attention

        layers = _f(-(-model.n_layers // pp_)) if layers is None else _f(np.broadcast_to(layers, pp_.shape))
        has_head = np.ones(pp_.shape, dtype=bool) if last is None else np.asarray(last, dtype=bool) | (pp_ == 1)
        has_emb = None if first is None else np.asarray(first, dtype=bool) | (pp_ == 1)
        t_mb = _f(mb) * s / cp_  # tokens one rank of the TP group processes per micro-batch
        tp_f, cp_f = _f(tp_), _f(cp_)
        # Matmuls: forward 2N per token, backward 4N; recompute repeats forward matmuls.
        rc_mm = np.where(full, 8.0 / 6.0, np.where(sac, 7.0 / 6.0, 1.0))
        layer_mm = 6.0 * model.active_layer_params() / tp_f * rc_mm
        head_mm = np.where(has_head, 6.0 * V * h / tp_f, 0.0) if model.head == "lm" else 0.0
        # Small GEMMs run below the large-GEMM rate (tile / wave quantisation and a larger
        # memory-traffic share, NVIDIA Matrix Multiplication Background guide): x (1 + h0 / h).
        # The narrowest GEMM dimension per GPU: hidden (K), or 4h / tp (N of the column-parallel MLP).
        width = np.minimum(float(h), 4.0 * h / tp_f)
        # ... and so do GEMMs with few rows (tokens per micro-batch): their output tiles do not fill
        # a wave of SMs (the guide's "wave quantization").
        mm = t_mb * (layers * layer_mm + head_mm) * (1.0 + R.GEMM_HALF_WIDTH / width) * (1.0 + R.GEMM_HALF_ROWS / t_mb)
        # Attention per layer and micro-batch: causal forward 2 b s^2 h, backward 2.5x (flash).
        attn_fwd = 2.0 * _f(mb) * s * s * h / (tp_f * cp_f)
        redo_attn = full | selective | sac
        if flash:
            attn = layers * attn_fwd * (3.5 + np.where(redo_attn, 1.0, 0.0))
        else:
            # Eager: full (unmasked) score matmuls, 4 b s^2 h forward, 8 backward, at the GEMM rate.
            mm = mm + layers * 2.0 * attn_fwd * (3.0 + np.where(redo_attn, 1.0, 0.0))
            attn = np.zeros_like(mm)
        # Memory-bound passes: h-wide tensors (split over TP only with sequence parallelism),
        # the ffn-wide activation, eager softmax over the scores, fp32 logits for the loss.
        passes = R.ELEM_PASSES_FUSED if fused else R.ELEM_PASSES_EAGER
        if model.dropout > 0:
            passes += R.DROPOUT_PASSES
        if fp8:
            passes += R.FP8_CAST_BYTES
        ffn_active = model.ffn if not model.experts else model.expert_ffn * model.top_k
        redo_elem = np.where(full, 4.0 / 3.0, 1.0)
        per_layer = (passes * h / np.where(sp_, tp_f, 1.0) + R.ACT_PASSES[model.mlp] * ffn_active / tp_f) * e * redo_elem
        elem = t_mb * layers * per_layer
        if not flash:
            # Materialised b x heads x s^2 scores: the score matmul writes them, softmax reads and
            # writes, P.V reads; the backward doubles that (EAGER_SCORE_PASSES), dropout on the
            # probabilities adds its mask and apply; the recomputed forward repeats a third.
            score_passes = R.EAGER_SCORE_PASSES + (R.DROPOUT_SCORE_PASSES if model.dropout > 0 else 0.0)
            elem = elem + (layers * _f(mb) * model.heads / tp_f * s * s / cp_f * e * score_passes
                           * np.where(redo_attn, 4.0 / 3.0, 1.0))  # fmt: skip
        if model.head == "lm":
            elem = elem + np.where(has_head, t_mb * V / tp_f * R.LOSS_BYTES_PER_LOGIT, 0.0)
        launches = layers * (R.KERNELS_PER_LAYER_FUSED if fused else R.KERNELS_PER_LAYER) * np.where(full, 4 / 3, 1.0)
        model_flop = t_mb * flops_per_token(model, s) / (tp_f * pp_)

        # TP collectives: 8 (12 with full recompute) of b s h elements per layer, ring (n-1)/n.
        n_coll = np.where(full, 12.0, 8.0)
        tp_bytes = np.where(tp_ > 1, layers * n_coll * (tp_f - 1) / tp_f * t_mb * h * e, 0.0)
        tp_hops = np.where(tp_ > 1, layers * n_coll * (tp_f - 1), 0.0)
        # CP ring attention: K and V chunks, (cp - 1) hops forward, twice that backward.
        kv = 2.0 * t_mb * model.kv_dim / tp_f * e
        cp_bytes = np.where(cp_ > 1, layers * 3.0 * (cp_f - 1) * kv, 0.0)

        shard = dp_ * cp_
        shard_f = _f(shard)
        # Rank order tp, cp, dp, pp (Megatron, torchtitan): a node holds gpus_per_node / tp members
        # of one DP x CP group, each with its own NIC (rail-optimised fabrics), so a ring across nodes
        # moves its data over that many NICs at once (NCCL rings, one per NIC).
        rails = np.clip(gpus_per_node // tp_, 1, shard).astype(np.float64)
        if has_emb is None:
            first_p, last_p, _layer, _vocab = stage_param_counts(model, tp_, pp_)
            stage_params = _f(np.maximum(first_p, last_p))
        else:  # the given stage: its blocks, plus the embeddings / the head where it holds them
            first_p, last_p, _layer, _vocab = stage_param_counts(model, tp_, pp_, layers.astype(np.int64))
            body = layers.astype(np.int64) * _layer
            stage_params = _f(np.where(pp_ == 1, first_p, body + np.where(has_emb, first_p - body, 0)
                                       + np.where(has_head, last_p - body, 0)))  # fmt: skip
        _pb, gb, _ob = state_bytes_per_param(recipe.policy, recipe.optimizer)
        trainable = stage_params if recipe.finetune == "full" else stage_params * 0.01  # adapters: a sliver
        # Gradients travel in their buffer's dtype (a half main-grad buffer: Megatron --fp16's default).
        grad_b = 2.0 if recipe.policy == "pure-bf16" or recipe.main_grad_dtype == "half" else gb
        ring = (shard_f - 1) / shard_f
        z3 = zs >= 3
        # FSDP: gather the (compute-dtype) parameters forward and backward, reduce-scatter the grads.
        fsdp = np.where(z3 & (shard > 1), ring * (stage_params * 2.0 * e + trainable * grad_b), 0.0)
        # DP: all-reduce of the gradients (ZeRO 0), or reduce-scatter of the gradients and
        # all-gather of the updated compute-dtype parameters (ZeRO 1/2, Megatron's distributed optimizer).
        dp_bytes = np.where(~z3 & (shard > 1),
                            ring * trainable * np.where(zs >= 1, grad_b + e,
                                                        2.0 * grad_b), 0.0)  # fmt: skip
        opt_params = np.where(zs >= 1, trainable / shard_f, trainable)
        # The last gradient bucket is reduced only after the backward ends, with nothing left to
        # hide behind: DDP fills buckets in reverse parameter order and the bucket holding the first
        # parameters (the input embedding, whose gradient completes last) is all-reduced after the
        # final backward kernel (Li et al. 2020, PyTorch Distributed, sec. 3.2.3 and 4.1; Megatron's
        # --overlap-grad-reduce likewise). A bucket holds whole tensors, so it is the larger of the
        # bucket cap and, on a single stage, the vocab matrix (as big as 30 % of a small model).
        emb_grad = np.where(pp_ == 1, _f(_vocab), 0.0) * (0.01 if recipe.finetune != "full" else 1.0) * grad_b
        tail = np.maximum(R.DDP_BUCKET_BYTES, emb_grad) * np.where(zs >= 1, 1.0 + e / grad_b, 2.0)
        dp_tail = np.where(dp_bytes > 0, np.minimum(ring * tail, dp_bytes), 0.0)

        bubble = np.where(pp_ > 1, _f(pp_ - 1) / vpp_, 0.0)
        p2p = np.where(pp_ > 1, 2.0 * (_f(ga) * vpp_ + pp_ - 1), 0.0)
        return cls(
            mm_flop_mb=mm, attn_flop_mb=attn, elem_bytes_mb=elem, launches_mb=launches, model_flop_mb=model_flop,
            n_mb=_f(ga), bubble=bubble, p2p_count=p2p, tp_n=tp_, tp_bytes_mb=tp_bytes, tp_hops_mb=tp_hops,
            cp_bytes_mb=cp_bytes, cp_inter=tp_ * cp_ > gpus_per_node, shard_n=shard, fsdp_bytes_mb=fsdp,
            layers=layers, dp_bytes=dp_bytes, dp_inter=tp_ * dp_ * cp_ > gpus_per_node, dp_rails=rails,
            dp_tail_bytes=dp_tail, opt_params=opt_params, fp8=fp8, fused=bool(fused),
        )  # fmt: skip

    def seconds_on(
        self, gpu: GpuType, precision: str, mfu: float | None = None, inter_node_gbps: float | None = None,
    ) -> NDArray[np.float64]:
        """Seconds per optimizer step of every layout of the shape on ``gpu``."""
        parts = self.parts_on(gpu, precision, mfu, inter_node_gbps)
        return parts["pipeline"] + parts["dp"] + parts["optimizer"]

    def parts_on(
        self, gpu: GpuType, precision: str, mfu: float | None = None, inter_node_gbps: float | None = None,
    ) -> dict[str, NDArray[np.float64]]:
        """The step's parts on ``gpu``: ``micro_batch`` (one micro-batch's forward and backward on
        one GPU of the stage, its TP / CP / FSDP communication included), ``pipeline`` (every
        micro-batch with the 1F1B bubble and the sends), ``dp`` (the exposed gradient reduce) and
        ``optimizer``; ``seconds_on`` is pipeline + dp + optimizer."""
        inter = (R.default_inter_node_gbps(gpu) if inter_node_gbps is None else inter_node_gbps) * 1e9 * R.INTER_BW_EFF
        intra = gpu.intra_node_gbps * 1e9 * R.INTRA_BW_EFF
        mem = gpu.mem_bw_gbps * 1e9 * R.MEM_BW_EFF
        if mfu is not None:
            compute = self.model_flop_mb / sustained_flops(gpu, precision, mfu)
        else:
            gpu.check_precision(precision)
            mm_rate = sustained_flops(gpu, precision, None, self.fp8)
            attn_rate = gpu.peak_tflops(precision) * 1e12 * R.attn_eff(gpu, self.fused)
            compute = self.mm_flop_mb / mm_rate + self.attn_flop_mb / attn_rate + self.elem_bytes_mb / mem
            compute = np.maximum(compute, self.launches_mb * R.LAUNCH_S)
        # TP collectives on the critical path, partly hidden by Transformer Engine's userbuffer
        # overlap on Hopper-class parts with Megatron-style (fused) kernels.
        tp = (self.tp_bytes_mb / intra + self.tp_hops_mb * R.ALPHA_INTRA_S) * (
            1.0 - (R.TP_OVERLAP_TE if self.fused and gpu.name in HOPPER else 0.0))
        # CP exchanges hide behind attention (roughly the attention share of the compute).
        cp_bw = np.where(self.cp_inter, inter, intra)
        cp = _exposed(self.cp_bytes_mb / cp_bw, 0.5 * compute)
        # FSDP per micro-batch, overlapped with that micro-batch's compute.
        fsdp_bw = np.where(self.dp_inter, np.minimum(inter * self.dp_rails, intra), intra)
        fsdp_t = self.fsdp_bytes_mb / fsdp_bw
        fsdp_alpha = np.where(self.dp_inter, R.ALPHA_INTER_S, R.ALPHA_INTRA_S)
        fsdp_t = fsdp_t + np.where(self.fsdp_bytes_mb > 0, 3.0 * self.layers * (self.shard_n - 1) * fsdp_alpha, 0.0)
        fsdp = _exposed(fsdp_t, compute) + fsdp_t / np.maximum(self.layers, 1.0)
        per_mb = compute + tp + cp + fsdp
        pipeline = per_mb * (self.n_mb + self.bubble) + self.p2p_count * R.P2P_LATENCY_S
        # DP gradient reduce: hidden behind the last micro-batch's backward (2/3 of its compute).
        dp_bw = fsdp_bw
        dp_alpha = np.where(self.dp_inter, R.ALPHA_INTER_S, R.ALPHA_INTRA_S)
        dp_t = (self.dp_bytes - self.dp_tail_bytes) / dp_bw
        dp_t = dp_t + np.where(self.dp_bytes > 0, 2.0 * (self.shard_n - 1) * dp_alpha, 0.0)
        # The reduce of the last micro-batch's gradients overlaps its backward; with pipelining the
        # cool-down (bubble) slots hide it too, and the parameter gather the next step's warm-up.
        # The last bucket (dp_tail_bytes) comes after the backward: exposed in full.
        dp = _exposed(dp_t, (2.0 / 3.0 + self.bubble) * per_mb) + self.dp_tail_bytes / dp_bw
        optimizer = self.opt_params * R.OPT_BYTES_PER_PARAM / mem + R.STEP_FIXED_S
        return {"micro_batch": per_mb, "pipeline": pipeline, "dp": dp, "optimizer": optimizer}


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
    inter_node_gbps: float | None = DEFAULT_INTER_NODE_GBPS,
    *,
    recompute: ArrayLike | None = None,
    sp: ArrayLike | None = None,
    cp: ArrayLike = 1,
    vpp: ArrayLike = 1,
    fp8: bool = False,
    compiled: bool = False,
) -> NDArray[np.float64]:
    """Estimated seconds per optimizer step for a grid of layouts (arguments broadcast)."""
    shape = StepShape.of(model, recipe, tp, pp, dp, zero_stage, micro_batch, grad_accum, recompute_full,
                         gpus_per_node, recompute=recompute, cp=cp, vpp=vpp, sp=sp, fp8=fp8,
                         compiled=compiled)  # fmt: skip
    return shape.seconds_on(gpu, recipe.precision, mfu, inter_node_gbps)


def estimate_step_time(
    model: ModelSpec,
    recipe: TrainingRecipe,
    layout: Layout,
    gpu: GpuType,
    gpus_per_node: int = 8,
    mfu: float | None = None,
    inter_node_gbps: float | None = DEFAULT_INTER_NODE_GBPS,
    *,
    fp8: bool = False,
    compiled: bool = False,
) -> float:
    """Estimated seconds per optimizer step of one layout on ``gpu``."""
    grid = step_time_grid(
        model, recipe, gpu, [layout.tp], [layout.pp], [layout.dp], [layout.zero_stage],
        [layout.micro_batch], [layout.grad_accum], [False], gpus_per_node, mfu, inter_node_gbps,
        recompute=[RECOMPUTE_CODE[layout.recompute]], sp=[layout.sp], cp=[layout.cp], vpp=[layout.vpp],
        fp8=fp8, compiled=compiled,
    )  # fmt: skip
    return float(grid[0])


__all__ = [
    "DEFAULT_INTER_NODE_GBPS", "DEFAULT_MFU", "StepShape", "estimate_step_time", "flops_per_token",
    "step_time_grid", "sustained_flops",
]  # fmt: skip
