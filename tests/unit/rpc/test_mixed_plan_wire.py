"""Mixed plans on the wire (issue 33): the predictor's pure function returns them when asked and
the pools hold several types, the Plan proto carries stages and shares, and convert maps them back."""

from __future__ import annotations

from frenzy.predictor.planning import predict
from frenzy.rpc import convert
from frenzy.v1 import predictor_pb2, types_pb2

# examples/clusters/fragmented.yaml's pools
POOLS = [types_pb2.GpuPool(gpu_type="A100-80GB", total_gpus=2, gpus_per_node=2),
         types_pb2.GpuPool(gpu_type="L4", total_gpus=8, gpus_per_node=4),
         types_pb2.GpuPool(gpu_type="A10G", total_gpus=8, gpus_per_node=4)]


def _request(model: str, seq: int, batch: int, mixed: bool, pools=POOLS) -> predictor_pb2.PredictRequest:
    return predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(catalog_name=model),
                                        recipe=types_pb2.TrainingRecipe(seq_len=seq, global_batch=batch),
                                        pools=pools, mixed=mixed)


def test_a_model_no_pool_holds_gets_a_mixed_plan_first_on_the_wire():
    off = predict(_request("llama-2-13b", 4096, 64, mixed=False))
    assert not off.plans  # fits no single pool of the fragmented cluster
    resp = predict(_request("llama-2-13b", 4096, 64, mixed=True))
    best = resp.plans[0]
    assert best.gpu_type == "A100-80GB+L4" and best.kind == "pipeline"
    assert dict(best.gpus_by_type) == {"A100-80GB": 2, "L4": 8} and best.num_gpus == 10
    assert best.layout.pp == len(best.stages) and best.layout.tp * best.layout.pp * best.layout.dp == 10
    layers = [(st.first_layer, st.last_layer) for st in best.stages]
    assert layers[0][0] == 0 and layers[-1][1] == 39  # 40 blocks, covered in order without a gap
    assert all(b[0] == a[1] + 1 for a, b in zip(layers, layers[1:], strict=False))
    for st in best.stages:
        for share in st.shares:
            assert share.micro_batch >= 1 and share.grad_accum == best.micro_batches and share.peak_bytes > 0
    # back to MARP's layout: the same stages and shares
    lay = convert.mixed_from_proto(best)
    assert lay.gpus_by_type == dict(best.gpus_by_type) and lay.type_key == best.gpu_type
    assert [(st.first_layer, st.last_layer, st.tp) for st in lay.stages] == [
        (st.first_layer, st.last_layer, st.tp) for st in best.stages]
    assert lay.stages[0].shares[0].peak_bytes == best.stages[0].shares[0].peak_bytes
    assert convert.is_mixed(best) and not convert.is_mixed(types_pb2.Plan(gpu_type="L4"))


def test_single_type_answers_are_unchanged_when_off_or_with_one_type():
    req = _request("gpt2-xl", 1024, 16, mixed=False)
    off = predict(req)
    assert off.plans and all(not p.stages and not p.gpus_by_type and not p.kind for p in off.plans)
    on = predict(_request("gpt2-xl", 1024, 16, mixed=True))
    singles = [p for p in on.plans if not p.stages]
    assert any(p.stages for p in on.plans)  # mixed plans ranked beside them
    # the single-type plans themselves are the same plans
    assert {(p.gpu_type, p.num_gpus, p.step_time_s) for p in singles} <= {
        (p.gpu_type, p.num_gpus, p.step_time_s) for p in off.plans}
    one = [types_pb2.GpuPool(gpu_type="L4", total_gpus=8, gpus_per_node=4)]
    assert predict(_request("gpt2-xl", 1024, 16, True, one)) == predict(_request("gpt2-xl", 1024, 16, False, one))
