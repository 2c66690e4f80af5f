"""FSDP2's all-gather copy-in stream pool (issue 16): reserved, not allocated, bytes.

FSDP2 allocates each all-gather's flat output on its copy-in stream in the forward and the
pre-backward (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_all_gather), and
the caching allocator keeps freed blocks per stream, so that stream's pool keeps the root's flat
output (embeddings, final norm, head) and the first block's, which are alive together at the first
block's all-gather. At a peak at the forward's end at least the root's share of that pool is cached
and unused; in a unit's backward at least root - unit. DeepSpeed's ZeRO-3 (master-*), one GPU and
FSDP under pipeline parallelism do not get it; allocated bytes never move.
"""

from __future__ import annotations

import pytest

from marp import Layout, TrainingRecipe, get_model, predict_memory
from marp.sizes import FRAGMENTATION, stage_param_counts

LLAMA = get_model("llama-3-8b")  # vocab 128256: a 1 GiB bf16 root per rank, larger than a block


def _mem(precision: str = "fsdp-bf16", dp: int = 8, zero_stage: int = 3, pp: int = 1):  # type: ignore[no-untyped-def]
    recipe = TrainingRecipe(seq_len=8192, global_batch=dp, micro_batch=1, precision=precision)  # type: ignore[arg-type]
    layout = Layout(tp=1, pp=pp, dp=dp, zero_stage=zero_stage, micro_batch=1, grad_accum=1, recompute="op-sac")
    return predict_memory(LLAMA, recipe, layout, "H100-80GB")


def _root_bytes() -> float:
    total, _last, layer, _v = (int(x) for x in stage_param_counts(LLAMA, 1, 1))
    return (total - LLAMA.n_layers * layer) * 2.0  # gathered in bf16


def test_forward_end_peak_reserves_the_roots_flat_output(monkeypatch: pytest.MonkeyPatch) -> None:
    mem = _mem()
    assert mem.phase == "forward+loss"
    dynamic = mem.peak_allocated - mem.parameters - mem.optimizer_states
    assert mem.fragmentation == pytest.approx(FRAGMENTATION * dynamic + _root_bytes(), abs=64)
    assert mem.reserved - mem.peak_allocated == mem.fragmentation


def test_allocated_bytes_do_not_move_and_deepspeed_one_gpu_get_none() -> None:
    fsdp2 = _mem()
    ds = _mem("master-bf16")
    one = _mem("pure-bf16", dp=1, zero_stage=0)
    for mem in (ds, one):
        dynamic = mem.peak_allocated - mem.parameters - mem.optimizer_states
        assert mem.fragmentation <= FRAGMENTATION * dynamic + 64  # the default share only
    # The pool is the allocator's: the live peak is what it was without it (the oracle's terms).
    assert fsdp2.peak_allocated == fsdp2.total - fsdp2.runtime_reserve - fsdp2.fragmentation
    assert fsdp2.fragmentation - FRAGMENTATION * (fsdp2.peak_allocated - fsdp2.parameters
                                                  - fsdp2.optimizer_states) > 0.9 * _root_bytes()  # fmt: skip
