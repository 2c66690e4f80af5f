"""QueuePolicy(preempt_within_s=...): stop a just-arrived job for a much shorter one."""

from __future__ import annotations

import dataclasses

import pytest
from unit.has.has_builders import A100, H100, MEM, cluster, free_node, job, plan

from has import (
    ClusterView,
    GpuSlot,
    NodeView,
    PlanOption,
    Preemption,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    schedule,
)
from has.cluster_spec import ClusterSpec, parse_cluster
from has.sim.baselines import POLICY_NAMES, FrenzyPolicy, make_policy
from has.sim.engine import Simulator, Stop
from has.sim.traces import TraceJob

HOUR = 3600.0
NOW = 1000 * HOUR


def timed(runtime_s: float, dp: int = 8, gpu_type: str = A100) -> PlanOption:
    return dataclasses.replace(plan(gpu_type, dp=dp), runtime_s=runtime_s)


def owned_node(name: str, owner: str, free_at: float, gpu_type: str = A100, n: int = 8) -> NodeView:
    """A node whose every GPU is held by ``owner`` until (estimated) ``free_at``."""
    gpus = tuple(
        GpuSlot(name, i, gpu_type, MEM[gpu_type], 1 << 30, owner, True, free_at) for i in range(n)
    )  # fmt: skip
    return NodeView(name, gpus)


def policy(**kw: object) -> QueuePolicy:
    base: dict[str, object] = {"preempt_within_s": 60.0, "explain": False}
    base.update(kw)
    return QueuePolicy.named("frenzy-completion", **base)


def burst(
    left_s: float = 5 * HOUR, short_s: float = 0.5 * HOUR, victim_age_s: float = 20.0
) -> tuple[ClusterView, list[QueuedJob], list[RunningJob]]:
    """Job "long" arrived and started ``victim_age_s`` ago on the only node; "short" arrived since."""
    c = cluster(owned_node("a", "long", NOW + left_s))
    q = [job("short", 2, timed(short_s), at=NOW - 5.0)]
    running = [RunningJob("long", started_at=NOW - victim_age_s, submitted_at=NOW - victim_age_s)]
    return c, q, running


def test_off_in_the_papers_has_and_when_switched_off() -> None:
    assert QueuePolicy().preempt_within_s == 0.0
    # ours (the split's choice) does not preempt; frenzy-completion does (docs/simulator.md)
    assert QueuePolicy.frenzy().preempt_within_s == 0.0
    assert QueuePolicy.named("frenzy-completion").preempt_within_s == 60.0
    c, q, running = burst()
    # (frenzy's long-job stop, preempt_long_gain, is off in frenzy-nostop: test_has_stop_long)
    for off in (QueuePolicy.named("frenzy-nopreempt", explain=False), QueuePolicy.named("frenzy-nostop", explain=False)):
        res = schedule(c, q, NOW, off, running)
        assert res.preemptions == () and res.placements == ()
    assert schedule(c, q, NOW, QueuePolicy.named("frenzy-completion", explain=False), running).preemptions != ()
    # enabled but without the running jobs (what the live service passes today): nothing
    assert schedule(c, q, NOW, policy()).preemptions == ()


def test_a_much_shorter_job_takes_the_gpus_of_one_that_arrived_seconds_before() -> None:
    c, q, running = burst()
    res = schedule(c, q, NOW, policy(), running)
    assert res.preemptions == (Preemption("long", "short", 20.0),)
    assert [p.job_id for p in res.placements] == ["short"]
    assert res.placements[0].gpus() == [("a", i) for i in range(8)]
    assert "short" not in res.pending


def test_only_jobs_submitted_within_the_window() -> None:
    # "long" waited 10 min in the queue, then started 20 s ago: its start was not a matter of
    # arrival order within seconds, so it keeps its GPUs.
    c, q, _ = burst()
    running = [RunningJob("long", started_at=NOW - 20.0, submitted_at=NOW - 600.0)]
    assert schedule(c, q, NOW, policy(), running).preemptions == ()


def test_a_job_is_preempted_at_most_once() -> None:
    c, q, _ = burst()
    running = [RunningJob("long", NOW - 20.0, NOW - 20.0, preemptible=False)]
    assert schedule(c, q, NOW, policy(), running).preemptions == ()


def test_the_gain_must_exceed_twice_the_loss() -> None:
    # short (0.1 h) waiting for long's end gains what long has left; the loss is short's
    # runtime + the restart (120 s) + long's 20 s of lost progress = 500 s, doubled: 1,000 s.
    c, q, running = burst(left_s=1100.0, short_s=360.0)
    assert len(schedule(c, q, NOW, policy(), running).preemptions) == 1
    c, q, running = burst(left_s=900.0, short_s=360.0)
    assert schedule(c, q, NOW, policy(), running).preemptions == ()
    # with preempt_gain 1 the second one is worth it
    assert len(schedule(c, q, NOW, policy(preempt_gain=1.0), running).preemptions) == 1


def test_smiths_rule_a_job_longer_than_what_the_victim_has_left_never_preempts() -> None:
    c, q, running = burst(left_s=HOUR, short_s=2 * HOUR)
    assert schedule(c, q, NOW, policy(preempt_gain=0.0), running).preemptions == ()


def test_jobs_waiting_for_the_same_gpu_type_pay_the_switch_cost_too() -> None:
    # Alone, short would preempt (gain 1,100 s > 2 x 500 s). Two more 8-A100 jobs wait for
    # long's GPUs and would each start 140 s later: loss 360 + 140 x 3 = 780 s, doubled > gain.
    c, q, running = burst(left_s=1100.0, short_s=360.0)
    q = q + [job("w1", 3, timed(3 * HOUR), at=NOW - 4.0), job("w2", 4, timed(4 * HOUR), at=NOW - 3.0)]
    assert schedule(c, q, NOW, policy(), running).preemptions == ()


def test_a_job_that_fits_the_free_gpus_does_not_preempt() -> None:
    c = cluster(owned_node("a", "long", NOW + 5 * HOUR), free_node("b", 8))
    q = [job("short", 2, timed(0.5 * HOUR), at=NOW - 5.0)]
    running = [RunningJob("long", NOW - 20.0, NOW - 20.0)]
    res = schedule(c, q, NOW, policy(), running)
    assert res.preemptions == ()
    assert [(p.job_id, p.nodes[0][0]) for p in res.placements] == [("short", "b")]


def test_a_victim_of_another_gpu_type_is_no_use() -> None:
    c = cluster(owned_node("h", "long", NOW + 5 * HOUR, gpu_type=H100))
    q = [job("short", 2, timed(0.5 * HOUR), at=NOW - 5.0)]  # A100 only
    assert schedule(c, q, NOW, policy(), [RunningJob("long", NOW - 20.0, NOW - 20.0)]).preemptions == ()


def test_the_first_waiting_job_in_the_order_is_the_one_weighed() -> None:
    # Two short jobs: the shortest-first order puts "tiny" first; it gets the GPUs.
    c, q, running = burst()
    q = q + [job("tiny", 3, timed(0.1 * HOUR), at=NOW - 2.0)]
    res = schedule(c, q, NOW, policy(), running)
    assert res.preemptions == (Preemption("long", "tiny", 20.0),)
    assert [p.job_id for p in res.placements] == ["tiny"]
    assert "short" in res.pending


def test_knobs_are_validated() -> None:
    for bad in ({"preempt_within_s": -1.0}, {"preempt_restart_s": -1.0}, {"preempt_gain": -0.5}):
        with pytest.raises(ValueError, match="preempt"):
            QueuePolicy(**bad)  # type: ignore[arg-type]


# ----- the simulator acts on it ---------------------------------------------------------


def _trace() -> list[TraceJob]:
    # A 32B job that takes every H100 of a small cluster for hours, then a short one 20 s later.
    return [
        TraceJob("long", 0.0, "qwen2.5-32b", 2048, 64, 400_000_000, 8),
        TraceJob("short", 20.0, "qwen2.5-32b", 2048, 64, 2_000_000, 8),
    ]


def _spec() -> ClusterSpec:
    return parse_cluster(
        {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8, "name_prefix": "h100"}]}
    )


def test_simulator_stops_the_victim_which_loses_its_progress_and_restarts_once() -> None:
    assert "frenzy-nopreempt" in POLICY_NAMES
    base = Simulator(_spec(), _trace(), make_policy("frenzy-nopreempt"), runtime_noise=0.0).run()
    pre = Simulator(_spec(), _trace(), make_policy("frenzy-completion"), runtime_noise=0.0).run()
    by = {r.job_id: r for r in base.jobs}
    got = {r.job_id: r for r in pre.jobs}
    assert base.restarts == 0 and pre.restarts == 1 and pre.oom_failures == 0
    assert got["long"].restarts == 1 and got["short"].restarts == 0
    assert got["short"].first_start_s == 20.0  # at once, not after long
    assert got["short"].finish_s < by["short"].finish_s
    # long restarts from scratch when short ends (its 20 s are lost) and pays the 120 s restart
    assert got["long"].finish_s == pytest.approx(
        by["long"].finish_s + got["short"].finish_s + 120.0, abs=1e-6
    )
    assert sum(r.jct_s for r in pre.jobs) < sum(r.jct_s for r in base.jobs)


def test_stop_keeps_progress_unless_told_to_lose_it() -> None:
    sim = Simulator(
        _spec(), _trace()[:1], FrenzyPolicy("f", QueuePolicy.frenzy(explain=False)), runtime_noise=0.0
    )
    info = sim.info["long"]
    steps = info.steps_left
    sim._handle(0.0, 0, "long", 0)  # arrival
    sim._decide(0.0)
    assert "long" in sim.running
    sim._preempt(100.0, "long", lose_progress=True)
    assert info.steps_left == steps and info.restarts == 1
    sim._decide(100.0)
    sim._preempt(1000.0, "long")  # restarted at 100 s, progress from 220 s (restart cost) on
    assert info.steps_left < steps and info.restarts == 2
    assert Stop("x").lose_progress is False


def test_only_the_few_most_recently_started_jobs_are_weighed() -> None:
    """A pass weighs at most MAX_VICTIMS recent jobs (the most recently started), so its cost
    stays bounded on a big cluster where many jobs started within the window."""
    from has.preemption import MAX_VICTIMS

    n = MAX_VICTIMS + 1
    # "long" (the only worthwhile victim: its node is the one "short" fits) started first;
    # n - 1 jobs started after it, each on a 1-GPU node "short" cannot use.
    nodes = [owned_node("a", "long", NOW + 5 * HOUR)]
    nodes += [owned_node(f"b{k}", f"tiny{k}", NOW + 5 * HOUR, n=1) for k in range(n - 1)]
    c = cluster(*nodes)
    q = [job("short", 2, timed(0.5 * HOUR), at=NOW - 5.0)]
    running = [RunningJob("long", started_at=NOW - 30.0, submitted_at=NOW - 30.0)]
    running += [RunningJob(f"tiny{k}", started_at=NOW - 20.0 + k, submitted_at=NOW - 20.0 + k) for k in range(n - 1)]
    assert schedule(c, q, NOW, policy(), running).preemptions == ()  # "long" is the oldest: not weighed
    assert schedule(c, q, NOW, policy(), running[:MAX_VICTIMS]).preemptions == (Preemption("long", "short", 30.0),)
