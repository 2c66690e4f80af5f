"""The recipe fields a submitted job is planned with (issue 16): finetune, lora_rank,
weight_decay, ep, lora_dropout, lora_adapter_dtype, fsdp_reshard and qlora_backend travel from a job entry (CLI, YAML, REST) through the JobSpec proto to
MARP's TrainingRecipe, so the predictor plans the job the way it will run. Bad values name the field."""

from __future__ import annotations

import typing

import pytest

import marp
from frenzy.predictor.server import predict
from frenzy.rpc import convert
from frenzy.rpc.jobspec import JobEntry, JobSpecError, parse_entry
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
    # The job entry offers exactly the names MARP takes, the default first.
    for name, choices in convert.CHOICE_FIELDS.items():
        assert typing.get_args(JobEntry.model_fields[name].annotation) == choices
        assert JobEntry.model_fields[name].default == convert.CHOICE_DEFAULTS[name] == choices[0]


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
    default = _recipe()
    assert (default.lora_adapter_dtype, default.fsdp_reshard, default.qlora_backend) == ("fp32", "keep-last",
                                                                                          "bitsandbytes")
    tuned = _recipe(finetune="qlora", lora_adapter_dtype="compute", fsdp_reshard="all", qlora_backend="torchao")
    assert (tuned.lora_adapter_dtype, tuned.fsdp_reshard, tuned.qlora_backend) == ("compute", "all", "torchao")
    # The defaults stay empty on the wire: a job written before these fields reads the same.
    wire = parse_entry({**GOOD, "lora_adapter_dtype": "fp32", "qlora_backend": "torchao"}).to_proto().recipe
    assert (wire.lora_adapter_dtype, wire.fsdp_reshard, wire.qlora_backend) == ("", "", "torchao")
    # Megatron's main-grad buffer: fp32 by default (empty on the wire), half under fp16's master weights
    assert default.main_grad_dtype == "fp32" and parse_entry(GOOD).to_proto().recipe.main_grad_dtype == ""
    half = _recipe(precision="fp16", main_grad_dtype="half")
    assert (half.precision, half.main_grad_dtype) == ("fp16", "half")  # (fp16: master-fp16 when ranked)
    with pytest.raises(marp.MarpError, match="main_grad_dtype"):  # only with master weights
        _recipe(precision="pure-bf16", main_grad_dtype="half")


def test_recipe_to_proto_round_trips() -> None:
    recipe = marp.TrainingRecipe(seq_len=2048, global_batch=16, micro_batch=2, precision="amp-bf16",
                                 optimizer="sgd-momentum", finetune="lora", lora_rank=8, weight_decay=0.05, ep=2,
                                 zero_stages=(1, 3), lora_dropout=0.05)  # fmt: skip
    back = convert.recipe_from_proto(convert.recipe_to_proto(recipe))
    assert back == recipe
    tuned = marp.TrainingRecipe(seq_len=2048, global_batch=16, precision="pure-bf16", finetune="qlora",
                                lora_adapter_dtype="compute", fsdp_reshard="all", qlora_backend="torchao")  # fmt: skip
    assert convert.recipe_from_proto(convert.recipe_to_proto(tuned)) == tuned
    megatron = marp.TrainingRecipe(seq_len=1024, global_batch=16, precision="fp16", main_grad_dtype="half")
    assert convert.recipe_from_proto(convert.recipe_to_proto(megatron)) == megatron


@pytest.mark.parametrize(
    ("over", "field"),
    [({"finetune": "dora"}, "finetune"), ({"lora_rank": 0}, "lora_rank"), ({"lora_rank": 1 << 17}, "lora_rank"),
     ({"weight_decay": -0.1}, "weight_decay"), ({"weight_decay": float("nan")}, "weight_decay"),
     ({"weight_decay": 1e9}, "weight_decay"), ({"ep": 0}, "ep"), ({"ep": 1e23}, "ep"),
     ({"lora_dropout": 1.0}, "lora_dropout"), ({"lora_dropout": -0.1}, "lora_dropout"),
     ({"lora_dropout": float("nan")}, "lora_dropout"), ({"lora_adapter_dtype": "bf16"}, "lora_adapter_dtype"),
     ({"fsdp_reshard": "none"}, "fsdp_reshard"), ({"qlora_backend": "hqq"}, "qlora_backend"),
     ({"qlora_backend": ""}, "qlora_backend"), ({"main_grad_dtype": "bf16"}, "main_grad_dtype")],
)  # fmt: skip
def test_bad_values_name_the_field(over: dict[str, object], field: str) -> None:
    with pytest.raises(JobSpecError) as info:
        parse_entry({**GOOD, **over})
    assert str(info.value).startswith(f"{field}:")
    allowed = {"lora_adapter_dtype": ("fp32", "compute"), "fsdp_reshard": ("keep-last", "all"),
               "qlora_backend": ("bitsandbytes", "torchao")}.get(field, ())  # fmt: skip
    assert all(a in str(info.value) for a in allowed), info.value


def test_a_grpc_client_gets_the_same_refusals() -> None:
    """A JobSpec sent straight (no JobEntry): MARP's checks name the recipe field."""
    for recipe, field in ((types_pb2.TrainingRecipe(seq_len=512, global_batch=8, finetune=99), "recipe.finetune"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, lora_rank=-1), "recipe.lora_rank"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, weight_decay=-1.0),
                           "recipe.weight_decay"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, ep=2), "recipe.ep"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, lora_dropout=1.5),
                           "recipe.lora_dropout"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, lora_adapter_dtype="bf16"),
                           "recipe.lora_adapter_dtype"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, fsdp_reshard="none"),
                           "recipe.fsdp_reshard"),
                          (types_pb2.TrainingRecipe(seq_len=512, global_batch=8, qlora_backend="Torchao"),
                           "recipe.qlora_backend")):  # fmt: skip
        request = predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(catalog_name="gpt2-124m"), recipe=recipe)
        with pytest.raises(marp.MarpError) as info:
            predict(request)
        assert info.value.field == field
        if field in convert.CHOICE_FIELDS:  # the message lists what is allowed
            assert all(c in str(info.value) for c in convert.CHOICE_FIELDS[field]), info.value


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

    # Pure bf16 with peft's fp32 adapters (the default) vs adapters in the compute dtype: the field
    # crosses the wire, and every plan the two share keeps half the adapter states.
    compute = parse_entry({**base, "finetune": "lora", "lora_rank": 8, "lora_adapter_dtype": "compute"}).to_proto(
        read_model_files=False)
    fp32_states = {(p.gpu_type, p.num_gpus, str(p.layout)): p.memory.optimizer_states for p in plans[1]}
    shared = [(p.memory.optimizer_states, fp32_states[k]) for p in predict(predictor_pb2.PredictRequest(
        model=compute.model, recipe=compute.recipe, limits=compute.limits)).plans
        if (k := (p.gpu_type, p.num_gpus, str(p.layout))) in fp32_states]
    assert shared and all(c * 2 == f for c, f in shared)
