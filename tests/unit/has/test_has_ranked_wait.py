"""PlanChoice.RANKED_WAIT: MARP's first plan that fits now, unless waiting for a better-ranked
plan's busy GPUs finishes more than ``wait_slack`` sooner (the simulator's ``frenzy``).

The case it is for (docs/simulator.md, "Pollux 5 / paper-64"): a 13B job whose only free plan
is 16 slow GPUs for hours, while the fast GPUs it ranks first free in minutes."""

from __future__ import annotations

import dataclasses

import pytest
from unit.has.has_builders import A100, H100, L4, MEM, cluster, free_node, job, plan

from has import GpuSlot, NodeView, PlanChoice, PlanOption, QueuePolicy, schedule
from has.sim.baselines import POLICY_NAMES, make_policy

NOW = 1_000_000.0


def timed(gpu_type: str, runtime_s: float, dp: int = 4) -> PlanOption:
    return dataclasses.replace(plan(gpu_type, dp=dp), runtime_s=runtime_s)


def busy_until(name: str, gpu_type: str, free_at: float, n: int = 4) -> NodeView:
    """A node whose GPUs are all held by one running job until (estimated) ``free_at``."""
    gpus = tuple(GpuSlot(name, i, gpu_type, MEM[gpu_type], 1 << 30, "running", True, free_at) for i in range(n))
    return NodeView(name, gpus)


def policy(choice: PlanChoice = PlanChoice.RANKED_WAIT, **kw: object) -> QueuePolicy:
    return QueuePolicy.frenzy(plan_choice=choice, explain=False, **kw)  # type: ignore[arg-type]


def fast_busy_slow_free(h100_free_in_s: float) -> object:
    """Four H100s busy for ``h100_free_in_s`` more seconds, four L4s free."""
    return cluster(busy_until("h", H100, NOW + h100_free_in_s), free_node("l", 4, n=4, gpu_type=L4))


# MARP's order: the H100 plan (35 min) first, the L4 plan (7 h) after it.
FAST, SLOW = timed(H100, 2_100.0), timed(L4, 25_200.0)


def test_ranked_takes_the_slow_plan_ranked_wait_waits_for_the_fast_one() -> None:
    c = fast_busy_slow_free(600.0)
    q = [job("j", 1, FAST, SLOW, at=NOW - 10.0)]
    ranked = schedule(c, q, NOW, policy(PlanChoice.RANKED))
    assert [(p.job_id, p.plan.gpu_type) for p in ranked.placements] == [("j", L4)]
    waited = schedule(c, q, NOW, policy())
    assert waited.placements == ()
    # 600 s + 2,100 s on the H100s vs 25,200 s on the L4s now
    assert waited.pending["j"].summary.startswith("waiting for")
    assert "2700 s vs 25200 s" in waited.pending["j"].summary


def test_starts_the_slower_plan_when_waiting_gains_less_than_the_slack() -> None:
    # the H100s free in 6 h: 6 h + 35 min waiting vs 7 h now, within 20 %: start now
    c = fast_busy_slow_free(6 * 3600.0)
    res = schedule(c, [job("j", 1, FAST, SLOW, at=NOW - 10.0)], NOW, policy())
    assert [(p.job_id, p.plan.gpu_type) for p in res.placements] == [("j", L4)]
    # with no slack at all the same wait is worth it
    res = schedule(c, [job("j", 1, FAST, SLOW, at=NOW - 10.0)], NOW, policy(wait_slack=0.0))
    assert res.placements == ()


def test_at_exactly_the_slack_it_starts_now() -> None:
    # waiting: 1,000 + 1,000 s; now: 2,400 s = 1.2 x 2,000: not more than wait_slack later
    c = fast_busy_slow_free(1_000.0)
    q = [job("j", 1, timed(H100, 1_000.0), timed(L4, 2_400.0), at=NOW)]
    res = schedule(c, q, NOW, policy(wait_slack=0.2))
    assert [p.plan.gpu_type for p in res.placements] == [L4]


def test_first_ranked_plan_free_now_is_taken_as_ranked_does() -> None:
    # a faster plan ranked *after* the free one is no reason to wait: MARP's order stands
    c = cluster(free_node("h", 4, n=4, gpu_type=H100), busy_until("l", L4, NOW + 10.0))
    q = [job("j", 1, timed(H100, 5_000.0), timed(L4, 100.0), at=NOW)]
    for choice in (PlanChoice.RANKED, PlanChoice.RANKED_WAIT):
        res = schedule(c, q, NOW, policy(choice))
        assert [(p.job_id, p.plan_index) for p in res.placements] == [("j", 0)]


def test_a_waiting_job_claims_the_release_so_the_next_one_does_not_count_on_it() -> None:
    # Both jobs would rather wait 600 s for the H100s than run 5,000 s on the L4s. The first
    # claims the H100s until 600 + 2,100 s; the second would get them only then (2,700 +
    # 2,100 = 4,800 s, x 1.2 > 5,000 s), so it starts on the L4s now.
    c = fast_busy_slow_free(600.0)
    slow = timed(L4, 5_000.0)
    q = [job("a", 1, FAST, slow, at=NOW - 20.0), job("b", 2, FAST, slow, at=NOW - 10.0)]
    res = schedule(c, q, NOW, policy())
    assert [(p.job_id, p.plan.gpu_type) for p in res.placements] == [("b", L4)]
    assert res.pending["a"].summary.startswith("waiting for")


@pytest.mark.parametrize(("h100_free_in_s", "waits_for"), [(5_000.0, A100), (1_000.0, H100)])
def test_it_waits_for_the_better_ranked_plan_that_finishes_first(h100_free_in_s: float, waits_for: str) -> None:
    # plan 0: H100s, 1,000 s once free; plan 1: A100s (free in 500 s), 1,500 s; plan 2: L4s now,
    # 20,000 s. H100s free in 5,000 s: the A100 plan finishes first (2,000 s). Free in 1,000 s:
    # both finish at 2,000 s, and the tie goes to the better-ranked plan.
    c = cluster(busy_until("h", H100, NOW + h100_free_in_s), busy_until("a", A100, NOW + 500.0),
                free_node("l", 4, n=4, gpu_type=L4))  # fmt: skip
    q = [job("j", 1, timed(H100, 1_000.0), timed(A100, 1_500.0), timed(L4, 20_000.0), at=NOW)]
    res = schedule(c, q, NOW, policy())
    assert res.placements == ()
    summary = res.pending["j"].summary
    assert summary.startswith("waiting for 4 ") and f"{waits_for} (tp=1" in summary.split(":")[0]
    assert "2000 s vs 20000 s" in summary


def test_untimed_plans_fall_back_to_ranked() -> None:
    c = fast_busy_slow_free(600.0)
    q = [job("j", 1, plan(H100, dp=4), plan(L4, dp=4), at=NOW)]
    res = schedule(c, q, NOW, policy())
    assert [p.plan.gpu_type for p in res.placements] == [L4]


def test_nothing_fits_now_waits_as_ranked_does() -> None:
    c = cluster(busy_until("h", H100, NOW + 600.0), busy_until("l", L4, NOW + 60.0))
    q = [job("j", 1, FAST, SLOW, at=NOW)]
    for choice in (PlanChoice.RANKED, PlanChoice.RANKED_WAIT):
        res = schedule(c, q, NOW, policy(choice))
        assert res.placements == () and "j" in res.pending


def test_the_option_is_a_string_enum_and_the_simulators_default() -> None:
    assert QueuePolicy(plan_choice="ranked-wait").plan_choice is PlanChoice.RANKED_WAIT
    with pytest.raises(ValueError, match="ranked-wait"):
        QueuePolicy(plan_choice="ranked-wiat")
    assert make_policy("frenzy").queue_policy.plan_choice is PlanChoice.RANKED_WAIT  # type: ignore[union-attr]
    assert "frenzy-ranked" in POLICY_NAMES
    assert make_policy("frenzy-ranked").queue_policy.plan_choice is PlanChoice.RANKED  # type: ignore[union-attr]
