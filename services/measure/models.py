"""Plain torch modules for a ``marp.ModelSpec``: what ``frenzy measure`` trains on fake tensors.

Three flavours, written to keep for backward exactly what the Hugging Face reference modules
keep (the memory, not the code, is what is reproduced; nothing is copied from transformers):

* GPT-2 style (``norm == "layernorm"``, decoder): pre-LN blocks, learned positions, biases,
  tanh-GeLU MLP, softmax in the compute dtype in eager attention (GPT2Attention._attn);
* LLaMA style (``norm == "rmsnorm"``): HF RMSNorm (fp32 upcast, normalise, cast back, scale),
  rotary embeddings applied as q*cos + rotate_half(q)*sin, SwiGLU, GQA (K and V repeated to
  every head with ``repeat_kv`` as torchtitan's and torchtune's Llama and HF's eager attention do,
  or, ``gqa="native"``, grouped K/V handed to SDPA with ``enable_gqa``), eager softmax
  upcast to fp32 and cast back (``softmax(..., dtype=float32).to(query.dtype)``), no biases
  (``qkv_bias`` for Qwen2);
* BERT style (``arch == "encoder"``): post-LN blocks, learned positions and token types,
  embedding LayerNorm, exact GeLU, bidirectional attention, a masked-LM head (dense, GeLU,
  LayerNorm, decoder tied to the word embeddings plus a vocabulary bias) or a classifier
  (pooler on the first token + linear).

Parameters are created directly in the policy's storage dtype with ``torch.empty`` (no
initialisation: values never matter on fake tensors, and ``module.to(dtype)`` fails under
FakeTensorMode, memory-notes pitfall 3). Dropout, where the spec's flavour has it (GPT-2:
embeddings, attention probabilities, both residual branches; BERT: after the embedding
LayerNorm, attention probabilities, both sub-layer outputs), is ``torch.native_dropout``, which
saves a bool mask as CUDA's does (CPU ``F.dropout`` saves a float noise tensor, pitfall 4).
Attention "flash" is SDPA without dropout (the CPU flash kernel keeps only the output and an
fp32 log-sum-exp, like FlashAttention-2, whose dropout keeps only an RNG state; CPU SDPA with
dropout would fall back to the math path, pitfall 5); "eager" materialises the s x s scores and
probabilities.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from frenzy.measure.config import ATTENTIONS, GQA_MODES, RECOMPUTES
from frenzy.measure.precision import Policy
from marp import ModelSpec
from marp.activations import gpt2_style

LN_EPS = 1e-5


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.native_dropout(x, p, True)[0] if p > 0 else x


def _param(policy: Policy, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=policy.param_dtype))


class Linear(nn.Linear):
    """y = x W^T + b, with autocast's casts (weights through the region's cache).

    An ``nn.Linear`` (so that DTensor's ColwiseParallel / RowwiseParallel and peft's LoRA accept
    it) whose parameters are created uninitialised in the policy's dtype: nn.Linear's own
    ``__init__`` is skipped, its initialisation would only cost time on fake tensors."""

    def __init__(self, policy: Policy, d_in: int, d_out: int, bias: bool) -> None:
        nn.Module.__init__(self)
        self.policy = policy
        self.in_features, self.out_features = d_in, d_out
        self.weight = _param(policy, d_out, d_in)
        self.bias = _param(policy, d_out) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.policy
        return F.linear(p.low(x), p.low(self.weight), p.low(self.bias))


class Embedding(nn.Embedding):
    """The token embedding as an ``nn.Embedding`` (DTensor's RowwiseParallel shards it by
    vocabulary), its weight uninitialised in the policy's dtype."""

    def __init__(self, policy: Policy, vocab: int, h: int) -> None:
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = vocab, h
        self.padding_idx, self.max_norm, self.norm_type = None, None, 2.0
        self.scale_grad_by_freq, self.sparse = False, False
        self.weight = _param(policy, vocab, h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, policy: Policy, h: int) -> None:
        super().__init__()
        self.policy = policy
        self.weight = _param(policy, h)
        self.bias = _param(policy, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # layer_norm is on CUDA autocast's fp32 list; it saves its input and fp32 mean / rstd.
        return F.layer_norm(self.policy.f32(x), (x.shape[-1],), self.weight, self.bias, LN_EPS)


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm's computation: the fp32 upcast, its normalised copy cast back to the input
    dtype, and the weight product are what autograd keeps (the upcast by pow and mul, the cast-back
    copy by the weight product, the output by the next linear)."""

    def __init__(self, policy: Policy, h: int) -> None:
        super().__init__()
        self.policy = policy
        self.weight = _param(policy, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        var = self.policy.f32(x32).pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(var + 1e-6)
        return self.weight * x32.to(dtype)


def _norm(spec: ModelSpec, policy: Policy) -> nn.Module:
    return RMSNorm(policy, spec.hidden) if spec.norm == "rmsnorm" else LayerNorm(policy, spec.hidden)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, policy: Policy, attention: str, gqa: str = "repeat",
                 dropout: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        h, kv = spec.hidden, spec.kv_dim
        self.dropout = dropout
        qkv_bias = spec.bias or spec.qkv_bias
        self.policy = policy
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.causal = spec.arch == "decoder"
        self.flash = attention == "flash"
        # Eager attention always repeats (a batched matmul needs per-head K and V).
        self.repeat_kv = spec.kv_heads != spec.heads and (gqa == "repeat" or not self.flash)
        # HF LLaMA-family eager attention upcasts the softmax; GPT-2 and BERT keep the input dtype.
        self.softmax_fp32 = spec.norm == "rmsnorm"
        # GPT-2 projects q, k and v with one fused matmul (HF GPT2Attention.c_attn): under autocast
        # its input is cast once, where three projections (LLaMA, BERT) cast it three times.
        self.fused_qkv = gpt2_style(spec)
        if self.fused_qkv:
            self.qkv = Linear(policy, h, h + 2 * kv, qkv_bias)
        else:
            self.q = Linear(policy, h, h, qkv_bias)
            self.k = Linear(policy, h, kv, qkv_bias)
            self.v = Linear(policy, h, kv, qkv_bias)
        self.o = Linear(policy, h, h, spec.bias)
        # An attention kernel set from outside (the multi-GPU oracle's ring attention for context
        # parallelism), called as sdpa(q, k, v) in place of flash / eager attention.
        self.sdpa: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        b, s, _ = x.shape
        if self.fused_qkv:
            kv = self.kv_heads * self.head_dim
            q, k, v = self.qkv(x).split([self.heads * self.head_dim, kv, kv], dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        # Head counts from the shapes: under tensor parallelism q, k and v hold this rank's heads.
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, s, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        p = self.policy
        q, k, v = p.low(q), p.low(k), p.low(v)
        if self.repeat_kv:  # expand + reshape materialises h-wide K and V (the kv-wide ones are freed)
            groups, d, kv_local = self.heads // self.kv_heads, self.head_dim, k.shape[1]
            k = k[:, :, None].expand(b, kv_local, groups, s, d).reshape(b, kv_local * groups, s, d)
            v = v[:, :, None].expand(b, kv_local, groups, s, d).reshape(b, kv_local * groups, s, d)
        if self.sdpa is not None:
            out = self.sdpa(q, k, v)
        elif self.flash:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                                 enable_gqa=k.shape[1] != q.shape[1])  # fmt: skip
        else:
            out = self._eager(q, k, v, mask)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            scores = scores + mask
        if self.softmax_fp32:
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            probs = F.softmax(self.policy.f32(scores), dim=-1).to(v.dtype)
        return torch.matmul(_dropout(probs, self.dropout), v)


class Mlp(nn.Module):
    def __init__(self, spec: ModelSpec, policy: Policy) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn
        self.swiglu = spec.mlp == "swiglu"
        self.exact_gelu = spec.arch == "encoder"  # BERT: erf GeLU; GPT-2: gelu_new (tanh)
        if self.swiglu:
            self.gate = Linear(policy, h, f, spec.bias)
        self.up = Linear(policy, h, f, spec.bias)
        self.down = Linear(policy, f, h, spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="none" if self.exact_gelu else "tanh"))


class Block(nn.Module):
    """Pre-LN decoder block, or BERT's post-LN encoder block."""

    def __init__(self, spec: ModelSpec, policy: Policy, attention: str, gqa: str, dropout: float) -> None:
        super().__init__()
        self.post_ln = spec.arch == "encoder"
        self.p = dropout
        self.norm1, self.attn = _norm(spec, policy), Attention(spec, policy, attention, gqa, dropout)
        self.norm2, self.mlp = _norm(spec, policy), Mlp(spec, policy)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        p = self.p
        if self.post_ln:
            x = self.norm1(x + _dropout(self.attn(x, rope, mask), p))
            return self.norm2(x + _dropout(self.mlp(x), p))
        x = x + _dropout(self.attn(self.norm1(x), rope, mask), p)
        return x + _dropout(self.mlp(self.norm2(x)), p)


class TransformerModel(nn.Module):
    """Embeddings, blocks and the head of ``spec``; ``forward`` returns the logits.

    ``recompute == "full"`` checkpoints every block (torch.utils.checkpoint, non-reentrant): the
    block input is kept and the block is recomputed in the backward, under a fresh autocast
    region (``recompute_context``).
    """

    def __init__(self, spec: ModelSpec, policy: Policy, attention: str = "flash", recompute: str = "none",
                 gqa: str = "repeat", dropout: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.dropout = dropout
        if gqa not in GQA_MODES:
            raise ValueError(f"gqa must be one of {', '.join(GQA_MODES)}, got {gqa!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        if recompute not in RECOMPUTES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTES)}, got {recompute!r}")
        if spec.experts:
            raise ValueError(f"{spec.name}: mixture-of-experts models are not supported by frenzy measure")
        self.spec, self.policy, self.recompute = spec, policy, recompute
        h = spec.hidden
        self.embed = Embedding(policy, spec.vocab, h)
        self.wpe = _param(policy, spec.max_positions, h) if spec.pos_emb == "learned" else None
        encoder = spec.arch == "encoder"
        self.wtt = _param(policy, spec.type_vocab, h) if encoder and spec.type_vocab else None
        self.emb_norm = _norm(spec, policy) if encoder else None
        self.blocks = nn.ModuleList(Block(spec, policy, attention, gqa, dropout) for _ in range(spec.n_layers))
        self.final_norm = _norm(spec, policy) if spec.arch == "decoder" else None
        if spec.head == "classifier":
            self.pooler = Linear(policy, h, h, True)
            self.classifier = Linear(policy, h, spec.num_labels, True)
        elif encoder:  # BERT MLM head: transform (dense, GeLU, LayerNorm) + decoder + vocab bias
            self.mlm_dense = Linear(policy, h, h, True)
            self.mlm_norm = _norm(spec, policy)
            self.mlm_bias = _param(policy, spec.vocab)
        self.lm_head = (Linear(policy, h, spec.vocab, False)
                        if spec.head == "lm" and not spec.tied_embeddings else None)  # fmt: skip
        if spec.pos_emb == "rope":
            inv_freq = 1.0 / 10000.0 ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim)
            self.register_buffer("inv_freq", inv_freq, persistent=False)

    def recompute_context(self) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        return contextlib.nullcontext(), self.policy.region()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        b, s = ids.shape
        x = self.embed(ids)  # not on autocast's lists: stays in the parameter dtype
        if self.wpe is not None:
            x = x + F.embedding(torch.arange(s, device=ids.device), self.wpe)
        if self.wtt is not None:
            x = x + F.embedding(torch.zeros_like(ids), self.wtt)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        x = _dropout(x, self.dropout)
        rope = None
        if spec.pos_emb == "rope":
            # Computed once per forward and shared by every layer (HF LlamaRotaryEmbedding), in
            # the dtype of the hidden states.
            with torch.no_grad():
                freqs = torch.outer(torch.arange(s, dtype=torch.float32), self.inv_freq)
                emb = torch.cat((freqs, freqs), dim=-1)
                rope = (emb.cos().to(x.dtype), emb.sin().to(x.dtype))
        mask = None
        if spec.arch == "decoder" and not self.blocks[0].attn.flash:
            # One additive causal mask for all layers, in the hidden states' dtype as HF builds it
            # (fp32 under autocast, where adding it promotes the bf16 scores to fp32).
            mask = torch.full((s, s), float("-inf"), dtype=x.dtype).triu(1)
        for block in self.blocks:
            if self.recompute == "full":
                x = checkpoint(block, x, rope, mask, use_reentrant=False, preserve_rng_state=False,
                               context_fn=self.recompute_context)  # fmt: skip
            else:
                x = block(x, rope, mask)
        return self._head(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        if spec.head == "classifier":
            pooled = torch.tanh(self.pooler(x[:, 0]))
            return self.classifier(pooled)
        if spec.arch == "encoder":
            x = self.mlm_norm(F.gelu(self.mlm_dense(x)))
            weight = self.wte if spec.tied_embeddings else self.lm_weight
            return F.linear(self.policy.low(x), self.policy.low(weight), self.policy.low(self.mlm_bias))
        x = self.final_norm(x)
        if self.lm_head is not None:
            return self.lm_head(x)
        return F.linear(self.policy.low(x), self.policy.low(self.wte))

    @property
    def wte(self) -> torch.Tensor:
        return self.embed.weight

    @property
    def lm_weight(self) -> torch.Tensor:
        return self.lm_head.weight  # type: ignore[union-attr]


def build_model(spec: ModelSpec, policy: Policy, attention: str = "flash", recompute: str = "none",
                gqa: str = "repeat", dropout: float = 0.0) -> TransformerModel:  # fmt: skip
    """The model of ``spec`` (create it under FakeTensorMode: no memory is allocated)."""
    return TransformerModel(spec, policy, attention, recompute, gqa, dropout)


def loss_fn(spec: ModelSpec) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy on fp32-upcast logits (HF's loss and torchtitan's ``pred.float()``)."""

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten())

    return loss


__all__ = ["ATTENTIONS", "GQA_MODES", "RECOMPUTES", "TransformerModel", "build_model", "loss_fn"]
