"""peft's fp32 adapters beside a bf16 base (issue 16; get_peft_model's autocast_adapter_dtype=True).

Under pure bf16 nothing casts the adapters to the compute dtype, so they keep fp32 parameters,
gradients and Adam states, and each adapted linear casts its bf16 input to fp32 before lora_A,
which keeps that copy (4 B per element per target) where the bf16 input, kept by nobody else, is
freed. Under fsdp-bf16 (FSDP's mixed precision) or with ``lora_adapter_dtype="compute"`` the
adapters run in bf16 and lora_A keeps the input itself. Either way a frozen linear keeps no input
and a frozen RMSNorm weight's product keeps no normalised copy (autograd saves a mul operand only
for the other operand's gradient). The multi-GPU oracle (fake tensors, peft) checks all of it:
docs/marp.md "Multi-GPU validation", rows OR-10..12 and OR-23 / OR-24.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import InvalidRecipeError, Layout, TrainingRecipe, get_model, predict_memory
from marp.sizes import lora_params

LLAMA = replace(get_model("llama-3-8b"), vocab=1024)
ALL = ("q", "k", "v", "o", "gate", "up", "down")
SEQ, MB = 2048, 2


def _recipe(dtype: str, precision: str = "pure-bf16", targets: tuple[str, ...] = ALL, dp: int = 1) -> TrainingRecipe:
    return TrainingRecipe(seq_len=SEQ, global_batch=MB * dp, micro_batch=MB, precision=precision,  # type: ignore[arg-type]
                          finetune="lora", lora_rank=8, lora_targets=targets, lora_adapter_dtype=dtype)  # fmt: skip


def _mem(recipe: TrainingRecipe, zero: int = 0, dp: int = 1):  # type: ignore[no-untyped-def]
    layout = Layout(tp=1, pp=1, dp=dp, zero_stage=zero, micro_batch=MB, grad_accum=1, recompute="none")
    return predict_memory(LLAMA, recipe, layout, "H100-80GB")


def test_fp32_adapters_keep_an_fp32_copy_of_each_input_and_fp32_states() -> None:
    h, ffn, tokens, e = LLAMA.hidden, LLAMA.ffn, SEQ * MB, 2
    fp32, bf16 = _mem(_recipe("fp32")), _mem(_recipe("compute"))
    # q, k, v: three fp32 copies, the norm output freed; o: one copy (the attention keeps its
    # output); gate, up: two, the second norm's output freed; down: one, the MLP hidden freed.
    per_layer = tokens * ((3 * 4 - e) * h + 4 * h + (2 * 4 - e) * h + (4 - e) * ffn)
    assert fp32.activations - bf16.activations == pytest.approx(LLAMA.n_layers * per_layer, abs=64)
    adapters = LLAMA.n_layers * lora_params(LLAMA, 8, ALL)
    # fp32 parameter and gradient (4 + 4 B) and Adam's two fp32 states (8 B), against 2 + 2 + 4.
    assert fp32.parameters - bf16.parameters == pytest.approx(2 * adapters, abs=64)
    assert fp32.optimizer_states - bf16.optimizer_states == pytest.approx(4 * adapters, abs=64)


def test_mixed_precision_policies_are_not_cast() -> None:
    # FSDP's mixed precision computes the adapters in bf16: the adapter dtype changes nothing.
    for precision, zero in (("fsdp-bf16", 3), ("master-bf16", 1)):
        a, b = (_mem(_recipe(d, precision, dp=8), zero, 8) for d in ("fp32", "compute"))
        assert a == b


def test_frozen_linears_and_norms_keep_no_inputs() -> None:
    h, ffn, tokens, e = LLAMA.hidden, LLAMA.ffn, SEQ * MB, 2
    full = TrainingRecipe(seq_len=SEQ, global_batch=MB, micro_batch=MB, precision="pure-bf16")
    lora_qv = _recipe("compute", targets=("q", "v"))
    # q, v adapted (lora_A keeps the norm output as is); gate, up, down frozen: the second norm's
    # output and the MLP hidden are kept by nobody; both norms' normalised copies are freed.
    freed = tokens * (h + ffn + 2 * h) * e
    assert _mem(full).activations - _mem(lora_qv).activations == pytest.approx(LLAMA.n_layers * freed, abs=64)


def test_bad_adapter_dtype_is_refused() -> None:
    with pytest.raises(InvalidRecipeError) as info:
        _recipe("fp16")
    assert info.value.field == "recipe.lora_adapter_dtype"
