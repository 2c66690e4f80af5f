"""Expert parallelism: a rank holds 1 / ep of the experts, and the planner keeps the job's ep.

Each of the ep ranks of an expert-parallel group holds experts / ep of every MoE layer's experts
(GShard, Lepikhin et al. 2021, sec. 2); their gradients and optimizer states shard over the
expert-data-parallel group (dp x cp / ep). MARP used to charge the experts as if ep were 1
(the non-local share was subtracted and added back), so --ep changed nothing or made it worse.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from unit.marp.marp_builders import MOE

from marp import (
    GpuPool,
    InvalidRecipeError,
    Layout,
    ModelSpec,
    TrainingRecipe,
    enumerate_plans,
    get_model,
    predict_memory,
)


def _mem(ep: int, zero: int = 1) -> dict[str, int]:
    recipe = TrainingRecipe(seq_len=2048, global_batch=32, precision="master-bf16", ep=ep)
    layout = Layout(tp=2, pp=1, dp=8, zero_stage=zero, micro_batch=1, grad_accum=4, ep=ep, sp=True)
    return predict_memory(MOE, recipe, layout, "A100-80GB").to_dict()


def test_ep_divides_the_expert_parameters() -> None:
    experts = MOE.n_layers * MOE.expert_params() // 2  # per TP rank (tp 2)
    one, four = _mem(1), _mem(4)
    # bf16 parameters (2 B) and fp32 main gradients (4 B): 3/4 of the experts leave the rank.
    assert one["parameters"] - four["parameters"] == pytest.approx(2 * experts * 3 / 4, rel=1e-6)
    assert one["gradients"] - four["gradients"] == pytest.approx(4 * experts * 3 / 4, rel=1e-6)
    # Distributed optimizer: experts / ep over dp / ep ranks is experts / dp either way.
    assert four["optimizer_states"] == pytest.approx(one["optimizer_states"], rel=1e-6)
    assert _mem(8)["total"] < four["total"] < one["total"]


def test_ep_1_charges_every_expert_as_before() -> None:
    # All parameters on the rank, bf16: the stage's parameter count x 2 B (ZeRO-1 keeps them whole).
    from marp.memory import stage_param_counts

    first, _last, _layer, _vocab = stage_param_counts(MOE, 2, 1)
    assert _mem(1)["parameters"] == 2 * int(first)


def test_the_planner_keeps_the_jobs_ep() -> None:
    recipe = TrainingRecipe(seq_len=2048, global_batch=32, ep=4)
    plans = enumerate_plans(MOE, recipe, [GpuPool("A100-80GB", 16, 8)]).plans
    assert plans and all(p.layout.ep == 4 and p.layout.dp % 4 == 0 for p in plans)
    # Same layout, less memory with the experts spread.
    recipe_1 = TrainingRecipe(seq_len=2048, global_batch=32)
    for p in plans:
        at_ep_1 = predict_memory(MOE, recipe_1, replace(p.layout, ep=1), "A100-80GB")
        assert p.memory.total < at_ep_1.total


def test_the_planner_tries_ep_for_a_moe_job_that_sets_none() -> None:
    # MOE has 8 experts: ep 1, 2, 4, 8 wherever it divides dp; the layouts tie on step time (the
    # all-to-all is not priced) and the one with the most headroom -- the widest ep -- ranks first.
    from marp.plans import _candidate_grid, expert_parallel_degrees

    recipe = TrainingRecipe(seq_len=2048, global_batch=32)
    assert expert_parallel_degrees(MOE, recipe) == [1, 2, 4, 8]
    assert expert_parallel_degrees(get_model("llama-3-8b"), recipe) == [1]
    grid = _candidate_grid(MOE, recipe, 16, 8)
    assert set(grid["ep"].tolist()) == {1, 2, 4, 8} and not (grid["dp"] % grid["ep"]).any()
    assert "ep" not in _candidate_grid(get_model("llama-3-8b"), recipe, 16, 8)
    plans = enumerate_plans(MOE, recipe, [GpuPool("A100-80GB", 16, 8)]).plans
    assert any(p.layout.ep > 1 for p in plans)
    for p in plans:
        assert p.layout.ep == max(e for e in (1, 2, 4, 8) if p.layout.dp % e == 0)


@pytest.mark.parametrize(("model", "ep"), [(get_model("llama-3-8b"), 2), (MOE, 3)])
def test_ep_the_model_cannot_take_is_refused_by_name(model: ModelSpec, ep: int) -> None:
    with pytest.raises(InvalidRecipeError) as info:
        enumerate_plans(model, TrainingRecipe(seq_len=2048, global_batch=32, ep=ep), [GpuPool("A100-80GB", 16, 8)])
    assert info.value.field == "recipe.ep"
    with pytest.raises(InvalidRecipeError) as info:
        TrainingRecipe(seq_len=2048, global_batch=32, ep=0)
    assert info.value.field == "recipe.ep"
