"""Per-token activation coefficients of one transformer layer: what autograd keeps for backward.

MARP multiplies these by the tokens a rank holds (micro-batch x seq_len / cp) to get activation
bytes. Each coefficient is a sum of named tensors, following Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", sec. 4.1, eq. 1-2: per layer
sbh(34 + 5as/h) at 16 bits with dropout), generalised term by term to GQA, SwiGLU, RMSNorm,
RoPE, flash attention and the precision policies, with the per-variant values measured on
fake tensors in memory-notes B.5 (../shared/reference/memory-notes.md) as the check:

=============================================  =============  ==================
variant (h=1024, a=16, s=1024)                 these terms    measured (B.5)
=============================================  =============  ==================
GPT-2, pure bf16, eager, dropout 0.1           115 (114+1*)   115.0
GPT-2, pure bf16, flash, no dropout            32.06          32.07
GPT-2, AMP-bf16, flash (+ weight copies)       36.06 + 24     60.08
GPT-2, AMP-bf16, eager                         132 + 24 + 1*  157.0
GPT-2, fp32, eager, dropout 0.1                210            211.0
Llama-style bf16 flash MHA / GQA kv=4          50.06 / 45.56  50.3 / 45.8
=============================================  =============  ==================
(* the materialised causal mask of the measuring model, not counted here.)

Units: bytes per token of one micro-batch at tensor-parallel degree 1. ``rep`` is replicated
across TP ranks (norms and their outputs, dropout masks: divided by tp only under sequence
parallelism), ``par`` is sharded by TP (head- or column-parallel tensors), ``score`` is per
token *and per attended key* (the s x s attention probabilities of eager attention).
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


def element_bytes(policy: str) -> int:
    """Activation element size: fp32 keeps 4-byte activations, every other policy 2-byte ones."""
    return 4 if policy == "fp32" else 2


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
    MoE token dispatcher (Shoeybi et al. 2019 code base; Fedus et al. 2022 sec. 2 for routing)."""
    return 8 * model.experts + 2 * model.top_k * e * model.hidden


def layer_coefficients(
    model: ModelSpec, policy: str, flash: bool, dropout: float, fused: bool = False
) -> LayerCoefficients:
    """The per-token coefficients of one layer of ``model`` under a precision policy.

    ``fused``: Megatron / Transformer Engine kernels (fused norms, fused RoPE that keeps no
    pre-rotation copies, fused bias-SwiGLU) instead of the eager PyTorch / HF modules.
    """
    e = element_bytes(policy)
    amp = policy.startswith("amp-")
    drop = dropout > 0.0
    h, kv, a = model.hidden, model.kv_dim, model.heads

    # Replicated: two norms (+ outputs) and, with dropout, two hidden-dropout masks of 1 B
    # (bool masks; Korthikanti's "sbh" dropout-mask terms).
    rep = h * (2 * _norm_coef(model, e, amp, fused) + (2 if drop else 0))

    # TP-sharded: Q, K, V (GQA: K and V are kv_dim wide, Ainslie et al. 2023) ...
    par = e * (h + 2 * kv)
    if model.pos_emb == "rope" and not fused:
        # ... the pre-rotation Q and K kept besides the rotated ones (memory-notes B.5: +e(h+kv)
        # reproduces the Llama-style MHA 50.3 / GQA 45.8 sbh) ...
        par += e * (h + kv)
    par += e * h  # ... the attention output, which is also the out-projection's input ...
    score = 0.0
    if flash:
        par += 4 * a  # ... flash keeps only the fp32 log-sum-exp per head (Dao et al. 2022)
    else:
        # Eager: softmax output (fp32 under AMP, plus its bf16 copy fed to P@V), and with
        # attention dropout its 1 B mask and output (Korthikanti's 5as/h at 16 bits).
        score = a * ((4 + 2) if amp else e)
        if drop:
            score += a * (1 + (0 if amp else e))
    ffn = model.expert_ffn if model.experts else model.ffn
    mlp = _mlp_coef(model, e, ffn, fused)
    if model.experts:
        mlp = model.top_k * mlp + _moe_extra(model, e)
    par += mlp

    # op-level SAC (torchtitan, "selective op" policy): the checkpointed layer input plus the
    # outputs of every other matmul (1st, 3rd, ...) and of the attention kernel are saved; the
    # rest is recomputed in backward.
    residual = 4 if (amp or policy == "fp32") else e
    mm_widths = [h, kv, kv, h] + ([ffn, ffn, h] if model.mlp == "swiglu" else [ffn, h])
    sac_par = e * sum(mm_widths[0::2]) + e * h + (4 * a if flash else 0)
    if model.experts:
        sac_par += e * (model.top_k - 1) * ffn
    # Full recompute keeps the layer input only (Korthikanti sec. 4.2: 2sbh per layer at 16 bits,
    # 4sbh with the fp32 residual stream of AMP / fp32, memory-notes B.5 "full checkpointing").
    ckpt = residual * h

    # Non-layer terms. First stage: the embedding output (input of layer 1: counted by the layer
    # as its residual input) plus the embedding-dropout mask; an encoder adds its embedding
    # LayerNorm input and output. Last stage: the final norm (decoders) and the head input.
    emb = (h if drop else 0) + (2 * e * h if model.arch == "encoder" else 0)
    if model.arch == "decoder":
        final = _norm_coef(model, e, amp, fused) * h
    elif model.head == "lm":
        final = (2 * e + _norm_coef(model, e, amp, fused)) * h  # MLM transform: dense, GeLU, LayerNorm
    else:
        final = 0.0  # classifier: pooler on the first token only
    return LayerCoefficients(
        rep=rep, par=par, score=score, sac_rep=residual * h, sac_par=sac_par, ckpt_rep=ckpt,
        weight_cache_per_param=2.0 if amp else 0.0, emb=emb, final=final,
    )  # fmt: skip


__all__ = ["LayerCoefficients", "element_bytes", "layer_coefficients"]
