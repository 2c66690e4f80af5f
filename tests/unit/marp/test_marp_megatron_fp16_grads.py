"""Megatron --fp16's half-precision main-grad buffer and the out-of-place vocab-parallel CE (issue 16).

Megatron forces an fp32 main-grad buffer only under --bf16; under --fp16 the buffer is in the
parameters' dtype unless --accumulate-allreduce-grads-in-fp32 is given, and the Float16 optimizer
copies it to fp32 (``main_grad.float()``) in its step, until the next step's zero_grad. Megatron's
vocab-parallel CE subtracted the max out of place until at least mid-2024 ("fused-copy"): its
forward holds the half logits, their fp32 copy and the shifted copy. libs/marp/recipe.py
(MAIN_GRAD_DTYPES) and sizes.loss_bytes_per_logit cite the sources.
"""

from __future__ import annotations

import dataclasses

import pytest

from marp import InvalidRecipeError, Layout, TrainingRecipe, get_model, predict_memory

GPT2 = get_model("gpt2")


def _recipe(**over: object) -> TrainingRecipe:
    base: dict[str, object] = {"seq_len": 128, "global_batch": 1, "micro_batch": 1}
    return TrainingRecipe(**{**base, "precision": "master-fp16", **over})  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", ["master-fp16", "fp16", "master-bf16", "bf16"])
def test_half_main_grads_are_megatrons(precision: str) -> None:
    recipe = _recipe(precision=precision, main_grad_dtype="half")
    assert recipe.main_grad_dtype == "half" and recipe.to_dict()["main_grad_dtype"] == "half"
    assert _recipe(precision=precision).main_grad_dtype == "fp32"  # the default keeps today's buffer


@pytest.mark.parametrize("precision", ["fp32", "amp-fp16", "amp-bf16", "pure-bf16", "fsdp-bf16"])
def test_half_main_grads_are_refused_outside_master_policies(precision: str) -> None:
    with pytest.raises(InvalidRecipeError) as info:
        _recipe(precision=precision, main_grad_dtype="half")
    assert info.value.field == "recipe.main_grad_dtype"


@pytest.mark.parametrize("bad", ["fp16", "bf16", "", None, 2])
def test_bad_main_grad_dtype_is_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidRecipeError) as info:
        _recipe(main_grad_dtype=bad)
    assert info.value.field == "recipe.main_grad_dtype"


def test_half_buffer_halves_the_gradients_between_steps() -> None:
    # Activations dominate (no recompute, s 1024): the peak is in the forward / backward, where
    # the persistent buffer is 2 B per parameter instead of 4.
    recipe = _recipe(seq_len=1024, global_batch=4, micro_batch=4)
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=4, grad_accum=1)
    fp32 = predict_memory(GPT2, recipe, layout)
    half = predict_memory(GPT2, dataclasses.replace(recipe, main_grad_dtype="half"), layout)
    assert fp32.phase == half.phase != "optimizer"
    assert half.gradients == pytest.approx(fp32.gradients / 2, abs=2)
    assert fp32.gradients == pytest.approx(4 * GPT2.param_count(), abs=2)
    assert fp32.peak_allocated - half.peak_allocated == pytest.approx(2 * GPT2.param_count(), abs=4)


@pytest.mark.parametrize(("dp", "zero_stage", "copy_div"), [(1, 0, 1), (4, 1, 4)])
def test_the_optimizer_step_copies_the_half_grads_to_fp32(dp: int, zero_stage: int, copy_div: int) -> None:
    # Fully recomputed, one short micro-batch: the optimizer step is the peak once it holds the
    # fp32 copy of the gradients (of the rank's optimizer shard under the distributed optimizer).
    recipe = _recipe(global_batch=dp, main_grad_dtype="half")
    layout = Layout(tp=1, pp=1, dp=dp, zero_stage=zero_stage, micro_batch=1, grad_accum=1, recompute="full")
    mem = predict_memory(GPT2, recipe, layout)
    p = GPT2.param_count()
    assert mem.phase == "optimizer"
    assert mem.gradients == pytest.approx(2 * p + 4 * p / copy_div, rel=1e-6)
    # Without the copy an fp32 buffer's step would hold 4 B per parameter: the half buffer holds
    # more in its step (6 B at dp 1), less everywhere else.
    fp32 = predict_memory(GPT2, dataclasses.replace(recipe, main_grad_dtype="fp32"), layout)
    assert fp32.gradients < mem.gradients if copy_div == 1 else fp32.gradients > mem.gradients


def test_fused_copy_loss_holds_more_in_the_loss_forward_only() -> None:
    # The last stage at the loss: fused-copy's forward holds 4 B per logit more than fused's (the
    # shifted fp32 copy beside the first); at the backward's start both hold 4 + 2 B per logit.
    b, s = 4, 1024
    recipe = _recipe(seq_len=s, global_batch=b, micro_batch=b, loss="fused")
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=b, grad_accum=1)
    fused = predict_memory(GPT2, recipe, layout)
    copy = predict_memory(GPT2, dataclasses.replace(recipe, loss="fused-copy"), layout)
    assert fused.phase == copy.phase == "forward+loss"
    logits = b * s * GPT2.vocab
    assert fused.logits == pytest.approx(6 * logits, abs=2)
    assert copy.logits == pytest.approx(10 * logits, abs=2)
    assert copy.peak_allocated - fused.peak_allocated == pytest.approx(4 * logits, abs=4)
    # Under tensor parallelism the logits are the rank's vocabulary shard.
    tp2 = Layout(tp=2, pp=1, dp=1, zero_stage=0, micro_batch=b, grad_accum=1, sp=True)
    assert predict_memory(GPT2, dataclasses.replace(recipe, loss="fused-copy"), tp2).logits < copy.logits
