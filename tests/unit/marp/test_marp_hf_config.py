"""Loading models from HF config.json (each supported architecture), the neutral spec, and refs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from marp import (
    ModelConfigError,
    UnknownModelError,
    get_model,
    model_from_hf_config,
    model_from_json,
    resolve_model,
)

DATA = Path(__file__).parent / "data"


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


LLAMA_TINY: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    ("file", "catalog", "family"),
    [
        ("gpt2_config.json", "gpt2-124m", "gpt2"),
        ("llama2_7b_config.json", "llama-2-7b", "llama"),
        ("llama3_8b_config.json", "llama-3-8b", "llama"),
        ("mistral_7b_config.json", "mistral-7b", "mistral"),
        ("qwen2_5_0_5b_config.json", "qwen2.5-0.5b", "qwen2"),
    ],
)
def test_sample_config_files_match_catalog(file: str, catalog: str, family: str) -> None:
    spec = model_from_hf_config(_load(file))
    ref = get_model(catalog)
    assert spec.family == family
    assert spec.param_count() == ref.param_count()
    for attr in ("n_layers", "hidden", "heads", "kv_heads", "ffn", "mlp", "vocab", "tied_embeddings",
                 "pos_emb", "norm", "bias", "qkv_bias", "dropout"):  # fmt: skip
        assert getattr(spec, attr) == getattr(ref, attr), attr


def test_small_llama_dict_by_hand() -> None:
    spec = model_from_hf_config(LLAMA_TINY, name="tiny")
    assert spec.name == "tiny" and spec.family == "llama"
    h, f, kv = 512, 1376, 4 * 64
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert spec.param_count() == 2 * 1000 * h + 2 * layer + h


def test_gpt2_dict_defaults_n_inner_and_ties_head() -> None:
    cfg = {"architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64, "n_head": 4,
           "n_positions": 128, "vocab_size": 100}  # fmt: skip
    spec = model_from_hf_config(cfg)
    assert spec.ffn == 256 and spec.tied_embeddings and spec.pos_emb == "learned" and spec.bias
    assert spec.dropout == 0.1  # HF GPT2Config default p_drop
    h = 64
    layer = 4 * h * h + 4 * h + 2 * h * 256 + 256 + h + 4 * h
    assert spec.param_count() == 100 * h + 128 * h + 2 * layer + 2 * h


def test_qwen2_has_qkv_bias_and_model_type_is_enough() -> None:
    cfg = dict(LLAMA_TINY)
    del cfg["architectures"]
    cfg["model_type"] = "qwen2"
    spec = model_from_hf_config(cfg)
    assert spec.family == "qwen2" and spec.qkv_bias and not spec.bias
    plain = model_from_hf_config(LLAMA_TINY)
    assert spec.param_count() - plain.param_count() == 2 * (512 + 2 * 256)


def test_missing_kv_heads_defaults_to_heads() -> None:
    cfg = dict(LLAMA_TINY)
    del cfg["num_key_value_heads"]
    assert model_from_hf_config(cfg).kv_heads == 8


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda c: c.pop("hidden_size"), "hidden_size"),
        (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers"),
        (lambda c: c.update(intermediate_size="1376"), "intermediate_size"),
        (lambda c: c.update(vocab_size=0), "vocab_size"),
        (lambda c: c.update(num_attention_heads=True), "num_attention_heads"),
        (lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings"),
        (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
        (lambda c: c.update(hidden_size=500), "hidden_size"),
        (lambda c: c.update(head_dim=128), "head_dim"),
        (lambda c: c.update(architectures=["T5ForConditionalGeneration"]), "architectures"),
        (lambda c: c.update(attention_dropout=2.0), "attention_dropout"),
    ],
)
def test_malformed_config_names_the_key(mutate: Any, key: str) -> None:
    cfg = dict(LLAMA_TINY)
    mutate(cfg)
    with pytest.raises(ModelConfigError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == f"model.config.{key}"
    assert key in str(info.value)


def test_gpt2_missing_key_is_named() -> None:
    cfg = _load("gpt2_config.json")
    del cfg["n_head"]
    with pytest.raises(ModelConfigError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.config.n_head"


def test_config_without_architecture_hint() -> None:
    with pytest.raises(ModelConfigError) as info:
        model_from_hf_config({"hidden_size": 64})
    assert info.value.field == "model.config"


def test_neutral_spec_file() -> None:
    spec = model_from_json((DATA / "neutral_tiny.json").read_text())
    assert spec.name == "tiny-decoder" and spec.family == "custom"
    assert (spec.kv_heads, spec.mlp, spec.norm, spec.pos_emb) == (2, "swiglu", "rmsnorm", "rope")
    assert spec.param_count() == 1000 * 256 + 4 * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688 + 512) + 256


def test_neutral_spec_errors() -> None:
    base = json.loads((DATA / "neutral_tiny.json").read_text())
    for key, value, field in [
        ("arch", "encdec", "model.config.arch"),
        ("head", "classifier", "model.config.num_labels"),  # a classifier head needs num_labels
        ("hiden", 3, "model.config.hiden"),  # typo: unknown key
        ("mlp", "relu", "model.config.mlp"),
        ("heads", 7, "model.config.hidden"),  # 256 % 7 != 0, reported on the hidden key
    ]:
        cfg = dict(base)
        cfg[key] = value
        with pytest.raises(ModelConfigError) as info:
            model_from_hf_config(cfg)
        assert info.value.field == field, (key, info.value)
    cfg = dict(base)
    del cfg["vocab"]
    with pytest.raises(ModelConfigError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.config.vocab"


def test_model_from_json_rejects_bad_json() -> None:
    for text in ["{not json", "[1, 2]", ""]:
        with pytest.raises(ModelConfigError) as info:
            model_from_json(text)
        assert info.value.field == "model.config"


def test_resolve_model_catalog_path_and_inline(tmp_path: Path) -> None:
    assert resolve_model("Mistral-7B").name == "mistral-7b"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_TINY))
    assert resolve_model(str(path)).hidden == 512
    assert resolve_model(json.dumps(LLAMA_TINY)).n_layers == 2
    assert resolve_model(str(DATA / "llama2_7b_config.json")).name == "meta-llama/Llama-2-7b-hf"


def test_resolve_model_unknown() -> None:
    with pytest.raises(UnknownModelError) as info:
        resolve_model("qwen2.5-8b")
    assert info.value.field == "model"
    assert "qwen2.5-7b" in str(info.value)
    with pytest.raises(UnknownModelError):
        resolve_model("/no/such/config.json")
    with pytest.raises(ModelConfigError):
        resolve_model("{broken")


BERT_LARGE = {  # https://huggingface.co/google-bert/bert-large-uncased/blob/main/config.json
    "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
    "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 30522, "max_position_embeddings": 512,
    "type_vocab_size": 2, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
}  # fmt: skip


def test_bert_configs_count_parameters_like_transformers() -> None:
    cls = model_from_hf_config({**BERT_LARGE, "architectures": ["BertForSequenceClassification"]})
    assert cls.arch == "encoder" and cls.head == "classifier" and cls.num_labels == 2
    assert cls.param_count() == 335_143_938  # AutoModelForSequenceClassification, 2 labels (HF docs)
    mlm = model_from_hf_config(BERT_LARGE)
    # BertForMaskedLM: no pooler; MLM transform (h x h + h, LayerNorm) and a vocab bias, decoder tied
    assert mlm.param_count() == cls.param_count() - (1024 * 1024 + 1024 + 2 * 1024 + 2) + (
        1024 * 1024 + 1024 + 2 * 1024 + 30522)


def test_neutral_encoder_spec_with_classifier() -> None:
    base = json.loads((DATA / "neutral_tiny.json").read_text())
    cfg = {**base, "arch": "encoder", "head": "classifier", "num_labels": 3, "pos_emb": "learned",
           "norm": "layernorm", "mlp": "gelu", "ffn": 1024, "bias": True}  # fmt: skip
    spec = model_from_hf_config(cfg)
    assert spec.arch == "encoder" and spec.num_labels == 3 and spec.type_vocab == 2
    missing = dict(base)
    del missing["bias"]
    with pytest.raises(ModelConfigError) as info:
        model_from_hf_config(missing)
    assert info.value.field == "model.config.bias"
