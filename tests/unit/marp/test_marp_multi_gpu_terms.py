"""The multi-GPU memory terms of issue 16: loss parallel under TP, FSDP under pipeline parallelism.

Loss parallel (torch's ``loss_parallel()`` on vocab-sharded logits, what torchtitan runs with TP)
keeps 16 B per local logit at the start of the loss backward, 4 more than the plain loss, and
e + 12 in its forward (measured on fake tensors, ``marp.sizes.loss_bytes_per_logit``). FSDP2 under
PP keeps the stage's parameters gathered from the first forward to the step's end and accumulates
its unsharded gradients over the micro-batches (torch.distributed.pipelining runs every backward
without resharding or gradient sync); the sharded gradients exist only in the optimizer step.
"""

from __future__ import annotations

import pytest

from marp import Layout, TrainingRecipe, get_model, predict_memory
from marp.sizes import loss_bytes_per_logit, stage_param_counts

LLAMA = get_model("llama-3-8b")


def test_loss_parallel_bytes_per_logit() -> None:
    assert loss_bytes_per_logit("loss-parallel", 2, 1) == 16.0
    assert loss_bytes_per_logit("torch", 2, 1) == 12.0


def _logits(tp: int, precision: str = "fsdp-bf16") -> tuple[int, str]:
    recipe = TrainingRecipe(seq_len=8192, global_batch=8 // tp * 2, micro_batch=2,
                            precision=precision)  # type: ignore[arg-type]
    zero = 3 if precision == "fsdp-bf16" else 1
    layout = Layout(tp=tp, pp=1, dp=8 // tp, zero_stage=zero, micro_batch=2, grad_accum=1,
                    recompute="full", sp=tp > 1)  # fmt: skip
    mem = predict_memory(LLAMA, recipe, layout, "H100-80GB")
    return mem.logits, mem.phase


def test_tp_charges_the_loss_parallel_logits() -> None:
    local_logits = 2 * 8192 * LLAMA.vocab // 2
    logits, phase = _logits(2)
    assert phase == "forward+loss"
    # At the loss backward's start (16 B) or in its forward with the bf16 logits (2 + 12 B).
    assert logits in (local_logits * 16, local_logits * 14)
    one, _ = _logits(1)
    assert one in (2 * 8192 * LLAMA.vocab * 12, 2 * 8192 * LLAMA.vocab * 10)  # the plain loss without TP


def test_megatron_tp_keeps_its_fused_vocab_parallel_loss() -> None:
    logits, _ = _logits(2, "master-bf16")
    assert logits <= 2 * 8192 * LLAMA.vocab // 2 * (4 + 2)


def _fsdp(pp: int, grad_accum: int = 8) -> tuple[Layout, TrainingRecipe]:
    recipe = TrainingRecipe(seq_len=4096, global_batch=8 * grad_accum, micro_batch=1, precision="fsdp-bf16")
    return Layout(tp=1, pp=pp, dp=8, zero_stage=3, micro_batch=1, grad_accum=grad_accum, recompute="full"), recipe


def test_fsdp_under_pp_keeps_the_stage_gathered_and_its_gradients_unsharded() -> None:
    layout, recipe = _fsdp(pp=4)
    first, _last, _layer, _vocab = stage_param_counts(LLAMA, 1, 4)
    mem = predict_memory(LLAMA, recipe, layout, "H100-80GB", stage="first")
    assert mem.phase in ("forward+loss", "backward")
    # The stage unsharded in bf16 (2 B/param) among the buffers; fp32 gradients (the reduce dtype)
    # of the whole stage, not 1 / dp of them.
    assert mem.buffers >= 2 * int(first)
    assert mem.gradients == pytest.approx(4 * int(first), rel=1e-6)
    # The sharded states stay sharded over dp.
    assert mem.parameters == pytest.approx(4 * int(first) / 8, rel=1e-6)


def test_fsdp_without_pp_is_unchanged_by_the_pp_rule() -> None:
    layout, recipe = _fsdp(pp=1)
    mem = predict_memory(LLAMA, recipe, layout, "H100-80GB")
    # Only two blocks and the root are gathered; gradients sharded.
    assert mem.buffers < 2 * LLAMA.param_count() / 4
    assert mem.gradients <= 4 * LLAMA.param_count() / 8 + 1


def test_fsdp_under_pp_costs_more_than_its_sharded_states_suggest() -> None:
    # The same stage with its parameters sharded over dp 8: the pipelined FSDP rank needs the
    # stage's 6 B/param unsharded (bf16 weights + fp32 gradients) on top.
    layout, recipe = _fsdp(pp=4)
    first, _last, _layer, _vocab = stage_param_counts(LLAMA, 1, 4)
    mem = predict_memory(LLAMA, recipe, layout, "H100-80GB", stage="first")
    sharded_states = 16 * int(first) / 8
    assert mem.peak_allocated > sharded_states + 6 * int(first)


def test_ring_attention_backward_buffers_grow_with_cp() -> None:
    # Ring attention's backward holds fp32 dq / dk / dv accumulators, the gathered K and V of all cp
    # ranks and the rotated K / V gradients: 40 + 4 cp B per token and channel (MHA) beyond the flash
    # backward, measured on fake tensors. Compare the per-layer attention transient of cp 2 and 4
    # through the memory terms on the same local tokens.
    from marp.memory_terms import _job, _ring_attention_backward
    from marp.recipe import LayoutGrid

    model = get_model("llama-2-7b")  # MHA: Q = K = V = hidden
    recipe = TrainingRecipe(seq_len=8192, global_batch=1, micro_batch=1, precision="pure-bf16")
    local = {}
    for cp in (1, 2, 4):
        layout = Layout(tp=1, pp=1, dp=1, cp=cp, zero_stage=0, micro_batch=1, grad_accum=1, recompute="full")
        job = _job(model, recipe, LayoutGrid.of(layout), None)
        local[cp] = float(_ring_attention_backward(job)[0]) / (8192 / cp * model.hidden)
    assert local[1] == 0.0
    assert local[2] == pytest.approx(48.0) and local[4] == pytest.approx(56.0)


def test_dtensor_sequence_parallel_keeps_the_gathered_norm_outputs_megatron_does_not() -> None:
    # torchtitan's TP plan all-gathers each norm output for the column-parallel linears, which save
    # the whole-sequence tensor; Megatron saves the shard (Korthikanti et al. 2022, eq. 4).
    from marp.memory_terms import _job
    from marp.recipe import LayoutGrid

    h, layers, tokens = LLAMA.hidden, LLAMA.n_layers, 4096

    def saving(precision: str) -> tuple[float, float]:
        recipe = TrainingRecipe(seq_len=tokens, global_batch=1, micro_batch=1, precision=precision)  # type: ignore[arg-type]
        out = []
        for sp in (False, True):
            layout = Layout(tp=4, pp=1, dp=1, zero_stage=0, micro_batch=1, grad_accum=1, recompute="none", sp=sp)
            out.append(predict_memory(LLAMA, recipe, layout, stage="last").activations)
        rep = _job(LLAMA, recipe, LayoutGrid.of(layout), None).coef.rep
        return out[0] - out[1], tokens * layers * rep * (1 - 1 / 4)

    torch_saving, torch_rep = saving("pure-bf16")
    megatron_saving, megatron_rep = saving("master-bf16")
    assert megatron_saving == pytest.approx(megatron_rep, rel=1e-6)
    gathered = (2 * layers + 1) * tokens * 2 * h * (1 - 1 / 4)
    assert torch_saving == pytest.approx(torch_rep - gathered, rel=1e-6)
