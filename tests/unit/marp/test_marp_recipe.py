"""TrainingRecipe and Layout validation."""

from __future__ import annotations

import numpy as np
import pytest

from marp import InvalidLayoutError, InvalidRecipeError, Layout, TrainingRecipe
from marp.recipe import LayoutGrid


def test_defaults_and_tokens_per_step() -> None:
    r = TrainingRecipe(seq_len=2048, global_batch=32)
    assert r.tokens_per_step == 65536
    assert (r.micro_batch, r.precision, r.optimizer, r.zero_stages) == (None, "bf16", "adamw", (0, 1, 2, 3))
    assert r.allow_recompute and r.flash_attention and r.train_steps == 1000 and r.max_gpus is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"seq_len": 0, "global_batch": 8}, "recipe.seq_len"),
        ({"seq_len": -5, "global_batch": 8}, "recipe.seq_len"),
        ({"seq_len": 512, "global_batch": 0}, "recipe.global_batch"),
        ({"seq_len": 512, "global_batch": -8}, "recipe.global_batch"),
        ({"seq_len": 512, "global_batch": 2.5}, "recipe.global_batch"),
        ({"seq_len": 512, "global_batch": 10, "micro_batch": 4}, "recipe.micro_batch"),
        ({"seq_len": 512, "global_batch": 8, "micro_batch": 0}, "recipe.micro_batch"),
        ({"seq_len": 512, "global_batch": 8, "precision": "int8"}, "recipe.precision"),
        ({"seq_len": 512, "global_batch": 8, "optimizer": "lion"}, "recipe.optimizer"),
        ({"seq_len": 512, "global_batch": 8, "train_steps": 0}, "recipe.train_steps"),
        ({"seq_len": 512, "global_batch": 8, "max_gpus": 0}, "recipe.max_gpus"),
        ({"seq_len": 512, "global_batch": 8, "zero_stages": (4,)}, "recipe.zero_stages"),
        ({"seq_len": 512, "global_batch": 8, "zero_stages": ()}, "recipe.zero_stages"),
        ({"seq_len": 512, "global_batch": 8, "allow_recompute": "yes"}, "recipe.allow_recompute"),
    ],
)
def test_bad_recipe_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRecipeError) as info:
        TrainingRecipe(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value)


def test_divisibility_message_says_how_to_fix() -> None:
    with pytest.raises(InvalidRecipeError) as info:
        TrainingRecipe(seq_len=512, global_batch=10, micro_batch=4)
    assert "not divisible" in str(info.value) and "To fix:" in str(info.value)


def test_zero_stages_list_is_normalised() -> None:
    assert TrainingRecipe(seq_len=8, global_batch=8, zero_stages=[0, 3]).zero_stages == (0, 3)  # type: ignore[arg-type]


def test_layout_num_gpus_and_validation() -> None:
    layout = Layout(tp=2, pp=2, dp=4, zero_stage=1, micro_batch=2, grad_accum=4, recompute="full")
    assert layout.num_gpus == 16 and layout.samples_per_step == 32
    for kwargs, field in [
        ({"tp": 0}, "layout.tp"),
        ({"dp": -1}, "layout.dp"),
        ({"zero_stage": 4}, "layout.zero_stage"),
        ({"recompute": "partial"}, "layout.recompute"),
        ({"micro_batch": 0}, "layout.micro_batch"),
    ]:
        base = {"tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, "micro_batch": 1, "grad_accum": 1}
        base.update(kwargs)
        with pytest.raises(InvalidLayoutError) as info:
            Layout(**base)  # type: ignore[arg-type]
        assert info.value.field == field


def test_layout_grid_broadcasts_and_round_trips_layouts() -> None:
    grid = LayoutGrid.broadcast([1, 2, 4], 2, [4, 8, 8], 1, 2, [4, 2, 2], 2, sp=[False, True, True], vpp=2, ep=[1, 2, 4])
    assert grid.tp.shape == grid.shard.shape == (3,) and grid.num_gpus.tolist() == [8, 32, 64]
    assert grid.shard.tolist() == [4, 8, 8]  # shard None: the whole dp group
    assert grid.layout_at(1) == Layout(2, 2, 8, 1, 2, 2, "full", sp=True, vpp=2, ep=2, shard_degree=8)
    one = Layout(tp=2, pp=1, dp=4, zero_stage=3, micro_batch=1, grad_accum=2, recompute="op-sac", shard_degree=2)
    assert LayoutGrid.of(one).layout_at(0) == one


@pytest.mark.parametrize(("change", "field"), [
    ({"tp": [1, 0]}, "layout.tp"), ({"zero_stage": [0, 4]}, "layout.zero_stage"),
    ({"recompute": [0, 9]}, "layout.recompute"), ({"vpp": [1, 2]}, "layout.vpp"), ({"ep": [1, 3]}, "layout.ep"),
    ({"shard": [2, 3]}, "layout.shard_degree"),
])  # fmt: skip
def test_layout_grid_rejects_what_layout_rejects(change: dict[str, list[int]], field: str) -> None:
    args = {"tp": 1, "pp": 1, "dp": [4, 4], "zero_stage": 0, "micro_batch": 1, "grad_accum": 1, "recompute": 0,
            **change}  # fmt: skip
    with pytest.raises(InvalidLayoutError) as info:
        LayoutGrid.broadcast(**args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_layout_grid_fields_share_one_shape() -> None:
    ones = np.ones(2, dtype=np.int64)
    with pytest.raises(InvalidLayoutError):
        LayoutGrid(ones, ones, ones, ones, ones, ones, ones, ones, ones, ones, ones, np.ones(3, dtype=np.int64), ones,
                   ones, ones)
