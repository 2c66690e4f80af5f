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

Family = Literal["gpt2", "llama", "mistral", "qwen2", "bert", "custom"]
Arch = Literal["decoder", "encoder"]
Head = Literal["lm", "classifier"]
MlpKind = Literal["gelu", "swiglu"]
PosEmb = Literal["learned", "rope"]
NormKind = Literal["layernorm", "rmsnorm"]

FAMILIES: tuple[str, ...] = ("gpt2", "llama", "mistral", "qwen2", "bert", "custom")
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
    ``top_k`` routing and a linear router (Shazeer et al. 2017; Fedus et al. 2022).
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

    def __post_init__(self) -> None:
        err = ModelConfigError
        check_choice(self.arch, "model.arch", err, ARCHS)
        check_choice(self.head, "model.head", err, HEADS)
        check_int(self.num_labels, "model.num_labels", err)
        for attr in ("type_vocab", "experts", "top_k", "expert_ffn"):
            check_int(getattr(self, attr), f"model.{attr}", err, minimum=0)
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

    # ---- shapes -------------------------------------------------------------------------------

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
        if self.bias:
            sharded += h + 2 * kv  # q, k, v biases (column-parallel)
            replicated += h  # attention-output bias (row-parallel)
        elif self.qkv_bias:
            sharded += h + 2 * kv  # Qwen2: q/k/v biases only
        if self.experts:
            # Experts live in expert_params(); the router (h x experts) is replicated.
            return sharded, replicated + h * self.experts
        mlp_sharded, mlp_replicated = self.mlp_params_split(f)
        return sharded + mlp_sharded, replicated + mlp_replicated

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
            + self.n_layers * self.layer_params()
            + self.final_norm_params()
            + self.head_params()
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["ARCHS", "FAMILIES", "HEADS", "MLP_KINDS", "NORMS", "POS_EMBS", "ModelSpec"]
