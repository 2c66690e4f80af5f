"""Plan enumeration, ranking, rejection reasons and the step-time model."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from marp import (
    GpuPool,
    InvalidRecipeError,
    Layout,
    MarpError,
    TrainingRecipe,
    UnknownGpuError,
    enumerate_plans,
    estimate_step_time,
    get_gpu,
    get_model,
    list_gpus,
    predict_memory,
)
from marp.perf import flops_per_token

LLAMA7 = get_model("llama-2-7b")
RECIPE = TrainingRecipe(seq_len=4096, global_batch=64, train_steps=500)


def test_every_plan_fits_is_valid_and_matches_predict_memory() -> None:
    margin = 0.05
    ps = enumerate_plans(LLAMA7, RECIPE, safety_margin=margin, max_plans=None)
    assert ps.plans
    for plan in ps.plans:
        gpu = get_gpu(plan.gpu_type)
        lay = plan.layout
        assert plan.memory.total <= gpu.memory_bytes * (1 - margin)
        assert plan.headroom_bytes == gpu.memory_bytes - plan.memory.total > 0
        assert LLAMA7.heads % lay.tp == 0 and LLAMA7.kv_heads % lay.tp == 0 and lay.tp <= 8
        assert LLAMA7.n_layers % lay.pp == 0 and lay.num_gpus <= 64
        assert lay.pp == 1 or lay.zero_stage <= 1
        assert lay.dp * lay.micro_batch * lay.grad_accum == RECIPE.global_batch
        assert lay.micro_batch in (1, 2, 4, 8, 16)
        assert lay.zero_stage == 0 or lay.dp > 1
        assert plan.memory == predict_memory(LLAMA7, RECIPE, lay, gpu)
        assert plan.gpu_hours == pytest.approx(lay.num_gpus * plan.step_time_s * 500 / 3600)
        assert plan.completion_s == pytest.approx(plan.step_time_s * 500)
        assert plan.explanation.startswith(f"{plan.headroom_bytes / 2**30:.1f} GiB headroom")
        assert plan.tokens_per_s == pytest.approx(RECIPE.tokens_per_step / plan.step_time_s)


def test_plans_are_ranked_and_diverse() -> None:
    ps = enumerate_plans(LLAMA7, RECIPE, max_plans=None)
    assert [p.rank for p in ps.plans] == list(range(1, len(ps.plans) + 1))
    keys = [(p.completion_s, p.gpu_hours) for p in ps.plans]
    assert keys == sorted(keys)  # completion time first (the default)
    cost = enumerate_plans(LLAMA7, RECIPE, max_plans=None, rank_by="gpu_hours")
    ckeys = [(p.gpu_hours, p.num_gpus, p.completion_s) for p in cost.plans]
    assert ckeys == sorted(ckeys)
    assert cost.plans[0].num_gpus < ps.plans[0].num_gpus  # cheapest is smaller than fastest
    with pytest.raises(MarpError) as info:
        enumerate_plans(LLAMA7, RECIPE, rank_by="vibes")
    assert info.value.field == "rank_by"
    slots = [(p.gpu_type, p.num_gpus) for p in ps.plans]
    assert len(slots) == len(set(slots))
    assert ps.best is ps.plans[0]
    assert len({p.gpu_type for p in ps.plans}) >= 4


def test_bf16_on_pre_ampere_is_rejected_with_reason() -> None:
    ps = enumerate_plans(LLAMA7, RECIPE)
    assert not any(p.gpu_type in ("T4", "V100-16GB", "V100-32GB") for p in ps.plans)
    assert any(r.startswith("T4: no bf16 support") for r in ps.rejected)


def test_impossible_job_gives_no_plan_and_a_numeric_reason() -> None:
    recipe = TrainingRecipe(seq_len=4096, global_batch=8, precision="fp16")
    ps = enumerate_plans(get_model("llama-2-70b"), recipe, pools=[GpuPool("T4", 1, 4)])
    assert ps.plans == [] and ps.best is None
    assert len(ps.rejected) == 2
    line = ps.rejected[0]
    assert line.startswith("T4: needs at least ") and "GiB usable" in line
    assert "recompute full" in line  # the smallest need uses recomputation
    need = float(line.split("least ")[1].split(" GiB")[0])
    assert need > 18 * 69e9 / 2**30 * 0.99  # at least the model states of 69 B params (master-fp16)
    nearest = ps.rejected[1]
    assert nearest.startswith("nearest plan that would fit: T4 x ")
    n = int(nearest.split(" x ")[1].split(" ")[0])
    assert n > 64  # a 70B model needs many 16 GB cards


def test_pools_caps_and_flags_are_respected() -> None:
    recipe = TrainingRecipe(seq_len=2048, global_batch=32, micro_batch=2, allow_recompute=False,
                            zero_stages=(0, 1), max_gpus=8)  # fmt: skip
    pools = [GpuPool("A100-80GB", 16, 4), GpuPool("h100", 2, 2)]
    ps = enumerate_plans(get_model("llama-3-8b"), recipe, pools=pools, max_plans=None)
    assert {p.gpu_type for p in ps.plans} <= {"A100-80GB", "H100-80GB"}
    for p in ps.plans:
        cap = 8 if p.gpu_type == "A100-80GB" else 2
        assert p.num_gpus <= cap and p.layout.tp <= (4 if p.gpu_type == "A100-80GB" else 2)
        assert p.layout.micro_batch == 2 and p.layout.recompute == "none" and p.layout.zero_stage in (0, 1)


def test_max_plans_truncates() -> None:
    full = enumerate_plans(LLAMA7, RECIPE, max_plans=None)
    top = enumerate_plans(LLAMA7, RECIPE, max_plans=3)
    assert len(full.plans) > 3
    assert [p.to_dict() for p in top.plans] == [p.to_dict() for p in full.plans[:3]]


def test_to_dict_is_json_safe() -> None:
    ps = enumerate_plans(get_model("gpt2-124m"), TrainingRecipe(seq_len=1024, global_batch=16), max_plans=5)
    text = json.dumps(ps.to_dict())
    back = json.loads(text)
    assert back["plans"][0]["rank"] == 1
    assert back["plans"][0]["layout"]["num_gpus"] == ps.plans[0].num_gpus
    assert back["plans"][0]["memory"]["total"] == ps.plans[0].memory.total


def test_bad_arguments() -> None:
    with pytest.raises(UnknownGpuError):
        GpuPool("B300", 8, 8)
    with pytest.raises(MarpError) as info:
        GpuPool("A100-80GB", 0, 8)
    assert info.value.field == "pools.total_gpus"
    with pytest.raises(MarpError) as info:
        enumerate_plans(LLAMA7, RECIPE, safety_margin=1.0)
    assert info.value.field == "safety_margin"


def test_default_enumeration_is_fast() -> None:
    start = time.perf_counter()
    enumerate_plans(get_model("llama-3-70b"), TrainingRecipe(seq_len=8192, global_batch=512))
    assert time.perf_counter() - start < 1.0


# ---- step time ---------------------------------------------------------------------------------


def test_single_gpu_step_time_is_flops_over_peak_times_mfu() -> None:
    model = get_model("gpt2-124m")
    recipe = TrainingRecipe(seq_len=1024, global_batch=8)
    gpu = get_gpu("A100-80GB")
    # Narayanan et al. 2021: 6N (matmul params, head included) + 12 L h s per token.
    per_token = 6 * (12 * model.layer_params() + 50257 * 768) + 12 * 12 * 768 * 1024
    assert flops_per_token(model, 1024) == per_token
    t = estimate_step_time(model, recipe, Layout(1, 1, 1, 0, 8, 1), gpu, mfu=0.4)
    assert t == pytest.approx(8 * 1024 * per_token / (312e12 * 0.4))
    calibrated = estimate_step_time(model, recipe, Layout(1, 1, 1, 0, 8, 1), gpu)
    assert calibrated == pytest.approx(8 * 1024 * per_token / (312e12 * 0.5))  # A100 anchor: 50 %
    h100 = estimate_step_time(model, recipe, Layout(1, 1, 1, 0, 8, 1), get_gpu("H100-80GB"))
    assert calibrated / h100 == pytest.approx(2.05)  # Lambda's measured BERT-large ratio, not 989/312
    rc = estimate_step_time(model, recipe, Layout(1, 1, 1, 0, 8, 1, "full"), gpu)
    assert rc > calibrated * 1.2


def test_step_time_scales_and_pays_for_communication() -> None:
    gpu = get_gpu("A100-80GB")
    one = estimate_step_time(LLAMA7, RECIPE, Layout(1, 1, 1, 0, 1, 64), gpu)
    eight = estimate_step_time(LLAMA7, RECIPE, Layout(1, 1, 8, 1, 1, 8), gpu)
    sixteen = estimate_step_time(LLAMA7, RECIPE, Layout(1, 1, 16, 1, 1, 4), gpu)  # crosses nodes
    assert one / 8 < eight < one / 6  # near-linear, plus the gradient all-reduce
    # Alpha-beta-gamma ring all-reduce of the fp32 (master-*) grads, 2(n-1)/n x 4 B x Psi: over
    # 25 GB/s between nodes at dp = 16 (+ 15 us per step and the incast term), over NVLink
    # (300 GB/s, 5 us) inside one node at dp = 8; the gamma term reads/writes 3 x (n-1)/n x B.
    from marp.perf import INCAST

    grads = 4 * LLAMA7.param_count()
    mem = gpu.mem_bw_gbps * 1e9
    inter16 = 2 * 15 * 15e-6 + 2 * 15 / 16 * grads / 25e9 + 15 / 16 * grads * 3 / mem + INCAST * 1 / 2 * grads / 16 / 25e9
    intra8 = 2 * 7 * 5e-6 + 2 * 7 / 8 * grads / 300e9 + 7 / 8 * grads * 3 / mem
    assert sixteen - eight / 2 == pytest.approx(inter16 - intra8 / 2)
    tp = estimate_step_time(LLAMA7, RECIPE, Layout(8, 1, 1, 0, 1, 64), gpu)
    assert tp > one / 8  # TP all-reduces cost time
    pp = estimate_step_time(LLAMA7, RECIPE, Layout(1, 4, 1, 0, 1, 64), gpu)
    assert pp == pytest.approx(one / 4 * (1 + 3 / 64), rel=0.02)  # 1F1B bubble (p-1)/m


def test_catalog_gpus_all_usable_for_fp16() -> None:
    recipe = TrainingRecipe(seq_len=1024, global_batch=8, precision="fp16")
    ps = enumerate_plans(get_model("gpt2-124m"), recipe, max_plans=None)
    assert {p.gpu_type for p in ps.plans} == {g.name for g in list_gpus()}
    assert ps.rejected == []


def test_recipe_the_model_cannot_take_raises() -> None:
    with pytest.raises(InvalidRecipeError) as info:
        enumerate_plans(get_model("gpt2-124m"), TrainingRecipe(seq_len=2048, global_batch=8))
    assert info.value.field == "recipe.seq_len"


def test_no_valid_layout_is_explained() -> None:
    # ZeRO-3 only, but a single GPU has no data-parallel group to shard over.
    recipe = TrainingRecipe(seq_len=1024, global_batch=8, zero_stages=(3,))
    ps = enumerate_plans(get_model("gpt2-124m"), recipe, pools=[GpuPool("A100-80GB", 1, 1)])
    assert ps.plans == []
    assert ps.rejected and ps.rejected[0].startswith("A100-80GB: no valid layout on 1 GPU(s)")


def test_min_gpus_keeps_only_plans_at_least_that_wide() -> None:
    # A command written for a fixed world size (min = max) gets exactly that many GPUs.
    recipe = TrainingRecipe(seq_len=128, global_batch=8, min_gpus=4, max_gpus=4)
    ps = enumerate_plans(get_model("gpt2-124m"), recipe, pools=[GpuPool("A100-80GB", 16, 8)], max_plans=None)
    assert ps.plans and {p.num_gpus for p in ps.plans} == {4}
    wide = enumerate_plans(get_model("gpt2-124m"), replace(recipe, max_gpus=None), pools=[GpuPool("A100-80GB", 16, 8)],
                           max_plans=None)
    assert min(p.num_gpus for p in wide.plans) >= 4 and max(p.num_gpus for p in wide.plans) > 4


def test_min_gpus_above_max_is_refused() -> None:
    with pytest.raises(InvalidRecipeError, match="min_gpus"):
        TrainingRecipe(seq_len=128, global_batch=8, min_gpus=8, max_gpus=4)
