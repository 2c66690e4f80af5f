"""The queue's plan reader gives what protobuf's JSON parser followed by plan_to_option gives."""

from __future__ import annotations

import json
import random

import pytest
from google.protobuf import json_format

from frenzy.state.plan_options import option_from_json, plan_to_option
from frenzy.v1 import types_pb2


def random_plan(rng: random.Random) -> types_pb2.Plan:
    plan = types_pb2.Plan(
        gpu_type=rng.choice(["", "A100-80GB", "L4", "H100-80GB"]),
        num_gpus=rng.choice([0, 1, 8, 64]),
        peak_bytes_per_gpu=rng.choice([0, 1, 2**31 + 7, 2**40 + 3, 80 * 2**30]),
        gpu_memory_bytes=80 * 2**30,
        layout=types_pb2.Layout(tp=rng.choice([1, 2, 8]), pp=rng.choice([1, 4]), dp=rng.choice([1, 3, 128]),
                                zero_stage=rng.choice([0, 3]), micro_batch=1, grad_accum=2, recompute="full"),
        step_time_s=rng.random(), gpu_hours=rng.random() * 100, rank=rng.randint(0, 40),
        completion_s=rng.choice([0.0, -1.0, 1e-9, 3600.25, 1e7, float("inf")]),
    )
    return plan


@pytest.mark.parametrize("seed", range(20))
def test_reading_stored_plans_matches_the_protobuf_parser(seed: int) -> None:
    rng = random.Random(seed)
    plans = [random_plan(rng) for _ in range(30)]
    stored = json.loads(json.dumps([json_format.MessageToDict(p) for p in plans]))  # as the store writes them
    for raw in stored:
        assert option_from_json(raw) == plan_to_option(json_format.ParseDict(raw, types_pb2.Plan()))
    # the original field names (ParseDict accepts them too)
    for plan in plans:
        raw = json_format.MessageToDict(plan, preserving_proto_field_name=True)
        assert option_from_json(raw) == plan_to_option(plan)


def test_a_plan_without_a_layout_is_refused_by_both() -> None:
    raw = json_format.MessageToDict(types_pb2.Plan(gpu_type="L4", peak_bytes_per_gpu=5))
    with pytest.raises(ValueError, match="tp must be >= 1"):
        plan_to_option(json_format.ParseDict(raw, types_pb2.Plan()))
    with pytest.raises(ValueError, match="tp must be >= 1"):
        option_from_json(raw)


def test_a_mixed_plan_reads_into_its_parts_by_both() -> None:
    """A mixed plan (issue 33) as stored: its stages' shares become the PlanOption's parts."""
    from frenzy.predictor.planning import predict
    from frenzy.v1 import predictor_pb2

    pools = [types_pb2.GpuPool(gpu_type="A100-80GB", total_gpus=2, gpus_per_node=2),
             types_pb2.GpuPool(gpu_type="L4", total_gpus=8, gpus_per_node=4)]
    resp = predict(predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(catalog_name="llama-2-13b"),
                                                recipe=types_pb2.TrainingRecipe(seq_len=4096, global_batch=64),
                                                pools=pools, mixed=True))
    plan = resp.plans[0]
    raw = json.loads(json.dumps(json_format.MessageToDict(plan)))
    option = option_from_json(raw)
    assert option == plan_to_option(plan)
    assert option.gpu_type == "A100-80GB+L4" and option.num_gpus == 10
    assert [(p.stage, p.gpu_type, p.gpus, p.tp) for p in option.parts] == [
        (st.index, s.gpu_type, s.gpus, st.tp) for st in plan.stages for s in st.shares]
    assert option.bytes_per_gpu == min(s.peak_bytes for st in plan.stages for s in st.shares)
    assert dict((t, n) for t, n, _, _ in option.type_needs()) == {"A100-80GB": 2, "L4": 8}
