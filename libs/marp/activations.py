"""Per-token activation coefficients of one transformer layer: what autograd keeps for backward.

MARP multiplies these by the tokens a rank holds (micro-batch x seq_len / cp) to get activation
bytes. Each coefficient is a sum of named tensors, following Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", sec. 4.1, eq. 1-2: per layer
sbh(34 + 5as/h) at 16 bits with dropout), generalised term by term to GQA, SwiGLU, RMSNorm,
flash attention and the precision policies. Two sets of fake-tensor measurements check them:
memory-notes B.5 (../shared/reference/memory-notes.md, GPT-2 style) and ``frenzy measure``
(services/measure, the oracle of tests/integration/measure: GPT-2, LLaMA and BERT styles, every
policy, flash / eager, per-layer values from 3 layers minus 1 layer at h=256, s=256, b=2):

===============================================  =============  ==================
variant                                          these terms    measured
===============================================  =============  ==================
GPT-2, pure bf16, eager, dropout 0.1 (B.5)       115 (114+1*)   115.0
GPT-2, pure bf16, flash, no dropout (B.5)        32.06          32.07
GPT-2, AMP-bf16, flash (+ weight copies) (B.5)   36.06 + 24     60.08
GPT-2, fp32, eager, dropout 0.1 (B.5)            210            211.0
LLaMA, pure bf16, flash, MHA / GQA (oracle)      45.56 / 43.56  45.59 / 43.59
LLaMA, pure bf16, eager, GQA 8:2 (oracle)        93.5           93.53
LLaMA, AMP-bf16, flash, MHA (oracle)             55.56 + 12.07  67.66
BERT, AMP-bf16, flash (oracle)                   40.06 + 12.05  52.16
===============================================  =============  ==================
(* the materialised causal mask of the measuring model, not counted here.)

Units: bytes per token of one micro-batch at tensor-parallel degree 1. ``rep`` is replicated
across TP ranks (norms and their outputs, dropout masks: divided by tp only under sequence
parallelism), ``par`` is sharded by TP (head- or column-parallel tensors), ``score`` is per
token *and per attended key* (the s x s attention probabilities of eager attention).

The ``bwd_*`` coefficients are the transients of one layer's backward beyond its saved tensors
(the phase-B peak, ``marp.memory``): the backward of a block visits the MLP first, then the
attention, and the two never coexist -- by the time the attention's s x s gradients exist, the
MLP's saved tensors and the second norm's (``relief``) have been freed.
"""

from __future__ import annotations

from dataclasses import dataclass

from marp.models import ModelSpec


@dataclass(frozen=True)
class LayerCoefficients:
    """Bytes per token (and per key for ``score``) one layer keeps, by recompute policy."""

    rep: float  # no recompute, replicated
    par: float  # no recompute, TP-sharded
    score: float  # no recompute, per key, TP-sharded (0 with flash attention)
    sac_rep: float  # op-level SAC: saved layer input
    sac_par: float  # op-level SAC: saved matmul / attention outputs
    ckpt_rep: float  # full recompute: the checkpointed layer input
    weight_cache_per_param: float  # autocast's low-precision weight copies (AMP only), bytes/param
    emb: float  # non-layer, first stage: embedding output / dropout mask
    final: float  # non-layer, last stage: final norm and head input
    # ---- one layer's backward (phase B) ----
    ckpt_alias: bool = True  # the checkpointed input is itself one of the tensors the layer saves
    # Transients of the layer's backward, net of what it has freed by then (may be negative):
    bwd_mlp_rep: float = 0.0  # down projection's backward: residual + branch gradient (post-LN: - LN2)
    bwd_mlp_par: float = 0.0  # down projection's backward: its input gradient
    bwd_act_rep: float = 0.0  # MLP activation's backward: residual gradient (post-LN: - LN2)
    bwd_act_par: float = 0.0  # MLP activation's backward: inner-width gradients net of freed inputs
    bwd_attn_rep: float = 0.0  # attention backward: residual gradient - the norms already freed
    bwd_attn_par: float = 0.0  # attention backward: dV or dq dk dv - the MLP's tensors freed
    bwd_score: float = 0.0  # attention backward, per key: s x s gradients beyond the saved scores
    # MoE token-dispatch copies (the permuted routed tokens and the expert outputs before the
    # combine), saved like ``par`` but on the tokens of the expert-TP group: x etp / tp, not / tp.
    dispatch: float = 0.0


def element_bytes(policy: str) -> int:
    """Activation element size: fp32 keeps 4-byte activations, every other policy 2-byte ones."""
    return 4 if policy == "fp32" else 2


def gpt2_style(model: ModelSpec) -> bool:
    """GPT-2 flavour (a decoder with LayerNorm): HF GPT2Attention projects q, k and v with one fused
    ``c_attn`` matmul; LLaMA-family (RMSNorm) and BERT modules use three separate projections."""
    return model.arch == "decoder" and model.norm == "layernorm"


def _norm_coef(model: ModelSpec, e: int, amp: bool, fused: bool = False) -> float:
    """One norm and its output as saved by the linear it feeds, bytes per token / hidden.

    LayerNorm saves its input (Korthikanti sec. 4.1: 2sbh per LN at 16 bits); under autocast
    layer_norm runs in fp32 on the fp32 residual stream (4 B), and the next linear saves its
    own bf16 copy (memory-notes B.5: AMP-bf16 flash = 32 + 4 + weight copies). HF-style RMSNorm
    (x.float(), x * rsqrt(mean(x^2)), .to(dtype), weight * x) saves the fp32 upcast (4), the
    normalised tensor in the input dtype and the output fed to the linear (memory-notes B.5,
    "RMSNorm fp32 copies"): 4 + 2e for bf16 / fp32, 4 + 4 + 2 under AMP. Fused norm kernels
    (Transformer Engine, apex, torch.compile) save the input and an fp32 statistic per token
    only, like LayerNorm.
    """
    if model.norm == "layernorm" or fused:
        return (4 if amp else e) + e
    x_dtype = 4 if amp else e
    return 4 + x_dtype + e


def _mlp_coef(model: ModelSpec, e: int, ffn: int, fused: bool = False) -> float:
    """MLP tensors saved per token: GeLU keeps its input and output (fc1 out, fc2 in: 2ef; 8 + 8
    sbh at f = 4h, Korthikanti); SwiGLU keeps gate, SiLU(gate), up and their product (4ef), or,
    with Megatron's fused bias-SwiGLU (megatron/core/fusions/fused_bias_swiglu.py saves only its
    input), the concatenated gate/up (2ef) and the product fed to the down projection (ef)."""
    if model.mlp == "swiglu":
        return (3 if fused else 4) * e * ffn
    return 2 * e * ffn


def _moe_extra(model: ModelSpec, e: int) -> float:
    """Router and token-dispatch tensors of one MoE layer per token: fp32 router logits and
    probabilities (2 x 4 B x experts) and the permuted copy of each routed token (top_k x e x h),
    plus the un-permuted expert outputs before the weighted combine (top_k x e x h). Megatron-LM
    MoE token dispatcher (Shoeybi et al. 2019 code base; Fedus et al. 2022 sec. 2 for routing).
    Per token of the sequence-parallel shard; with expert tensor parallelism the dispatcher
    all-gathers the routed tokens over the etp ranks after the all-to-all (Megatron-LM
    core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher), so a rank's copies are
    etp x those of its own tokens (``LayerCoefficients.dispatch``)."""
    return 8 * model.experts + 2 * model.top_k * e * model.hidden


def _softmax_bytes(model: ModelSpec, e: int, amp: bool, fused: bool) -> tuple[int, int, int]:
    """(p, d, c) of eager attention's softmax, bytes per score element: p its saved output, d its
    input (the dtype of its gradient), c the low-precision copy of the output fed to P @ V.

    Under autocast softmax is an fp32 op: the bf16 scores are cast up (d = 4), the fp32 output is
    saved and a bf16 copy goes to the matmul (4, 4, 2). HF's LLaMA-family eager attention
    (modeling_llama.py eager_attention_forward: ``softmax(w, dim=-1, dtype=torch.float32)
    .to(query.dtype)``) upcasts as well: ATen's softmax with a dtype converts its input first
    (aten/src/ATen/native/SoftMax.cpp; only CUDA fp16 inputs take the fused half_to_float path),
    so (4, 4, 2) from bf16 scores, (4, 4, 0) from fp32 ones. GPT-2 and BERT, and Megatron's fused
    softmax, stay in the compute dtype (e, e, 0; Korthikanti's 2as/h per softmax output at 16 bits).
    """
    if amp:
        return 4, 4, 2
    if model.norm == "rmsnorm" and not fused:
        return 4, 4, (2 if e == 2 else 0)
    return e, e, 0


@dataclass(frozen=True)
class _Layer:
    """What every group of one layer's terms reads: its widths and element sizes under a policy."""

    model: ModelSpec
    e: int  # activation element bytes
    amp: bool
    drop: bool  # dropout on
    flash: bool
    fused: bool
    q_w: int  # attention widths: Q, K, V and the attention output
    k_w: int
    v_w: int
    o_w: int
    residual: int  # element bytes of the residual stream
    norm: float  # one norm and its output (``_norm_coef``)
    stats: int  # one norm's fp32 statistics per token
    qkv_casts: float  # autocast's bf16 copies of the norm output for q, k and v (beyond ``norm``'s one)
    mlp_casts: float  # the same for the MLP's gate and up
    ffn: int  # the MLP's inner width (an expert's in a MoE layer)
    p_bytes: int  # eager softmax, bytes per score element (``_softmax_bytes``): its saved output,
    d_bytes: int  # its input,
    c_bytes: int  # its low-precision copy for P @ V

    @property
    def h(self) -> int:
        return self.model.hidden

    @property
    def a(self) -> int:
        return self.model.heads

    @property
    def pv_bytes(self) -> int:
        """Eager attention with dropout: bytes per score of the dropout output P @ V saves (the
        low-precision copy's dtype where softmax upcasts, else the compute dtype)."""
        return self.c_bytes if self.c_bytes else self.e


def _layer(model: ModelSpec, policy: str, flash: bool, dropout: float, fused: bool, kv_repeat: bool) -> _Layer:
    e = element_bytes(policy)
    amp = policy.startswith("amp-")
    h = model.hidden
    # GQA (Ainslie et al. 2023): K and V are kv_dim wide, unless repeated to all heads first --
    # repeat_kv in HF eager attention and in torchtitan's / torchtune's Llama, repeat_interleave
    # in Megatron's unfused attention -- when the matmuls (or SDPA) save the h-wide copies and the
    # kv-wide originals are freed.
    kv = h if (kv_repeat or not flash) else model.kv_dim
    # Attention widths: Q, K, V and the attention output. Multi-head latent attention has its own
    # per-head sizes (K and V expanded from the latent per head, so never repeated).
    q_w, k_w, v_w, o_w = (model.q_width, model.k_width, model.v_width, model.o_width) if model.mla else (h, kv, kv, h)
    residual = 4 if (amp or policy == "fp32") else e  # the residual stream (fp32 under autocast)
    # Per token, each norm also saves fp32 statistics: LayerNorm its mean and rstd (aten
    # native_layer_norm), RMSNorm its rsqrt.
    stats = 8 if (model.norm == "layernorm" or fused) else 4
    qkv_casts = mlp_casts = 0.0
    if amp and not fused:
        # Autocast caches casts of weights only (autocast_mode.cpp cached_cast: leaf tensors that
        # require grad), so every linear reading the fp32 norm output makes and saves its own bf16
        # copy: q, k and v (one fused c_attn for GPT-2), gate and up for SwiGLU. One is in ``norm``.
        qkv_casts = 2.0 * h * (0 if gpt2_style(model) else 2)
        mlp_casts = 2.0 * h * (1 if model.mlp == "swiglu" else 0)
    p_bytes, d_bytes, c_bytes = _softmax_bytes(model, e, amp, fused)
    return _Layer(model=model, e=e, amp=amp, drop=dropout > 0.0, flash=flash, fused=fused, q_w=q_w, k_w=k_w,
                  v_w=v_w, o_w=o_w, residual=residual, norm=_norm_coef(model, e, amp, fused), stats=stats,
                  qkv_casts=qkv_casts, mlp_casts=mlp_casts, ffn=model.expert_ffn if model.experts else model.ffn,
                  p_bytes=p_bytes, d_bytes=d_bytes, c_bytes=c_bytes)  # fmt: skip


def layer_coefficients(
    model: ModelSpec, policy: str, flash: bool, dropout: float, fused: bool = False, kv_repeat: bool = False
) -> LayerCoefficients:
    """The per-token coefficients of one layer of ``model`` under a precision policy.

    ``fused``: Megatron / Transformer Engine kernels (fused norms, fused bias-SwiGLU, fused
    softmax) instead of the eager PyTorch / HF modules. ``kv_repeat``: grouped K and V are
    repeated to every query head before attention (see ``TrainingRecipe.kv_repeat``); eager
    attention always repeats them.
    """
    lay = _layer(model, policy, flash, dropout, fused, kv_repeat)
    rep, par, score = _norms_and_attention(lay)
    mlp, dispatch = _mlp_saved(lay)
    par += mlp - dispatch
    emb, final = _stage_ends(lay)
    mlp1_rep, mlp1_par, mlp2_rep, mlp_inner, attn_rep, attn_par, bwd_score = _backward(lay, mlp)
    h = model.hidden
    # Full recompute keeps the layer input only (Korthikanti sec. 4.2: 2sbh per layer at 16 bits,
    # 4sbh with the fp32 residual stream of AMP / fp32, memory-notes B.5 "full checkpointing").
    ckpt = lay.residual * h
    return LayerCoefficients(
        rep=rep, par=par, score=score, sac_rep=lay.residual * h, sac_par=_selective_saved(lay), ckpt_rep=ckpt,
        weight_cache_per_param=2.0 if lay.amp else 0.0, emb=emb, final=final, ckpt_alias=_checkpoint_is_saved(lay),
        bwd_mlp_rep=mlp1_rep, bwd_mlp_par=mlp1_par, bwd_act_rep=mlp2_rep, bwd_act_par=mlp_inner, bwd_attn_rep=attn_rep, bwd_attn_par=attn_par,
        bwd_score=bwd_score, dispatch=dispatch,
    )  # fmt: skip


def _norms_and_attention(lay: _Layer) -> tuple[float, float, float]:
    """(rep, par, score) of everything the layer saves but its MLP: the norms, dropout masks and
    autocast copies (replicated), the attention's tensors (TP-sharded) and its scores (per key)."""
    model, e, h, a = lay.model, lay.e, lay.h, lay.a
    # Replicated: two norms (+ outputs) and, with dropout, two hidden-dropout masks of 1 B
    # (bool masks; Korthikanti's "sbh" dropout-mask terms), and each norm's statistics.
    rep = h * (2 * lay.norm + (2 if lay.drop else 0)) + 2 * lay.stats
    if lay.amp and not lay.fused:
        rep += lay.qkv_casts + lay.mlp_casts  # (see _layer)

    # TP-sharded: Q, K, V, and the attention output, which is also the out-projection's input.
    # Rotary embeddings (q * cos + rotate_half(q) * sin) keep nothing of q or k: cos and sin do
    # not require grad, and autograd's mul saves an operand only for the other's gradient
    # (tools/autograd/derivatives.yaml, mul.Tensor) -- so the rotated Q and K are all there is.
    par = e * (lay.q_w + lay.k_w + lay.v_w) + e * lay.o_w
    if model.mla:
        # The latents, replicated (Megatron's MLA down projections are not split): the K/V latent and
        # the decoupled RoPE key, the query latent, each latent's RMSNorm output and fp32 rstd
        # (DeepSeek-V2, arXiv 2405.04434, eqs. 9-10 and 12-13: c^KV (d_c) and k^R (d_h^R) per token,
        # c^Q (d_c'); Q and K per head are d_h + d_h^R wide, V v_head_dim: q_width, k_width, v_width).
        rep += e * (2 * model.kv_lora_rank + model.qk_rope_head_dim + 2 * model.q_lora_rank)
        rep += 4 * (2 if model.q_lora_rank else 1)
    score = 0.0
    if lay.flash:
        par += 4 * a  # flash keeps only the fp32 log-sum-exp per head (Dao et al. 2022)
    else:
        # Eager: the softmax output and its low-precision copy for P @ V; with attention dropout
        # the 1 B mask and the dropout output, which P @ V saves instead of the copy (dropout does
        # not save its input): Korthikanti's 5as/h at 16 bits.
        score = a * (lay.p_bytes + 1 + lay.pv_bytes) if lay.drop else a * (lay.p_bytes + lay.c_bytes)
    return rep, par, score


def _mlp_saved(lay: _Layer) -> tuple[float, float]:
    """(mlp, dispatch): what the MLP saves per token (a MoE layer's routed experts, router and
    shared expert), and the part of it that is token-dispatch copies (``LayerCoefficients.dispatch``)."""
    model, e = lay.model, lay.e
    mlp = _mlp_coef(model, e, lay.ffn, lay.fused)
    dispatch = 0.0
    if model.experts:
        mlp = model.top_k * mlp + _moe_extra(model, e)
        if model.shared_ffn:
            mlp += _mlp_coef(model, e, model.shared_ffn, lay.fused)  # the shared expert, every token
        dispatch = 2.0 * model.top_k * e * model.hidden  # _moe_extra's token copies
    return mlp, dispatch


def _selective_saved(lay: _Layer) -> float:
    """``sac_par``: op-level SAC (torchtitan, "selective op" policy): the checkpointed layer input
    plus the outputs of every other matmul (1st, 3rd, ...) and of the attention kernel are saved;
    the rest is recomputed in backward."""
    model, e, h, ffn = lay.model, lay.e, lay.h, lay.ffn
    # (Matmul outputs: K and V are kv_dim wide whether or not they are repeated afterwards.)
    kvm = model.kv_dim
    mm_widths = [lay.q_w, kvm if not model.mla else lay.k_w, kvm if not model.mla else lay.v_w, h]
    mm_widths += [ffn, ffn, h] if model.mlp == "swiglu" else [ffn, h]
    sac_par = e * sum(mm_widths[0::2]) + e * h + (4 * lay.a if lay.flash else 0)
    if model.experts:
        sac_par += e * (model.top_k - 1) * ffn
    return sac_par


def _checkpoint_is_saved(lay: _Layer) -> bool:
    """Is the checkpointed input one of the tensors the rebuilt layer saves? A (pre-)LayerNorm and a
    fused norm save their input as is; HF RMSNorm saves its fp32 upcast, the input itself when it
    is already fp32; BERT's post-LN block saves its input through q/k/v unless autocast casts it."""
    if lay.fused:
        return True
    if lay.model.arch == "encoder":
        return not lay.amp
    return lay.model.norm == "layernorm" or lay.residual == 4


def _stage_ends(lay: _Layer) -> tuple[float, float]:
    """(emb, final): the non-layer terms. First stage: the embedding output (input of layer 1:
    counted by the layer as its residual input) plus the embedding-dropout mask; an encoder adds its
    embedding LayerNorm input and output. Last stage: the final norm (decoders) and the head input."""
    model, e, h, norm = lay.model, lay.e, lay.h, lay.norm
    # An encoder's embedding LayerNorm is saved like a block's second norm (input, statistics, its
    # output as layer 1's q/k/v save it: three bf16 casts under autocast).
    emb = (h if lay.drop else 0) + (norm * h + lay.stats + lay.qkv_casts if model.arch == "encoder" else 0)
    if model.arch == "decoder":
        final = norm * h
    elif model.head == "lm":
        final = (e + norm) * h  # MLM transform: the dense output (GeLU input), then the LayerNorm
    else:
        # Classifier: the pooler reads the first token. Its linear saves that row as a view of the
        # last block's output, which keeps the whole output alive (counted by the block as its
        # second norm's output); under autocast it saves a bf16 cast of the row only, and the
        # block output (and the casts a next block would have made) are never kept.
        final = -(e * h + lay.qkv_casts) if lay.amp and not lay.fused else 0.0
    return emb, final


def _backward(lay: _Layer, mlp: float) -> tuple[float, float, float, float, float, float, float]:
    """One layer's backward (phase B), beyond its saved tensors: the ``bwd_*`` coefficients in
    field order (mlp_rep, mlp_par, act_rep, act_par, attn_rep, attn_par, score). ``mlp``: what the
    MLP saved (``_mlp_saved``), freed by the time the attention's backward runs."""
    model, e, h, a, ffn, norm, stats = lay.model, lay.e, lay.h, lay.a, lay.ffn, lay.norm, lay.stats
    # Incoming residual gradient, in the residual dtype; under autocast also its bf16 cast into the
    # block's last linear (the engine casts a gradient to its input's dtype), freed by that linear.
    dres = lay.residual * h
    # MLP backward: GeLU holds d(fc2 input) and d(fc1 output) while the GeLU output is already
    # freed, net + e f; SwiGLU at the product's backward holds d(product), d(silu) and d(up) with
    # the product freed, net + 2 e f. A post-LN block (BERT) runs its LN2 backward first: the
    # block output (which the next block or the head saved, already back-propagated) and LN2's
    # input and statistics are gone.
    mlp_inner = (2 if model.mlp == "swiglu" else 1) * e * ffn * max(model.top_k, 1)
    norm2_all = norm * h + stats + lay.qkv_casts  # post-LN: LN2 in/out + the next block's casts of it
    # Two moments: the down projection's backward holds the branch gradient (the autocast cast, or
    # hidden dropout's backward output, grad x mask x scale: e h, one or the other) and its input
    # gradient (e f); by the activation's backward both are freed.
    relief_mlp = norm2_all + (h if lay.drop else 0) if model.arch == "encoder" else 0
    mlp1_rep = dres + (e * h if (lay.amp or lay.drop) else 0) - relief_mlp
    mlp1_par = e * ffn * max(model.top_k, 1)
    mlp2_rep = dres - relief_mlp
    # Attention backward, after the MLP's tensors, the second norm's (post-LN: both norms') and,
    # in eager attention, the out-projection's input (a reshaped copy of P @ V) are freed. Flash
    # produces dq, dk, dv at once (+ fp32 softmax statistics) from d(out); eager holds dV while
    # softmax's backward runs on its saved output p, its gradient (p) and the input gradient it
    # produces (d), the low-precision copy (c) already freed: a (p + d - c) per key.
    if model.arch == "encoder":
        relief_rep = 2 * (norm * h + stats) + lay.qkv_casts + lay.mlp_casts + (2 * h if lay.drop else 0)
    else:
        relief_rep = norm * h + stats + lay.mlp_casts + (h if lay.drop else 0)
    if lay.flash:
        attn_par = e * lay.o_w + e * (lay.q_w + lay.k_w + lay.v_w) + 4 * a - mlp
        bwd_score = 0.0
    else:
        attn_par = e * lay.v_w - mlp - e * lay.o_w
        if lay.drop:
            # The saved dropout output (low) is freed by P @ V's backward, its gradient and the
            # dropout's input gradient are made, the mask freed, then softmax's backward as above.
            low = lay.pv_bytes
            bwd_score = a * max(low, lay.p_bytes + lay.d_bytes - low - 1)
        else:
            bwd_score = a * (lay.p_bytes + lay.d_bytes - lay.c_bytes)
    return mlp1_rep, mlp1_par, mlp2_rep, mlp_inner, dres - relief_rep, attn_par, bwd_score


__all__ = ["LayerCoefficients", "element_bytes", "gpt2_style", "layer_coefficients"]
