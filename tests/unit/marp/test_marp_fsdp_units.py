"""FSDP2's gathered units and gradient buffers as the multi-GPU oracle counts them (issue 16).

The oracle counts FSDP2's frees (storage resizes): at the forward's end one block is gathered (the
last: torchtitan does not reshard it after its forward) plus the root; in a block's backward two
(it and the prefetched one); a block's gradients are unsharded in the compute dtype until its
post-backward copies them into a reduce-dtype reduce-scatter input, which FSDP2 holds until the
next block's post-backward -- so every block below the first back-propagated one runs beside it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import Layout, TrainingRecipe, get_model, predict_memory
from marp.sizes import stage_param_counts

LLAMA = get_model("llama-3-8b")
DP = 8


def _mem(vocab: int, recompute: str, reshard: str = "keep-last") -> tuple[dict[str, int], str]:
    model = replace(LLAMA, vocab=vocab)
    recipe = TrainingRecipe(seq_len=4096, global_batch=4 * DP, micro_batch=4, precision="fsdp-bf16",
                            fsdp_reshard=reshard)  # fmt: skip
    layout = Layout(tp=1, pp=1, dp=DP, zero_stage=3, micro_batch=4, grad_accum=1, recompute=recompute)  # type: ignore[arg-type]
    mem = predict_memory(model, recipe, layout, "H100-80GB")
    return mem.to_dict(), mem.phase


def _sizes(vocab: int) -> tuple[int, int]:
    total, _last, layer, _v = (int(x) for x in stage_param_counts(replace(LLAMA, vocab=vocab), 1, 1))
    return layer, total - LLAMA.n_layers * layer


def test_one_unit_and_the_root_are_gathered_at_the_forwards_end() -> None:
    mem, phase = _mem(128256, "full")  # the logits set the peak
    layer, root = _sizes(128256)
    assert phase == "forward+loss"
    assert mem["buffers"] == pytest.approx((layer + root) * 2, abs=8)  # bf16 compute copies


def test_torchtunes_policy_reshards_every_block_after_its_forward() -> None:
    # torchtune's shard_model: reshard_after_forward=True on every block, so at the loss only the
    # root is gathered; the backward gathers the last block again, as under torchtitan's policy.
    mem, phase = _mem(128256, "full", "all")
    layer, root = _sizes(128256)
    assert phase == "forward+loss" and mem["buffers"] == pytest.approx(root * 2, abs=8)
    assert _mem(1024, "full", "all") == _mem(1024, "full")
    with pytest.raises(ValueError, match="fsdp_reshard"):
        TrainingRecipe(seq_len=8, global_batch=1, fsdp_reshard="none")


def test_the_backward_holds_two_units_and_the_previous_reduce_scatter_input() -> None:
    mem, phase = _mem(1024, "full")  # small logits: the backward sets the peak
    layer, root = _sizes(1024)
    assert phase == "backward"
    two_units = 2 * layer * 2 + root * 2
    reduce_input = layer * 4  # the previous block's gradients, copied to fp32 for the reduce-scatter
    sharded_grads = layer * 4 / DP  # one block's share after it
    # Under full recompute a block saves only its input, less than its sharded gradients, so the
    # peak is the second block from the top: the input held, one block's gradients not yet there.
    assert two_units + reduce_input - sharded_grads <= mem["buffers"] <= two_units + reduce_input
