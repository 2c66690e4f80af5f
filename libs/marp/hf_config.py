"""Build a ``ModelSpec`` from a Hugging Face ``config.json`` or from Frenzy's neutral spec.

Users describe a model by catalog name, by a HF-style config file, or inline
JSON. Supported HF architectures: LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, GPT2LMHeadModel, BertFor* (SequenceClassification, MaskedLM,
PreTraining, BertModel), and the mixture-of-experts MixtralForCausalLM, Qwen2MoeForCausalLM and
DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (multi-head latent attention, shared experts, leading
dense layers), read with the same keys and defaults as the
``transformers`` config classes. Every missing or mistyped key raises a
ModelConfigError whose field is ``model.config.<key>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from marp.errors import ModelConfigError, UnknownModelError
from marp.model_catalog import find_model, list_models, suggest_models
from marp.models import FAMILIES, MLP_KINDS, NORMS, POS_EMBS, ModelSpec

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "GPT2LMHeadModel",
    "BertForSequenceClassification",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertModel",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
)
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM",
                "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}  # fmt: skip

_MISSING = object()

# Far beyond any model trained today (about 2e12 parameters, 200 layers, widths under 2^18), and small
# enough that MARP's byte counts, which run in int64 arrays, cannot overflow for any recipe.
MAX_PARAMS = 10**15
MAX_LAYERS = 2**14
MAX_WIDTH = 2**24  # hidden, ffn, heads, vocab, positions, labels, token types
MAX_EXPERTS = 2**12  # the router's logits are tokens x experts per layer
_WIDTHS = ("hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions", "num_labels", "type_vocab",
           "expert_ffn", "shared_ffn", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
           "v_head_dim")  # fmt: skip


def _field(key: str) -> str:
    return f"model.config.{key}"


def _get_int(cfg: Mapping[str, Any], key: str, default: Any = _MISSING) -> int:
    value = cfg.get(key, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise ModelConfigError(_field(key), f"required key {key!r} is missing.",
                                   f"add \"{key}\": <positive integer> to the config.")  # fmt: skip
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(_field(key), f"{key!r} must be a positive integer, got {value!r}.")
    return value


def _get_bool(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelConfigError(_field(key), f"{key!r} must be true or false, got {value!r}.")
    return value


def _get_float(cfg: Mapping[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ModelConfigError(_field(key), f"{key!r} must be a probability in [0, 1), got {value!r}.")
    return float(value)


def _get_choice(cfg: Mapping[str, Any], key: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
    value = cfg.get(key, default)
    if value is _MISSING:
        raise ModelConfigError(_field(key), f"required key {key!r} is missing.",
                               f"add \"{key}\": one of {', '.join(map(repr, choices))}.")  # fmt: skip
    if value not in choices:
        raise ModelConfigError(
            _field(key), f"{key!r} must be one of {', '.join(map(repr, choices))}, got {value!r}."
        )
    return value


def _build(attr_to_key: Mapping[str, str], **kwargs: Any) -> ModelSpec:
    """Construct the spec, renaming a validation error's field to the config key it came from."""
    try:
        return ModelSpec(**kwargs)
    except ModelConfigError as exc:
        attr = exc.field.removeprefix("model.")
        key = attr_to_key.get(attr)
        if key is None:
            raise
        raise ModelConfigError(_field(key), f"(config key {key!r}) {exc.problem}", exc.fix) from None


def _spec_name(cfg: Mapping[str, Any], name: str) -> str:
    if name != "custom":
        return name
    for key in ("name", "_name_or_path"):
        value = cfg.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return name


def _from_gpt2(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # Keys and defaults of transformers' GPT2Config.
    hidden = _get_int(cfg, "n_embd")
    # Old GPT-2 configs also carry n_ctx (same value); n_positions wins when both exist.
    key_pos = "n_positions" if "n_positions" in cfg or "n_ctx" not in cfg else "n_ctx"
    positions = _get_int(cfg, key_pos)
    # HF GPT-2 drops out embeddings, attention probabilities and residuals; the memory model
    # uses one probability for all (they are equal, 0.1, in every published GPT-2 config).
    dropout = max(_get_float(cfg, k, 0.1) for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop"))
    return _build(
        {"n_layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "kv_heads": "n_head",
         "ffn": "n_inner", "vocab": "vocab_size", "max_positions": key_pos},
        name=_spec_name(cfg, name), family="gpt2", n_layers=_get_int(cfg, "n_layer"), hidden=hidden,
        heads=_get_int(cfg, "n_head"), kv_heads=_get_int(cfg, "n_head"),
        ffn=_get_int(cfg, "n_inner", 4 * hidden), mlp="gelu", vocab=_get_int(cfg, "vocab_size"),
        tied_embeddings=_get_bool(cfg, "tie_word_embeddings", True), pos_emb="learned",
        max_positions=positions, norm="layernorm", bias=True, qkv_bias=False, dropout=dropout,
    )  # fmt: skip


def _from_bert(cfg: Mapping[str, Any], name: str, arch: str) -> ModelSpec:
    # Keys and defaults of transformers' BertConfig (Devlin et al. 2019): post-LN encoder, GeLU,
    # biases everywhere, learned absolute positions, token-type embeddings, MLM decoder tied.
    hidden = _get_int(cfg, "hidden_size", 768)
    heads = _get_int(cfg, "num_attention_heads", 12)
    classifier = arch == "BertForSequenceClassification"
    labels = cfg.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) and labels else _get_int(cfg, "num_labels", 2)
    dropout = max(_get_float(cfg, "hidden_dropout_prob", 0.1), _get_float(cfg, "attention_probs_dropout_prob", 0.1))
    return _build(
        {"n_layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
         "kv_heads": "num_attention_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
         "max_positions": "max_position_embeddings", "type_vocab": "type_vocab_size"},
        name=_spec_name(cfg, name), family="bert", n_layers=_get_int(cfg, "num_hidden_layers", 12),
        hidden=hidden, heads=heads, kv_heads=heads, ffn=_get_int(cfg, "intermediate_size", 4 * hidden),
        mlp="gelu", vocab=_get_int(cfg, "vocab_size", 30522),
        tied_embeddings=_get_bool(cfg, "tie_word_embeddings", True), pos_emb="learned",
        max_positions=_get_int(cfg, "max_position_embeddings", 512), norm="layernorm", bias=True,
        dropout=dropout, arch="encoder", head="classifier" if classifier else "lm", num_labels=num_labels,
        type_vocab=_get_int(cfg, "type_vocab_size", 2),
    )  # fmt: skip


def _get_int0(cfg: Mapping[str, Any], key: str, default: int = 0) -> int:
    """A size that may be 0 or null (absent feature), else a positive integer."""
    value = cfg.get(key, default)
    if value is None or value == 0 and not isinstance(value, bool):
        return 0
    return _get_int(cfg, key)


def _from_moe(cfg: Mapping[str, Any], name: str, arch: str) -> ModelSpec:
    """Mixtral, Qwen2-MoE and DeepSeek-V2 / V3: the keys and defaults of transformers' MixtralConfig,
    Qwen2MoeConfig and DeepseekV2Config / DeepseekV3Config.

    Not counted: Qwen2-MoE's shared-expert gate (hidden x 1 per layer) and DeepSeek-V3's router
    score-correction bias (experts per layer), under 10^-5 of the parameters.
    """
    hidden = _get_int(cfg, "hidden_size")
    heads = _get_int(cfg, "num_attention_heads")
    n_layers = _get_int(cfg, "num_hidden_layers")
    common: dict[str, Any] = {
        "name": _spec_name(cfg, name), "n_layers": n_layers, "hidden": hidden, "heads": heads,
        "kv_heads": _get_int(cfg, "num_key_value_heads", heads), "mlp": "swiglu", "vocab": _get_int(cfg, "vocab_size"),
        "tied_embeddings": _get_bool(cfg, "tie_word_embeddings", False), "pos_emb": "rope", "norm": "rmsnorm",
        "bias": False, "dropout": _get_float(cfg, "attention_dropout", 0.0),
    }  # fmt: skip
    keys = {"n_layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
            "kv_heads": "num_key_value_heads", "vocab": "vocab_size", "max_positions": "max_position_embeddings",
            "dropout": "attention_dropout"}  # fmt: skip
    if arch == "MixtralForCausalLM":
        ffn = _get_int(cfg, "intermediate_size")
        keys.update(ffn="intermediate_size", experts="num_local_experts", top_k="num_experts_per_tok")
        return _build(keys, **common, family="mixtral", ffn=ffn, expert_ffn=ffn,
                      experts=_get_int(cfg, "num_local_experts", 8), top_k=_get_int(cfg, "num_experts_per_tok", 2),
                      max_positions=_get_int(cfg, "max_position_embeddings", 4096 * 32))  # fmt: skip
    if arch == "Qwen2MoeForCausalLM":
        step = _get_int(cfg, "decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise ModelConfigError(_field("mlp_only_layers"), f"must be a list of layer indices, got {only!r}.")
        experts = _get_int0(cfg, "num_experts", 60)
        # Qwen2MoeDecoderLayer: a sparse MLP where the layer is not in mlp_only_layers and
        # (index + 1) % decoder_sparse_step == 0; a dense one of intermediate_size elsewhere.
        dense = sum(1 for i in range(n_layers) if i in only or not experts or (i + 1) % step) if experts else 0
        keys.update(ffn="intermediate_size", expert_ffn="moe_intermediate_size", experts="num_experts",
                    top_k="num_experts_per_tok", shared_ffn="shared_expert_intermediate_size")
        return _build(keys, **{**common, "qkv_bias": True}, family="qwen2_moe",
                      ffn=_get_int(cfg, "intermediate_size"), experts=experts,
                      top_k=_get_int(cfg, "num_experts_per_tok", 4) if experts else 0,
                      expert_ffn=_get_int(cfg, "moe_intermediate_size", 1408) if experts else 0,
                      shared_ffn=_get_int0(cfg, "shared_expert_intermediate_size", 5632) if experts else 0,
                      dense_layers=dense, max_positions=_get_int(cfg, "max_position_embeddings", 32768))  # fmt: skip
    # DeepSeek-V2 / V3: MLA attention; MoE layers from first_k_dense_replace on, every moe_layer_freq-th.
    if _get_bool(cfg, "attention_bias", False):
        raise ModelConfigError(_field("attention_bias"), "linear biases with multi-head latent attention are not "
                               "supported yet.")  # fmt: skip
    experts = _get_int0(cfg, "n_routed_experts")
    first_dense = _get_int0(cfg, "first_k_dense_replace")
    freq = _get_int(cfg, "moe_layer_freq", 1)
    dense = sum(1 for i in range(n_layers) if i < first_dense or i % freq) if experts else 0
    moe_ffn = _get_int(cfg, "moe_intermediate_size", 1407) if experts else 0
    keys.update(ffn="intermediate_size", expert_ffn="moe_intermediate_size", experts="n_routed_experts",
                top_k="num_experts_per_tok", dense_layers="first_k_dense_replace", q_lora_rank="q_lora_rank",
                kv_lora_rank="kv_lora_rank", qk_nope_head_dim="qk_nope_head_dim",
                qk_rope_head_dim="qk_rope_head_dim", v_head_dim="v_head_dim")  # fmt: skip
    return _build(keys, **common, family="deepseek", ffn=_get_int(cfg, "intermediate_size"), experts=experts,
                  top_k=_get_int(cfg, "num_experts_per_tok") if experts else 0, expert_ffn=moe_ffn,
                  shared_ffn=_get_int0(cfg, "n_shared_experts") * moe_ffn if experts else 0, dense_layers=dense,
                  q_lora_rank=_get_int0(cfg, "q_lora_rank"), kv_lora_rank=_get_int(cfg, "kv_lora_rank"),
                  qk_nope_head_dim=_get_int(cfg, "qk_nope_head_dim"), qk_rope_head_dim=_get_int(cfg, "qk_rope_head_dim"),
                  v_head_dim=_get_int(cfg, "v_head_dim"),
                  max_positions=_get_int(cfg, "max_position_embeddings", 2048))  # fmt: skip


def _from_llama_like(cfg: Mapping[str, Any], name: str, arch: str) -> ModelSpec:
    # Keys and defaults of transformers' LlamaConfig / MistralConfig / Qwen2Config.
    family = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}[arch]
    hidden = _get_int(cfg, "hidden_size")
    heads = _get_int(cfg, "num_attention_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and (isinstance(head_dim, bool) or head_dim != hidden // heads or hidden % heads):
        raise ModelConfigError(
            _field("head_dim"),
            f"head_dim {head_dim!r} differs from hidden_size / num_attention_heads; "
            "a decoupled head_dim is not supported yet.",
        )
    qkv_bias = family == "qwen2"  # Qwen2Attention always has q/k/v biases
    bias = False
    if family == "llama":
        attention_bias = _get_bool(cfg, "attention_bias", False)
        mlp_bias = _get_bool(cfg, "mlp_bias", False)
        if attention_bias != mlp_bias:
            raise ModelConfigError(
                _field("attention_bias"),
                "attention_bias and mlp_bias differ; only all-or-nothing linear biases are supported yet.",
            )
        bias = attention_bias
    return _build(
        {"n_layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
         "kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
         "max_positions": "max_position_embeddings", "dropout": "attention_dropout"},
        name=_spec_name(cfg, name), family=family, n_layers=_get_int(cfg, "num_hidden_layers"),
        hidden=hidden, heads=heads,
        # transformers: num_key_value_heads None -> num_attention_heads (plain multi-head).
        kv_heads=_get_int(cfg, "num_key_value_heads", heads),
        ffn=_get_int(cfg, "intermediate_size"), mlp="swiglu", vocab=_get_int(cfg, "vocab_size"),
        tied_embeddings=_get_bool(cfg, "tie_word_embeddings", False), pos_emb="rope",
        max_positions=_get_int(cfg, "max_position_embeddings", {"llama": 2048, "mistral": 32768,
                                                                "qwen2": 32768}[family]),
        norm="rmsnorm", bias=bias, qkv_bias=qkv_bias and not bias,
        dropout=_get_float(cfg, "attention_dropout", 0.0),
    )  # fmt: skip


# Frenzy's neutral spec (docs/marp.md): exactly these fields are required ...
NEUTRAL_FIELDS: tuple[str, ...] = (
    "arch", "head", "n_layers", "hidden", "heads", "kv_heads", "ffn", "mlp", "vocab", "tied_embeddings",
    "pos_emb", "max_positions", "norm", "bias",
)  # fmt: skip
# ... and these are optional (num_labels with a classifier head; the rest refine the model).
_NEUTRAL_OPTIONAL = ("num_labels", "qkv_bias", "dropout", "name", "family", "type_vocab", "experts", "top_k",
                     "expert_ffn", "shared_ffn", "dense_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim")  # fmt: skip
_NEUTRAL_KEYS = frozenset(NEUTRAL_FIELDS + _NEUTRAL_OPTIONAL)


def _from_neutral(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    """Frenzy's neutral spec: every field of NEUTRAL_FIELDS is required (the spec states the
    architecture completely, nothing is guessed); ``num_labels`` is required with a classifier
    head; the other optional keys default to none / 0."""
    unknown = sorted(set(cfg) - _NEUTRAL_KEYS, key=str)  # YAML keys need not be strings, nor sort together
    if unknown:
        raise ModelConfigError(_field(unknown[0]), f"unknown key {unknown[0]!r} in the neutral model spec.",
                               f"use only {', '.join(NEUTRAL_FIELDS + _NEUTRAL_OPTIONAL)}.")  # fmt: skip
    for key in NEUTRAL_FIELDS:
        if key not in cfg:
            raise ModelConfigError(_field(key), f"required key {key!r} is missing from the neutral model spec.",
                                   f"a neutral spec has exactly: {', '.join(NEUTRAL_FIELDS)}.")  # fmt: skip
    arch = _get_choice(cfg, "arch", ("decoder", "encoder"))
    head = _get_choice(cfg, "head", ("lm", "classifier"))
    if head == "classifier" and "num_labels" not in cfg:
        raise ModelConfigError(_field("num_labels"), "a classifier head needs num_labels.",
                               'add "num_labels": <number of classes>.')  # fmt: skip
    family = _get_choice(cfg, "family", FAMILIES, "bert" if arch == "encoder" else "custom")
    experts = cfg.get("experts", 0)
    return _build(
        {k: k for k in _NEUTRAL_KEYS},
        name=_spec_name(cfg, name), family=family, n_layers=_get_int(cfg, "n_layers"),
        hidden=_get_int(cfg, "hidden"), heads=_get_int(cfg, "heads"), kv_heads=_get_int(cfg, "kv_heads"),
        ffn=_get_int(cfg, "ffn"), mlp=_get_choice(cfg, "mlp", MLP_KINDS), vocab=_get_int(cfg, "vocab"),
        tied_embeddings=_get_bool(cfg, "tied_embeddings", False),
        pos_emb=_get_choice(cfg, "pos_emb", POS_EMBS), max_positions=_get_int(cfg, "max_positions"),
        norm=_get_choice(cfg, "norm", NORMS), bias=_get_bool(cfg, "bias", False),
        qkv_bias=_get_bool(cfg, "qkv_bias", False), dropout=_get_float(cfg, "dropout", 0.0),
        arch=arch, head=head, num_labels=_get_int(cfg, "num_labels", 2),
        type_vocab=cfg.get("type_vocab", 2 if arch == "encoder" else 0), experts=experts,
        top_k=cfg.get("top_k", 0), expert_ffn=cfg.get("expert_ffn", 0),
        **{k: cfg.get(k, 0) for k in ("shared_ffn", "dense_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                      "qk_rope_head_dim", "v_head_dim")},
    )  # fmt: skip


def _architecture(cfg: Mapping[str, Any]) -> str:
    archs = cfg.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ModelConfigError(
                _field("architectures"), f"must be a non-empty list of names, got {archs!r}."
            )
        for arch in archs:
            if arch in SUPPORTED_ARCHITECTURES:
                return arch
        raise ModelConfigError(
            _field("architectures"),
            f"architecture {archs[0]!r} is not supported yet.",
            f"use one of {', '.join(SUPPORTED_ARCHITECTURES)}, or Frenzy's neutral spec.",
        )
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in _MODEL_TYPES:  # a list or dict would not hash
        return _MODEL_TYPES[model_type]
    if model_type is not None:
        raise ModelConfigError(_field("model_type"), f"model_type {model_type!r} is not supported yet.",
                               f"use one of {', '.join(_MODEL_TYPES)}.")  # fmt: skip
    raise ModelConfigError(
        "model.config",
        "cannot tell the architecture: no 'architectures', 'model_type' or 'arch' key.",
        'pass a Hugging Face config.json or Frenzy\'s neutral spec with "arch": "decoder" or "encoder".',
    )


def model_from_hf_config(cfg: dict[str, Any], name: str = "custom") -> ModelSpec:
    """A ModelSpec from a HF ``config.json`` dict or from Frenzy's neutral spec (``"arch"`` key)."""
    if not isinstance(cfg, Mapping):
        raise ModelConfigError("model.config", f"must be a JSON object, got {type(cfg).__name__}.")
    if not isinstance(name, str) or not name.strip():
        raise ModelConfigError("model.name", f"must be a non-empty string, got {name!r}.")
    if "arch" in cfg and "architectures" not in cfg:
        return _within_limits(_from_neutral(cfg, name))
    arch = _architecture(cfg)
    if arch == "GPT2LMHeadModel":
        return _within_limits(_from_gpt2(cfg, name))
    if arch.startswith("Bert"):
        return _within_limits(_from_bert(cfg, name, arch))
    if arch in ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        return _within_limits(_from_moe(cfg, name, arch))
    return _within_limits(_from_llama_like(cfg, name, arch))


def _within_limits(spec: ModelSpec) -> ModelSpec:
    """``spec`` if MARP can size it without overflowing; else a ModelConfigError naming the field."""
    if spec.n_layers > MAX_LAYERS:
        raise ModelConfigError("model.n_layers", f"{spec.n_layers} layers; at most {MAX_LAYERS} are supported.")
    if spec.experts > MAX_EXPERTS:
        raise ModelConfigError("model.experts", f"{spec.experts} experts; at most {MAX_EXPERTS} are supported.")
    for attr in _WIDTHS:
        if getattr(spec, attr) > MAX_WIDTH:
            raise ModelConfigError(f"model.{attr}", f"{getattr(spec, attr)} is too large; at most {MAX_WIDTH}.")
    if spec.param_count() > MAX_PARAMS:
        raise ModelConfigError("model.config", f"{spec.param_count():.3g} parameters; at most {MAX_PARAMS:.0e}.")
    return spec


def model_from_json(text: str, name: str = "custom") -> ModelSpec:
    """Parse ``text`` as a JSON config (HF or neutral) and build the ModelSpec."""
    if not isinstance(text, str | bytes):
        raise ModelConfigError("model.config", f"must be JSON text, got {type(text).__name__}.")
    try:
        cfg = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelConfigError("model.config", f"is not valid JSON ({exc}).") from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise ModelConfigError("model.config", "is nested too deeply to be a model config.") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError("model.config", f"must be a JSON object, got {type(cfg).__name__}.")
    return model_from_hf_config(cfg, name)


def resolve_model(ref: str) -> ModelSpec:
    """A catalog name; else a path to an existing JSON config file; else inline JSON ("{...")."""
    if not isinstance(ref, str) or not ref.strip():
        raise UnknownModelError("model", f"must be a model name, a config path or JSON, got {ref!r}.")
    spec = find_model(ref)
    if spec is not None:
        return spec
    text = ref.strip()
    if os.path.isfile(text):
        try:
            with open(text, encoding="utf-8") as fh:
                content = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelConfigError("model", f"cannot read config file {text!r}: {exc}.") from None
        return model_from_json(content)
    if text.startswith("{"):
        return model_from_json(text)
    if os.sep in text or text.lower().endswith(".json"):  # meant as a file: say it is not there
        what = "is a directory" if os.path.isdir(text) else "file not found"
        raise UnknownModelError(
            "model", f"{what}: {text!r} (relative to {os.getcwd()}).",
            "give the path of an existing config.json, a catalog name (frenzy models), or the config as inline JSON.")
    close = suggest_models(text)
    hint = f"Did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(
        "model",
        f"{text!r} is not a catalog model, an existing config file, or inline JSON. {hint}"
        f"Catalog: {', '.join(s.name for s in list_models())}.",
        "use a catalog name, a path to a config.json, or the config as inline JSON.",
    )


__all__ = ["NEUTRAL_FIELDS", "SUPPORTED_ARCHITECTURES", "model_from_hf_config", "model_from_json", "resolve_model"]
