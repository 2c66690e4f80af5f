"""The memory terms of a whole grid of layouts at once: one function per term, then the phases.

Each function computes one term (model states, layer gradients, activations, logits, buffers,
autocast's weight copies, the optimizer's and one layer's transients) for every layout of a
``LayoutGrid`` as numpy arrays, for one pipeline stage where it says so; ``_forward_end`` and
``_backward`` are phases A and B, ``_stage_terms`` takes the maximum over the three phases, and
``memory_for_grid`` picks the first or last stage and rounds to whole bytes. The sizes come from
``marp.sizes``; ``marp.memory`` is the public face (``predict_memory``, ``memory_grid``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from marp.activations import LayerCoefficients, element_bytes, layer_coefficients
from marp.errors import InvalidLayoutError
from marp.gpus import GpuType, MiB
from marp.models import ModelSpec
from marp.recipe import LayoutGrid, TrainingRecipe
from marp.sizes import (
    DS_PREFETCH_ELEMENTS,
    DS_REDUCE_BUCKET_ELEMENTS,
    FRAGMENTATION,
    HOPPER,
    NF4_BYTES,
    NF4_CONST_BYTES,
    RECOMPUTE_CODE,
    SHARDED_LORA_RECOMPUTE_FRAGMENTATION,
    TE_STREAMS,
    ceil_div,
    in_flight,
    lora_params,
    loss_bytes_per_logit,
    loss_forward_bytes_per_logit,
    runtime_reserve_bytes,
    stage_layer_count,
    stage_param_counts,
    state_bytes_per_param,
)

# The names of the result: the breakdown's terms, the phases (A, B, C) and the pipeline stages.
FIELDS: tuple[str, ...] = (
    "parameters", "gradients", "optimizer_states", "activations", "logits", "runtime_reserve",
    "buffers", "transient", "fragmentation",
)  # fmt: skip
PHASES: tuple[str, ...] = ("forward+loss", "backward", "optimizer")
STAGES: tuple[str, ...] = ("first", "last", "max")

FloatArray = NDArray[np.floating[Any]]


@dataclass(frozen=True)
class _Job:
    """One job over a grid of layouts: the inputs and the per-rank sizes every stage shares."""

    model: ModelSpec
    recipe: TrainingRecipe
    grid: LayoutGrid
    gpu: GpuType | None
    coef: LayerCoefficients
    e: int  # bytes per activation element
    pb: float  # parameter, gradient and optimizer-state bytes per parameter (state_bytes_per_param)
    gb: float
    ob: float
    first_params: NDArray[np.int64]  # parameters on one TP rank of the first / last stage
    last_params: NDArray[np.int64]
    layer_local: NDArray[np.int64]  # one layer's parameters on one TP rank
    vocab_local: NDArray[np.int64]  # the vocab matrix on one TP rank
    layers_stage: NDArray[np.int64]
    expert_all: NDArray[np.int64]  # every expert's parameters on one TP rank of a stage
    expert_local: NDArray[np.int64]  # ... the rank's own share, 1 / ep of them
    tokens: FloatArray  # tokens of one micro-batch on one rank (context parallelism splits s)
    keys: FloatArray  # keys each query attends to on one rank
    sp_div: NDArray[np.int64]  # what divides the replicated activations (tp under sequence parallelism)
    chunk_layers: FloatArray  # layers of the model chunk one forward / backward pass runs

    @property
    def lora(self) -> bool:
        return self.recipe.finetune in ("lora", "qlora")

    @property
    def grads_persistent(self) -> bool:
        return self.recipe.resolved_grad_buffer == "persistent"


def _job(model: ModelSpec, recipe: TrainingRecipe, grid: LayoutGrid, gpu: GpuType | None) -> _Job:
    policy = recipe.policy
    dropout = model.dropout if recipe.dropout is None else recipe.dropout
    coef = layer_coefficients(model, policy, recipe.flash_attention, dropout, fused=recipe.pointwise_fused,
                              kv_repeat=recipe.resolved_kv_repeat)  # fmt: skip
    s = recipe.seq_len
    pb, gb, ob = state_bytes_per_param(policy, recipe.optimizer)
    if recipe.main_grad_dtype == "half":
        gb = 2.0  # Megatron --fp16's main-grad buffer in the parameters' dtype (recipe.MAIN_GRAD_DTYPES)
    first_params, last_params, layer_local, vocab_local = stage_param_counts(model, grid.tp, grid.pp,
                                                                             grid.stage_layers)  # fmt: skip
    layers_stage = stage_layer_count(model.n_layers, grid.pp, grid.stage_layers)
    if model.experts:
        # Expert tensor parallelism shards the experts over etp instead of tp (Megatron's
        # --expert-tensor-parallel-size): swap the experts' tp shard for their etp shard.
        experts_full = np.full_like(grid.tp, model.expert_params())
        swap = ceil_div(experts_full, grid.etp) - ceil_div(experts_full, grid.tp)
        layer_local = layer_local + swap
        first_params, last_params = first_params + layers_stage * swap, last_params + layers_stage * swap
    # One forward / backward pass of a model chunk: an uneven split's fullest virtual stage.
    chunk_layers = layers_stage / grid.vpp
    if grid.chunk_layers.any():
        chunk_layers = np.where(grid.chunk_layers > 0, grid.chunk_layers, chunk_layers)
    # Experts are divided over the expert-parallel group (Lepikhin et al. 2021, GShard sec. 2).
    expert_all = np.where(model.experts > 0,
                          layers_stage * ceil_div(np.full_like(grid.tp, model.expert_params()), grid.etp), 0)  # fmt: skip
    expert_local = ceil_div(expert_all, grid.ep)
    return _Job(
        model=model, recipe=recipe, grid=grid, gpu=gpu, coef=coef, e=element_bytes(policy), pb=pb, gb=gb, ob=ob,
        first_params=first_params, last_params=last_params, layer_local=layer_local, vocab_local=vocab_local,
        layers_stage=layers_stage, expert_all=expert_all, expert_local=expert_local, tokens=grid.micro_batch * s / grid.cp,
        keys=s / grid.cp, sp_div=np.where(grid.sp > 0, grid.tp, 1), chunk_layers=chunk_layers,
    )  # fmt: skip


@dataclass(frozen=True)
class _Layer:
    """One transformer layer of one micro-batch on one rank, by recompute policy."""

    saved: FloatArray  # activations kept for the backward
    rebuilt: FloatArray  # activations while the layer is back-propagated
    mlp_tr: FloatArray  # transients of the MLP's down projection's backward
    act_tr: FloatArray  # ... of the MLP activation's backward
    attn_tr: FloatArray  # ... of the attention's backward
    dequant: FloatArray | float  # QLoRA: one dequantised matrix


def _layer(job: _Job) -> _Layer:
    coef, g, tokens, sp_div = job.coef, job.grid, job.tokens, job.sp_div
    tp_, rc = g.tp, g.recompute
    # MoE token copies on the expert-TP group's tokens.
    dispatch = tokens * coef.dispatch * g.etp / tp_ if coef.dispatch else 0.0
    gathered = _sp_gathered_inputs(job, 2.0) + _lora_input_copies(job)
    full_layer = tokens * (coef.rep / sp_div + coef.par / tp_ + job.keys * coef.score / tp_) + dispatch + gathered
    saved = np.select(
        [rc == RECOMPUTE_CODE["none"], rc == RECOMPUTE_CODE["selective"], rc == RECOMPUTE_CODE["full"]],
        [full_layer, tokens * (coef.rep / sp_div + coef.par / tp_) + dispatch + gathered,
         tokens * coef.ckpt_rep / sp_div],
        tokens * (coef.sac_rep / sp_div + coef.sac_par / tp_),
    )
    # The layer being back-propagated holds all its activations: kept (none), or rebuilt by the
    # recomputation (full, op-sac: the whole layer; selective: its attention scores, Korthikanti
    # sec. 5) -- under full recompute beside its checkpointed input, unless that input is itself
    # one of the saved tensors (LayerNorm saves its input as is).
    ckpt_extra = 0.0 if coef.ckpt_alias else 1.0
    rebuilt = full_layer + np.where(rc == RECOMPUTE_CODE["full"], ckpt_extra * tokens * coef.ckpt_rep / sp_div, 0.0)
    # Beyond that, the larger of the MLP backward's transients and the attention backward's, which
    # run after the MLP's and the second norm's tensors are freed (marp.activations, bwd_*).
    attn_tr = tokens * (coef.bwd_attn_rep / sp_div + coef.bwd_attn_par / tp_ + job.keys * coef.bwd_score / tp_)
    if bool(np.any(g.cp > 1)):
        attn_tr = attn_tr + _ring_attention_backward(job)
    return _Layer(
        saved=saved, rebuilt=rebuilt,
        mlp_tr=tokens * (coef.bwd_mlp_rep / sp_div + coef.bwd_mlp_par / tp_),
        act_tr=tokens * (coef.bwd_act_rep / sp_div + coef.bwd_act_par / tp_),
        attn_tr=attn_tr,
        dequant=(2.0 * job.layer_local / 4 if job.recipe.finetune == "qlora" else 0.0),
    )  # fmt: skip


def _sp_gathered_inputs(job: _Job, n_norms: float) -> FloatArray | float:
    """Sequence parallelism in PyTorch's DTensor TP (torchtitan's plan): a norm runs on its 1 / tp
    of the sequence, and PrepareModuleInput all-gathers its output for the column-parallel
    linears after it, which save the gathered, whole-sequence tensor for their weight gradients
    -- where Megatron's sequence parallelism saves the shard and gathers it again in the backward
    (Korthikanti et al. 2022, sec. 4.2.2). So each norm output (two per layer, the final norm's
    for the head) costs e per token and channel, not e / tp: (1 - 1 / tp) e h per token more than
    the sharded charge. Checked on the multi-GPU oracle at tp 2 (vocabulary 64: forward peak
    -6.5 % before)."""
    g = job.grid
    if job.recipe.megatron_style or not bool(np.any((g.sp > 0) & (g.tp > 1))):
        return 0.0
    on = (g.sp > 0) & (g.tp > 1)
    return np.where(on, job.tokens * n_norms * job.e * job.model.hidden * (1.0 - 1.0 / g.tp), 0.0)


def _lora_input_copies(job: _Job) -> FloatArray | float:
    """What peft's LoRA adapters save beyond the layer's own activations, per token of one layer on
    one rank (0 without LoRA, or where the adapters keep no copy of their inputs).

    Each adapted linear computes ``lora_B(lora_A(dropout(x)))`` (peft tuners/lora/layer.py,
    Linear.forward; the dropout is nn.Identity at ``lora_dropout`` 0), after casting ``x`` to the
    adapter's dtype (``_cast_input_dtype``: a no-op when the dtypes match). lora_A saves its input
    for its weight gradient: ``x`` itself when there is neither a cast nor a dropout (already
    counted, the layer keeps it), else a copy of its own per target -- the dropout's output (e B,
    or 4 B when fp32 adapters cast first) and its mask (1 B, CUDA's fused native_dropout), or the
    fp32 cast alone (4 B) -- q, k and v each their own copy of the same norm output. The input
    itself is then saved by nobody when its only keeper was an adapter: the frozen base linears
    need no input for their gradients (only weights), the norm saves its own input, not its output
    -- so the first norm's output is freed once q, k or v is adapted, the second's once gate or up
    is, and the MLP's hidden (down's input) once down is; the attention output (o's input) stays,
    the attention saves it. Inputs per rank: the norm outputs replicated (divided by sequence
    parallelism), the attention output and the MLP's hidden split over tp; an MoE layer's experts
    see top_k of the tokens. Saved like the layer's other activations (under full recompute only
    the layer being rebuilt holds them)."""
    recipe, model, g = job.recipe, job.model, job.grid
    if not job.lora:
        return 0.0
    e, h, t = job.e, model.hidden, set(recipe.lora_targets)
    if "gate" in t and model.mlp != "swiglu":
        t.discard("gate")
    copies = recipe.lora_dropout > 0.0 or recipe.fp32_adapters
    # One adapted target's saved bytes per input element: its own copy, or a share of x (0 here).
    copy = ((4.0 if recipe.fp32_adapters else e) + (1.0 if recipe.lora_dropout > 0.0 else 0.0)) if copies else 0.0
    route = model.top_k if model.experts else 1  # copies of a token's MLP input (one per expert it visits)
    ffn_in = route * (model.expert_ffn if model.experts else model.ffn)
    qkv, gate_up = len(t & {"q", "k", "v"}), len(t & {"gate", "up"})
    # An input nobody but the linears after it kept is freed when none of them keeps it as is: no
    # adapter there (frozen linears save no input), or adapters that each keep their own copy.
    free_qkv = e if (qkv == 0 or copies) else 0.0
    free_gate_up = e if (gate_up == 0 or copies) else 0.0
    free_down = e if ("down" not in t or copies) else 0.0
    rep = (qkv * copy - free_qkv) * h + (gate_up * copy - free_gate_up) * route * h
    if model.norm == "rmsnorm" and not recipe.pointwise_fused:
        # HF RMSNorm's ``weight * x.to(dtype)``: a frozen weight needs no gradient, so the product
        # keeps no normalised copy (autograd saves a mul operand only for the other's gradient).
        rep -= 2 * (4.0 if recipe.policy.startswith("amp") else e) * h
    par = copy * model.o_width * ("o" in t) + (copy * ("down" in t) - free_down) * ffn_in
    return job.tokens * (rep / job.sp_div + par / g.tp)


def _ring_attention_backward(job: _Job) -> FloatArray:
    """Context parallelism: what ring attention's backward holds beyond one flash backward, per rank.

    torch's ``_templated_ring_attention_backward`` (torch/distributed/tensor/experimental/
    _context_parallel/_attention.py) accumulates dq, dk and dv in fp32 across the cp steps, gathers
    the other ranks' K and V (the all-gather rotater: cp x the local K and V, plus the concatenated
    send buffer) and rotates the K / V gradients in fp32 buffers. Measured on fake tensors (one
    attention, bf16, 8 heads x 64, 4096 tokens over cp ranks): 40 + 4 cp B per token and channel of
    Q = K = V over the flash backward's own 6 -- 48 at cp 2, 56 at cp 4 -- charged here as
    4 B per Q channel plus 16 + (cp + 1) e per K and V channel. Zero without context parallelism."""
    m, g, e = job.model, job.grid, job.e
    per_token = 4.0 * m.q_width + (16.0 + (g.cp + 1) * e) * (m.k_width + m.v_width)
    return np.where(g.cp > 1, job.tokens * per_token / g.tp, 0.0)


@dataclass(frozen=True)
class _Stage:
    """One pipeline rank of every layout: the first (rank 0) or the last (pp - 1)."""

    is_first: NDArray[np.bool_]
    is_last: NDArray[np.bool_]
    n_params: NDArray[np.int64]
    units: FloatArray  # layer x micro-batch units of activations in flight (_in_flight)
    mbs: FloatArray  # micro-batches in flight


def _stage(job: _Job, last: bool) -> _Stage:
    g = job.grid
    single = g.pp == 1
    rank = g.pp - 1 if last else np.zeros_like(g.pp)
    units, mbs = in_flight(job.model.n_layers, g.pp, g.vpp, g.grad_accum, rank, g.stage_layers, g.chunk_layers)
    return _Stage(
        is_first=single if last else np.ones_like(single), is_last=np.ones_like(single) if last else single,
        n_params=job.last_params if last else job.first_params, units=units, mbs=mbs,
    )  # fmt: skip


def _activations(job: _Job, layer: _Layer, st: _Stage) -> tuple[FloatArray, FloatArray]:
    """(every saved activation in flight, one micro-batch's embedding output on the first stage)."""
    emb_this = np.where(st.is_first, job.tokens * job.coef.emb, 0.0)
    acts = st.units * layer.saved + st.mbs * emb_this
    acts = acts + np.where(st.is_last, job.tokens * job.coef.final + _sp_gathered_inputs(job, 1.0), 0.0)
    return acts, emb_this


def _logits(job: _Job, st: _Stage) -> tuple[FloatArray, FloatArray]:
    """The loss's logits at the start of its backward, and in its forward (memory-notes D.5)."""
    model, recipe = job.model, job.recipe
    loss_kind, e = recipe.resolved_loss, job.e
    logit_elems = job.tokens * job.vocab_local / model.hidden if model.vocab_logits else np.zeros_like(job.tokens)
    per_logit: FloatArray | float = loss_bytes_per_logit(loss_kind, e, recipe.loss_chunks, recipe.pointwise_fused)
    # The loss's forward, still inside the autocast region: the logits, their fp32 upcast (the
    # same tensor in fp32) and log_softmax's output (torch loss only; the others keep their peak).
    per_logit_fwd: FloatArray | float = ((0.0 if e == 4 else e) + 8.0 if loss_kind == "torch" else
                                         loss_forward_bytes_per_logit(loss_kind, e, recipe.loss_chunks,
                                                                      recipe.pointwise_fused))  # fmt: skip
    if loss_kind == "torch" and not recipe.megatron_style and bool(np.any(job.grid.tp > 1)):
        # Under TP the head's logits stay vocab-sharded and F.cross_entropy runs as DTensor's loss
        # parallel (torchtitan enables it with TP): its log_softmax keeps one more fp32 copy per
        # local logit in both directions (sizes.loss_bytes_per_logit, "loss-parallel").
        tp_on = job.grid.tp > 1
        per_logit = np.where(tp_on, loss_bytes_per_logit("loss-parallel", e, 1), per_logit)
        per_logit_fwd = np.where(tp_on, per_logit_fwd + 4.0, per_logit_fwd)
    logits = np.where(st.is_last, logit_elems * per_logit, 0.0)
    return logits, np.where(st.is_last, logit_elems * per_logit_fwd, 0.0)


@dataclass(frozen=True)
class _States:
    """Model states of one rank, trainable vs frozen, after ZeRO / FSDP sharding."""

    params: FloatArray
    grads: FloatArray
    opt_params: FloatArray  # parameters whose optimizer states this rank keeps
    opt: FloatArray
    trainable: FloatArray
    ex: FloatArray  # expert parameters (trained in full)
    g_div: FloatArray  # what divides the gradients (the shard group from ZeRO-2)
    sd: FloatArray  # the shard group
    sd_e: FloatArray  # the shard group of the expert parameters


def _model_states(job: _Job, st: _Stage) -> _States:
    model, recipe, g, pb = job.model, job.recipe, job.grid, job.pb
    gb, ob = job.gb, job.ob
    zs = g.zero_stage
    whole: FloatArray | float = 0.0  # bitsandbytes' NF4 constants, never sharded
    # The stage's parameters count every expert; the rank holds its 1 / ep share of them.
    dense = (st.n_params - job.expert_all).astype(np.float64)
    own = dense + job.expert_local
    if job.lora:
        adapters = job.layers_stage * lora_params(model, recipe.lora_rank, recipe.lora_targets) / g.tp
        if recipe.finetune == "qlora":
            # NF4 base (sizes.NF4_BYTES); embeddings, norms and the head stay in bf16.
            layers = job.layers_stage * job.layer_local - job.expert_all + job.expert_local
            frozen = layers * NF4_BYTES + (own - layers) * 2.0
            if recipe.qlora_backend == "bitsandbytes":
                # bitsandbytes' block constants are no parameter: FSDP / ZeRO-3 keep them whole.
                whole = layers * NF4_CONST_BYTES
                frozen = frozen - whole
        else:
            frozen = own * (2.0 if pb == 2.0 else pb)
        trainable = adapters
        if recipe.fp32_adapters:
            # peft's fp32 adapters beside a bf16 base: fp32 parameters, gradients and states.
            pb, gb, ob = state_bytes_per_param("fp32", recipe.optimizer)
    else:
        frozen = np.zeros_like(dense)
        trainable = dense
    # ZeRO / FSDP shard over the data-parallel group *with* the context-parallel ranks: cp ranks
    # hold the same parameters (they split the sequence, not the model), so FSDP2 shards over
    # torchtitan's dp_shard x cp mesh ("dp_shard_cp", torchtitan parallel_dims.py) and Megatron's
    # distributed optimizer over get_data_parallel_group(with_context_parallel=True).
    sd = np.maximum(g.shard * g.cp, 1).astype(np.float64)
    # Expert states shard over the expert-data-parallel group, tp x dp x cp / (etp x ep) (Megatron's
    # expert grid; = dp x cp / ep when etp = tp).
    sd_e = np.maximum(g.shard * g.cp * g.tp // (g.etp * g.ep), 1).astype(np.float64)
    p_div = np.where(zs >= 3, sd, 1.0)
    g_div = np.where(zs >= 2, sd, 1.0)
    o_div = np.where(zs >= 1, sd, 1.0)
    ex = job.expert_local.astype(np.float64) if not job.lora else np.zeros_like(dense)
    params = trainable * pb / p_div + frozen / np.where(zs >= 3, sd, 1.0) + ex * pb / np.where(zs >= 3, sd_e, 1)
    params = params + whole
    grads = trainable * gb / g_div + ex * job.gb / np.where(zs >= 2, sd_e, 1)
    opt_params = trainable / o_div + ex / np.where(zs >= 1, sd_e, 1)
    opt = opt_params * ob
    if recipe.offload_optimizer:
        opt = np.zeros_like(opt)  # ZeRO-Offload (Ren et al. 2021): states and master in CPU memory
    return _States(params=params, grads=grads, opt_params=opt_params, opt=opt, trainable=trainable, ex=ex,
                   g_div=g_div, sd=sd, sd_e=sd_e)  # fmt: skip


@dataclass(frozen=True)
class _LayerGrads:
    """Gradients produced during one layer's backward."""

    layer: FloatArray  # one layer's (and its share of the experts')
    post: FloatArray  # the head side's, there before any layer's backward (last stage)
    own_mlp: FloatArray | float  # the layer's own, produced so far: in the MLP's backward
    own_attn: FloatArray | float  # ... in the attention's backward


def _head_side_params(job: _Job) -> NDArray[np.int64]:
    """Head-side parameters on one TP rank: the LM head's matrix (a tied head's gradient lands in
    the embedding), its other parts, the final norm."""
    model = job.model
    if model.head == "lm":
        head_side = job.vocab_local + (model.head_params() - (0 if model.tied_embeddings else model.vocab * model.hidden))
    else:
        head_side = np.full_like(job.grid.tp, model.head_params())
    return head_side + model.final_norm_params()


def _layer_grads(job: _Job, st: _Stage, states: _States, fsdp: NDArray[np.bool_]) -> _LayerGrads:
    model, g, gb, g_div = job.model, job.grid, job.gb, states.g_div
    # Under FSDP a layer's own gradients are the unsharded parameters' gradients, in the compute
    # dtype (bf16 under fsdp-bf16), until the unit's post-backward reduce-scatters them (_buffers).
    own_b = np.where(fsdp & (job.recipe.policy == "fsdp-bf16"), 2.0, gb)
    own_div = np.where(fsdp, 1.0, g_div)
    if job.lora:
        grads = states.grads
        # Only the adapters get gradients; the layer's, unsharded, under FSDP (tiny either way).
        adapters = lora_params(model, job.recipe.lora_rank, job.recipe.lora_targets) / g.tp
        own = np.where(fsdp, adapters * (4.0 if job.recipe.fp32_adapters else own_b), 0.0)
        return _LayerGrads(layer=grads / job.layers_stage, post=np.zeros_like(grads), own_mlp=own,
                           own_attn=own)  # fmt: skip
    # One layer's gradients: its dense part over the shard group, its own experts over theirs.
    dense_layer = job.layer_local - job.expert_all / job.layers_stage
    g_layer = (dense_layer * gb / g_div
               + states.ex * gb / np.where(g.zero_stage >= 2, states.sd_e, 1) / job.layers_stage)  # fmt: skip
    g_post = np.where(st.is_last, _head_side_params(job) * gb / g_div, 0.0)
    if job.grads_persistent and job.recipe.megatron_style:
        # Megatron accumulates into its fp32 main_grad buffer with fused wgrad kernels.
        zeros = np.zeros_like(states.grads)
        return _LayerGrads(layer=g_layer, post=g_post, own_mlp=zeros, own_attn=zeros)
    # The layer's own weight gradients produced so far: the MLP's down projection, then the whole
    # MLP and the attention output projection (params, per TP rank). Under autocast the MLP-phase
    # gradient is still the bf16 copy's (the matmul's output), cast to the fp32 parameter's dtype
    # by the cast's backward once the matmul is done.
    h, ffn = model.hidden, model.expert_ffn if model.experts else model.ffn
    n_mlp = 3 if model.mlp == "swiglu" else 2
    own_grads_mlp = (0 if model.experts else h * ffn) / g.tp
    own_grads_attn = (0 if model.experts else n_mlp * h * ffn + h * h) / g.tp
    return _LayerGrads(
        layer=g_layer, post=g_post,
        own_mlp=own_grads_mlp * (job.e if job.recipe.policy.startswith("amp-") else own_b) / own_div,
        own_attn=own_grads_attn * own_b / own_div,
    )  # fmt: skip


@dataclass(frozen=True)
class _Buffers:
    """Buffers beside the model states: FSDP / ZeRO-3 gathers, DDP buckets, TE workspaces."""

    gathered: FloatArray  # unsharded parameters in a layer's backward (the unit and its prefetch)
    gathered_fwd: FloatArray  # ... at the forward's end
    gathered_post: FloatArray  # ... in a unit's post-backward (the prefetched unit only)
    unsharded_grads: FloatArray  # a unit's post-backward: its unsharded gradients and reduce-scatter
    held_rs: FloatArray  # the previous unit's reduce-scatter input, held through the next unit's backward
    unit: FloatArray  # one gathered unit (FSDP outside PP; 0 otherwise)
    fsdp: NDArray[np.bool_]  # FSDP / ZeRO-3 outside PP: a unit's gradients are unsharded until its reduce
    ddp: FloatArray  # PyTorch DDP's gradient buckets
    te_ws: float  # Transformer Engine's cuBLAS workspaces
    fp8_cache: FloatArray | float  # Transformer Engine's fp8 weight copies (float8 under master-*)
    pp_fsdp: NDArray[np.bool_]  # FSDP under pipeline parallelism (_pipelined_fsdp)
    accumulated: FloatArray  # ... the stage's unsharded gradients, accumulated over the micro-batches
    root_flat: FloatArray  # FSDP2: the root's all-gather output, cached in the copy-in stream's pool
    unit_flat: FloatArray  # ... one unit's (0 where the job is not FSDP2 outside PP)


def _pipelined_fsdp(job: _Job, st: _Stage, states: _States, fsdp: NDArray[np.bool_],
                    gather_b: float) -> tuple[NDArray[np.bool_], FloatArray, FloatArray]:  # fmt: skip
    """FSDP2 under pipeline parallelism: (which layouts, the stage's gathered parameters, its
    accumulated unsharded gradients).

    torchtitan shards with reshard_after_forward=False when PP is on (parallelize.py: the default
    policy reshards after forward only without PP), so a parameter gathered for a micro-batch's
    forward stays gathered; and torch.distributed.pipelining runs every backward with
    set_reshard_after_backward(False) and set_requires_gradient_sync(False)
    (stage.py, backward_maybe_with_nosync), resharding and reduce-scattering once, after the last
    micro-batch (perform_reduce_grad). So from the first forward to the end of the step a rank holds
    its whole stage unsharded in the compute dtype, and from the first backward the stage's
    unsharded gradients, accumulated in the reduce dtype (fp32 under fsdp-bf16: FSDP2's
    to_accumulated_grad_if_needed; the parameters' own dtype otherwise), in place of the sharded
    gradients, which exist only after that reduce-scatter."""
    pp_fsdp = fsdp & (job.grid.pp > 1)
    if not pp_fsdp.any():
        zeros = np.zeros(pp_fsdp.shape)
        return pp_fsdp, zeros, zeros
    own = st.n_params - job.expert_all + job.expert_local  # the stage's parameters on this rank
    gathered = np.where(pp_fsdp, own * gather_b, 0.0)
    trainable = states.trainable + states.ex
    return pp_fsdp, gathered, np.where(pp_fsdp, trainable * job.gb, 0.0)


def _buffers(job: _Job, st: _Stage, states: _States) -> _Buffers:
    recipe, g, policy, layer_local = job.recipe, job.grid, job.recipe.policy, job.layer_local
    fsdp = (g.zero_stage >= 3) & (states.sd > 1)
    gather_b = 4.0 if policy in ("fp32", "amp-fp16", "amp-bf16") else 2.0
    root = st.n_params - job.layers_stage * layer_local  # embeddings / head / norms of this stage
    # FSDP2 / ZeRO-3: in a unit's backward the unit and the one FSDP2 prefetches are unsharded in
    # the compute dtype; at the forward's end only the last unit is (torchtitan's reshard policy:
    # every block but the last reshards after its forward, parallelize.py apply_fsdp); the root
    # module (embeddings, final norm, head) stays unsharded between forward and backward (FSDP2
    # does not reshard the root after forward). Counted by the multi-GPU oracle, which sees
    # FSDP2's frees (storage resize_(0)): at the loss one unit, in a unit's backward two.
    # QLoRA: FSDP gathers what it shards, a layer's NF4 storage (sizes.NF4_BYTES), and the
    # linears dequantise one weight at a time (_Layer.dequant); the root stays in bf16.
    unit_b = gather_b
    if recipe.finetune == "qlora":
        unit_b = NF4_BYTES - (NF4_CONST_BYTES if recipe.qlora_backend == "bitsandbytes" else 0.0)
    unit = layer_local * unit_b
    fp8_cache: FloatArray | float = 0.0
    not_fsdp_unit: FloatArray | float = 0.0  # float8 without FSDP: the layer's fp8 weight copies
    if recipe.float8:
        linears = layer_local - 2 * job.model.norm_params()  # a layer's matmul weights (per TP rank)
        unit = layer_local * gather_b
        if recipe.megatron_style:
            # Transformer Engine casts each weight to fp8 once per step and keeps the fp8 copy and
            # its transpose across the micro-batches (te.Linear's is_first_microbatch weight cache;
            # the transpose feeds the backward's GEMMs on Hopper): 2 B per matmul parameter.
            fp8_cache = job.layers_stage * linears * 2.0
        else:
            # FSDP2 with torchao's float8 all-gather gathers the matmul weights in fp8 (1 B); without
            # FSDP, Float8Linear casts the layer being computed to fp8 (the weight, and its transpose
            # in the backward): 2 B per matmul parameter of one layer (torchao float8_linear.py).
            not_fsdp_unit = np.where(fsdp, 0.0, linears * 2.0)
            unit = np.where(fsdp, linears * 1.0 + (layer_local - linears) * gather_b, unit)
    root_g = root * gather_b
    gathered = np.where(fsdp, 2 * unit + root_g, not_fsdp_unit)
    # At the forward's end the last block is still gathered under torchtitan's reshard policy; under
    # torchtune's (every block reshards after its forward) only the root is.
    last_unit = unit if recipe.fsdp_reshard == "keep-last" else 0.0
    gathered_fwd = np.where(fsdp, last_unit + root_g, not_fsdp_unit)
    gathered_post = np.where(fsdp, unit + root_g, 0.0)
    # A unit's gradients are unsharded (in the compute dtype) until its post-backward, which
    # reshards the unit, copies the gradients into a flat reduce-scatter input in the reduce
    # dtype (fp32 under fsdp-bf16) and frees them, then allocates the sharded output
    # (FSDP2 foreach_reduce): the layer's own gradients while it is back-propagated
    # (_LayerGrads.own_*, unsharded under FSDP), and at its post-backward, with the layer's
    # activations and the unit itself freed, the larger of gradients + input and input + output.
    # Under LoRA / QLoRA only the adapters get gradients (FSDP allocates none for frozen
    # parameters); in full training, the whole layer's.
    grad_unit = (np.asarray(lora_params(job.model, recipe.lora_rank, recipe.lora_targets) / g.tp)
                 if job.lora else layer_local)  # fmt: skip
    # FSDP2 keeps that input alive until the next unit's post-backward (reduce_scatter_states, one
    # buffer by default: the reduce-scatter stream may still read it), so every layer but the
    # first back-propagated one runs beside the previous unit's.
    # (Megatron-FSDP reduce-scatters a unit's main grads in the main-grad dtype: fp32 under --bf16.)
    reduce_b = 4.0 if policy == "fsdp-bf16" else (job.gb if recipe.megatron_style else gather_b)
    rs_peak = grad_unit * (reduce_b + np.maximum(gather_b, reduce_b / np.maximum(states.sd, 1.0)))
    unsharded_grads = np.where(fsdp, rs_peak, 0.0)
    held_rs = np.where(fsdp, grad_unit * reduce_b, 0.0)
    unit_fsdp = np.where(fsdp, unit, 0.0)
    # PyTorch DDP keeps its own gradient buckets beside .grad unless gradient_as_bucket_view
    # (torch.nn.parallel.DistributedDataParallel docs: the saving "equals the total gradients
    # size"); Megatron's master-* grads are the buckets.
    ddp = np.where((g.zero_stage == 0) & (g.dp > 1) & (not recipe.megatron_style), states.trainable * job.gb, 0.0)
    te_ws = 0.0
    if recipe.megatron_style:
        te_ws = TE_STREAMS * (32 * MiB if job.gpu is not None and job.gpu.name in HOPPER else 4 * MiB)
    if recipe.megatron_style and recipe.zero3_backend == "deepspeed" and bool(np.any(fsdp)):
        # ZeRO-3 under master-* with zero3_backend "deepspeed" is DeepSpeed's, with its defaults
        # (sizes.DS_*): each submodule's
        # parameters are fetched before use and released after unless reused soon
        # (stage3_max_reuse_distance 1e9 elements keeps a checkpointed layer's weights from its
        # recomputation to its backward), with stage3_prefetch_bucket_size elements fetched ahead;
        # no root stays gathered (the head is, at the loss). So a layer's backward holds that layer
        # and the prefetch, the loss the last layer (reused at once) and the head. Gradients are
        # copied into the contiguous reduce bucket (one reduce_bucket_size buffer in the model's
        # dtype, always allocated), not held per unit. Megatron-FSDP (the default zero3_backend)
        # has no such bucket: it gathers and reduce-scatters per unit as FSDP2 does (recipe.
        # ZERO3_BACKENDS) and takes the path above -- charging it the bucket too counted its
        # gradients twice, per unit and in a 1 GB bucket (issue 36: +70 % at TP 2 on 8 H100).
        ds = fsdp
        prefetch = np.minimum(DS_PREFETCH_ELEMENTS * gather_b, unit)
        head = np.maximum(root - job.model.embedding_params() * (not job.model.tied_embeddings) * st.is_first, 0.0)
        gathered = np.where(ds, unit + prefetch, gathered)
        gathered_fwd = np.where(ds & st.is_last, unit + head * gather_b, np.where(ds, unit, gathered_fwd))
        gathered_post = np.where(ds, prefetch, gathered_post)
        held_rs = np.where(ds, 0.0, held_rs)
        unit_fsdp = np.where(ds, 0.0, unit_fsdp)
        ddp = ddp + np.where(ds, DS_REDUCE_BUCKET_ELEMENTS * gather_b, 0.0)
    # FSDP2 allocates each all-gather's flat output on its all-gather copy-in stream in the forward
    # and the pre-backward (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
    # foreach_all_gather: `with device_handle.stream(all_gather_copy_in_stream)`; the stream pair of
    # _fsdp_param_group.py, get_all_gather_streams), copies it out into the unsharded parameters on
    # the compute stream, and in the forward keeps it until the next unit's copy-out (wait_for_unshard:
    # "Defer free to allow for overlap"). The caching allocator keeps freed blocks per stream
    # (CUDACachingAllocator's block pools are searched by stream), so that stream's pool holds the
    # root's flat output and the first block's beside it (both alive at the first block's
    # all-gather) for the rest of the step, out of reach of the compute stream: reserved, not
    # allocated, bytes (_stage_terms). DeepSpeed's ZeRO-3 (master-*) gathers otherwise.
    fsdp2 = fsdp & ~np.asarray(recipe.megatron_style)
    root_flat = np.where(fsdp2, root_g, 0.0)
    unit_flat = np.where(fsdp2, unit, 0.0)
    pp_fsdp, stage_gathered, accumulated = _pipelined_fsdp(job, st, states, fsdp, gather_b)
    if pp_fsdp.any():
        # The whole stage stays gathered (the unit and its prefetch are in it), and the backward
        # accumulates into the stage's unsharded gradients instead of one unit's.
        gathered = np.where(pp_fsdp, stage_gathered, gathered)
        gathered_fwd = np.where(pp_fsdp, stage_gathered, gathered_fwd)
        gathered_post = np.where(pp_fsdp, stage_gathered, gathered_post)
        unsharded_grads = np.where(pp_fsdp, 0.0, unsharded_grads)
        held_rs = np.where(pp_fsdp, 0.0, held_rs)
        unit_fsdp = np.where(pp_fsdp, 0.0, unit_fsdp)
        root_flat = np.where(pp_fsdp, 0.0, root_flat)
        unit_flat = np.where(pp_fsdp, 0.0, unit_flat)
    return _Buffers(gathered=gathered, gathered_fwd=gathered_fwd, gathered_post=gathered_post,
                    unsharded_grads=unsharded_grads, held_rs=held_rs, unit=unit_fsdp, fsdp=fsdp & ~pp_fsdp,
                    ddp=ddp, te_ws=te_ws, fp8_cache=fp8_cache, pp_fsdp=pp_fsdp,
                    accumulated=accumulated, root_flat=root_flat, unit_flat=unit_flat)  # fmt: skip


@dataclass(frozen=True)
class _WeightCopies:
    """Autocast's low-precision weight copies (AMP policies; zero otherwise)."""

    layer: FloatArray  # one layer's
    saved: FloatArray  # one layer's, kept for its backward
    after: FloatArray  # at the forward's end, after the autocast region
    region: FloatArray  # inside the region (every cached copy alive)


def _weight_copies(job: _Job, st: _Stage) -> _WeightCopies:
    model, rc, h = job.model, job.grid.recompute, job.model.hidden
    per_param = job.coef.weight_cache_per_param
    # Matmul weights autocast casts (and caches, and the linears save): a layer's linears (not its
    # norms) and the head's matrices; embedding look-ups are not on autocast's lists (the token and
    # position tables stay fp32). memory-notes D.2, autocast_mode.cpp.
    head_mm = (job.vocab_local + (h * h if model.arch == "encoder" else 0) if model.head == "lm"
               else np.full_like(job.grid.tp, h * (h + model.num_labels)))  # fmt: skip
    layer_mm = job.layer_local - 2 * model.norm_params()
    # Autocast casts each weight once per autocast region and caches the copy until the region
    # exits (memory-notes D.2: "a bf16 weight copy (2) that is live during fwd/bwd"); a linear
    # saves it for backward, so it outlives the region unless the layer is recomputed (full /
    # op-sac checkpointing drops saved tensors and re-casts in the recomputation). Every
    # micro-batch in flight casts its own (one region per forward).
    copy_layer = layer_mm * per_param
    copy_saved = np.where(rc <= RECOMPUTE_CODE["selective"], copy_layer, 0.0)
    copy_head = np.where(st.is_last, head_mm * per_param, 0.0)
    wc_after = st.units * copy_saved + copy_head  # after the region: the saved copies
    wc_region = wc_after + np.where(rc <= RECOMPUTE_CODE["selective"], 0.0, job.chunk_layers * copy_layer)
    return _WeightCopies(layer=copy_layer, saved=copy_saved, after=wc_after, region=wc_region)


def _optimizer_transient(job: _Job, states: _States) -> FloatArray:
    """The optimizer step's temporaries (memory-notes D.3).

    torch.optim's Adam / AdamW (torch/optim/adam.py, _multi_tensor_adam) always allocate one
    state-sized temporary, ``exp_avg_sq_sqrt = _foreach_sqrt(...)`` (Adam's L2 weight decay makes
    a gradient-sized copy first, freed before the sqrt, so it does not add). SGD, with or without
    momentum (torch/optim/sgd.py), updates in place and allocates only for weight decay: ``grads
    = _foreach_add(grads, params, alpha=weight_decay)``, a gradient-sized copy -- absent at
    torch's default weight decay of 0.
    """
    recipe = job.recipe
    state_elem = 2 if recipe.policy == "pure-bf16" else 4
    impl = recipe.resolved_optimizer_impl
    sgd_in_place = recipe.optimizer in ("sgd", "sgd-momentum") and recipe.resolved_weight_decay == 0.0
    if recipe.offload_optimizer or recipe.optimizer == "adam8bit" or impl == "fused" or sgd_in_place:
        return np.zeros_like(states.params)
    if impl == "foreach":
        return states.opt_params * state_elem  # one state-sized temporary of the local shard
    # forloop: the largest tensor's temporaries
    return np.minimum(states.opt_params, job.vocab_local.astype(np.float64)) * state_elem


@dataclass(frozen=True)
class _Phase:
    """One phase of the step on one stage: its allocated bytes and their kinds (the rest of the
    breakdown -- parameters, optimizer states, DDP buckets, workspaces -- is every phase's)."""

    peak: FloatArray
    gradients: FloatArray | float
    activations: FloatArray | float
    logits: FloatArray | float
    buffers: FloatArray | float
    transient: FloatArray | float


@dataclass(frozen=True)
class _StageTerms:
    """Every term of one stage, computed once and shared by the phases."""

    states: _States
    grads_in_a: bool | NDArray[np.bool_]  # gradients already exist in the forward
    const: FloatArray  # parameters + optimizer states + DDP buckets + workspaces
    buffers: _Buffers
    copies: _WeightCopies
    acts: FloatArray
    emb_this: FloatArray


def _forward_end(t: _StageTerms, logits: FloatArray, logits_fwd: FloatArray) -> _Phase:
    """Phase A: at the start of the loss backward (autocast region closed), or in the loss forward
    (region open, every cached weight copy alive, smaller logits) -- whichever is larger."""
    grads = np.where(t.grads_in_a, t.states.grads, 0.0)
    a_base = t.const + grads + t.buffers.gathered_fwd + t.acts
    a_after = a_base + t.copies.after + logits
    a_region = a_base + t.copies.region + logits_fwd
    in_region = a_region > a_after
    return _Phase(
        peak=np.maximum(a_after, a_region), gradients=grads, activations=t.acts,
        logits=np.where(in_region, logits_fwd, logits),
        buffers=t.buffers.gathered_fwd + np.where(in_region, t.copies.region, t.copies.after), transient=0.0,
    )  # fmt: skip


def _layer_transient(job: _Job, layer: _Layer, lg: _LayerGrads, grads_in_a: bool | NDArray[np.bool_]) -> FloatArray:
    """The larger of one layer's MLP-backward and attention-backward transients, with the layer's
    own weight gradients produced by then (marp.activations, bwd_*)."""
    model = job.model
    # A gradient kept between micro-batches (or steps) is accumulated in place, but each weight
    # gradient is first computed into a fresh tensor (AccumulateGrad adds it in afterwards): the
    # MLP phase holds the down projection's either way; later ones are accumulated by then.
    own = np.where(grads_in_a, 0.0, 1.0)
    # By the attention's backward the MLP's saved weight copies (AMP) are freed too.
    h, ffn = model.hidden, model.expert_ffn if model.experts else model.ffn
    n_mlp = 3 if model.mlp == "swiglu" else 2
    copy_mlp = (0 if model.experts else n_mlp * h * ffn) / job.grid.tp * job.coef.weight_cache_per_param
    return np.maximum(np.maximum(layer.mlp_tr + lg.own_mlp, layer.act_tr + own * lg.own_mlp),
                      layer.attn_tr - copy_mlp + own * lg.own_attn)  # fmt: skip


def _backward(job: _Job, layer: _Layer, st: _Stage, t: _StageTerms, lg: _LayerGrads) -> _Phase:
    """Phase B: the backward of one layer of the chunk being back-propagated (chunk_layers layers),
    the other in-flight micro-batches' activations untouched; under FSDP, a unit's post-backward
    (its activations and parameters freed, its gradients being reduce-scattered); or the end of
    the backward.

    Layer l (counting from the first) holds the saved tensors of layers 1..l-1, its own rebuilt
    activations and copies, and -- when the gradients are transient -- the gradients of the head
    side and of layers l+1..n_c: the maximum over l is at one of the ends,
    G_post + (n_c - 1) x max(g, a_saved).
    """
    n_c, grads, grads_in_a, copies = job.chunk_layers, t.states.grads, t.grads_in_a, t.copies
    gathered, unsharded_grads = t.buffers.gathered, t.buffers.unsharded_grads
    a_saved = layer.saved + copies.saved
    other = (st.units - n_c) * a_saved + (st.mbs - 1) * t.emb_this
    layer_now = layer.rebuilt + copies.layer + t.emb_this
    grads_win = ~grads_in_a & (lg.layer > a_saved)
    chain = np.where(grads_in_a, grads + (n_c - 1) * a_saved,
                     lg.post + (n_c - 1) * np.maximum(lg.layer, a_saved))  # fmt: skip
    # FSDP's unsharded gradients are fresh tensors even where the sharded ones persist.
    layer_tr = _layer_transient(job, layer, lg, grads_in_a & ~t.buffers.fsdp)
    base = t.const + other + chain
    b_layers = base + gathered + layer_now + layer_tr + layer.dequant
    in_post: NDArray[np.bool_] | bool = False
    held: FloatArray | float = 0.0
    if t.buffers.fsdp.any():
        # Under FSDP the layers differ: layer l (from the bottom) holds l - 1 layers' saved tensors
        # and n_c - l layers' sharded gradients, as above, and besides every layer but the top
        # (the first back-propagated) runs beside the previous unit's reduce-scatter input
        # (_buffers.held_rs), and the bottom one has no next unit to prefetch. The chain term
        # above is the top's or the bottom's (n_c - 1) x max(g, a); the maximum over l is at the
        # top, at l = 1 or 2, or at n_c - 1 (linear in between).
        # With d = g - a: where gradients outweigh saved tensors (d >= 0) the bottom or the layer
        # above it wins, rs - min(unit, d) over the chain term (or the top, -(n_c - 1) d); else
        # the layer below the top, rs - |d| (or the top, 0). Without FSDP rs = unit = 0: exactly 0.
        rs, unit = t.buffers.held_rs, t.buffers.unit
        d = np.where(grads_in_a, 0.0, lg.layer) - a_saved
        up = d >= 0
        held = np.where(up, np.maximum(-(n_c - 1) * d, rs - np.minimum(unit, d)), np.maximum(rs + d, 0.0))
        if not bool(np.all(n_c >= 3)):
            # Two layers: the bottom (rs, no prefetch) or the top; one: no layer below the top.
            two = np.where(up, np.maximum(-d, rs - unit), np.maximum(rs - unit + d, 0.0))
            held = np.where(n_c >= 3, held, np.where(n_c >= 2, two, 0.0))
        b_layers = b_layers + held
        # (Without FSDP the post-backward terms are 0 and b_post never exceeds b_layers.)
        b_post = base + t.buffers.gathered_post + unsharded_grads + t.emb_this
        in_post = b_post > b_layers
        b_layers = np.maximum(b_layers, b_post)
    # ... or the end of the backward: every gradient, and a tied embedding's second gradient
    # (the look-up's) before it is accumulated into the head's (first stage, pp = 1). Autograd holds
    # the head's gradient of the shared weight in the AccumulateGrad node's input buffer until the
    # look-up's arrives, and sums the two out of place (torch/csrc/autograd/input_buffer.cpp,
    # ``accumulate``: ``old_var + var`` unless the buffered gradient can be stolen), so the look-up's
    # gradient and the sum exist beside the head's: two vocab-sized gradients more than ``grads``
    # (which counts the head's), three where the parameter's .grad already exists (persistent, or a
    # later micro-batch), AccumulateGrad then adding the sum into it in place. Measured (issue 36):
    # `frenzy measure` of tied GPT-2 / BERT-MLM under SGD with or without momentum, whose peak is
    # there, was 8-13.5 % above MARP's one-gradient charge, exactly one vocab x hidden gradient; a
    # plain CUDA run on an H100 (bench/marp_gpu_accumulation_check.py) gave the oracle's peak to the
    # byte. Megatron (master-*) accumulates the head's weight gradient into main_grad itself.
    model = job.model
    tied_copies = 1.0 if job.recipe.megatron_style else np.where(grads_in_a, 3.0, 2.0)
    tied_tmp = np.where(st.is_first & st.is_last & model.tied_embeddings & (not job.lora) & model.vocab_logits,
                        tied_copies * job.vocab_local * job.gb / t.states.g_div, 0.0)  # fmt: skip
    b_end = t.const + grads + tied_tmp
    at_end = b_end > b_layers
    # The terms by kind, in whichever branch set the maximum.
    b_grads = np.where(grads_in_a, grads, lg.post + np.where(grads_win, (n_c - 1) * lg.layer, 0.0))
    b_acts = (other - (st.units - n_c) * copies.saved + layer.rebuilt + t.emb_this
              + np.where(grads_in_a | ~grads_win, (n_c - 1) * layer.saved, 0.0))  # fmt: skip
    b_copies = ((st.units - n_c) * copies.saved + copies.layer
                + np.where(grads_in_a | ~grads_win, (n_c - 1) * copies.saved, 0.0))  # fmt: skip
    # At a post-backward the layer's rebuilt activations and weight copies are gone.
    b_copies = np.where(at_end, 0.0, b_copies)
    b_buffers = gathered + held + b_copies
    if np.any(in_post):
        b_acts = np.where(in_post, b_acts - layer.rebuilt, b_acts)
        b_copies = np.where(in_post & ~at_end, b_copies - copies.layer, b_copies)
        b_buffers = np.where(in_post, t.buffers.gathered_post + unsharded_grads, gathered) + b_copies
    return _Phase(
        peak=np.maximum(b_layers, b_end), gradients=np.where(at_end, grads, b_grads),
        activations=np.where(at_end, 0.0, b_acts), logits=0.0,
        buffers=np.where(at_end, 0.0, b_buffers),
        transient=np.where(at_end, tied_tmp, np.where(in_post, 0.0, layer_tr + layer.dequant)),
    )  # fmt: skip


def _stage_terms(job: _Job, layer: _Layer, st: _Stage) -> dict[str, FloatArray]:
    """The breakdown of one stage at its peak phase (A forward end, B backward, C optimizer step)."""
    states = _model_states(job, st)
    buffers = _buffers(job, st, states)
    acts, emb_this = _activations(job, layer, st)
    grads_in_a: bool | NDArray[np.bool_] = job.grads_persistent | (job.grid.grad_accum > 1)
    states_ab = states
    if buffers.pp_fsdp.any():
        # FSDP under PP: through the forwards and backwards the gradients are the stage's unsharded
        # accumulation (live in the steady state's forwards too); the sharded ones only in phase C.
        states_ab = replace(states, grads=np.where(buffers.pp_fsdp, buffers.accumulated, states.grads))
        grads_in_a = grads_in_a | buffers.pp_fsdp
    t = _StageTerms(
        states=states_ab, grads_in_a=grads_in_a,
        const=states.params + states.opt + buffers.ddp + buffers.te_ws + buffers.fp8_cache, buffers=buffers,
        copies=_weight_copies(job, st), acts=acts, emb_this=emb_this,
    )  # fmt: skip
    opt_tr = _optimizer_transient(job, states)
    # A half-precision main-grad buffer: the step first copies the gradients of the optimizer's
    # parameters to fp32 (Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads,
    # `main_param.grad = model_param.main_grad.float()`; the distributed optimizer copies its shard),
    # freed only by the next step's zero_grad(set_to_none=True), before its forward
    # (NVIDIA/Megatron-LM megatron/optimizer/optimizer.py at d657a3e; megatron/core/optimizer alike).
    grads_c = states.grads + (states.opt_params * 4.0 if job.recipe.main_grad_dtype == "half" else 0.0)
    phases = (
        _forward_end(t, *_logits(job, st)),
        _backward(job, layer, st, t, _layer_grads(job, st, states, buffers.fsdp)),
        _Phase(peak=t.const + grads_c + opt_tr, gradients=grads_c, activations=0.0, logits=0.0,
               buffers=0.0, transient=opt_tr),
    )  # fmt: skip
    stacked = np.stack([p.peak for p in phases])
    phase = np.argmax(stacked, axis=0)
    peak = np.max(stacked, axis=0)
    persistent = t.const + np.where(job.grads_persistent, states.grads, 0.0)
    in_a, in_b = phase == 0, phase == 1
    fragmentation = FRAGMENTATION * np.maximum(peak - persistent, 0.0)
    # FSDP2's copy-in stream pool (_buffers): it holds the root's and a unit's flat all-gather
    # outputs; at most one unit's is alive at a forward-end peak, and two (the current and the
    # prefetched) in a unit's backward, so at least root (forward end) or root - unit (backward)
    # of it is cached and unused at the peak.
    pool = np.where(in_a, buffers.root_flat, np.maximum(buffers.root_flat - buffers.unit_flat, 0.0))
    fragmentation = fragmentation + np.where(phase == 2, buffers.root_flat + buffers.unit_flat, pool)
    if job.lora:
        # Sharded states + LoRA + full recompute: GMLake's measured fragmentation (sizes.py).
        f = SHARDED_LORA_RECOMPUTE_FRAGMENTATION
        gmlake = (job.grid.zero_stage >= 3) & (states.sd > 1) & (job.grid.recompute == RECOMPUTE_CODE["full"])
        fragmentation = np.where(gmlake, np.maximum(fragmentation, peak * f / (1.0 - f)), fragmentation)

    def at_peak(kind: str) -> FloatArray:
        a, b, c = (getattr(p, kind) for p in phases)
        return np.where(in_a, a, np.where(in_b, b, c))

    return {
        "parameters": states.params, "gradients": at_peak("gradients"), "optimizer_states": states.opt,
        "activations": at_peak("activations"), "logits": at_peak("logits"),
        "buffers": buffers.ddp + buffers.te_ws + buffers.fp8_cache + at_peak("buffers"), "transient": at_peak("transient"),
        "fragmentation": fragmentation, "peak": peak, "phase": phase,
    }  # fmt: skip


def _to_bytes(terms: dict[str, FloatArray], reserve: NDArray[np.int64]) -> dict[str, NDArray[np.int64]]:
    """Whole bytes per term; the breakdown's terms are the phase's, made to sum exactly to its peak."""
    ints = {k: np.ceil(np.asarray(terms[k], dtype=np.float64)).astype(np.int64)
            for k in FIELDS if k != "runtime_reserve"}  # fmt: skip
    ints["runtime_reserve"] = reserve.astype(np.int64)
    live = [k for k in FIELDS if k not in ("runtime_reserve", "fragmentation")]
    alloc = sum((ints[k] for k in live), np.zeros_like(reserve))
    ints["transient"] = ints["transient"] + np.maximum(np.ceil(terms["peak"]).astype(np.int64) - alloc, 0)
    ints["peak_allocated"] = sum((ints[k] for k in live), np.zeros_like(reserve))
    ints["reserved"] = ints["peak_allocated"] + ints["fragmentation"]
    ints["total"] = ints["reserved"] + ints["runtime_reserve"]
    ints["phase"] = terms["phase"].astype(np.int64)
    return ints


def memory_for_grid(
    model: ModelSpec, recipe: TrainingRecipe, grid: LayoutGrid, gpu: GpuType | None = None, stage: str = "max"
) -> dict[str, NDArray[np.int64]]:
    """``memory_grid`` over a LayoutGrid: the memory terms of every layout of ``grid`` at once."""
    if stage not in STAGES:
        raise InvalidLayoutError("layout.stage", f"must be one of {', '.join(STAGES)}, got {stage!r}.")
    job = _job(model, recipe, grid, gpu)
    layer = _layer(job)
    reserve = np.where(grid.num_gpus > 1, runtime_reserve_bytes(gpu, 2), runtime_reserve_bytes(gpu, 1))
    first = _to_bytes(_stage_terms(job, layer, _stage(job, last=False)), reserve)
    last = _to_bytes(_stage_terms(job, layer, _stage(job, last=True)), reserve)
    if stage == "first":
        choose_last = np.zeros(first["total"].shape, dtype=bool)
    elif stage == "last":
        choose_last = np.ones(first["total"].shape, dtype=bool)
    else:
        choose_last = last["total"] > first["total"]
    out = {k: np.where(choose_last, last[k], first[k]) for k in first}
    out["stage"] = choose_last.astype(np.int64)
    return out

