"""DeepSpeed ZeRO-3's defaults and bitsandbytes' NF4 constants (issue 16, the PEFT rows).

Under ``master-*`` with ``zero3_backend="deepspeed"`` ZeRO-3 is DeepSpeed's (the default,
"megatron-fsdp", is Megatron-Core's FSDP: test_marp_megatron_fsdp.py). A config that leaves its knobs out gets DeepSpeed's
defaults (deepspeed/runtime/zero/config.py), as accelerate's DeepSpeedPlugin does for the PEFT
scripts' YAML configs: a reduce bucket of 5e8 elements in the model's dtype, always allocated with
contiguous_gradients (stage3.py, _setup_for_real_optimizer); parameters fetched per submodule and
released unless reused within 1e9 elements (a checkpointed layer's, from its recomputation to its
backward), with 5e7 elements prefetched; no root kept gathered. bitsandbytes' Params4bit keeps its
block constants in a quant_state that FSDP and DeepSpeed neither shard nor sync (only parameters
and buffers), so they stay whole on every rank; torchao's NF4Tensor shards them with the data.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import InvalidRecipeError, Layout, TrainingRecipe, get_model, predict_memory
from marp.gpus import MiB
from marp.sizes import (
    DS_PREFETCH_ELEMENTS,
    DS_REDUCE_BUCKET_ELEMENTS,
    NF4_CONST_BYTES,
    TE_STREAMS,
    stage_param_counts,
)

LLAMA = replace(get_model("llama-3-70b"), vocab=1024)  # small logits: the backward sets the peak
ALL = ("q", "k", "v", "o", "gate", "up", "down")
DP = 8


def _mem(precision: str, finetune: str = "lora", backend: str = "bitsandbytes"):  # type: ignore[no-untyped-def]
    recipe = TrainingRecipe(seq_len=2048, global_batch=2 * DP, micro_batch=2, precision=precision,  # type: ignore[arg-type]
                            finetune=finetune, lora_rank=8, lora_targets=ALL, loss="chunked",  # type: ignore[arg-type]
                            lora_adapter_dtype="compute", qlora_backend=backend,
                            zero3_backend="deepspeed")  # fmt: skip
    layout = Layout(tp=1, pp=1, dp=DP, zero_stage=3, micro_batch=2, grad_accum=1, recompute="full")
    return predict_memory(LLAMA, recipe, layout, "A100-80GB")


def test_deepspeed_holds_one_layer_the_prefetch_and_its_reduce_bucket() -> None:
    _total, _last, layer, _v = (int(x) for x in stage_param_counts(LLAMA, 1, 1))
    ds = _mem("master-bf16")
    assert ds.phase == "backward"
    te_workspaces = TE_STREAMS * 4 * MiB  # master-* runs Transformer Engine (A100: 4 MiB each)
    expected = (layer + DS_PREFETCH_ELEMENTS) * 2 + DS_REDUCE_BUCKET_ELEMENTS * 2 + te_workspaces
    assert ds.buffers == pytest.approx(expected, rel=1e-6)
    # FSDP2 (here pure bf16) holds two units and the root instead, and no bucket.
    fsdp = _mem("pure-bf16")
    root = _total - LLAMA.n_layers * layer
    assert fsdp.buffers == pytest.approx((2 * layer + root) * 2, rel=1e-6)


def test_bitsandbytes_nf4_constants_are_not_sharded() -> None:
    _total, _last, layer, _v = (int(x) for x in stage_param_counts(LLAMA, 1, 1))
    bnb, tao = _mem("pure-bf16", "qlora"), _mem("pure-bf16", "qlora", "torchao")
    constants = LLAMA.n_layers * layer * NF4_CONST_BYTES
    assert bnb.parameters - tao.parameters == pytest.approx(constants * (1 - 1 / DP), rel=1e-4)
    with pytest.raises(InvalidRecipeError):
        TrainingRecipe(seq_len=8, global_batch=1, qlora_backend="gptq")
