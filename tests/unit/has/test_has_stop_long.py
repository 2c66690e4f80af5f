"""QueuePolicy(preempt_long_gain=...): stop a long running job, keeping its progress, for waiting
jobs much shorter than what it has left (has.preemption.stop_long; docs/simulator.md)."""

from __future__ import annotations

import dataclasses

import pytest
from unit.has.has_builders import A100, H100, MEM, cluster, job, plan

from has import GpuSlot, NodeView, PlanOption, Preemption, QueuedJob, QueuePolicy, RunningJob, schedule
from has.cluster_spec import ClusterSpec, parse_cluster
from has.sim.baselines import make_policy
from has.sim.engine import Simulator
from has.sim.traces import TraceJob

HOUR = 3600.0
NOW = 1000 * HOUR


def timed(runtime_s: float, dp: int = 4, gpu_type: str = A100) -> PlanOption:
    return dataclasses.replace(plan(gpu_type, dp=dp), runtime_s=runtime_s)


def owned_node(name: str, owner: str, free_at: float, gpu_type: str = A100, n: int = 8) -> NodeView:
    """A node whose every GPU is held by ``owner`` until (estimated) ``free_at``."""
    gpus = tuple(GpuSlot(name, i, gpu_type, MEM[gpu_type], 1 << 30, owner, True, free_at) for i in range(n))
    return NodeView(name, gpus)


def policy(**kw: object) -> QueuePolicy:
    return QueuePolicy.frenzy(explain=False, **kw)


def long_and_burst(
    left_s: float = 3 * HOUR, short_s: float = 0.1 * HOUR, shorts: int = 2
) -> tuple[list[NodeView], list[QueuedJob], list[RunningJob]]:
    """Job "long" holds the only node for ``left_s`` more; ``shorts`` jobs of 4 GPUs wait."""
    nodes = [owned_node("a", "long", NOW + left_s)]
    q = [job(f"s{k}", k + 2, timed(short_s), at=NOW - 60.0) for k in range(shorts)]
    running = [RunningJob("long", started_at=NOW - 2 * HOUR, submitted_at=NOW - 2 * HOUR)]
    return nodes, q, running


def test_off_unless_asked() -> None:
    assert QueuePolicy().preempt_long_gain == 0.0  # the paper's HAS
    assert QueuePolicy.named("frenzy-nostop").preempt_long_gain == 0.0
    assert QueuePolicy.frenzy().preempt_long_gain > 0.0  # ours (the tuning split chose it)
    nodes, q, running = long_and_burst()
    c = cluster(*nodes)
    for off in (QueuePolicy(explain=False), QueuePolicy.named("frenzy-nostop", explain=False)):
        assert off.preempt_long_gain == 0.0
        assert schedule(c, q, NOW, off, running).preemptions == ()
    # on, but without the running jobs: nothing to stop
    assert schedule(c, q, NOW, policy()).preemptions == ()
    # it reads the "ranked-wait" plan choice's wait estimates: under another choice, nothing
    assert schedule(c, q, NOW, policy(plan_choice="ranked"), running).preemptions == ()


def test_a_burst_of_short_jobs_takes_the_gpus_of_a_long_one_which_keeps_its_progress() -> None:
    nodes, q, running = long_and_burst()
    res = schedule(cluster(*nodes), q, NOW, policy(), running)
    assert res.preemptions == (Preemption("long", "s0", 0.0),)  # lost_s 0: it keeps its checkpoint
    assert sorted(p.job_id for p in res.placements) == ["s0", "s1"]  # both fit its 8 GPUs
    got = sorted(g for p in res.placements for g in p.gpus())
    assert got == [("a", i) for i in range(8)]  # no GPU handed out twice
    assert res.pending == {}


def test_the_gain_must_exceed_the_long_jobs_delay_times_the_gain_knob() -> None:
    # one 0.1 h job gains 3 h - 0 = ~2.9 h against a delay of 0.1 h + 120 s
    nodes, q, running = long_and_burst(shorts=1)
    assert schedule(cluster(*nodes), q, NOW, policy(), running).preemptions != ()
    # a knob of 100 asks for 100 x (360 + 120) s = 13.3 h of gain: no stop
    assert schedule(cluster(*nodes), q, NOW, policy(preempt_long_gain=100.0), running).preemptions == ()


def test_no_stop_when_the_waiting_jobs_start_elsewhere_soon() -> None:
    # another node frees in 5 minutes: waiting for it costs the short job 300 s, less than
    # 2 x (its 360 s + the 120 s restart) the long job would lose
    nodes, q, running = long_and_burst(shorts=1)
    nodes.append(owned_node("b", "other", NOW + 300.0))
    running.append(RunningJob("other", started_at=NOW - 3000.0, submitted_at=NOW - 3000.0, preemptible=False))
    assert schedule(cluster(*nodes), q, NOW, policy(), running).preemptions == ()
    # the same node freeing in 2 hours: the stop pays
    nodes[1] = owned_node("b", "other", NOW + 2 * HOUR)
    assert schedule(cluster(*nodes), q, NOW, policy(), running).preemptions == (Preemption("long", "s0", 0.0),)


def test_only_for_jobs_much_shorter_than_what_the_victim_has_left() -> None:
    # 1 h left, a 0.5 h job: not a quarter of it (preempt_long_ratio 4)
    nodes, q, running = long_and_burst(left_s=HOUR, short_s=0.5 * HOUR, shorts=1)
    assert schedule(cluster(*nodes), q, NOW, policy(), running).preemptions == ()
    # (gain 1 h against a delay of 0.5 h + 120 s: with a ratio of 1.5 and a gain knob of 1 it stops)
    assert schedule(cluster(*nodes), q, NOW, policy(preempt_long_ratio=1.5, preempt_long_gain=1.0), running).preemptions
    assert not schedule(cluster(*nodes), q, NOW, policy(preempt_long_ratio=4.0, preempt_long_gain=1.0), running).preemptions


def test_a_victim_must_outlast_several_restarts() -> None:
    # 7 minutes left < 4 x 120 s: never a victim, however short the waiting job
    nodes, q, running = long_and_burst(left_s=420.0, short_s=10.0, shorts=1)
    assert schedule(cluster(*nodes), q, NOW, policy(), running).preemptions == ()


def test_a_job_is_stopped_at_most_once_and_only_for_jobs_of_its_priority_or_higher() -> None:
    nodes, q, running = long_and_burst()
    c = cluster(*nodes)
    once = [dataclasses.replace(running[0], preemptible=False)]
    assert schedule(c, q, NOW, policy(), once).preemptions == ()
    high = [dataclasses.replace(running[0], priority=10)]
    assert schedule(c, q, NOW, policy(), high).preemptions == ()


def test_starving_jobs_are_left_to_their_reservation() -> None:
    nodes, q, running = long_and_burst(shorts=1)
    old = [dataclasses.replace(q[0], submitted_at=NOW - 5 * HOUR)]  # past starvation_s (4 h)
    assert schedule(cluster(*nodes), old, NOW, policy(), running).preemptions == ()


def test_a_job_that_needs_another_gpu_type_is_no_taker() -> None:
    nodes, _, running = long_and_burst()
    q = [job("h", 2, timed(0.1 * HOUR, gpu_type=H100), at=NOW - 60.0)]
    assert schedule(cluster(*nodes), q, NOW, policy(), running).preemptions == ()


def test_knobs_are_validated() -> None:
    with pytest.raises(ValueError, match="preempt_long"):
        QueuePolicy(preempt_long_gain=-1.0)
    with pytest.raises(ValueError, match="preempt_long"):
        QueuePolicy(preempt_long_ratio=0.5)


# ----- the simulator acts on it ---------------------------------------------------------


def _spec() -> ClusterSpec:
    return parse_cluster({"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8, "name_prefix": "h100"}]})


def _trace() -> list[TraceJob]:
    # a 32B job that holds the only node for hours, and a short one an hour later
    return [
        TraceJob("long", 0.0, "qwen2.5-32b", 2048, 64, 400_000_000, 8),
        TraceJob("short", HOUR, "qwen2.5-32b", 2048, 64, 2_000_000, 8),
    ]


def test_simulator_stops_the_long_job_which_resumes_from_its_progress() -> None:
    base = Simulator(_spec(), _trace(), make_policy("frenzy-nostop"), runtime_noise=0.0).run()
    stop = Simulator(_spec(), _trace(), make_policy("frenzy"), runtime_noise=0.0).run()
    by = {r.job_id: r for r in base.jobs}
    got = {r.job_id: r for r in stop.jobs}
    assert base.restarts == 0 and stop.restarts == 1
    assert by["long"].finish_s > 2 * HOUR  # (long enough to be worth stopping)
    assert got["short"].first_start_s == HOUR  # at once, not after long
    assert got["long"].restarts == 1 and got["short"].restarts == 0
    # long loses nothing of its hour: it ends later by short's run and the 120 s restart
    short_run = got["short"].finish_s - got["short"].first_start_s
    assert got["long"].finish_s == pytest.approx(by["long"].finish_s + short_run + 120.0, abs=1e-6)
    assert sum(r.jct_s for r in stop.jobs) < sum(r.jct_s for r in base.jobs)


# ----- a job stopped again after a while of its run (preempt_long_every_s) -------------------


def test_a_stopped_job_is_spent_unless_it_may_be_stopped_again_after_every_s_of_its_run() -> None:
    nodes, q, running = long_and_burst()
    c = cluster(*nodes)
    # stopped once before and resumed 2 h ago (started_at is this attempt's start)
    once = [dataclasses.replace(running[0], stops=1)]
    assert schedule(c, q, NOW, policy(), once).preemptions == ()  # default: once per job
    assert schedule(c, q, NOW, policy(preempt_long_every_s=3 * HOUR), once).preemptions == ()  # ran 2 h < 3 h
    again = schedule(c, q, NOW, policy(preempt_long_every_s=HOUR), once)  # ran 2 h >= 1 h
    assert again.preemptions == (Preemption("long", "s0", 0.0),)
    # the operator's word still holds, and the named variant is the same knob
    pinned = [dataclasses.replace(once[0], preemptible=False)]
    assert schedule(c, q, NOW, policy(preempt_long_every_s=HOUR), pinned).preemptions == ()
    assert QueuePolicy.named("frenzy-restop").preempt_long_every_s == HOUR
    assert not QueuePolicy.named("frenzy-restop").preempt_long_pairs  # (as it was measured)
    assert QueuePolicy.frenzy().preempt_long_every_s == 0.0
    with pytest.raises(ValueError, match="preempt_long_every_s"):
        QueuePolicy(preempt_long_every_s=-1.0)


def test_the_just_started_rule_never_stops_a_job_stopped_before() -> None:
    # (the live store may mark a job stopped once preemptible and count its stops instead)
    nodes = [owned_node("a", "new", NOW + 3 * HOUR)]
    q = [job("s", 2, timed(0.1 * HOUR, dp=8), at=NOW - 10.0)]
    fresh = RunningJob("new", started_at=NOW - 20.0, submitted_at=NOW - 20.0)
    pol = QueuePolicy.named("frenzy-completion", explain=False)
    assert schedule(cluster(*nodes), q, NOW, pol, [fresh]).preemptions != ()
    stopped = dataclasses.replace(fresh, stops=1)
    assert schedule(cluster(*nodes), q, NOW, pol, [stopped]).preemptions == ()


def _trace_two_bursts() -> list[TraceJob]:
    # a long job, then a short one at 1 h and another at 2.5 h (1.5 h into its resumed run)
    return [*_trace(), TraceJob("short2", 2.5 * HOUR, "qwen2.5-32b", 2048, 64, 2_000_000, 8)]


def test_simulator_stops_a_long_job_again_only_with_every_s() -> None:
    once = Simulator(_spec(), _trace_two_bursts(), make_policy("frenzy"), runtime_noise=0.0).run()
    again = Simulator(_spec(), _trace_two_bursts(), make_policy("frenzy-restop"), runtime_noise=0.0).run()
    one = {r.job_id: r for r in once.jobs}
    two = {r.job_id: r for r in again.jobs}
    assert one["long"].restarts == 1 and two["long"].restarts == 2
    assert two["short2"].first_start_s == 2.5 * HOUR  # at once, the long job stopped again
    assert one["short2"].first_start_s > 2.5 * HOUR  # waits: the long job was spent
    assert two["short2"].jct_s < one["short2"].jct_s



# ----- two jobs stopped together for a job that needs both's GPUs (preempt_long_pairs) -------


def split_pool() -> tuple[list[NodeView], list[QueuedJob], list[RunningJob]]:
    """Two 8-GPU jobs hold the two A100 nodes for 3 h more; a 16-GPU job of 0.1 h waits."""
    nodes = [owned_node("a", "x", NOW + 3 * HOUR), owned_node("b", "y", NOW + 3 * HOUR)]
    q = [job("wide", 2, timed(0.1 * HOUR, dp=16), at=NOW - 60.0)]
    running = [RunningJob(v, started_at=NOW - 2 * HOUR, submitted_at=NOW - 2 * HOUR) for v in ("x", "y")]
    return nodes, q, running


def test_two_jobs_are_stopped_together_only_with_pairs() -> None:
    nodes, q, running = split_pool()
    c = cluster(*nodes)
    single = policy(preempt_long_pairs=False)
    assert schedule(c, q, NOW, single, running).preemptions == ()  # no one job frees 16 GPUs
    res = schedule(c, q, NOW, policy(preempt_long_pairs=True), running)
    assert sorted(p.job_id for p in res.preemptions) == ["x", "y"]
    assert all(p.for_job == "wide" and p.lost_s == 0.0 for p in res.preemptions)
    assert [p.job_id for p in res.placements] == ["wide"]
    assert sorted(res.placements[0].gpus()) == [(n, i) for n in ("a", "b") for i in range(8)]
    # the default since the tuning split (docs/simulator.md); frenzy-single is the one before
    assert QueuePolicy.frenzy().preempt_long_pairs and not QueuePolicy.named("frenzy-single").preempt_long_pairs


def test_a_pair_is_stopped_only_when_the_gain_covers_both_delays() -> None:
    nodes, q, running = split_pool()
    # a 0.5 h job of 16 GPUs gains ~3 h (the pool frees in 3 h); each victim is delayed by
    # 0.5 h + 120 s, so the pair costs 2 x 0.53 h = 1.07 h: stopped at gain 2 (2.13 h < 3 h),
    # not at gain 3 (3.2 h), though one victim's delay alone (1.6 h at gain 3) would pass
    half = [dataclasses.replace(q[0], plans=(timed(0.5 * HOUR, dp=16),))]
    c = cluster(*nodes)
    assert schedule(c, half, NOW, policy(preempt_long_pairs=True), running).preemptions != ()
    assert schedule(c, half, NOW, policy(preempt_long_pairs=True, preempt_long_gain=3.0), running).preemptions == ()
    # a job that needs one victim's GPUs only is the single stop's, not a reason to stop two
    one = [job("narrow", 2, timed(0.1 * HOUR, dp=8), at=NOW - 60.0)]
    res = schedule(c, one, NOW, policy(preempt_long_pairs=True), running)
    assert len(res.preemptions) == 1
