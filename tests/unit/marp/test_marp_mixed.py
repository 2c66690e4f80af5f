"""Mixed plans (issue 33): one job over several GPU types, uneven data parallelism and pipeline
stages per type (marp.mixed), ranked beside single-type plans (enumerate_plans(mixed=True))."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marp import (
    GpuPool,
    InvalidLayoutError,
    Layout,
    TrainingRecipe,
    enumerate_plans,
    estimate_step_time,
    get_gpu,
    get_model,
    predict_memory,
)
from marp.memory import memory_grid
from marp.memory_stages import memory_for_stages
from marp.mixed import PoolLinks, StageRequest, evaluate_stages
from marp.mixed_search import mixed_plans
from marp.perf import StepShape
from marp.recipe import LayoutGrid

LLAMA13 = get_model("llama-2-13b")
LLAMA7 = get_model("llama-2-7b")
GPT2 = get_model("gpt2-medium")  # 24 layers
RECIPE = TrainingRecipe(seq_len=4096, global_batch=64, train_steps=1000)
# A fragmented cluster: 4 A100-80GB on one node, 16 L4 on 4 nodes of 4 (each pool too small alone).
FRAGMENTED = [GpuPool("A100-80GB", 4, 4, 25.0), GpuPool("L4", 16, 4, 1.5625, "pcie")]


def test_memory_for_stages_matches_the_first_and_last_stage_of_an_even_split() -> None:
    """A stage given explicitly (rank, layers, first / last) is the planner's first or last stage."""
    tp, pp, dp, m = np.array([1, 2, 1]), np.array([4, 4, 2]), np.array([2, 1, 4]), np.array([8, 16, 4])
    zero, mb, rc = np.array([1, 0, 1]), np.array([1, 2, 1]), np.array([0, 2, 0])
    layers = -(-LLAMA7.n_layers // pp)
    whole = {s: memory_grid(LLAMA7, RECIPE, tp, pp, dp, zero, mb, m, False, get_gpu("A100-80GB"), recompute=rc,
                            stage=s) for s in ("first", "last")}  # fmt: skip
    grid = LayoutGrid.broadcast(tp, pp, dp, zero, mb, m, rc, stage_layers=layers)
    first = memory_for_stages(LLAMA7, RECIPE, grid, get_gpu("A100-80GB"), np.zeros(3, np.int64), np.ones(3, bool),
                              np.zeros(3, bool))  # fmt: skip
    last = memory_for_stages(LLAMA7, RECIPE, grid, get_gpu("A100-80GB"), pp - 1, np.zeros(3, bool), np.ones(3, bool))
    assert (first["total"] == whole["first"]["total"]).all()
    assert (last["total"] == whole["last"]["total"]).all()
    # A middle stage holds neither embeddings nor head, and fewer micro-batches than rank 0.
    middle = memory_for_stages(LLAMA7, RECIPE, grid, get_gpu("A100-80GB"), np.ones(3, np.int64), np.zeros(3, bool),
                               np.zeros(3, bool))  # fmt: skip
    assert (middle["total"] < first["total"]).all() and (middle["parameters"] < last["parameters"]).all()


def test_step_shape_of_a_given_stage_defaults_to_the_old_shape() -> None:
    """StepShape.of without a stage is unchanged; a whole-model stage (pp 1) prices the same."""
    args = (LLAMA7, RECIPE, [1, 2], [1, 1], [8, 4], [1, 1], [1, 1], [8, 16], False)
    old = StepShape.of(*args).seconds_on(get_gpu("H100-80GB"), RECIPE.precision)
    new = StepShape.of(*args, layers=[32, 32], first=[True, True], last=[True, True]).seconds_on(
        get_gpu("H100-80GB"), RECIPE.precision)
    assert np.allclose(old, new, rtol=1e-12)


def test_one_type_one_stage_is_the_single_type_prediction() -> None:
    """A 'mixed' layout of one stage on one type is exactly the single-layout prediction."""
    recipe = TrainingRecipe(seq_len=4096, global_batch=32, micro_batch=1, train_steps=10)
    lay = evaluate_stages(LLAMA7, recipe, [StageRequest(32, (("A100-80GB", 8),))], zero_stage=1)
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch=1, grad_accum=4)
    assert lay.stages[0].peak_bytes == predict_memory(LLAMA7, recipe, layout, "A100-80GB").total
    assert lay.step_time_s == pytest.approx(estimate_step_time(LLAMA7, recipe, layout, get_gpu("A100-80GB")), rel=1e-12)
    assert lay.gpus_by_type == {"A100-80GB": 8} and lay.kind == "data"


def test_an_even_pipeline_on_one_type_is_close_to_the_single_type_model() -> None:
    """Four even stages on one type: the mixed model (sum of stages + (m-1) x slowest + links)
    stays within a few percent of the single-type pipeline estimate ((m + p - 1) x last stage)."""
    recipe = TrainingRecipe(seq_len=4096, global_batch=64, micro_batch=1, train_steps=10)
    stages = [StageRequest(8, (("A100-80GB", 4),)) for _ in range(4)]
    lay = evaluate_stages(LLAMA7, recipe, stages, zero_stage=1)
    layout = Layout(tp=1, pp=4, dp=4, zero_stage=1, micro_batch=1, grad_accum=16)
    single = estimate_step_time(LLAMA7, recipe, layout, get_gpu("A100-80GB"))
    assert lay.step_time_s == pytest.approx(single, rel=0.05)
    assert lay.micro_batches == 16 and lay.link_kind == ("intra", "inter", "intra")  # 8 GPUs a node, 4 a stage
    assert [st.peak_bytes for st in lay.stages][0] == predict_memory(LLAMA7, recipe, layout, "A100-80GB",
                                                                      stage="first").total


def test_explicit_stages_over_two_types_report_every_stage() -> None:
    """The issue's example: 3 V100 stages and a T4 stage, 24 layers split 7 / 7 / 6 / 4."""
    recipe = TrainingRecipe(seq_len=1024, global_batch=32, micro_batch=1, precision="fp16", train_steps=10)
    stages = [StageRequest(7, (("V100-16GB", 4),)), StageRequest(7, (("V100-16GB", 4),)),
              StageRequest(6, (("V100-16GB", 4),)), StageRequest(4, (("T4", 4),))]  # fmt: skip
    lay = evaluate_stages(GPT2, recipe, stages, zero_stage=0)
    assert [st.layers for st in lay.stages] == [7, 7, 6, 4]
    assert lay.stages[0].embeddings and lay.stages[-1].head and not lay.stages[1].head
    assert lay.gpus_by_type == {"V100-16GB": 12, "T4": 4} and lay.label == "12x V100-16GB + 4x T4"
    assert lay.micro_batches == 8  # 4 ranks x micro batch 1 per micro-batch, 32 samples
    slow = max([st.micro_batch_s for st in lay.stages] + list(lay.link_s))
    tail = lay.step_time_s - (sum(st.micro_batch_s for st in lay.stages) + sum(lay.link_s) + 7 * slow)
    assert 0 < tail < 0.5 * lay.step_time_s  # the reduce and optimizer step of the slowest stage
    assert lay.stages[0].fqns()[:2] == ["tok_embeddings", "layers.0"] and lay.stages[-1].fqns()[-1] == "output"


def test_one_stage_over_two_types_balances_the_accumulation() -> None:
    """12 V100 + 4 T4 in one data-parallel group (tp 2): the faster type runs more micro-steps, the
    global batch is exact, the ranks end close together."""
    recipe = TrainingRecipe(seq_len=1024, global_batch=64, micro_batch=1, precision="fp16", train_steps=10)
    lay = evaluate_stages(GPT2, recipe, [StageRequest(24, (("V100-16GB", 12), ("T4", 4)), tp=2)], zero_stage=1)
    shares = {s.gpu_type: s for s in lay.stages[0].shares}
    v, t = shares["V100-16GB"], shares["T4"]
    assert 6 * v.micro_batch * v.grad_accum + 2 * t.micro_batch * t.grad_accum == 64
    assert v.grad_accum > t.grad_accum
    assert lay.step_time_s == max(v.busy_s, t.busy_s)


def test_malformed_explicit_layouts_name_the_field() -> None:
    recipe = TrainingRecipe(seq_len=1024, global_batch=32, micro_batch=1, precision="fp16", train_steps=10)
    cases = [
        ([StageRequest(20, (("V100-16GB", 4),))], "layers"),  # 20 of 24
        ([StageRequest(12, (("V100-16GB", 4),)), StageRequest(12, (("T4", 2),))], "samples per micro-batch"),
        ([StageRequest(24, (("V100-16GB", 3),), tp=2)], "multiple of tp"),
    ]
    for stages, words in cases:
        with pytest.raises(InvalidLayoutError, match=words) as exc:
            evaluate_stages(GPT2, recipe, stages)
        assert exc.value.field.startswith("layout.")
    with pytest.raises(InvalidLayoutError, match="runs no stage"):
        evaluate_stages(GPT2, recipe, [StageRequest(24, (("V100-16GB", 4),))], local_micro_batch={"T4": 2})


def test_a_mixed_plan_pays_for_its_gpus_against_the_types_it_mixes() -> None:
    """13B full fine-tune on 4 A100-80GB + 16 L4: the 20-GPU mixed pipeline is faster than the 4 A100
    alone but takes ~3x their GPU-hours, so it ranks after them (scaling efficiency against the
    cheapest plan of the types it mixes, not only against other mixed plans); every rank fits and
    the split puts more layers on the faster type."""
    ps = enumerate_plans(LLAMA13, RECIPE, FRAGMENTED, mixed=True)
    assert ps.plans[0].mixed is None and ps.plans[0].gpu_type == "A100-80GB", [p.label for p in ps.plans]
    best = next(p for p in ps.plans if p.mixed is not None)
    assert sorted(best.gpus_by_type) == ["A100-80GB", "L4"] and best.num_gpus == 20
    assert best.completion_s < ps.plans[0].completion_s  # faster, but not worth its GPUs
    assert "scaling efficiency" in best.explanation and f"{ps.plans[0].num_gpus} A100-80GB" in best.explanation
    assert enumerate_plans(LLAMA13, RECIPE, FRAGMENTED, mixed=True, min_scaling_eff=0.0).plans[0].mixed is not None
    lay = best.mixed
    for st in lay.stages:
        for s in st.shares:
            assert s.peak_bytes <= get_gpu(s.gpu_type).memory_bytes * 0.95
    if lay.kind == "pipeline":
        assert sum(st.layers for st in lay.stages) == LLAMA13.n_layers
        per_gpu = {st.shares[0].gpu_type: st.layers for st in lay.stages}
        assert per_gpu["A100-80GB"] > per_gpu["L4"]
    d = best.to_dict()
    assert d["gpus_by_type"] == best.gpus_by_type and d["mixed"]["stages"]
    # Off by default: the predictor service's plans stay single-type.
    assert all(p.mixed is None for p in enumerate_plans(LLAMA13, RECIPE, FRAGMENTED).plans)
    assert all(p.gpus_by_type == {p.gpu_type: p.num_gpus}
               for p in enumerate_plans(LLAMA7, RECIPE, FRAGMENTED).plans)  # fmt: skip


def test_uneven_data_parallelism_is_balanced_and_exact() -> None:
    """Every data-shape candidate the search returns makes the global batch exactly and ends its
    types' steps within a few percent of each other (or is bound by the batch's granularity)."""
    recipe = TrainingRecipe(seq_len=2048, global_batch=96, train_steps=10)
    pools = [("A100-80GB", 8, PoolLinks(8)), ("L40S", 8, PoolLinks(8, 12.5))]
    layouts, search = mixed_plans(LLAMA7, recipe, pools, None, None)
    data = [lay for lay in layouts if lay.kind == "data"]
    assert data and search.pairs == 1
    for lay in data:
        shares = lay.stages[0].shares
        tp = lay.stages[0].tp
        assert sum(s.gpus // tp * s.micro_batch * s.grad_accum for s in shares) == 96
        busy = [s.busy_s for s in shares]
        assert min(busy) > 0.7 * max(busy)
        if lay.zero_stage == 3:
            assert len({s.grad_accum for s in shares}) == 1  # FSDP: the same number of gathers everywhere


def test_pairs_that_cannot_win_are_not_searched() -> None:
    """A pair whose whole compute, at the best efficiency seen, is slower than the best single plan
    is skipped: the search is bounded."""
    pools = [("H100-80GB", 64, PoolLinks()), ("T4", 2, PoolLinks()), ("L4", 2, PoolLinks())]
    recipe = TrainingRecipe(seq_len=2048, global_batch=64, train_steps=10)
    _, search = mixed_plans(LLAMA7, recipe, pools, 1e-3, 0.5)
    assert search.pairs == 0
    _, search = mixed_plans(LLAMA7, recipe, pools, None, None)
    assert 1 <= search.pairs <= 3


def test_the_mixed_search_runs_on_the_bench_grid() -> None:
    """bench/marp_speed.py's grid (70B, 12 types x 1,024 GPUs) with mixed plans: every plan sane."""
    names = ("V100-16GB", "V100-32GB", "T4", "A10", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB",
             "H200", "RTX-4090")  # fmt: skip
    model = get_model("llama-3-70b")
    recipe = TrainingRecipe(seq_len=4096, global_batch=1024, train_steps=10_000)
    pools = [GpuPool(n, 1024, 8) for n in names]
    # (min_scaling_eff 0: every mixed plan kept in the ranking, whatever its GPU-hours, so the
    # search's output is all there to check)
    ps = enumerate_plans(model, recipe, pools, mixed=True, min_scaling_eff=0.0)
    # (its speed is bench/marp_speed.py --mixed's to measure, not a timed test's: 18-20 ms there)
    assert any(p.mixed is not None for p in ps.plans)
    assert all(math.isfinite(p.step_time_s) and p.step_time_s > 0 for p in ps.plans)
