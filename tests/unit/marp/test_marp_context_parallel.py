"""Context parallelism shards model states too: ZeRO / FSDP over dp x cp, not dp alone.

cp ranks split the sequence and hold the same parameters, so FSDP2 shards them over the
dp_shard x cp mesh (torchtitan) and Megatron's distributed optimizer over the data-parallel group
with context parallel. MARP sharded over dp only, +30 % at cp 4 on an 8B FSDP2 run (issue 16).
"""

from __future__ import annotations

import pytest

from marp import Layout, TrainingRecipe, get_model, predict_memory

LLAMA8 = get_model("llama-3-8b")
N = LLAMA8.param_count()


def _fsdp(dp: int, cp: int, zero: int = 3, precision: str = "fsdp-bf16") -> dict[str, int]:
    recipe = TrainingRecipe(seq_len=131072, global_batch=dp, micro_batch=1, precision=precision)  # type: ignore[arg-type]
    layout = Layout(tp=1, pp=1, dp=dp, cp=cp, zero_stage=zero, micro_batch=1, grad_accum=1, recompute="full")
    return predict_memory(LLAMA8, recipe, layout, "H100-80GB").to_dict()


@pytest.mark.parametrize(("dp", "cp"), [(2, 4), (1, 8), (4, 2)])
def test_fsdp_model_states_divide_by_dp_times_cp(dp: int, cp: int) -> None:
    m = _fsdp(dp, cp)
    shards = dp * cp
    # fsdp-bf16: fp32 sharded parameters and gradients, AdamW's two fp32 states (4 + 4 + 8 B).
    assert m["parameters"] == pytest.approx(4 * N / shards, rel=1e-6)
    assert m["optimizer_states"] == pytest.approx(8 * N / shards, rel=1e-6)
    # The same states as an FSDP run over dp x cp data-parallel ranks without context parallelism.
    same_gpus = _fsdp(shards, 1)
    assert (m["parameters"], m["optimizer_states"]) == (same_gpus["parameters"], same_gpus["optimizer_states"])


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_shards_over_the_dp_group_with_context_parallel(zero: int) -> None:
    m, flat = _fsdp(2, 4, zero, "master-bf16"), _fsdp(2, 1, zero, "master-bf16")
    # Megatron's distributed optimizer: fp32 master + m + v (12 B) over dp x cp, bf16 params whole.
    assert m["optimizer_states"] == pytest.approx(12 * N / 8, rel=1e-6)
    assert m["optimizer_states"] * 4 == pytest.approx(flat["optimizer_states"], rel=1e-6)
    assert m["parameters"] == flat["parameters"] == 2 * N


def test_cp_alone_shards_with_fsdp() -> None:
    # dp 1, cp 8: FSDP still shards over the 8 cp ranks (and gathers, so FSDP buffers appear).
    m, one = _fsdp(1, 8), _fsdp(1, 1)
    assert m["parameters"] * 8 == pytest.approx(one["parameters"], rel=1e-6)
    assert m["buffers"] > 0 == one["buffers"]
