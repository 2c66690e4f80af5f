"""The caching allocator's fragmentation under sharded states + LoRA + full recompute (issue 16).

GMLake (Guo et al., ASPLOS 2024) measures PyTorch's fragmentation -- (reserved - allocated) /
reserved -- under ZeRO-3-style sharding, LoRA and recomputation, and removes 15 % of it on average:
MARP charges that lower bound (``sizes.SHARDED_LORA_RECOMPUTE_FRAGMENTATION``) for jobs that use
all three, where it exceeds the default share of the dynamic bytes, and nothing changes for a job
missing any one of them. Allocated bytes never move: only reserved and device memory.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from marp import Layout, TrainingRecipe, get_model, predict_memory
from marp.sizes import FRAGMENTATION, SHARDED_LORA_RECOMPUTE_FRAGMENTATION

LLAMA = replace(get_model("llama-3-70b"), vocab=1024)
DP = 8


def _mem(finetune: str = "lora", zero_stage: int = 3, dp: int = DP, recompute: str = "full"):  # type: ignore[no-untyped-def]
    recipe = TrainingRecipe(seq_len=2048, global_batch=2 * dp, micro_batch=2, precision="pure-bf16",
                            finetune=finetune, lora_rank=8, loss="chunked")  # type: ignore[arg-type]  # fmt: skip
    layout = Layout(tp=1, pp=1, dp=dp, zero_stage=zero_stage, micro_batch=2, grad_accum=1,
                    recompute=recompute)  # type: ignore[arg-type]  # fmt: skip
    return predict_memory(LLAMA, recipe, layout, "A100-80GB")


def test_sharded_lora_recompute_reserves_gmlakes_share() -> None:
    mem = _mem()
    f = SHARDED_LORA_RECOMPUTE_FRAGMENTATION
    assert (mem.reserved - mem.peak_allocated) / mem.reserved == pytest.approx(f, abs=1e-6)
    assert mem.device == mem.reserved + mem.runtime_reserve


@pytest.mark.parametrize("change", [
    {"finetune": "full"},  # no adapters
    {"recompute": "none"},  # nothing recomputed
    {"zero_stage": 1},  # states not sharded
    {"dp": 1, "zero_stage": 3},  # one GPU: nothing to shard
])  # fmt: skip
def test_without_any_of_the_three_the_default_share_stands(change: dict[str, object]) -> None:
    # (FSDP2's copy-in stream pool, test_marp_fsdp2_stream_pool.py, may add to the default share.)
    mem = _mem(**change)  # type: ignore[arg-type]
    assert mem.fragmentation >= FRAGMENTATION * (mem.peak_allocated - mem.parameters - mem.optimizer_states) - 2
    assert (mem.reserved - mem.peak_allocated) / mem.reserved < SHARDED_LORA_RECOMPUTE_FRAGMENTATION


def test_allocated_bytes_do_not_move(monkeypatch: pytest.MonkeyPatch) -> None:
    # The term is the allocator's, beside the live tensors: the peak MARP compares with
    # max_memory_allocated (and the oracle) is the same with the term switched off.
    with_term = _mem()
    monkeypatch.setattr("marp.memory_terms.SHARDED_LORA_RECOMPUTE_FRAGMENTATION", 0.0)
    without = _mem()
    assert with_term.peak_allocated == without.peak_allocated
    assert with_term.phase == without.phase
    assert with_term.fragmentation > 2 * without.fragmentation
