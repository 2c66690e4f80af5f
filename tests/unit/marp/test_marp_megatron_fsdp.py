"""Megatron-FSDP: ZeRO-3 of a ``master-*`` job without DeepSpeed's reduce bucket (issue 36, item 1).

Megatron-Core's FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params``)
keeps bf16 parameters, fp32 main grads, fp32 master weights and Adam states sharded over the
data-parallel group; a unit is unsharded only in its forward and backward and its full gradients
are reduce-scattered into the sharded main grads at its post-backward (Megatron-LM
``megatron/core/distributed/fsdp/src/docs/mfsdp_design.md``, "Flow") -- FSDP2's flow. The previous
round charged every ``master-*`` ZeRO-3 job DeepSpeed's defaults, a 5e8-element contiguous reduce
bucket among them: the gradients counted a second time, +0.93 GiB per GPU, which put a Megatron-FSDP
run at TP 2 on 8 H100 about 70 % over its measurement. ``TrainingRecipe.zero3_backend`` tells
the two apart ("megatron-fsdp" by default; "deepspeed" keeps the DeepSpeed terms,
test_marp_deepspeed_zero3.py).

The project's data holds no published Megatron-FSDP measurement. MLM-13 (Megatron-LM's own test
model at TP 2 x DP 4 on 8 H100, distributed optimizer = ZeRO-1, measured) is the same job one
sharding strategy away, so the tests hold the Megatron-FSDP layout of that job to what ZeRO-3
changes: less model state, one gathered unit and the embedding / head more.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from marp import InvalidRecipeError, TrainingRecipe, predict_memory
from marp.gpus import MiB
from marp.sizes import DS_REDUCE_BUCKET_ELEMENTS, TE_STREAMS, stage_param_counts

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import marp_accuracy  # noqa: E402


def _mlm13():  # type: ignore[no-untyped-def]
    with open(marp_accuracy.CSV_PATH, newline="", encoding="utf-8") as fh:
        row = next(r for r in csv.DictReader(fh) if r["id"] == "MLM-13")
    model, recipe, layout, gpu, stage, quantity = marp_accuracy.row_inputs(row)
    assert (layout.tp, layout.dp, layout.zero_stage, recipe.policy, gpu) == (2, 4, 1, "master-bf16", "H100-80GB")
    # MLM-13 runs two distributed-optimizer instances: its states shard over groups of 2 of the 4.
    assert layout.shard == 2
    return model, recipe, layout, gpu, stage, int(row["measured_bytes"])


def test_megatron_fsdp_is_the_default_and_has_no_reduce_bucket() -> None:
    model, recipe, layout, gpu, stage, _ = _mlm13()
    assert recipe.zero3_backend == "megatron-fsdp"
    z3 = replace(layout, zero_stage=3)
    mfsdp = predict_memory(model, recipe, z3, gpu, stage=stage)
    ds = predict_memory(model, replace(recipe, zero3_backend="deepspeed"), z3, gpu, stage=stage)
    assert mfsdp.phase == "forward+loss"
    # At the loss: Transformer Engine's workspaces, the last unit still gathered (bf16) and the
    # embedding / head / final norm gathered (FSDP2's flow) -- nothing else.
    total, _last, layer, _vocab = (int(x) for x in stage_param_counts(model, 2, 1))
    root = total - model.n_layers * layer
    te = TE_STREAMS * 32 * MiB
    assert mfsdp.buffers == pytest.approx(te + 2 * layer + 2 * root, abs=16)
    # DeepSpeed's bucket is DeepSpeed's: 5e8 elements in bf16 more than Megatron-FSDP holds.
    assert ds.buffers - mfsdp.buffers > DS_REDUCE_BUCKET_ELEMENTS * 2 - 2 * root


def test_megatron_fsdp_shards_more_than_the_distributed_optimizer_and_adds_only_gathered_units() -> None:
    model, recipe, layout, gpu, stage, _ = _mlm13()
    layout = replace(layout, shard_degree=None)  # both over all of DP 4
    z1 = predict_memory(model, recipe, layout, gpu, stage=stage)
    z3 = predict_memory(model, recipe, replace(layout, zero_stage=3), gpu, stage=stage)
    n = int(stage_param_counts(model, 2, 1)[0])  # parameters on one TP rank
    # bf16 parameters and fp32 main grads now sharded over dp 4 as well; optimizer states as before
    assert z1.parameters - z3.parameters == pytest.approx(2 * n * (1 - 1 / 4), rel=1e-3)
    assert z1.gradients - z3.gradients == pytest.approx(4 * n * (1 - 1 / 4), rel=1e-3)
    assert z3.optimizer_states == z1.optimizer_states
    # what it adds is one gathered unit and the root, far less than what it saves here
    assert z3.activations == z1.activations and z3.logits == z1.logits
    assert z3.buffers - z1.buffers < 0.05 * z1.peak_allocated
    assert z3.peak_allocated < z1.peak_allocated


def test_the_megatron_fsdp_layout_of_a_measured_megatron_job_stays_near_its_measurement() -> None:
    """MLM-13's job with ZeRO-3 over the same shard group, against MLM-13's measurement (ZeRO-1).
    Not a measurement of a Megatron-FSDP run: ZeRO-3 holds less model state (bf16 parameters and
    fp32 main grads halved, -93 MiB here) and adds a gathered unit and the root (+29 MiB), so a
    prediction above the ZeRO-1 peak, or far below it, is a term gone wrong. Before issue 36's fix:
    +56.8 % (DeepSpeed's bucket); after: -2.6 %."""
    model, recipe, layout, gpu, stage, measured = _mlm13()
    z3 = predict_memory(model, recipe, replace(layout, zero_stage=3), gpu, stage=stage)
    error = 100.0 * (z3.peak_allocated - measured) / measured
    assert -8.0 < error < 2.0, f"Megatron-FSDP of MLM-13's job: {error:+.1f} % against the ZeRO-1 measurement"


def test_zero3_backend_is_checked() -> None:
    with pytest.raises(InvalidRecipeError, match="zero3_backend"):
        TrainingRecipe(seq_len=8, global_batch=1, zero3_backend="colossal")
    assert TrainingRecipe(seq_len=8, global_batch=1).to_dict()["zero3_backend"] == "megatron-fsdp"
