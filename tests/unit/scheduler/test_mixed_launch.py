"""A mixed plan's launch (issue 33): HAS's placement of the predictor's plan on the fragmented
cluster, rendered per node (``placing.render_launches``), through the signed message's layout to
the job's environment (``launcher.build_env``), gives every local rank its stage, layers, local
batch and loss share (``frenzy.train.contract``), and the shares add up to the global batch."""

from __future__ import annotations

from fractions import Fraction

import pytest

from frenzy.agent import launcher
from frenzy.predictor.planning import predict
from frenzy.scheduler.placing import Rendezvous, rank_contracts, render_launches
from frenzy.state.messages import LaunchMessage, LayoutEnv
from frenzy.state.plan_options import plan_to_option
from frenzy.train import contract
from frenzy.v1 import predictor_pb2, types_pb2
from has import ClusterView, GpuSlot, NodeView, QueuedJob, QueuePolicy, schedule

GiB = 1 << 30


def _node(name: str, gpu_type: str, n: int, mem: int) -> NodeView:
    return NodeView(name, tuple(GpuSlot(name, i, gpu_type, mem, mem, None) for i in range(n)))


def fragmented() -> ClusterView:  # examples/clusters/fragmented.yaml
    return ClusterView([_node("a100-0", "A100-80GB", 2, 80 * GiB), _node("l4-0", "L4", 4, 24 * GiB),
                        _node("l4-1", "L4", 4, 24 * GiB), _node("a10g-0", "A10G", 4, 24 * GiB),
                        _node("a10g-1", "A10G", 4, 24 * GiB)])


def mixed_plan(model: str = "llama-2-13b", seq: int = 4096, batch: int = 64) -> types_pb2.Plan:
    pools = [types_pb2.GpuPool(gpu_type=t, total_gpus=n, gpus_per_node=g)
             for t, n, g in (("A100-80GB", 2, 2), ("L4", 8, 4), ("A10G", 8, 4))]
    resp = predict(predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(catalog_name=model),
                                                recipe=types_pb2.TrainingRecipe(seq_len=seq, global_batch=batch),
                                                pools=pools, mixed=True))
    return resp.plans[0]


def launches(plan: types_pb2.Plan) -> list[LaunchMessage]:
    option = plan_to_option(plan)
    result = schedule(fragmented(), [QueuedJob("j1", 1, 0.0, (option,))], 0.0, QueuePolicy.frenzy())
    (placement,) = result.placements
    spec = types_pb2.JobSpec(command=["train.py", "--layers", "{stage_layers}", "--mb", "{local_micro_batch}"])
    uuids = {n: [f"GPU-{n}-{i}" for i in idxs] for n, idxs in placement.nodes}
    return render_launches("j1", 1, 7, spec, plan, placement.nodes, Rendezvous("10.0.0.1", 29500), uuids,
                           parts=placement.parts)


def rank_envs(msgs: list[LaunchMessage]) -> list[tuple[str, contract.RankContract]]:
    """(node, contract) of every rank, as the training script would parse it under torchrun."""
    out = []
    for msg in msgs:
        msg = LaunchMessage.model_validate_json(msg.model_dump_json())  # what the agent reads
        env = launcher.build_env(msg, msg.node, base={})
        for local in range(msg.nproc_per_node):
            got = contract.parse({**env, "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(msg.nproc_per_node)})
            assert got is not None
            out.append((msg.node, got))
    return out


def test_every_rank_of_a_pipeline_over_two_types_gets_its_stage_layers_batch_and_share():
    plan = mixed_plan()
    assert plan.kind == "pipeline" and plan.gpu_type == "A100-80GB+L4"
    msgs = launches(plan)
    assert [m.node for m in msgs] == ["a100-0", "l4-0", "l4-1"] and [m.node_rank for m in msgs] == [0, 1, 2]
    ranks = rank_envs(msgs)
    assert len(ranks) == 10
    by_stage = {st.index: st for st in plan.stages}
    for node, rc in ranks:
        st = by_stage[rc.stage]
        assert (rc.first_layer, rc.last_layer) == (st.first_layer, st.last_layer)
        (share,) = st.shares
        assert node.startswith("a100" if share.gpu_type == "A100-80GB" else "l4")
        assert (rc.local_micro_batch, rc.local_grad_accum) == (share.micro_batch, share.grad_accum)
        assert rc.global_batch == 64 and rc.loss_scale == Fraction(share.micro_batch * share.grad_accum, 64)
    # every stage is present, each with tp x dp ranks; the layers cover the model in order
    assert sorted({rc.stage for _, rc in ranks}) == list(range(len(plan.stages)))
    assert all(sum(rc.stage == s for _, rc in ranks) == by_stage[s].tp * plan.layout.dp for s in by_stage)
    # a node with two stages gets per-local-rank lists; its {stage_layers} stays as written
    l4 = next(m for m in msgs if m.node == "l4-0")
    assert "," in l4.layout.contract["FRENZY_STAGE"]
    assert launcher.build_argv(l4)[2] == "{stage_layers}"
    a100 = msgs[0]
    argv = launcher.build_argv(a100)
    st0 = by_stage[0]
    assert f"{st0.first_layer}-{st0.last_layer}" in argv and str(st0.shares[0].micro_batch) in argv
    assert a100.layout.peak_bytes_per_gpu == st0.shares[0].peak_bytes


def test_uneven_data_parallelism_shares_add_up_to_the_global_batch():
    # the docs' example: one stage, 2 A100 ranks of 3 x 2, 2 L4 ranks of 2 x 1, global batch 16
    plan = types_pb2.Plan(gpu_type="A100-80GB+L4", num_gpus=4, kind="data", micro_batches=2,
                          layout=types_pb2.Layout(tp=1, pp=1, dp=4, micro_batch=3, grad_accum=2),
                          stages=[types_pb2.PlanStage(index=0, first_layer=0, last_layer=1, tp=1, shares=[
                              types_pb2.TypeShare(gpu_type="A100-80GB", gpus=2, micro_batch=3, grad_accum=2,
                                                  peak_bytes=GiB),
                              types_pb2.TypeShare(gpu_type="L4", gpus=2, micro_batch=2, grad_accum=1,
                                                  peak_bytes=GiB)])])  # fmt: skip
    a, b = rank_contracts(plan, [0, 0]), rank_contracts(plan, [1, 1])
    assert contract.render(a) == {"FRENZY_STAGE": "0", "FRENZY_STAGE_LAYERS": "0-1", "FRENZY_LOCAL_MICRO_BATCH": "3",
                                  "FRENZY_LOCAL_GRAD_ACCUM": "2", "FRENZY_LOSS_SCALE": "3/8"}
    assert contract.render(b)["FRENZY_LOSS_SCALE"] == "1/8"
    assert sum(rc.loss_scale for rc in a + b) == 1


def test_a_single_type_launch_carries_no_contract_and_a_broken_one_is_refused():
    plan = types_pb2.Plan(gpu_type="L4", num_gpus=2, layout=types_pb2.Layout(tp=1, pp=1, dp=2, micro_batch=4,
                                                                             grad_accum=1))
    (msg,) = render_launches("j", 1, 1, types_pb2.JobSpec(command=["x", "{local_micro_batch}"]), plan,
                             [("n", (0, 1))], Rendezvous("h", 29500), {})
    env = launcher.build_env(msg, "n", base={})
    assert not any(name in env for name in contract.NAMES)
    assert launcher.build_argv(msg)[:2] == ["x", "4"]
    with pytest.raises(ValueError, match="all of"):
        LayoutEnv(gpu_type="L4", tp=1, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1,
                  contract={"FRENZY_STAGE": "0"})
    with pytest.raises(ValueError, match="FRENZY_LOSS_SCALE"):
        LayoutEnv(gpu_type="L4", tp=1, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1,
                  contract={"FRENZY_STAGE": "0", "FRENZY_STAGE_LAYERS": "0-1", "FRENZY_LOCAL_MICRO_BATCH": "3",
                            "FRENZY_LOCAL_GRAD_ACCUM": "1", "FRENZY_LOSS_SCALE": "3/7,2/7"})
