"""The recipe fields a submitted job is planned with (issue 16): finetune, lora_rank,
weight_decay and ep travel from a job entry (CLI, YAML, REST) through the JobSpec proto to
MARP's TrainingRecipe, so the predictor plans the job the way it will run. Bad values name the field."""

from __future__ import annotations

import pytest

import marp
from frenzy.predictor.server import predict
from frenzy.rpc import convert
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.v1 import predictor_pb2, types_pb2

GOOD = {"name": "j", "model": "llama-3.2-1b", "seq_len": 1024, "global_batch": 8, "command": ["python", "t.py"]}


def _recipe(**over: object) -> marp.TrainingRecipe:
    spec = parse_entry({**GOOD, **over}).to_proto(read_model_files=False)
    return convert.recipe_from_proto(spec.recipe, spec.limits)


def test_defaults_are_marps() -> None:
    recipe = _recipe()
    assert (recipe.finetune, recipe.lora_rank, recipe.weight_decay, recipe.ep) == ("full", 16, None, 1)
    assert recipe.resolved_weight_decay == 0.01  # AdamW's own default
    assert _recipe(optimizer="sgd-momentum").resolved_weight_decay == 0.0


def test_fields_reach_the_recipe() -> None:
    recipe = _recipe(finetune="qlora", lora_rank=64, weight_decay=0.0, optimizer="sgd-momentum", precision="pure-bf16")
    assert (recipe.finetune, recipe.lora_rank, recipe.weight_decay, recipe.ep) == ("qlora", 64, 0.0, 1)
    # An explicit 0 is not "unset": the proto's optional field keeps them apart.
    assert _recipe(weight_decay=0.0).resolved_weight_decay == 0.0
    moe = ('{"arch": "decoder", "head": "lm", "n_layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn": 1024, '
           '"mlp": "swiglu", "vocab": 1000, "tied_embeddings": false, "pos_emb": "rope", "max_positions": 4096, '
           '"norm": "rmsnorm", "bias": false, "experts": 8, "top_k": 2}')  # fmt: skip
    assert _recipe(model=moe, ep=4).ep == 4
    assert _recipe().lora_dropout == 0.0 and _recipe(finetune="lora", lora_dropout=0.1).lora_dropout == 0.1


def test_recipe_to_proto_round_trips() -> None:
    recipe = marp.TrainingRecipe(seq_len=2048, global_batch=16, micro_batch=2, precision="amp-bf16",
                                 optimizer="sgd-momentum", finetune="lora", lora_rank=8, weight_decay=0.05, ep=2,
                                 zero_stages=(1, 3), lora_dropout=0.05)  # fmt: skip
    back = convert.recipe_from_proto(convert.recipe_to_proto(recipe))
    assert back == recipe


@pytest.mark.parametrize(
    ("over", "field"),
    [({"finetune": "dora"}, "finetune"), ({"lora_rank": 0}, "lora_rank"), ({"lora_rank": 1 << 17}, "lora_rank"),
     ({"weight_decay": -0.1}, "weight_decay"), ({"weight_decay": float("nan")}, "weight_decay"),
     ({"weight_decay": 1e9}, "weight_decay"), ({"ep": 0}, "ep"), ({"ep": 1e23}, "ep"),
     ({"lora_dropout": 1.0}, "lora_dropout"), ({"lora_dropout": -0.1}, "lora_dropout"),
     ({"lora_dropout": float("nan")}, "lora_dropout")],
)  # fmt: skip
def test_bad_values_name_the_field(over: dict[str, object], field: str) -> None:
    with pytest.raises(JobSpecError) as info:
        parse_entry({**GOOD, **over})
    assert str(info.value).startswith(f"{field}:")


def test_a_grpc_client_gets_the_same_refusals() -> None:
    """A JobSpec sent straight (no JobEntry): MARP's checks name the recipe field."""
    for recipe, field in ((types_pb2.TrainingRecipe(seq_len=512, global_batch=8, finetune=99), "recipe.finetune"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, lora_rank=-1), "recipe.lora_rank"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, weight_decay=-1.0),
                           "recipe.weight_decay"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, ep=2), "recipe.ep"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, lora_dropout=1.5),
                           "recipe.lora_dropout")):  # fmt: skip
        request = predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(catalog_name="gpt2-124m"), recipe=recipe)
        with pytest.raises(marp.MarpError) as info:
            predict(request)
        assert info.value.field == field


def test_the_predictor_plans_with_the_fields() -> None:
    """A LoRA job is planned with frozen base weights: the optimizer states are the adapters' only."""
    base = {**GOOD, "model": "llama-3-8b", "seq_len": 2048, "global_batch": 16, "precision": "pure-bf16",
            "gpu_types": ["A100-80GB"], "max_gpus": 8}  # fmt: skip
    full, lora = (parse_entry({**base, **over}).to_proto(read_model_files=False)
                  for over in ({}, {"finetune": "lora", "lora_rank": 8}))  # fmt: skip
    plans = [predict(predictor_pb2.PredictRequest(model=s.model, recipe=s.recipe, limits=s.limits)).plans
             for s in (full, lora)]  # fmt: skip
    assert plans[0] and plans[1]
    assert max(p.memory.optimizer_states for p in plans[1]) * 10 < min(p.memory.optimizer_states for p in plans[0])
