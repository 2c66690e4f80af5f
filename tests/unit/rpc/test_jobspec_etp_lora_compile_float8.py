"""etp, lora_targets, compile and float8 (issue 16) travel from a job entry (CLI, YAML, REST)
through the JobSpec proto to MARP's TrainingRecipe, so the predictor plans a submitted job the way it
will run; bad values name the field, and a gRPC client is held to the same bounds."""

from __future__ import annotations

import pytest

import marp
from frenzy.predictor.server import predict
from frenzy.rpc import convert
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.rpc.spec_limits import check_recipe
from frenzy.v1 import predictor_pb2, types_pb2

GOOD = {"name": "j", "model": "llama-3.2-1b", "seq_len": 1024, "global_batch": 8, "command": ["python", "t.py"]}
MOE = ('{"arch": "decoder", "head": "lm", "n_layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn": 1024, '
       '"mlp": "swiglu", "vocab": 1000, "tied_embeddings": false, "pos_emb": "rope", "max_positions": 4096, '
       '"norm": "rmsnorm", "bias": false, "experts": 8, "top_k": 2}')  # fmt: skip


def _recipe(**over: object) -> marp.TrainingRecipe:
    spec = parse_entry({**GOOD, **over}).to_proto(read_model_files=False)
    return convert.recipe_from_proto(spec.recipe, spec.limits)


def test_defaults_are_marps() -> None:
    recipe = _recipe()
    default = marp.TrainingRecipe(seq_len=1, global_batch=1)
    assert (recipe.etp, recipe.lora_targets, recipe.compile, recipe.float8) == (
        default.etp, default.lora_targets, default.compile, default.float8)


def test_fields_reach_the_recipe() -> None:
    recipe = _recipe(model=MOE, ep=4, etp=1, finetune="lora", lora_targets="q,v,gate", compile=True, float8=True)
    assert (recipe.etp, recipe.lora_targets, recipe.compile, recipe.float8) == (1, ("q", "v", "gate"), True, True)
    assert _recipe(lora_targets=["q", "k", "v", "o", "gate", "up", "down"]).lora_targets == marp.recipe.LORA_TARGETS


def test_recipe_to_proto_round_trips() -> None:
    recipe = marp.TrainingRecipe(seq_len=2048, global_batch=16, ep=2, etp=1, finetune="qlora", precision="pure-bf16",
                                 lora_targets=("q", "down"), compile=True, float8=True)  # fmt: skip
    assert convert.recipe_from_proto(convert.recipe_to_proto(recipe)) == recipe


def test_the_predictor_plans_float8_only_on_fp8_gpus() -> None:
    spec = parse_entry({**GOOD, "float8": True, "compile": True, "max_gpus": 8,
                        "gpu_types": ["A100-80GB", "H100-80GB"]}).to_proto(read_model_files=False)  # fmt: skip
    resp = predict(predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits))
    assert resp.plans and {p.gpu_type for p in resp.plans} == {"H100-80GB"}
    assert any(r.startswith("A100-80GB: no fp8 support") for r in resp.rejected)


@pytest.mark.parametrize(
    ("over", "field"),
    [({"etp": 0}, "etp"), ({"etp": 1e23}, "etp"), ({"lora_targets": "q,x"}, "lora_targets"),
     ({"lora_targets": "q,q"}, "lora_targets"), ({"lora_targets": []}, "lora_targets"), ({"compile": "maybe"}, "compile"),
     ({"float8": 3}, "float8")],
)  # fmt: skip
def test_bad_values_name_the_field(over: dict[str, object], field: str) -> None:
    with pytest.raises(JobSpecError) as info:
        parse_entry({**GOOD, **over})
    assert str(info.value).startswith(f"{field}")


def test_a_grpc_client_is_held_to_the_same_bounds() -> None:
    with pytest.raises(ValueError, match="recipe.etp"):
        check_recipe(types_pb2.TrainingRecipe(seq_len=1, global_batch=1, etp=-1))
    with pytest.raises(ValueError, match="recipe.lora_targets"):
        check_recipe(types_pb2.TrainingRecipe(seq_len=1, global_batch=1, lora_targets=["q"] * 8))
    with pytest.raises(marp.InvalidRecipeError, match="recipe.lora_targets"):
        convert.recipe_from_proto(types_pb2.TrainingRecipe(seq_len=1, global_batch=1, lora_targets=["qq"]))
