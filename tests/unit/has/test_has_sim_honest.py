"""Issue 18: the simulator's truth apart from the prediction, baselines at their best, every job counted."""

from __future__ import annotations

import pytest

from has.cluster_spec import parse_cluster
from has.sim.baselines import GavelPolicy, SiaPolicy, make_policy
from has.sim.engine import ProfileBook, Simulator, SimView, Start
from has.sim.traces import TraceJob

V100_A100 = parse_cluster({"nodes": [
    {"gpu": "V100-32GB", "count": 2, "gpus_per_node": 8},
    {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8},
]})  # fmt: skip


def _jobs(n: int, model: str = "qwen2.5-0.5b", steps: int = 200, gpus: int = 2) -> list[TraceJob]:
    return [TraceJob(f"j{i}", 60.0 * i, model, 2048, 64, 64 * 2048 * steps, gpus) for i in range(n)]


def test_a_gpu_without_the_precision_is_infeasible_not_zero_speed() -> None:
    # MARP gives a V100 0 bf16 TFLOPS; Sia's score for a V100 column was 0/0 = NaN and the ILP
    # picked it, so shipped Sia finished 0 jobs on a cluster with V100s.
    book = ProfileBook(V100_A100)
    job = _jobs(1)[0]
    prof = book.get(job)
    assert prof.runnable_types == frozenset({"A100-80GB"})
    sia = SiaPolicy()
    sim = Simulator(V100_A100, [job], sia, profiles=book, runtime_noise=0.0)
    info = sim.info[job.job_id]
    assert sia.believed_step_time(info, "V100-32GB", 8) is None
    assert all(t == "A100-80GB" for t, _ in sia.configs(SimView(sim, 0.0), info, {"V100-32GB": (8, 2), "A100-80GB": (8, 1)}))


@pytest.mark.parametrize("name", ["sia", "sia-memaware", "gavel", "opportunistic", "frenzy"])
def test_every_policy_finishes_on_a_cluster_with_v100s(name: str) -> None:
    jobs = _jobs(6)
    sim = Simulator(V100_A100, jobs, make_policy(name), runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == len(jobs)
    assert all(t == "A100-80GB" for _, _, t, _ in sim.placements)  # never a V100: bf16 cannot run there


def test_gavel_restarts_are_its_round_by_round_time_sharing() -> None:
    """Why Gavel restarts so often: each round (360 s) it re-derives who runs, and a job whose
    max-min share X is below 1 is stopped in the rounds it is not given (each stop = a restart
    that pays the restart cost). Two 4-GPU jobs on one 4-GPU node (X = 0.5 each) alternate
    every round, so restarts grow with the rounds the jobs overlap: doubling the round length
    halves them, and every restart is a Stop Gavel issued (no hidden ones)."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob(f"j{i}", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 20_000, 4) for i in range(2)]
    counts = {}
    for round_s in (360.0, 720.0):
        sim = Simulator(spec, jobs, GavelPolicy(round_s=round_s), runtime_noise=0.0, restart_s=0.0)
        res = sim.run()
        assert res.metrics()["jobs_finished"] == 2
        overlap = min(o.finish_s or 0.0 for o in res.jobs)  # both jobs active until the first ends
        # one restart per round boundary while both are active (the one stopped gives way), not more
        assert res.restarts == pytest.approx(overlap / round_s, abs=2)
        counts[round_s] = res.restarts
    assert counts[720.0] == pytest.approx(counts[360.0] / 2, abs=2)


# ----- the truth model apart from the predictor ----------------------------------------------

PAPERISH = parse_cluster({"nodes": [
    {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8},
    {"gpu": "A100-80GB", "count": 2, "gpus_per_node": 8},
    {"gpu": "L4", "count": 2, "gpus_per_node": 4},
]})  # fmt: skip


def test_truth_factors_are_per_job_and_type_seeded_and_shared_by_policies() -> None:
    jobs = _jobs(3, model="llama-2-7b")
    a = Simulator(PAPERISH, jobs, make_policy("frenzy"), seed=5, memory_error=0.1, speed_error=0.1)
    b = Simulator(PAPERISH, jobs, make_policy("sia"), seed=5, memory_error=0.1, speed_error=0.1)
    c = Simulator(PAPERISH, jobs, make_policy("frenzy"), seed=6, memory_error=0.1, speed_error=0.1)
    for kind in ("mem", "speed"):
        fa = [a.type_factor(kind, j.job_id, t) for j in jobs for t in ("H100-80GB", "A100-80GB", "L4")]
        assert fa == [b.type_factor(kind, j.job_id, t) for j in jobs for t in ("H100-80GB", "A100-80GB", "L4")]
        assert fa != [c.type_factor(kind, j.job_id, t) for j in jobs for t in ("H100-80GB", "A100-80GB", "L4")]
        assert len(set(fa)) == len(fa)  # one factor per job and GPU type
    exact = Simulator(PAPERISH, jobs, make_policy("frenzy"), seed=5)
    assert exact.type_factor("mem", "j0", "L4") == 1.0 == exact.type_factor("speed", "j0", "L4")


def test_speed_error_is_per_type_so_the_true_run_time_follows_it() -> None:
    job = _jobs(1, steps=500)[0]
    # (frenzy-single-type: a single-type plan, whose truth is one type's factor; frenzy may run a mixed one)
    sim = Simulator(PAPERISH, [job], make_policy("frenzy-single-type"), runtime_noise=0.0, speed_error=0.3, seed=2)
    res = sim.run()
    _, _, gpu_type, gpus = sim.placements[0]
    info = sim.info[job.job_id]
    plan = next(p for p in info.profile.plans if (p.gpu_type, p.num_gpus) == (gpu_type, len(gpus)))
    want = 500 * plan.step_time_s * sim.type_factor("speed", job.job_id, gpu_type)
    assert res.jobs[0].jct_s == pytest.approx(want, rel=1e-6)


def test_frenzy_learns_from_an_oom_as_the_live_scheduler_will() -> None:
    """A true peak 40 % above MARP's on the type frenzy picks first: the start fails as an OOM
    after the OOM delay; ``has.oom`` then rules out that plan and every plan predicted to need as
    large a share of its GPU, the job is requeued and finishes on a plan that may fit."""
    import marp
    from has.oom import memory_share

    job = _jobs(1, model="llama-2-7b", steps=300)[0]
    # (frenzy-single-type: one type's factor makes the OOM here; a mixed plan's OOM is
    # tests/unit/has/test_has_sim_mixed.py's)
    probe = Simulator(PAPERISH, [job], make_policy("frenzy-single-type"), runtime_noise=0.0)
    first = probe.run()
    first_type = probe.placements[0][2]
    policy = make_policy("frenzy-single-type")
    used: list[marp.Plan] = []
    decide = policy.decide

    def spy(view: SimView) -> list:
        acts = decide(view)
        info = view._sim.info
        for a in acts:
            if isinstance(a, Start):
                used.append(a.plan if a.plan is not None else info[a.job_id].profile.plans[a.plan_index])
        return acts

    policy.decide = spy  # type: ignore[method-assign]
    sim = Simulator(PAPERISH, [job], policy, runtime_noise=0.0, oom_delay_s=100.0)
    sim._type_factors[("mem", job.job_id, first_type)] = 1.4  # the truth on that type only
    res = sim.run()
    assert first.oom_failures == 0
    assert res.oom_failures >= 1 and res.jobs[0].finish_s is not None
    assert res.jobs[0].finish_s >= 100.0  # the OOM cost its delay
    info = sim.info[job.job_id]
    share = lambda p: memory_share(p.memory.total, marp.get_gpu(p.gpu_type).memory_bytes)  # noqa: E731
    assert info.oom_plans == used[: len(info.oom_plans)] and len(used) == res.oom_failures + 1
    # every start after an OOM used a plan below the share of every plan that failed before it
    for k in range(1, len(used)):
        assert all(share(used[k]) < share(f) for f in used[:k])


# ----- baselines at their best -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gavel-memaware", "gavel-minjct", "hadar-approx", "sia-memaware"])
def test_memory_aware_baselines_never_place_where_marp_says_no_fit(name: str) -> None:
    # llama-2-7b does not fit one or two 24 GB L4s; a memory-blind Gavel tries and OOMs
    jobs = [TraceJob(f"j{i}", 30.0 * i, "llama-2-7b", 2048, 64, 64 * 2048 * 40, 1) for i in range(4)]
    sim = Simulator(PAPERISH, jobs, make_policy(name), runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == 4 and res.oom_failures == 0
    for _, job_id, t, gpus in sim.placements:
        assert (t, len(gpus)) in sim.info[job_id].profile.configs
    blind = Simulator(PAPERISH, jobs, make_policy("gavel"), runtime_noise=0.0).run()
    assert blind.oom_failures > 0  # the memory-blind one learns by OOMing


def test_gavel_minjct_runs_the_shorter_job_first_where_maxmin_shares() -> None:
    """One 4-GPU node, two 4-GPU jobs, one 10x shorter: max-min fairness time-shares them round by
    round; the completion-time objective (Smith's rule) gives the node to the short job."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob("long", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 40_000, 4),
            TraceJob("short", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 4_000, 4)]  # fmt: skip
    fair = Simulator(spec, jobs, make_policy("gavel-memaware"), runtime_noise=0.0).run()
    fast = Simulator(spec, jobs, make_policy("gavel-minjct"), runtime_noise=0.0).run()
    short = lambda r: next(j for j in r.jobs if j.job_id == "short").jct_s  # noqa: E731
    assert fast.restarts == 0 and short(fast) < short(fair)
    assert fast.metrics()["avg_jct_s"] < fair.metrics()["avg_jct_s"]


def test_gavel_round_length_is_an_option() -> None:
    assert make_policy("gavel", gavel_round_s=60.0).round_s == 60.0
    assert make_policy("gavel-minjct", gavel_round_s=720.0).round_s == 720.0


def test_hadar_prices_gpus_so_a_contended_type_is_shared() -> None:
    """Hadar's dual subroutine: a GPU type's price rises with what is given out in the round, and a
    job gets the configuration with the best utility minus price. Alone on an empty node, the
    first round gives the earlier arrival all four GPUs (cheap); with the second job waiting, the
    next round prices the node so that the last GPUs buy j0 less than they cost, and the node is
    split: both jobs run (Hadar's utilisation argument), each placement on free GPUs only."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob(f"j{i}", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 3_000, 4) for i in range(2)]
    sim = Simulator(spec, jobs, make_policy("hadar-approx"), runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == 2 and res.oom_failures == 0
    first, *rest = sim.placements
    assert first[1] == "j0" and len(first[3]) == 4
    second_round = [p for p in rest if p[0] == rest[0][0]]
    assert {p[1] for p in second_round} == {"j0", "j1"}
    assert sum(len(p[3]) for p in second_round) <= 4


def test_a_round_policy_that_never_lets_jobs_progress_is_stopped_and_reported() -> None:
    """A policy that restarts every job every round, with the restart as long as the round, makes
    no progress: the run stops after stall_s and names the jobs as stalled, not 10 years later."""
    from has.sim.engine import Stop

    class Rotate:
        name, round_s = "rotate", 100.0

        def decide(self, view: SimView) -> list:
            stops = [Stop(j.job_id) for j in view.running]
            free = [s for n in view.cluster.nodes for s in n.gpus]
            starts = [Start(j.job_id, free[0].gpu_type, ((free[0].node, free[0].index),)) for j in view.queue[:1]]
            return stops + starts

    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 1}]})
    jobs = _jobs(2, steps=100_000, gpus=1)
    res = Simulator(spec, jobs, Rotate(), runtime_noise=0.0, restart_s=100.0, stall_s=86400.0).run()
    assert res.metrics()["jobs_finished"] == 0
    assert res.end_s < 3 * 86400.0
    assert all(why.startswith("stalled") for why in res.unfinished.values()) and len(res.unfinished) == 2


def test_gavel_keeps_a_job_until_its_restart_is_amortised() -> None:
    """With a round no longer than the restart cost, Gavel's rotation alone would give no progress;
    our guard keeps a restarted job for a second round, so both jobs finish."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob(f"j{i}", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 5_000, 4) for i in range(3)]
    res = Simulator(spec, jobs, make_policy("gavel", restart_s=120.0, gavel_round_s=120.0),
                    runtime_noise=0.0, restart_s=120.0).run()  # fmt: skip
    assert res.metrics()["jobs_finished"] == 3


def test_gavel_minjct_places_long_jobs_too() -> None:
    """Smith's-rule weights are tiny for a long job (steps/s per step left); a lone long job
    still starts at the first round."""
    spec = parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob("long", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 2_000_000, 4)]
    sim = Simulator(spec, jobs, make_policy("gavel-minjct"), runtime_noise=0.0)
    res = sim.run()
    assert res.metrics()["jobs_finished"] == 1 and sim.placements[0][0] == 360.0


def test_gavel_memaware_asks_only_for_counts_a_round_can_place() -> None:
    """MARP may fit a job on 20 A100s, but a round places a power of two within a node or whole
    nodes; asking for 20 on 8-GPU nodes blocked the type every round (seen on Pollux 6 with
    memory error: two 32-GPU jobs never ran). The memory-aware request takes a placeable count,
    and after every fitting count OOMed it falls back to the memory-blind rule."""
    from has.sim.baselines import GavelPolicy
    from has.sim.engine import JobInfo, JobProfile

    prof = JobProfile("qwen2.5-72b", (), {("A100-80GB", 16): 2.0, ("A100-80GB", 20): 1.7}, frozenset({"A100-80GB"}))
    job = JobInfo("j", 0, 0.0, "qwen2.5-72b", 64, "", prof, 100.0)
    g = GavelPolicy(memory_aware=True)
    cap, per = {"A100-80GB": 32}, {"A100-80GB": 8}
    assert g.request(job, ["A100-80GB"], cap, per) == (16, ["A100-80GB"])
    job.failed_configs.add(("A100-80GB", 16))
    assert g.request(job, ["A100-80GB"], cap, per) == (32, ["A100-80GB"])  # memory-blind: 2 x 16


@pytest.mark.parametrize("name", ["sia", "gavel", "hadar-approx", "opportunistic", "frenzy"])
def test_a_job_no_gpu_of_the_cluster_holds_is_reported_not_retried(name: str) -> None:
    """qwen2.5-72b fits no layout on four L4s: it never enters the queue (no policy could run it
    here), the run ends with the small job's finish, and the big one is named with why."""
    spec = parse_cluster({"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 4}]})
    jobs = [TraceJob("small", 0.0, "qwen2.5-0.5b", 2048, 64, 64 * 2048 * 50, 1),
            TraceJob("huge", 10.0, "qwen2.5-72b", 2048, 64, 64 * 2048 * 50, 4)]  # fmt: skip
    res = Simulator(spec, jobs, make_policy(name), runtime_noise=0.0).run()
    small = next(j for j in res.jobs if j.job_id == "small")
    assert small.finish_s is not None and res.end_s == small.finish_s and res.oom_failures == 0
    assert "too big for this cluster" in res.unfinished["huge"]
