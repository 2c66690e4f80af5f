"""The simulator's independent truth (issue 32, ``has.sim.truth_independent``): built from the
measurements in the repository, not from MARP's speed model, with diminishing returns of width
that MARP's scaling curve does not have, and errors that vary with width and layout."""

from __future__ import annotations

import ast
import math
import statistics
from pathlib import Path

import pytest

import marp
from has.cluster_spec import parse_cluster
from has.sim import truth_independent as ti
from has.sim.engine import ProfileBook, SimError, Simulator
from has.sim.traces import TraceJob

PAPER64 = parse_cluster({"nodes": [
    {"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8, "name_prefix": "h100", "inter_node_gbps": 50},
    {"gpu": "A100-80GB", "count": 4, "gpus_per_node": 8, "name_prefix": "a100", "inter_node_gbps": 25},
    {"gpu": "L4", "count": 4, "gpus_per_node": 4, "name_prefix": "l4", "inter_node_gbps": 1.5625},
]})  # fmt: skip


def _dp(n: int, gb: int = 64) -> marp.Layout:
    return marp.Layout(tp=1, pp=1, dp=n, zero_stage=1 if n > 1 else 0, micro_batch=1, grad_accum=gb // n)


def test_imports_nothing_of_marps_speed_code() -> None:
    """Read the module: no name of MARP's speed model appears in it, imported or used."""
    source = Path(ti.__file__).read_text()
    tree = ast.parse(source)
    forbidden = {"perf", "estimate_step_time", "step_time_s", "enumerate_plans", "tokens_per_s", "plans", "activations"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("marp.") or node.module in ("marp.recipe", "marp.models",
                                                                                  "marp.gpus"), node.module  # fmt: skip
            assert not {a.name for a in node.names} & forbidden
        if isinstance(node, ast.Attribute):
            assert node.attr not in forbidden, f"line {node.lineno}: .{node.attr}"
        if isinstance(node, ast.Name):
            assert node.id not in forbidden, f"line {node.lineno}: {node.id}"


def test_the_fits_come_from_the_measurements() -> None:
    f = ti.fits()
    # Gavel's 19 job types measured at 1 GPU and more: per-GPU throughput falls ~12 % per doubling
    assert f.gavel_types == 19 and 0.8 < f.d_gavel < 0.95
    # Megatron-LM 2019: 75.6 % over 512 V100s, on a 6.25 GB/s-per-GPU fabric
    assert f.d_nodes == pytest.approx((29.49 / 39.0) ** (1 / 9), rel=1e-6) and f.ref_fabric_gbps == 6.25
    # the three measured types, every anchor a plausible utilisation, fp8 rows left out
    assert set(f.curves) == {"H100-80GB", "A100-80GB", "A100-40GB"}
    assert all(0.2 < a.hfu < 0.9 for a in f.anchors) and not any("FP8" in a.row for a in f.anchors)
    assert 0.1 < f.alpha < 1.5  # less bandwidth per FLOP keeps less of the peak
    # a type without a published run: the reference curve, cut by its bandwidth per FLOP
    assert ti.efficiency("L4", 7e9) < ti.efficiency("A100-80GB", 7e9)


def test_diminishing_returns_of_width() -> None:
    truth = ti.IndependentTruth(PAPER64)
    recipe = marp.TrainingRecipe(seq_len=2048, global_batch=64)
    for gpu in ("H100-80GB", "A100-80GB", "L4"):
        per_gpu = [1.0 / (n * truth.model_step_s("llama-3.2-1b", recipe, gpu, _dp(n))) for n in (1, 2, 4, 8, 16, 32)]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(per_gpu, per_gpu[1:], strict=False)), (gpu, per_gpu)
        # and strictly: 32 GPUs give less than 32x one GPU's throughput
        assert per_gpu[-1] < 0.75 * per_gpu[0]
    # crossing a slow fabric costs more than crossing a fast one
    assert ti.node_factor(4, 1.5625) < ti.node_factor(4, 25.0) < ti.node_factor(1, 25.0) == 1.0


def test_the_truth_is_not_marps_step_time() -> None:
    """Its ratio to MARP's step time moves with the GPU count: MARP's scaling curve is not the truth's."""
    book = ProfileBook(PAPER64)
    job = TraceJob("j", 0.0, "llama-2-7b", 2048, 64, 10**9, 2)
    prof = book.get(job)
    truth = ti.IndependentTruth(PAPER64)
    ratios = {cfg: truth.model_step_s("llama-2-7b", job.recipe(), cfg[0], p.layout) / p.step_time_s
              for cfg, p in prof.truth_plans.items() if cfg[0] == "A100-80GB"}  # fmt: skip
    assert len(ratios) >= 4
    assert max(ratios.values()) / min(ratios.values()) > 1.2, ratios
    # wider is relatively slower in truth than MARP believes
    assert ratios[("A100-80GB", 32)] > ratios[("A100-80GB", 4)]


def test_speed_error_grows_with_width_and_differs_by_layout() -> None:
    truth = ti.IndependentTruth(PAPER64, seed=3, speed_error=0.1)
    narrow = [math.log(truth.speed_factor(f"j{k}", "A100-80GB", _dp(1))) for k in range(400)]
    wide = [math.log(truth.speed_factor(f"j{k}", "A100-80GB", _dp(64, 64))) for k in range(400)]
    assert statistics.pstdev(wide) > 1.5 * statistics.pstdev(narrow)
    a = marp.Layout(tp=2, pp=1, dp=4, zero_stage=1, micro_batch=1, grad_accum=16)
    b = marp.Layout(tp=1, pp=2, dp=4, zero_stage=1, micro_batch=1, grad_accum=16)
    assert truth.speed_factor("j1", "A100-80GB", a) != truth.speed_factor("j1", "A100-80GB", b)
    # the same draw for the same (seed, job, type, layout): every policy meets the same truth
    again = ti.IndependentTruth(PAPER64, seed=3, speed_error=0.1)
    assert again.speed_factor("j1", "A100-80GB", a) == truth.speed_factor("j1", "A100-80GB", a)
    assert ti.IndependentTruth(PAPER64).speed_factor("j1", "A100-80GB", a) == 1.0  # no error: none


def test_memory_error_is_per_layout() -> None:
    truth = ti.IndependentTruth(PAPER64, seed=0, memory_error=0.1)
    layouts = [marp.Layout(tp=t, pp=1, dp=8 // t, zero_stage=z, micro_batch=1, grad_accum=64 // (8 // t))
               for t in (1, 2, 4) for z in (1, 2)]  # fmt: skip
    factors = {truth.memory_factor("j", "A100-80GB", lay) for lay in layouts}
    assert len(factors) == len(layouts)  # one draw per layout, not one per job and type


def test_engine_runs_the_independent_truth_and_refuses_an_unknown_one() -> None:
    from has.sim.baselines import make_policy

    jobs = [TraceJob(f"j{k}", 60.0 * k, m, 2048, 64, 3 * 10**8, 2)
            for k, m in enumerate(["llama-3.2-1b", "llama-2-7b", "qwen2.5-0.5b", "llama-2-7b"])]  # fmt: skip
    book = ProfileBook(PAPER64)
    jct = {}
    for truth in ("marp", "independent"):
        res = Simulator(PAPER64, jobs, make_policy("frenzy"), profiles=book, runtime_noise=0.0, truth=truth).run()
        assert res.metrics()["jobs_finished"] == 4
        jct[truth] = res.metrics()["avg_jct_s"]
    assert jct["marp"] != pytest.approx(jct["independent"], rel=0.02)
    with pytest.raises(SimError, match="truth"):
        Simulator(PAPER64, jobs, make_policy("frenzy"), profiles=book, truth="oracle")
