"""peft's lora_dropout (issue 16, the PEFT rows of the public multi-GPU set).

With ``lora_dropout`` > 0 every adapted linear runs ``lora_B(lora_A(dropout(x)))`` with its own
dropout: per target, a 1 B mask and the dropped-out input (which lora_A saves for its weight
gradient) per element of the target's input; q, k and v each keep their own copy of the norm
output, which is then kept by nobody (frozen linears save no input), nor is the MLP hidden once
down is adapted. With dropout 0 peft uses nn.Identity and lora_A saves x itself: nothing more.
The adapters here are in the compute dtype (no fp32 cast before the dropout; see
test_marp_lora_adapter_dtype.py for peft's fp32 default).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import InvalidRecipeError, Layout, TrainingRecipe, get_model, predict_memory

# A small vocabulary keeps the logits from setting the peak, so full recompute peaks in the backward.
LLAMA = replace(get_model("llama-3-8b"), vocab=1024)
ALL = ("q", "k", "v", "o", "gate", "up", "down")
SEQ, MB = 2048, 2


def _mem(lora_dropout: float, recompute: str, targets: tuple[str, ...] = ALL, tp: int = 1):  # type: ignore[no-untyped-def]
    recipe = TrainingRecipe(seq_len=SEQ, global_batch=MB, micro_batch=MB, precision="pure-bf16", finetune="lora",
                            lora_rank=8, lora_targets=targets, lora_dropout=lora_dropout,
                            lora_adapter_dtype="compute")  # fmt: skip
    layout = Layout(tp=tp, pp=1, dp=1, zero_stage=0, micro_batch=MB, grad_accum=1, recompute=recompute)  # type: ignore[arg-type]
    return predict_memory(LLAMA, recipe, layout, "H100-80GB")


def test_every_target_keeps_a_dropped_out_copy_and_mask_of_its_input() -> None:
    h, ffn, tokens = LLAMA.hidden, LLAMA.ffn, SEQ * MB
    # q, k, v: three copies + masks, the norm output freed; o: one; gate, up: two, the second
    # norm's output freed; down: one, its input (the MLP hidden) freed -- only the mask is new.
    per_layer = tokens * ((3 * 3 - 2) * h + 3 * h + (2 * 3 - 2) * h + 1 * ffn)
    plain, drop = _mem(0.0, "none"), _mem(0.1, "none")
    # No recompute: every layer saves its copies until its backward (the peak is in the last
    # layer's backward, with every layer's saved activations).
    assert drop.activations - plain.activations == pytest.approx(LLAMA.n_layers * per_layer, abs=64)
    # Full recompute: only the layer being rebuilt holds them.
    plain_ckpt, drop_ckpt = _mem(0.0, "full"), _mem(0.1, "full")
    assert plain_ckpt.phase == drop_ckpt.phase == "backward"
    assert drop_ckpt.peak_allocated - plain_ckpt.peak_allocated == pytest.approx(per_layer, rel=1e-6)


def test_copies_follow_the_targets_and_tensor_parallelism() -> None:
    h, tokens = LLAMA.hidden, SEQ * MB
    qv = _mem(0.1, "none", ("q", "v")).activations - _mem(0.0, "none", ("q", "v")).activations
    assert qv == pytest.approx(LLAMA.n_layers * tokens * (2 * 3 - 2) * h, abs=64)
    # o's input (the attention output) is split over tp; q's (the norm output) is not without SP.
    o_tp = _mem(0.1, "none", ("o",), tp=2).activations - _mem(0.0, "none", ("o",), tp=2).activations
    assert o_tp == pytest.approx(LLAMA.n_layers * tokens * 3 * h / 2, abs=64)


def test_full_finetune_ignores_lora_dropout_and_bad_values_are_refused() -> None:
    recipe = TrainingRecipe(seq_len=SEQ, global_batch=MB, micro_batch=MB, precision="pure-bf16")
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=MB, grad_accum=1)
    assert predict_memory(LLAMA, replace(recipe, lora_dropout=0.1), layout) == predict_memory(LLAMA, recipe, layout)
    with pytest.raises(InvalidRecipeError):
        replace(recipe, lora_dropout=1.5)
