"""ModelSpec validation, exact parameter counts and the model catalog."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from marp import (
    InvalidRecipeError,
    MarpError,
    ModelConfigError,
    ModelSpec,
    UnknownModelError,
    get_model,
    list_models,
)

# Published counts: sum(p.numel()) of the HF checkpoints (model cards / safetensors index).
PUBLISHED = {
    "gpt2-124m": 124_439_808,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "llama-3.2-1b": 1_235_814_400,
}

REQUIRED = [
    "gpt2-124m", "gpt2-355m", "gpt2-774m", "gpt2-1.5b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
    "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "qwen2.5-0.5b",
    "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-72b",
]  # fmt: skip


@pytest.mark.parametrize(("name", "count"), sorted(PUBLISHED.items()))
def test_param_count_matches_published(name: str, count: int) -> None:
    assert get_model(name).param_count() == count


def test_gpt2_124m_by_hand() -> None:
    # wte 50257*768 + wpe 1024*768 + 12 layers x (attn 4h^2+4h, mlp 8h^2+5h, 2 LN 4h) + ln_f 2h
    h, v = 768, 50257
    layer = (4 * h * h + 4 * h) + (8 * h * h + 4 * h + h) + 4 * h
    assert get_model("gpt2-124m").param_count() == v * h + 1024 * h + 12 * layer + 2 * h


def test_approximate_sizes_of_big_models() -> None:
    # Published rounded sizes: Llama-2-13B 13.0 B, Llama-2-70B 69.0 B, Llama-3-70B 70.6 B,
    # Qwen2.5-14B 14.7 B, Qwen2.5-72B 72.7 B, GPT-2 medium 355 M, large 774 M, XL 1.558 B.
    expect = {
        "llama-2-13b": 13.016e9, "llama-2-70b": 68.977e9, "llama-3-70b": 70.554e9,
        "qwen2.5-14b": 14.77e9, "qwen2.5-72b": 72.71e9, "gpt2-355m": 354.8e6,
        "gpt2-774m": 774.0e6, "gpt2-1.5b": 1557.6e6,
    }  # fmt: skip
    for name, approx in expect.items():
        assert abs(get_model(name).param_count() / approx - 1) < 0.002, name


def test_catalog_has_required_models_and_lookup_is_case_insensitive() -> None:
    names = {m.name for m in list_models()}
    assert set(REQUIRED) <= names
    assert get_model("LLaMA-2-7B") is get_model("llama-2-7b")
    assert get_model("meta-llama/Llama-2-7b-hf").name == "llama-2-7b"
    assert get_model("gpt2").name == "gpt2-124m"


def test_llama_3_1_differs_from_llama_3_only_in_context() -> None:
    a, b = get_model("llama-3-8b"), get_model("llama-3.1-8b")
    assert a.param_count() == b.param_count()
    assert (a.max_positions, b.max_positions) == (8192, 131072)


def test_unknown_model_lists_close_names() -> None:
    with pytest.raises(UnknownModelError) as info:
        get_model("llama-2-8b")
    err = info.value
    assert err.field == "model"
    assert "llama-2-7b" in str(err) and "Did you mean" in str(err)
    assert isinstance(err, MarpError) and isinstance(err, ValueError)


def test_errors_pickle_round_trip() -> None:
    err = UnknownModelError("model", "unknown model 'x'.", "use a catalog name.")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UnknownModelError
    assert back.field == "model" and str(back) == str(err) and "To fix:" in str(back)


def _spec(**over: object) -> ModelSpec:
    base = dataclasses.asdict(get_model("llama-2-7b"))
    base.update(over)
    return ModelSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"hidden": 4097}, "model.hidden"),
        ({"kv_heads": 5}, "model.kv_heads"),
        ({"n_layers": 0}, "model.n_layers"),
        ({"vocab": -1}, "model.vocab"),
        ({"heads": True}, "model.heads"),
        ({"mlp": "relu"}, "model.mlp"),
        ({"norm": "batchnorm"}, "model.norm"),
        ({"family": "t5"}, "model.family"),
        ({"tied_embeddings": "yes"}, "model.tied_embeddings"),
        ({"dropout": 1.5}, "model.dropout"),
        ({"name": ""}, "model.name"),
    ],
)
def test_model_spec_validation_names_the_field(over: dict[str, object], field: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        _spec(**over)
    assert info.value.field == field
    assert field in str(info.value)


def test_model_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_model("gpt2-124m").hidden = 1  # type: ignore[misc]


def test_tp_split_sums_to_layer_params() -> None:
    for model in list_models():
        sharded, replicated = model.layer_params_split()
        assert sharded + replicated == model.layer_params()
        assert replicated == 2 * model.norm_params() + (2 * model.hidden if model.bias else 0)


def test_error_message_form_used_by_the_services() -> None:
    err = InvalidRecipeError("recipe.precision: unknown value 7", field="recipe.precision")
    assert err.field == "recipe.precision" and str(err) == "recipe.precision: unknown value 7"
    plain = InvalidRecipeError("must be >= 0", field="limits.max_gpus", fix="use a count")
    assert str(plain) == "limits.max_gpus: must be >= 0 To fix: use a count"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is InvalidRecipeError and back.field == err.field and str(back) == str(err)
    with pytest.raises(TypeError):
        MarpError("only one argument")
