"""LoRA and QLoRA under FSDP / ZeRO-3 (issue 16, found on the public multi-GPU set).

FSDP gathers what it shards: a QLoRA layer's NF4 storage (bitsandbytes' Params4bit in its quant
storage dtype, torchao's NF4Tensor through fsdp_pre_all_gather), not a bf16 copy; the linears
dequantise one weight at a time. And only trainable parameters get gradients, so a LoRA unit's
unsharded gradients in the backward are its adapters', not the whole layer's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import Layout, TrainingRecipe, get_model, predict_memory
from marp.sizes import NF4_BYTES, NF4_CONST_BYTES, lora_params, stage_param_counts

# A 70B Llama with a small vocabulary: the logits stay small, so the backward sets the peak.
LLAMA = replace(get_model("llama-3-70b"), vocab=1024)
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _buffers(finetune: str, backend: str = "bitsandbytes") -> tuple[int, str]:
    recipe = TrainingRecipe(seq_len=2048, global_batch=16, micro_batch=2, precision="pure-bf16",
                            finetune=finetune, lora_rank=16, lora_targets=TARGETS, loss="chunked",  # type: ignore[arg-type]
                            qlora_backend=backend)  # fmt: skip
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch=2, grad_accum=1, recompute="full")
    mem = predict_memory(LLAMA, recipe, layout, "A100-80GB")
    return mem.buffers, mem.phase


def test_fsdp_gathers_nf4_layers_and_only_the_adapters_gradients() -> None:
    total, _last, layer, _vocab = (int(x) for x in stage_param_counts(LLAMA, 1, 1))
    root = total - LLAMA.n_layers * layer  # embeddings, final norm, head (bf16)
    adapters = lora_params(LLAMA, 16, TARGETS)
    lora, phase_lora = _buffers("lora")
    qlora, phase_qlora = _buffers("qlora")
    assert phase_lora == phase_qlora == "backward"
    # the unit being computed and the prefetched one and the root (the layer's unsharded adapter
    # gradients are its own gradients, in its backward's transient; only at a post-backward,
    # with its reduce-scatter buffers, are they a buffer)
    assert lora == pytest.approx((2 * layer + root) * 2, abs=8)
    # bitsandbytes gathers the packed storage only (its block constants are no parameter, kept
    # whole on every rank); torchao's NF4Tensor gathers its constants with the data.
    assert qlora == pytest.approx(2 * layer * (NF4_BYTES - NF4_CONST_BYTES) + root * 2, abs=8)
    torchao, _ = _buffers("qlora", "torchao")
    assert torchao == pytest.approx(2 * layer * NF4_BYTES + root * 2, abs=8)
    assert adapters * 2 < 0.01 * layer * 2  # either way: 0.2 % of a layer
