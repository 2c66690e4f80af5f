"""A job's pipeline split (issue 16): pp_layers travels from a job entry (CLI, YAML, REST) through
the JobSpec proto to MARP's TrainingRecipe, so the predictor plans only the pp x vpp layouts the
job's script can run, with the fullest stage charged. Bad values name the field."""

from __future__ import annotations

import pytest

import marp
from frenzy.predictor.server import predict
from frenzy.rpc import convert
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.rpc.spec_limits import check_recipe
from frenzy.v1 import predictor_pb2, types_pb2

GOOD = {"name": "j", "model": "llama-2-7b", "seq_len": 2048, "global_batch": 32, "command": ["python", "t.py"]}
SPLIT = [3, 5, 5, 5, 5, 5, 2, 2]  # llama-2-7b's 32 layers over 8 (virtual) stages


def _spec(**over: object) -> types_pb2.JobSpec:
    return parse_entry({**GOOD, **over}).to_proto(read_model_files=False)


def test_the_split_reaches_the_recipe_as_a_list_or_text() -> None:
    for given in (SPLIT, ",".join(map(str, SPLIT))):
        spec = _spec(pp_layers=given)
        assert list(spec.recipe.pp_layers) == SPLIT
        assert convert.recipe_from_proto(spec.recipe, spec.limits).pp_layers == tuple(SPLIT)
    assert convert.recipe_from_proto(_spec().recipe).pp_layers is None  # empty: an even split


def test_recipe_to_proto_round_trips_the_split() -> None:
    recipe = marp.TrainingRecipe(seq_len=2048, global_batch=16, pp_layers=(6, 10, 10, 6))
    assert convert.recipe_from_proto(convert.recipe_to_proto(recipe)) == recipe


def test_the_predictor_plans_the_split() -> None:
    spec = _spec(pp_layers=SPLIT, max_gpus=16)
    resp = predict(predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits))
    assert resp.plans
    assert {(p.layout.pp, p.layout.vpp or 1) for p in resp.plans} <= {(2, 4), (4, 2), (8, 1)}
    with pytest.raises(marp.InvalidRecipeError, match="places 31 layers"):
        bad = _spec(pp_layers=SPLIT[:-1] + [1])
        predict(predictor_pb2.PredictRequest(model=bad.model, recipe=bad.recipe, limits=bad.limits))


@pytest.mark.parametrize("value", ["2,x", [2, -1], [0, 0], [1] * 1025, [1 << 17]])
def test_bad_splits_name_the_field(value: object) -> None:
    with pytest.raises(JobSpecError) as info:
        parse_entry({**GOOD, "pp_layers": value})
    assert str(info.value).startswith("pp_layers")


def test_a_grpc_client_is_held_to_the_same_bounds() -> None:
    with pytest.raises(ValueError, match="recipe.pp_layers"):
        check_recipe(types_pb2.TrainingRecipe(seq_len=1, global_batch=1, pp_layers=[1] * 1025))
    with pytest.raises(ValueError, match="recipe.pp_layers"):
        check_recipe(types_pb2.TrainingRecipe(seq_len=1, global_batch=1, pp_layers=[-3]))
