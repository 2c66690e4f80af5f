"""Uneven pipeline splits (issue 16): the layers of each (virtual) pipeline stage, --pp-layers.

A split is charged at its fullest pipeline rank (and one chunk's pass at its fullest virtual
stage), so a 32-layer model split 6,10,10,6 over 4 ranks costs exactly what an evenly split
40-layer model does (10 layers a rank); 126 layers over 8 x 2 virtual stages, not an even split,
runs with torchtitan's balanced split (issue 36; before, it was refused without --pp-layers) and
costs what 128 even layers do (16 a rank, 8 a chunk).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from marp import (
    InvalidLayoutError,
    InvalidRecipeError,
    Layout,
    TrainingRecipe,
    enumerate_plans,
    get_gpu,
    get_model,
    memory_grid,
    predict_memory,
)
from marp.memory import with_default_split
from marp.recipe import balanced_split, split_maxima

LLAMA = get_model("llama-2-7b")  # 32 layers


def _layout(pp: int, ga: int = 8, vpp: int = 1, split: tuple[int, ...] | None = None, **kw: object) -> Layout:
    return Layout(tp=1, pp=pp, dp=1, zero_stage=0, micro_batch=1, grad_accum=ga, vpp=vpp, pp_layers=split, **kw)  # type: ignore[arg-type]


def _recipe(split: tuple[int, ...] | None = None, **kw: object) -> TrainingRecipe:
    return TrainingRecipe(seq_len=2048, global_batch=8, micro_batch=1, precision="master-bf16", pp_layers=split,
                          **kw)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("stage", ["first", "last"])
def test_an_even_split_given_explicitly_changes_nothing(stage: str) -> None:
    even = predict_memory(LLAMA, _recipe(), _layout(4), "H100-80GB", stage=stage)
    split = predict_memory(LLAMA, _recipe((8, 8, 8, 8)), _layout(4, split=(8, 8, 8, 8)), "H100-80GB", stage=stage)
    assert split == even


@pytest.mark.parametrize("stage", ["first", "last"])
def test_the_fullest_rank_is_charged(stage: str) -> None:
    uneven = predict_memory(LLAMA, _recipe((6, 10, 10, 6)), _layout(4, split=(6, 10, 10, 6)), "H100-80GB",
                            stage=stage)  # fmt: skip
    forty = replace(LLAMA, n_layers=40)
    assert uneven == predict_memory(forty, _recipe(), _layout(4), "H100-80GB", stage=stage)
    # ... which is more than the even split of the same 32 layers.
    assert uneven.total > predict_memory(LLAMA, _recipe(), _layout(4), "H100-80GB", stage=stage).total


def test_126_layers_over_16_virtual_stages() -> None:
    """Issue 36: without a split, 126 layers over pp 8 x vpp 2 run with torchtitan's and Megatron's
    balanced split (the embedding and the head one layer each: 7, 8 x 14, 7), not refused."""
    big = replace(LLAMA, name="llama-126", n_layers=126)
    split = (7,) + (8,) * 14 + (7,)
    assert balanced_split(126, 16) == split
    assert split_maxima(split, 8) == (16, 8)  # ranks 1-6 hold two 8-layer stages
    got = predict_memory(big, _recipe(split), _layout(8, vpp=2, split=split), "H100-80GB")
    even = predict_memory(replace(big, n_layers=128), _recipe(), _layout(8, vpp=2), "H100-80GB")
    assert got == even
    assert predict_memory(big, _recipe(), _layout(8, vpp=2), "H100-80GB") == got
    assert with_default_split(big, _layout(8, vpp=2)).pp_layers == split
    # a pp x vpp that divides the layers keeps Megatron's even split (no pp_layers)
    assert with_default_split(replace(big, n_layers=128), _layout(8, vpp=2)).pp_layers is None


@pytest.mark.parametrize(("n_layers", "stages", "split"), [
    (126, 16, (7,) + (8,) * 14 + (7,)),  # Llama 3.1 405B at pp 8 x vpp 2
    (32, 8, (4, 5, 4, 4, 4, 4, 4, 3)),  # 34 units: the first two stages get one more (torchtitan)
    (61, 16, (3,) + (4,) * 14 + (2,)),  # DeepSeek-V3 at pp 8 x vpp 2
    (30, 8, (3, 4, 4, 4, 4, 4, 4, 3)),
])  # fmt: skip
def test_the_balanced_split_is_torchtitans(n_layers: int, stages: int, split: tuple[int, ...]) -> None:
    got = balanced_split(n_layers, stages)
    assert sum(got) == n_layers and len(got) == stages
    assert got == split


def test_too_many_virtual_stages_are_refused_naming_vpp() -> None:
    tiny = replace(LLAMA, name="llama-5", n_layers=5)
    with pytest.raises(InvalidLayoutError, match="vpp"):
        predict_memory(tiny, _recipe(), _layout(4, vpp=2), "H100-80GB")


def test_the_grid_path_agrees_with_the_single_layout() -> None:
    split = (3, 5, 5, 5, 5, 5, 2, 2)
    recipe = _recipe(split)
    for pp, vpp in ((2, 4), (4, 2), (8, 1)):
        one = predict_memory(LLAMA, recipe, _layout(pp, vpp=vpp, split=split), "H100-80GB")
        stage, chunk = split_maxima(split, pp)
        grid = memory_grid(LLAMA, recipe, [1], [pp], [1], [0], [1], [8], False, get_gpu("H100-80GB"), vpp=[vpp],
                           stage_layers=[stage], chunk_layers=[chunk])  # fmt: skip
        assert int(grid["total"][0]) == one.total


@pytest.mark.parametrize(
    ("split", "layout_kw", "match"),
    [((8, 8, 8), {}, "3 stages given"), ((8, 8, 8, 7), {}, "places 31 layers"), ((8, 8, -1, 17), {}, "non-negative"),
     ((8, 8, 8, 8), {"vpp": 2}, "pp 4 x vpp 2")],
)  # fmt: skip
def test_bad_splits_name_the_field(split: tuple[int, ...], layout_kw: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidLayoutError, match=match) as info:
        predict_memory(LLAMA, _recipe(), _layout(4, split=split, **layout_kw), "H100-80GB")
    assert info.value.field == "layout.pp_layers"


def test_the_layout_must_use_the_recipes_split() -> None:
    with pytest.raises(InvalidLayoutError, match="recipe fixes the pipeline split"):
        predict_memory(LLAMA, _recipe((6, 10, 10, 6)), _layout(4, split=(8, 8, 8, 8)), "H100-80GB")
    with pytest.raises(InvalidRecipeError, match="recipe.pp_layers"):
        _recipe((0, 0))


def test_the_planner_keeps_the_split() -> None:
    split = (3, 5, 5, 5, 5, 5, 2, 2)
    recipe = TrainingRecipe(seq_len=4096, global_batch=64, precision="master-bf16", pp_layers=split, max_gpus=32)
    plans = enumerate_plans(LLAMA, recipe, max_plans=None).plans
    assert plans
    seen = set()
    for plan in plans:
        lay = plan.layout
        assert lay.pp_layers == split and lay.pp * lay.vpp == len(split)
        assert lay.vpp == 1 or lay.grad_accum % lay.pp == 0  # interleaved 1F1B needs m % pp == 0
        assert plan.memory == predict_memory(LLAMA, recipe, lay, plan.gpu_type)
        seen.add((lay.pp, lay.vpp))
    assert seen == {(2, 4), (4, 2), (8, 1)}
    with pytest.raises(InvalidRecipeError, match="places 31 layers"):
        enumerate_plans(LLAMA, replace(recipe, pp_layers=(3, 5, 5, 5, 5, 5, 2, 1)))
    with pytest.raises(InvalidRecipeError, match="fsdp-bf16"):
        enumerate_plans(LLAMA, replace(recipe, precision="fsdp-bf16", zero_stages=(3,)))


def test_without_a_split_the_planner_grid_is_unchanged() -> None:
    recipe = TrainingRecipe(seq_len=4096, global_batch=64, precision="master-bf16", max_gpus=16)
    plans = enumerate_plans(LLAMA, recipe, max_plans=None).plans
    assert all(p.layout.vpp == 1 and p.layout.pp_layers is None for p in plans)
    assert np.unique([p.layout.pp for p in plans]).size > 1
