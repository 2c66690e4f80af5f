"""The planner builds its plans' layouts without checking them again (``Layout.of_valid``): each is
a row of a grid ``memory_grid`` validated by Layout's rules. Every such layout must be one that
``Layout(...)`` itself accepts and equals, across the dimensions the grid enumerates -- dense and
MoE models (ep, etp), uneven pipeline splits (pp_layers with vpp), ZeRO stages, recompute, fsdp."""

from __future__ import annotations

from dataclasses import fields

import pytest
from unit.marp.test_marp_expert_parallel import MOE

from marp import GpuPool, InvalidLayoutError, Layout, TrainingRecipe, enumerate_plans, get_model

CASES = [
    (get_model("llama-3-70b"), TrainingRecipe(seq_len=4096, global_batch=1024)),
    (get_model("llama-2-7b"), TrainingRecipe(seq_len=4096, global_batch=64, precision="master-bf16",
                                             pp_layers=(4, 4, 4, 4, 4, 4, 4, 4), max_gpus=32)),
    (get_model("llama-3-8b"), TrainingRecipe(seq_len=8192, global_batch=64, precision="fsdp-bf16", zero_stages=(3,))),
    (MOE, TrainingRecipe(seq_len=2048, global_batch=32)),
    (MOE, TrainingRecipe(seq_len=2048, global_batch=32, ep=4, etp=1, precision="master-bf16")),
]


@pytest.mark.parametrize(("model", "recipe"), CASES, ids=lambda v: getattr(v, "name", None) or "")
def test_every_planned_layout_is_one_layout_itself_accepts(model, recipe) -> None:  # type: ignore[no-untyped-def]
    pools = [GpuPool("A100-80GB", 256, 8), GpuPool("H100-80GB", 64, 8), GpuPool("L4", 32, 8)]
    plans = enumerate_plans(model, recipe, pools, max_plans=None).plans
    assert plans
    for plan in plans:
        lay = plan.layout
        checked = Layout(**{f.name: getattr(lay, f.name) for f in fields(Layout)})  # validates
        assert checked == lay


def test_of_valid_takes_only_layout_fields_and_fills_the_defaults() -> None:
    lay = Layout.of_valid(tp=2, pp=1, dp=4, zero_stage=1, micro_batch=1, grad_accum=8)
    assert lay == Layout(tp=2, pp=1, dp=4, zero_stage=1, micro_batch=1, grad_accum=8)
    assert (lay.recompute, lay.cp, lay.vpp, lay.ep, lay.etp) == ("none", 1, 1, 1, None)
    with pytest.raises(TypeError, match="no field"):
        Layout.of_valid(tp=2, pp=1, dp=4, zero_stage=1, micro_batch=1, grad_accum=8, pipeline=2)
    with pytest.raises(InvalidLayoutError):  # the checking constructor still refuses what is wrong
        Layout(tp=2, pp=1, dp=4, zero_stage=4, micro_batch=1, grad_accum=8)
