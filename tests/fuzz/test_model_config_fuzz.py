"""Property-based fuzzing of the model parsers (issue 14): a Hugging Face ``config.json`` or Frenzy's
neutral spec, as a decoded value, as JSON text or as a model reference, ends in a ModelSpec or a
MarpError naming a ``model`` field, quickly; never another exception.

Besides arbitrary JSON, the near-valid cases start from real configs (the test data of
tests/unit/marp, a BERT and a mixture-of-experts neutral spec) and break them one key at a time:
wrong types, negatives, huge numbers, NaN and infinities, nested junk, missing and unknown keys.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from marp import MarpError, ModelSpec, model_from_hf_config, model_from_json, resolve_model
from marp.hf_config import MAX_EXPERTS, MAX_LAYERS, MAX_PARAMS

SETTINGS = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)

DATA = Path(__file__).resolve().parents[1] / "unit" / "marp" / "data"
BERT_BASE = {
    "architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_size": 768,
    "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
    "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "id2label": {"0": "neg", "1": "pos"},
}  # fmt: skip
NEUTRAL_MOE = {
    "name": "tiny-moe", "arch": "decoder", "head": "lm", "n_layers": 2, "hidden": 64, "heads": 4,
    "kv_heads": 4, "ffn": 128, "mlp": "swiglu", "vocab": 100, "tied_embeddings": False, "pos_emb": "rope",
    "max_positions": 128, "norm": "rmsnorm", "bias": False, "experts": 4, "top_k": 2, "expert_ffn": 64,
    "dropout": 0.0, "family": "custom",
}  # fmt: skip
VALID_CONFIGS: list[dict] = [json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))]
VALID_CONFIGS += [BERT_BASE, NEUTRAL_MOE]

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats() | st.text(max_size=20)
           | st.sampled_from([0, -1, 2**63, 2**64, 10**30, 10**400, math.nan, math.inf, -math.inf, 1e308, -0.0,
                              "", " ", "12", "llama", "gpt2", "bert", "decoder", "encoder", "\x00", "\ud800"]))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
# YAML (a batch file's inline model) gives keys that are not strings.
odd_keys = st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False))


@st.composite
def near_valid(draw: st.DrawFn) -> dict:
    """A real config with a few keys replaced by junk, removed, or added."""
    cfg = dict(draw(st.sampled_from(VALID_CONFIGS)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "delete" and cfg:
            cfg.pop(draw(st.sampled_from(list(cfg))))
        elif action == "add":
            cfg[draw(odd_keys)] = draw(json_values)
        elif cfg:
            cfg[draw(st.sampled_from(list(cfg)))] = draw(json_values)
    return cfg


def _check_value(cfg: object) -> None:
    try:
        spec = model_from_hf_config(cfg)  # type: ignore[arg-type]
    except MarpError as exc:
        _names_a_field(exc)
        return
    _sane(spec)


def _check_text(text: str | bytes) -> None:
    try:
        spec = model_from_json(text)
    except MarpError as exc:
        _names_a_field(exc)
        return
    _sane(spec)


def _names_a_field(exc: MarpError) -> None:
    assert exc.field.startswith("model"), exc
    assert str(exc).startswith(exc.field), exc


def _sane(spec: ModelSpec) -> None:
    assert isinstance(spec, ModelSpec)
    for attr in ("n_layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions"):
        assert isinstance(getattr(spec, attr), int) and getattr(spec, attr) >= 1
    assert 0.0 <= spec.dropout < 1.0
    assert spec.n_layers <= MAX_LAYERS and spec.experts <= MAX_EXPERTS and spec.param_count() <= MAX_PARAMS


@SETTINGS
@given(json_values)
@example({"model_type": []})  # unhashable model_type
@example({"model_type": {"a": 1}})
def test_any_value_is_a_spec_or_a_marp_error(value: object) -> None:
    _check_value(value)
    if isinstance(value, dict):
        _check_text(json.dumps(value))


@SETTINGS
@given(near_valid())
@example({**NEUTRAL_MOE, 1: "x", "y": 2})  # unknown keys that do not sort together (YAML)
@example({**VALID_CONFIGS[0], "model_type": ["gpt2"], "architectures": None})
@example({**NEUTRAL_MOE, "n_layers": 2**40, "hidden": 2**40, "ffn": 2**40})  # overflowed MARP's int64 sizes
@example({**NEUTRAL_MOE, "experts": 2**24})
def test_near_valid_configs(cfg: dict) -> None:
    _check_value(cfg)
    if all(isinstance(k, str) for k in cfg):
        _check_text(json.dumps(cfg))


def test_every_base_config_parses() -> None:
    for cfg in VALID_CONFIGS:
        _sane(model_from_hf_config(cfg))


@SETTINGS
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200),
                 st.lists(st.sampled_from(['{"arch":', '"decoder"', "[", "]", "{", "}", ",", ":", "NaN",
                                           "Infinity", "1e999", "-1", '"n_layers"', "9" * 5000]),
                          max_size=30).map("".join)))
def test_any_text_is_a_spec_or_a_marp_error(text: str | bytes) -> None:
    _check_text(text)


@settings(max_examples=40, deadline=2000, derandomize=True)
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from(["[", '{"a":']))
@example(100_000, "[")  # json.loads raised RecursionError, not a MarpError
def test_deeply_nested_json(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    _check_text('{"arch": ' + opener * depth + "1" + closer * depth + "}")


@SETTINGS
@given(st.one_of(st.text(max_size=60), st.builds(lambda v: json.dumps(v), json_values),
                 st.sampled_from(["gpt2-124m", "GPT2-124M ", "llama-3-8b", "{", "{}", " {\"arch\": 1}"])))
def test_any_model_reference(ref: str) -> None:
    # Catalog names, inline JSON, or near names (difflib suggestions); no text here names a file.
    try:
        _sane(resolve_model(ref))
    except MarpError as exc:
        _names_a_field(exc)
