"""Model description (``ModelSpec``) and exact parameter accounting.

A ``ModelSpec`` holds the few hyper-parameters of a transformer that decide its
memory: decoder (causal LM) or encoder (BERT family), sizes, attention grouping,
MLP flavour, norms, biases, embeddings, the head (LM or classifier) and, for a
mixture-of-experts model, the experts. Parameter counts are exact (they match the published counts of
GPT-2, LLaMA, Mistral and Qwen2.5, see the catalog tests) and are split into the
pieces the memory model needs: what tensor parallelism shards, what it
replicates, and what sits on the first / last pipeline stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from marp._check import check_bool, check_choice, check_int, check_number
from marp.errors import ModelConfigError

Family = Literal["gpt2", "llama", "mistral", "qwen2", "bert", "mixtral", "qwen2_moe", "deepseek", "custom"]
Arch = Literal["decoder", "encoder"]
Head = Literal["lm", "classifier"]
MlpKind = Literal["gelu", "swiglu"]
PosEmb = Literal["learned", "rope"]
NormKind = Literal["layernorm", "rmsnorm"]

FAMILIES: tuple[str, ...] = ("gpt2", "llama", "mistral", "qwen2", "bert", "mixtral", "qwen2_moe", "deepseek", "custom")
ARCHS: tuple[str, ...] = ("decoder", "encoder")
HEADS: tuple[str, ...] = ("lm", "classifier")
MLP_KINDS: tuple[str, ...] = ("gelu", "swiglu")
POS_EMBS: tuple[str, ...] = ("learned", "rope")
NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class ModelSpec:
    """A transformer: a decoder-only LM (default) or an encoder (BERT family, post-LN).

    ``ffn`` is the MLP inner size; for SwiGLU it is the size of each of the gate
    and up projections (HF ``intermediate_size``). ``bias`` means every linear
    layer has a bias (GPT-2); ``qkv_bias`` means only q/k/v have one (Qwen2).
    ``dropout`` (an addition to the brief's field list) is the dropout probability
    used in training: GPT-2's HF config trains with 0.1, LLaMA / Mistral / Qwen2
    with 0. It only changes activation memory (dropout masks, Korthikanti 2022).

    ``head`` "classifier" is a sequence classifier with ``num_labels`` outputs (BERT: pooler
    dense h x h + tanh, then h x num_labels); an encoder's "lm" head is BERT's masked-LM head
    (dense h x h, LayerNorm, decoder tied to the word embeddings plus a vocab bias).
    ``type_vocab`` is BERT's token-type (segment) embedding rows. ``experts`` > 0 makes every
    MLP a mixture of ``experts`` experts of inner size ``expert_ffn`` (default ffn) with top-
    ``top_k`` routing and a linear router (Shazeer et al. 2017; Fedus et al. 2022); ``shared_ffn``
    adds an always-active shared expert MLP of that inner size (DeepSeekMoE, Dai et al. 2024;
    Qwen2-MoE), and the first ``dense_layers`` layers keep a dense MLP of size ``ffn`` (DeepSeek's
    first_k_dense_replace; counted exactly in ``param_count``, charged as MoE layers by the memory
    model, an upper bound).

    ``kv_lora_rank`` > 0 makes the attention multi-head latent attention (MLA, DeepSeek-V2,
    DeepSeek-AI 2024, arXiv 2405.04434, sec. 2.1): K and V come from a shared latent of that rank (plus a decoupled
    RoPE key of ``qk_rope_head_dim``), queries from a latent of ``q_lora_rank`` (0: a plain
    projection); each head has ``qk_nope_head_dim + qk_rope_head_dim`` query/key and
    ``v_head_dim`` value dimensions. MLA needs kv_heads == heads.
    """

    name: str
    family: Family
    n_layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    mlp: MlpKind
    vocab: int
    tied_embeddings: bool
    pos_emb: PosEmb
    max_positions: int
    norm: NormKind
    bias: bool
    qkv_bias: bool = False
    dropout: float = 0.0
    arch: Arch = "decoder"
    head: Head = "lm"
    num_labels: int = 2
    type_vocab: int = 0
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        err = ModelConfigError
        check_choice(self.arch, "model.arch", err, ARCHS)
        check_choice(self.head, "model.head", err, HEADS)
        check_int(self.num_labels, "model.num_labels", err)
        for attr in ("type_vocab", "experts", "top_k", "expert_ffn", *_MOE_MLA_FIELDS):
            check_int(getattr(self, attr), f"model.{attr}", err, minimum=0)
        self._check_moe_mla()
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise err("model.top_k", f"top_k must be in [1, experts={self.experts}], got {self.top_k}.")
            if not self.expert_ffn:
                object.__setattr__(self, "expert_ffn", self.ffn)
        elif self.top_k:
            raise err("model.top_k", "top_k needs experts > 0 (a mixture-of-experts model).")
        if self.arch == "decoder" and self.head == "classifier":
            raise err("model.head", "a classifier head is only supported on encoders.",
                      'use "head": "lm" for a decoder.')  # fmt: skip
        if not isinstance(self.name, str) or not self.name.strip():
            raise err("model.name", f"must be a non-empty string, got {self.name!r}.")
        check_choice(self.family, "model.family", err, FAMILIES)
        for attr in ("n_layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions"):
            check_int(getattr(self, attr), f"model.{attr}", err)
        check_choice(self.mlp, "model.mlp", err, MLP_KINDS)
        check_choice(self.pos_emb, "model.pos_emb", err, POS_EMBS)
        check_choice(self.norm, "model.norm", err, NORMS)
        for attr in ("tied_embeddings", "bias", "qkv_bias"):
            check_bool(getattr(self, attr), f"model.{attr}", err)
        check_number(self.dropout, "model.dropout", err, 0.0, 1.0)
        if self.hidden % self.heads:
            raise err(
                "model.hidden",
                f"hidden size {self.hidden} is not divisible by the number of heads {self.heads}.",
                "use a hidden size that is a multiple of heads (head_dim = hidden / heads).",
            )
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise err(
                "model.kv_heads",
                f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}.",
                "kv_heads must divide heads (kv_heads == heads for plain multi-head attention).",
            )

    def _check_moe_mla(self) -> None:
        err = ModelConfigError
        if not self.experts:
            for attr in ("shared_ffn", "dense_layers"):
                if getattr(self, attr):
                    raise err(f"model.{attr}", f"{attr} needs experts > 0 (a mixture-of-experts model).")
        elif self.dense_layers >= self.n_layers:
            raise err("model.dense_layers", f"{self.dense_layers} dense layers leave no MoE layer of "
                      f"{self.n_layers}.", "use dense_layers < n_layers.")  # fmt: skip
        mla = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if not self.kv_lora_rank:
            for attr in mla:
                if getattr(self, attr):
                    raise err(f"model.{attr}", f"{attr} is a multi-head latent attention size; it needs "
                              "kv_lora_rank > 0.")  # fmt: skip
            return
        for attr in ("qk_rope_head_dim", "v_head_dim"):
            if not getattr(self, attr):
                raise err(f"model.{attr}", f"multi-head latent attention needs {attr} >= 1.")
        if self.kv_heads != self.heads:
            raise err("model.kv_heads", f"multi-head latent attention has one K/V per head: kv_heads must equal "
                      f"heads ({self.heads}), got {self.kv_heads}.")  # fmt: skip
        if self.bias or self.qkv_bias:
            raise err("model.bias", "linear biases are not supported with multi-head latent attention.")

    # ---- shapes -------------------------------------------------------------------------------

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2 / V3)."""
        return self.kv_lora_rank > 0

    @property
    def q_width(self) -> int:
        """Width of Q (= of K per token across heads): heads x (nope + rope) under MLA, else hidden."""
        return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim) if self.mla else self.hidden

    @property
    def k_width(self) -> int:
        return self.q_width if self.mla else self.kv_dim

    @property
    def v_width(self) -> int:
        """Width of V, and of the attention output the output projection reads."""
        return self.heads * self.v_head_dim if self.mla else self.kv_dim

    @property
    def o_width(self) -> int:
        return self.v_width if self.mla else self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: kv_heads x head_dim (GQA, Ainslie et al. 2023)."""
        return self.kv_heads * self.head_dim

    # ---- parameter accounting -----------------------------------------------------------------

    def norm_params(self) -> int:
        """One norm: LayerNorm has a weight and a bias (Ba et al. 2016); RMSNorm only a weight
        (Zhang & Sennrich 2019)."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_params_split(self) -> tuple[int, int]:
        """(tensor-parallel-sharded, replicated) parameters of one transformer layer.

        Megatron-LM TP (Shoeybi et al. 2019, sec. 3): q/k/v and the MLP up (and gate)
        projections are column-parallel, so their weights *and* biases are split; the
        attention output and MLP down projections are row-parallel, so their weights are
        split and their biases replicated; norms are replicated.
        """
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        sharded = 2 * h * h + 2 * h * kv  # Wq, Wo (h x h) and Wk, Wv (h x kv_dim)
        replicated = 2 * self.norm_params()  # pre-attention and pre-MLP norms
        if self.mla:
            sharded, replicated = self._mla_params_split()
            replicated += 2 * self.norm_params()
        if self.bias:
            sharded += h + 2 * kv  # q, k, v biases (column-parallel)
            replicated += h  # attention-output bias (row-parallel)
        elif self.qkv_bias:
            sharded += h + 2 * kv  # Qwen2: q/k/v biases only
        if self.experts:
            # Experts live in expert_params(); the router (h x experts) is replicated; a shared
            # expert is a dense MLP, TP-sharded like one.
            sh_sharded, sh_replicated = self.mlp_params_split(self.shared_ffn) if self.shared_ffn else (0, 0)
            return sharded + sh_sharded, replicated + sh_replicated + h * self.experts
        mlp_sharded, mlp_replicated = self.mlp_params_split(f)
        return sharded + mlp_sharded, replicated + mlp_replicated

    def _mla_params_split(self) -> tuple[int, int]:
        """(TP-sharded, replicated) attention parameters of multi-head latent attention (HF
        DeepseekV2Attention / DeepseekV3Attention; Megatron-LM's MLA keeps the down projections
        replicated and splits the up projections and the output projection by heads).

        The shapes are DeepSeek-V2's (arXiv 2405.04434, sec. 2.1.2-2.1.3, eqs. 9-19), with d_c =
        kv_lora_rank, d_c' = q_lora_rank, d_h = qk_nope_head_dim (v_head_dim for values), d_h^R =
        qk_rope_head_dim, n_h = heads: W^DKV (d_c x d) and the decoupled key W^KR (d_h^R x d) --
        HF's kv_a_proj_with_mqa, one d x (d_c + d_h^R) matrix -- W^UK (d_h n_h x d_c) and W^UV
        (v_head_dim n_h x d_c) -- kv_b_proj -- W^DQ (d_c' x d), W^UQ (d_h n_h x d_c') and W^QR
        (d_h^R n_h x d_c') -- q_a_proj, q_b_proj -- and W^O (d x v_head_dim n_h); plus the RMSNorms
        HF applies to each latent (kv_a_layernorm, q_a_layernorm)."""
        h, heads, rope = self.hidden, self.heads, self.qk_rope_head_dim
        qk = heads * (self.qk_nope_head_dim + rope)
        replicated = h * (self.kv_lora_rank + rope) + self.kv_lora_rank  # kv_a_proj_with_mqa, kv_a_layernorm
        sharded = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)  # kv_b_proj
        sharded += heads * self.v_head_dim * h  # o_proj
        if self.q_lora_rank:
            replicated += h * self.q_lora_rank + self.q_lora_rank  # q_a_proj, q_a_layernorm
            sharded += self.q_lora_rank * qk  # q_b_proj
        else:
            sharded += h * qk  # q_proj
        return sharded, replicated

    def dense_layer_params(self) -> int:
        """Parameters of one of the first ``dense_layers`` layers of a MoE model (a dense MLP)."""
        sharded, replicated = self.layer_params_split()
        sh_sharded, sh_replicated = self.mlp_params_split(self.shared_ffn) if self.shared_ffn else (0, 0)
        mlp_sharded, mlp_replicated = self.mlp_params_split(self.ffn)
        return (sharded - sh_sharded + mlp_sharded) + (replicated - sh_replicated - self.hidden * self.experts
                                                       + mlp_replicated)  # fmt: skip

    def mlp_params_split(self, ffn: int) -> tuple[int, int]:
        """(TP-sharded, replicated) parameters of one MLP of inner size ``ffn``."""
        h = self.hidden
        n_mlp_mats = 3 if self.mlp == "swiglu" else 2  # SwiGLU: gate, up, down (Shazeer 2020)
        sharded = n_mlp_mats * h * ffn
        replicated = 0
        if self.bias:
            sharded += (n_mlp_mats - 1) * ffn  # fc1 (and gate) biases (column-parallel)
            replicated += h  # MLP-down bias (row-parallel)
        return sharded, replicated

    def expert_params(self) -> int:
        """Parameters of all experts of one MoE layer (0 for a dense model)."""
        if not self.experts:
            return 0
        sharded, replicated = self.mlp_params_split(self.expert_ffn)
        return self.experts * (sharded + replicated)

    def layer_params(self) -> int:
        sharded, replicated = self.layer_params_split()
        return sharded + replicated + self.expert_params()

    def active_layer_params(self) -> int:
        """Parameters one token passes through in a layer (MoE: top_k of the experts)."""
        sharded, replicated = self.layer_params_split()
        if not self.experts:
            return sharded + replicated
        return sharded + replicated + self.top_k * self.expert_params() // self.experts

    def embedding_params(self) -> int:
        """Input token embedding (vocab x hidden); vocab-parallel under Megatron TP. Encoders add
        the token-type embeddings and the embedding LayerNorm (Devlin et al. 2019, sec. 3)."""
        extra = self.type_vocab * self.hidden + self.norm_params() if self.arch == "encoder" else 0
        return self.vocab * self.hidden + extra

    def position_params(self) -> int:
        """Learned absolute position embeddings (GPT-2); RoPE (Su et al. 2021) has none."""
        return self.max_positions * self.hidden if self.pos_emb == "learned" else 0

    def head_params(self) -> int:
        """Output head. Decoder LM: the projection to the vocabulary (zero when tied). Encoder LM
        (BERT MLM): dense h x h + bias, LayerNorm, vocab bias (decoder weight tied unless untied).
        Classifier: BERT pooler (h x h + h) and the classifier (h x labels + labels)."""
        h = self.hidden
        if self.head == "classifier":
            return h * h + h + h * self.num_labels + self.num_labels
        untied = 0 if self.tied_embeddings else self.vocab * h
        if self.arch == "encoder":
            return h * h + h + self.norm_params() + self.vocab + untied
        return untied

    def final_norm_params(self) -> int:
        """Decoders (pre-LN) end with a final norm; post-LN encoders do not."""
        return self.norm_params() if self.arch == "decoder" else 0

    @property
    def vocab_logits(self) -> bool:
        """Whether the loss runs over vocabulary logits per token (LM heads)."""
        return self.head == "lm"

    def param_count(self) -> int:
        """Exact number of parameters, as ``sum(p.numel() for p in model.parameters())``."""
        return (
            self.embedding_params()
            + self.position_params()
            + (self.n_layers - self.dense_layers) * self.layer_params()
            + self.dense_layers * (self.dense_layer_params() if self.dense_layers else 0)
            + self.final_norm_params()
            + self.head_params()
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_MOE_MLA_FIELDS = ("shared_ffn", "dense_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                   "qk_rope_head_dim", "v_head_dim")

__all__ = ["ARCHS", "FAMILIES", "HEADS", "MLP_KINDS", "NORMS", "POS_EMBS", "ModelSpec"]
