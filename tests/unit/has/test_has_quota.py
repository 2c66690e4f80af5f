"""The per-user GPU quota at placement (issue 34 item 4): ``QueuePolicy.max_gpus_per_user``.

Before it, the quota was checked only at submission, so a user capped at 2 GPUs whose jobs were
all admitted while they held none ended up holding 6 at once. Now no placement takes a user over
the quota, counting what the user holds (``schedule``'s ``held``) and what the pass itself places.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from unit.has.has_builders import A100, cluster, free_node, node, plan

from has import PlanChoice, QueuedJob, QueuePolicy, RunningJob, WaitKind, schedule


def ujob(job_id: str, seq: int, user: str, *plans, at: float = 0.0, priority: int = 0) -> QueuedJob:  # noqa: ANN002
    return QueuedJob(job_id=job_id, seq=seq, submitted_at=at, plans=tuple(plans), priority=priority, user=user)


POLICIES = [QueuePolicy(), QueuePolicy.frenzy(), QueuePolicy.named("frenzy-completion"),
            QueuePolicy.named("frenzy-ranked"), QueuePolicy(backfill=False)]


@pytest.mark.parametrize("base", POLICIES, ids=lambda p: f"{p.order}-{p.plan_choice}-{p.backfill}")
def test_a_user_capped_at_2_never_gets_more_than_2(base: QueuePolicy) -> None:
    c = cluster(free_node("a", 8), free_node("b", 8))
    q = [ujob(f"a{i}", i, "alice", plan()) for i in range(6)]
    q += [ujob("b0", 10, "bob", plan(dp=2))]
    policy = dataclasses.replace(base, max_gpus_per_user=2)
    res = schedule(c, q, 0.0, policy)
    alice = [p for p in res.placements if p.job_id.startswith("a")]
    assert sum(p.plan.num_gpus for p in alice) == 2
    assert any(p.job_id == "b0" for p in res.placements)  # one user's quota is not another's
    for job_id in ("a2", "a3", "a4", "a5"):
        why = res.pending[job_id]
        if why.kind is WaitKind.BEHIND_HEAD:  # strict FIFO: behind a job that waits
            continue
        assert why.kind is WaitKind.OVER_QUOTA
        assert "alice" in why.summary and "holds 2 GPUs" in why.summary and "limit is 2" in why.summary


def test_gpus_already_held_count_and_the_pass_waits_with_the_reason() -> None:
    c = cluster(free_node("a", 8))
    q = [ujob("a0", 1, "alice", plan(dp=2)), ujob("b0", 2, "bob", plan(dp=2))]
    res = schedule(c, q, 0.0, QueuePolicy(max_gpus_per_user=4), held={"alice": 3, "bob": 2})
    assert [p.job_id for p in res.placements] == ["b0"]
    why = res.pending["a0"]
    assert why.kind is WaitKind.OVER_QUOTA and "holds 3 GPUs" in why.summary and "needs 2" in why.summary
    # Without a quota, what users hold is not read.
    res = schedule(c, q, 0.0, QueuePolicy(), held={"alice": 3, "bob": 2})
    assert sorted(p.job_id for p in res.placements) == ["a0", "b0"]


def test_a_job_takes_a_smaller_plan_that_fits_its_users_room() -> None:
    c = cluster(free_node("a", 8))
    big, small = plan(dp=4), plan(dp=1)
    res = schedule(c, [ujob("a0", 1, "alice", big, small)], 0.0, QueuePolicy(max_gpus_per_user=2), held={"alice": 1})
    (p,) = res.placements
    assert p.plan_index == 1 and p.plan == small  # its index among the job's own plans


def test_an_over_quota_job_holds_nothing_for_itself_even_when_starving() -> None:
    # alice's starving job would hold the free GPUs for itself; over her quota it must not.
    c = cluster(node("a", n=8, busy=range(4), owner="alice-run"))
    q = [ujob("a-old", 1, "alice", plan(dp=8), at=-10_000.0), ujob("b0", 2, "bob", plan(dp=2))]
    res = schedule(c, q, 0.0, QueuePolicy(starvation_s=60.0, max_gpus_per_user=8), held={"alice": 4})
    assert res.reservation is None and res.blocked_by is None
    assert [p.job_id for p in res.placements] == ["b0"]
    assert res.pending["a-old"].kind is WaitKind.OVER_QUOTA


def test_a_cut_job_that_holds_names_its_own_plan() -> None:
    c = cluster(node("a", n=8, busy=range(6), owner="x"))
    big, mid = plan(dp=8), plan(dp=4)
    q = [ujob("a-old", 1, "alice", big, mid, at=-10_000.0)]
    res = schedule(c, q, 0.0, QueuePolicy(starvation_s=60.0, max_gpus_per_user=4))
    assert res.reservation is not None and res.blocked_by == "a-old"
    assert res.reservation.plan_index == 1 and res.reservation.plan == mid


def test_preemption_never_places_a_job_over_the_quota() -> None:
    # A just-started long job of bob's; alice's much shorter job would preempt it, but alice is
    # at her quota: no preemption.
    h = 3600.0
    c = cluster(node("a", n=4, busy=range(4), owner="bob-long"))
    gpus = [g for n in c.nodes for g in n.gpus]
    c = cluster(dataclasses.replace(c.nodes[0], gpus=tuple(dataclasses.replace(g, free_at=10 * h) for g in gpus)))
    short = dataclasses.replace(plan(dp=4), runtime_s=60.0)
    q = [ujob("a-short", 2, "alice", short, at=-5.0)]
    running = [RunningJob("bob-long", -10.0, -10.0)]
    policy = QueuePolicy.named("frenzy-completion")
    assert schedule(c, q, 0.0, policy, running).preemptions  # without a quota it preempts
    capped = dataclasses.replace(policy, max_gpus_per_user=4)
    assert not schedule(c, q, 0.0, capped, running, held={"alice": 2}).preemptions
    assert schedule(c, q, 0.0, capped, running, held={"alice": 0}).preemptions


def test_a_quota_as_large_as_the_cluster_changes_no_decision() -> None:
    rng = random.Random(7)
    for _ in range(60):
        nodes = [free_node(f"n{i}", rng.randint(0, 8)) for i in range(rng.randint(1, 5))]
        c = cluster(*nodes)
        q = [ujob(f"j{i}", i, rng.choice(["alice", "bob", "carol"]),
                  *[plan(A100, tp=rng.choice([1, 2]), dp=rng.randint(1, 4)) for _ in range(rng.randint(1, 3))],
                  at=-rng.uniform(0, 1000)) for i in range(rng.randint(1, 12))]
        for base in POLICIES:
            plain = schedule(c, q, 0.0, base)
            capped = schedule(c, q, 0.0, dataclasses.replace(base, max_gpus_per_user=10_000), held={"alice": 1})
            assert capped == plain


def test_random_passes_keep_every_user_within_the_quota() -> None:
    rng = random.Random(11)
    for _ in range(200):
        nodes = [free_node(f"n{i}", rng.randint(0, 8)) for i in range(rng.randint(1, 5))]
        c = cluster(*nodes)
        users = ["alice", "bob", "carol"]
        quota = rng.randint(1, 8)
        held = {u: rng.randint(0, quota) for u in users}
        q = [ujob(f"j{i}", i, rng.choice(users),
                  *[plan(A100, tp=rng.choice([1, 2]), dp=rng.randint(1, 4)) for _ in range(rng.randint(1, 3))],
                  at=-rng.uniform(0, 1000)) for i in range(rng.randint(1, 12))]
        by_id = {j.job_id: j for j in q}
        for base in POLICIES:
            res = schedule(c, q, 0.0, dataclasses.replace(base, max_gpus_per_user=quota, starvation_s=300.0), held=held)
            total = dict(held)
            for p in res.placements:
                j = by_id[p.job_id]
                assert j.plans[p.plan_index] == p.plan
                total[j.user] += p.plan.num_gpus
            assert all(total[u] <= max(quota, held[u]) for u in users), (quota, held, total)
            assert set(res.pending) | {p.job_id for p in res.placements} == set(by_id)


def test_the_quota_is_checked() -> None:
    with pytest.raises(ValueError, match="max_gpus_per_user"):
        QueuePolicy(max_gpus_per_user=-1)
    assert QueuePolicy.frenzy().max_gpus_per_user == 0 and PlanChoice  # (no quota unless given)
