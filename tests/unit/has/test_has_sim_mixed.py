"""Mixed plans in the simulator (issue 33): frenzy places them through HAS, the engine runs them on
GPUs of several types, the independent truth times them at their slowest stage, and
``frenzy-single-type`` never places one."""

from __future__ import annotations

import math

import pytest

import marp
from has.cluster import ClusterView, GpuSlot, NodeView
from has.cluster_spec import parse_cluster
from has.oom import memory_share
from has.preemption import _free_with, _mixed
from has.sim import truth_independent as ti
from has.sim.baselines import FrenzyPolicy, _peak_and_memory, make_policy
from has.sim.engine import ProfileBook, SimError, Simulator, Start
from has.sim.traces import TraceJob, fit_to_cluster, read_trace
from marp.mixed import StageRequest, evaluate_stages

# examples/clusters/fragmented.yaml
FRAGMENTED = parse_cluster({"nodes": [
    {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 2, "name_prefix": "a100", "inter_node_gbps": 25},
    {"gpu": "L4", "count": 2, "gpus_per_node": 4, "name_prefix": "l4", "intra_node_link": "pcie",
     "inter_node_gbps": 1.5625},
    {"gpu": "A10G", "count": 2, "gpus_per_node": 4, "name_prefix": "a10g", "intra_node_link": "pcie",
     "inter_node_gbps": 3.125},
]})  # fmt: skip
TOKENS = 64 * 2048


@pytest.fixture(scope="module")
def book() -> ProfileBook:
    return ProfileBook(FRAGMENTED)


def _types(sim: Simulator, gpus: tuple[tuple[str, int], ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for node, index in gpus:
        t = sim.node_gpus[node][index][1]
        out[t] = out.get(t, 0) + 1
    return out


@pytest.mark.parametrize("truth", ["independent", "marp"])
def test_a_mixed_plan_runs_on_gpus_of_both_types_at_the_truths_step_time(truth: str, book: ProfileBook) -> None:
    # llama-2-13b fits no single pool of the fragmented cluster, only a mix (docs/mixed-plans.md)
    job = TraceJob("big", 0.0, "llama-2-13b", 2048, 64, TOKENS * 40, 4)
    assert book.get(job).runs_only_mixed
    sim = Simulator(FRAGMENTED, [job], make_policy("frenzy"), profiles=book, truth=truth, runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == 1 and res.metrics()["jobs_mixed"] == 1 and res.oom_failures == 0
    (_, _, gpu_type, gpus), = sim.placements
    plan = sim.info["big"].profile.mixed_plans[0]  # MARP's first plan, which frenzy takes on a free cluster
    assert plan.mixed is not None and gpu_type == plan.gpu_type and "+" in gpu_type
    held = _types(sim, gpus)
    assert len(held) == 2 and held == plan.gpus_by_type  # GPUs of both types, as many as each share
    if truth == "independent":
        step = sim._indep.mixed_step_s("big", "llama-2-13b", job.recipe(), plan.mixed)  # type: ignore[union-attr]
        assert not math.isclose(step, plan.step_time_s, rel_tol=0.01)  # the truth, not MARP's estimate
    else:
        step = plan.step_time_s
    assert res.jobs[0].jct_s == pytest.approx(40 * step, rel=1e-9)
    # charged per GPU at its own type's price
    hours = 40 * step / 3600.0
    want = sum(n * sim.prices[t] for t, n in held.items()) * hours
    assert res.jobs[0].cost_usd == pytest.approx(want, rel=1e-9)


def test_frenzy_single_type_never_places_a_mixed_plan(book: ProfileBook) -> None:
    jobs = [TraceJob("big", 0.0, "llama-2-13b", 2048, 64, TOKENS * 20, 4)] + [
        TraceJob(f"j{i}", 60.0 * i, m, 2048 if "gpt2" not in m else 1024, 64, TOKENS * 30, 2)
        for i, m in enumerate(("llama-2-7b", "qwen2.5-0.5b", "gpt2-124m", "llama-3.2-3b", "llama-2-7b"))
    ]  # fmt: skip
    single = Simulator(FRAGMENTED, jobs, make_policy("frenzy-single-type"), profiles=book, truth="independent")
    res = single.run()
    for _, _, gpu_type, gpus in single.placements:
        assert "+" not in gpu_type and len(_types(single, gpus)) == 1
    assert res.metrics()["jobs_mixed"] == 0 and res.metrics()["jobs_finished"] == len(jobs) - 1
    assert "only a mixed plan fits" in res.unfinished["big"]  # it never enters that policy's queue
    assert not FrenzyPolicy.runs_mixed.fget(make_policy("frenzy-single-type"))  # type: ignore[attr-defined]
    # frenzy itself runs the 13B job (over two types) and every other one
    mixed = Simulator(FRAGMENTED, jobs, make_policy("frenzy"), profiles=book, truth="independent")
    m = mixed.run().metrics()
    assert m["jobs_finished"] == len(jobs) and m["jobs_mixed"] >= 1 and m["oom_failures"] == 0


def test_the_engine_refuses_a_mixed_start_on_the_wrong_gpus(book: ProfileBook) -> None:
    job = TraceJob("big", 0.0, "llama-2-13b", 2048, 64, TOKENS, 4)
    sim = Simulator(FRAGMENTED, [job], make_policy("frenzy"), profiles=book)
    sim.queue["big"] = None
    plan = sim.info["big"].profile.mixed_plans[0]
    wrong = tuple((f"a10g-{k // 4}", k % 4) for k in range(8)) + (("a100-0", 0), ("a100-0", 1))
    with pytest.raises(SimError, match="mixed plan"):
        sim._start(0.0, Start("big", plan.gpu_type, wrong, None, plan))


def test_the_truths_mixed_step_is_its_slowest_stage_times_the_bubble() -> None:
    truth = ti.IndependentTruth(FRAGMENTED)
    model = marp.get_model("llama-2-7b")
    rec = marp.TrainingRecipe(seq_len=2048, global_batch=64, micro_batch=1)
    # one stage of one type is terms 1-5 exactly
    one = evaluate_stages(model, rec, [StageRequest(32, (("L4", 8),), 1)], zero_stage=3)
    lay = marp.Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch=1, grad_accum=8)
    assert truth.mixed_step_s("j", "llama-2-7b", rec, one) == pytest.approx(
        truth.model_step_s("llama-2-7b", rec, "L4", lay), rel=1e-12)
    # a pipeline over two types: the slowest stage's time x (1 + (P - 1) / m)
    two = evaluate_stages(model, rec, [StageRequest(8, (("L4", 2),), 1), StageRequest(24, (("A100-80GB", 2),), 1)],
                          zero_stage=1)  # fmt: skip
    parts = truth.mixed_parts("llama-2-7b", rec, two)
    assert {(s, t) for s, t, _, _ in parts} == {(0, "L4"), (1, "A100-80GB")}
    slowest = max(t for *_, t in parts)
    assert truth.mixed_step_s("j", "llama-2-7b", rec, two) == pytest.approx(slowest * (1 + 1 / two.micro_batches))
    # more blocks on the slow type make its stage the slowest, and the step slower
    worse = evaluate_stages(model, rec, [StageRequest(24, (("L4", 2),), 1), StageRequest(8, (("A100-80GB", 2),), 1)],
                            zero_stage=1)  # fmt: skip
    assert truth.mixed_step_s("j", "llama-2-7b", rec, worse) > truth.mixed_step_s("j", "llama-2-7b", rec, two)
    # uneven data parallelism: each type's time from its own local batch; the slowest rank sets the step
    dp = evaluate_stages(model, rec, [StageRequest(32, (("A100-80GB", 2), ("L4", 8)), 1)],
                         local_micro_batch={"A100-80GB": 4, "L4": 1}, zero_stage=3)  # fmt: skip
    t = {g: x for _, g, _, x in truth.mixed_parts("llama-2-7b", rec, dp)}
    assert truth.mixed_step_s("j", "llama-2-7b", rec, dp) == pytest.approx(max(t.values()))
    # errors: per type, seeded, and one memory factor per (job, type, layout)
    noisy = ti.IndependentTruth(FRAGMENTED, seed=3, speed_error=0.2, memory_error=0.1)
    assert noisy.mixed_step_s("j", "llama-2-7b", rec, two) != truth.mixed_step_s("j", "llama-2-7b", rec, two)
    assert noisy.mixed_step_s("j", "llama-2-7b", rec, two) == noisy.mixed_step_s("j", "llama-2-7b", rec, two)
    assert noisy.mixed_memory_factor("j", "L4", two) != noisy.mixed_memory_factor("j", "L4", worse)
    assert truth.mixed_memory_factor("j", "L4", two) == 1.0


def test_a_mixed_plan_that_ooms_is_learnt_from(book: ProfileBook) -> None:
    """A true peak far above MARP's on the L4s of every layout: the mixed start OOMs, ``has.oom``
    rules out the plans that need as large a share, and the job ends unfinished or elsewhere --
    never started on a plan the rule dropped."""
    job = TraceJob("big", 0.0, "llama-2-13b", 2048, 64, TOKENS * 10, 4)
    sim = Simulator(FRAGMENTED, [job], make_policy("frenzy"), profiles=book, runtime_noise=0.0, oom_delay_s=50.0)
    sim._type_factors[("mem", "big", "L4")] = 1.5  # the marp truth: one factor per job and type
    used: list[marp.Plan] = []
    start = sim._start

    def spy(now: float, a: Start) -> None:
        used.append(a.plan)  # type: ignore[arg-type]
        start(now, a)

    sim._start = spy  # type: ignore[method-assign]
    res = sim.run()
    assert res.oom_failures >= 1
    failed = sim.info["big"].oom_plans
    assert failed[0].mixed is not None and "L4" in failed[0].gpus_by_type and failed == used[: len(failed)]
    # every start after an OOM used a plan whose tightest rank needs a smaller share of its GPU
    share = lambda p: memory_share(*_peak_and_memory(p))  # noqa: E731
    for k in range(1, len(used)):
        assert all(share(used[k]) < share(f) for f in used[:k])
    assert res.jobs[0].finish_s is not None or res.unfinished["big"]


def test_a_running_mixed_job_is_no_victim_and_freed_gpus_keep_their_types() -> None:
    slots = [GpuSlot("a100-0", i, "A100-80GB", 80 << 30, 1 << 30, "v", True, 100.0) for i in range(2)] + [
        GpuSlot("l4-0", i, "L4", 24 << 30, 1 << 30, "v", True, 100.0) for i in range(4)]  # fmt: skip
    assert _mixed(slots) and not _mixed(slots[:2])
    view = ClusterView([NodeView("a100-0", tuple(slots[:2])), NodeView("l4-0", tuple(slots[2:]))])
    from has.pass_state import PassFree

    free = PassFree(view)
    given = _free_with(free, slots)
    assert given.total.get("A100-80GB") == 2 and given.total.get("L4") == 4


def test_fit_to_cluster_cuts_requests_and_scales_lengths() -> None:
    from pathlib import Path

    trace = Path(__file__).resolve().parents[3] / "data/traces/gavel/msr_philly_seed1/103959.trace"
    jobs = read_trace(trace, max_jobs=40)
    fitted = fit_to_cluster(jobs, 2, 0.5)
    assert [j.job_id for j in fitted] == [j.job_id for j in jobs] and all(j.gpus <= 2 for j in fitted)
    for a, b in zip(jobs, fitted, strict=True):
        assert a.submit_s == b.submit_s
        if a.gpus <= 2:  # kept request: same model, half the tokens
            assert a.model == b.model and b.tokens == pytest.approx(a.tokens / 2, rel=1e-3)
    assert any(a.gpus > 2 for a in jobs)
    with pytest.raises(ValueError):
        fit_to_cluster(jobs, 0)
