"""Mixed plans in the scheduling pass (issue 33): a plan over several GPU types is placed when each
type's share fits on nodes of its type, all in one placement, by the same ranked / ranked-wait rule
as single-type plans; ``frenzy-single-type`` skips it and says so."""

from __future__ import annotations

import dataclasses

from unit.has.has_builders import A100, L4, GiB, cluster, free_node, job, node, plan

from has import NodeView, PlanOption, PlanPart, QueuedJob, QueuePolicy, WaitKind, schedule

A10G = "A10G"


def fragmented(a100_free: int = 2):
    """examples/clusters/fragmented.yaml: 1 node of 2 A100, 2 of 4 L4, 2 of 4 A10G."""
    return cluster(free_node("a100-0", a100_free, n=2), free_node("l4-0", 4, n=4, gpu_type=L4),
                   free_node("l4-1", 4, n=4, gpu_type=L4), free_node("a10g-0", 4, n=4, gpu_type=A10G),
                   free_node("a10g-1", 4, n=4, gpu_type=A10G))


def pipeline(runtime: float = 100.0, a100_gib: float = 61.0) -> PlanOption:
    """2 A100 (stage 0) + 8 L4 (stages 1-4), tp 2: MARP's best plan for Llama-2-13B there."""
    parts = (PlanPart(0, A100, 2, 2, int(a100_gib * GiB)),
             *(PlanPart(s, L4, 2, 2, 17 * GiB) for s in range(1, 5)))
    return PlanOption(f"{A100}+{L4}", 2, 5, 1, 17 * GiB, runtime_s=runtime, parts=parts)


def test_a_mixed_plan_is_placed_whole_each_stage_on_nodes_of_its_type():
    view = fragmented()
    result = schedule(view, [job("j", 1, pipeline())], 0.0, QueuePolicy.frenzy())
    (p,) = result.placements
    assert p.plan.parts and p.plan_index == 0
    # rank 0's node runs stage 0; the L4 stages fill l4-0 then l4-1, two stages (TP groups) a node
    assert p.nodes == (("a100-0", (0, 1)), ("l4-0", (0, 1, 2, 3)), ("l4-1", (0, 1, 2, 3)))
    assert p.parts == ((0, 0), (1, 1, 2, 2), (3, 3, 4, 4))
    kinds = {n.name: n.gpus[0].gpu_type for n in view.nodes}
    for (name, _), parts in zip(p.nodes, p.parts, strict=True):
        assert all(p.plan.parts[k].gpu_type == kinds[name] for k in parts)
    assert sorted(t for t, _ in p.by_type()) == [A100, L4]


def test_a_mixed_plan_waits_until_every_type_fits_and_a_later_job_still_backfills():
    view = fragmented(a100_free=1)  # one A100 busy: the A100 share (a TP group of 2) does not fit
    small = job("small", 2, plan(L4, dp=4, gib=10))
    result = schedule(view, [job("big", 1, pipeline()), small], 0.0, QueuePolicy.frenzy())
    assert [p.job_id for p in result.placements] == ["small"]
    why = result.pending["big"]
    assert why.kind is WaitKind.NO_FIT  # not "never fits": each type could hold its share
    assert "mixed plan" in why.summary and f"its share needs 2 × ≥61.0 GiB {A100}" in why.summary


def test_nothing_is_double_booked_by_two_mixed_jobs():
    view = fragmented()
    result = schedule(view, [job("a", 1, pipeline()), job("b", 2, pipeline())], 0.0, QueuePolicy.frenzy())
    assert [p.job_id for p in result.placements] == ["a"]
    taken = [g for p in result.placements for g in p.gpus()]
    assert len(taken) == len(set(taken)) == 10


def test_single_type_policy_skips_mixed_plans_and_says_so():
    view = fragmented()
    policy = QueuePolicy.named("frenzy-single-type")
    assert not policy.mixed_plans and QueuePolicy.frenzy().mixed_plans
    result = schedule(view, [job("j", 1, pipeline())], 0.0, policy)
    assert not result.placements
    assert "mixed plans are off (policy frenzy-single-type): it would fit now" in result.pending["j"].summary
    assert result.pending["j"].kind is WaitKind.NO_FIT


def test_ranked_order_holds_a_better_ranked_single_plan_first_and_a_fallback_mixed_plan_after():
    view = fragmented()
    single = plan(A100, dp=2, gib=40)
    single = PlanOption(single.gpu_type, 1, 1, 2, single.bytes_per_gpu, runtime_s=50.0)
    first = schedule(view, [job("j", 1, single, pipeline())], 0.0, QueuePolicy.frenzy())
    assert first.placements[0].plan_index == 0 and not first.placements[0].plan.parts
    # mixed ranked first: taken when it fits now
    second = schedule(view, [job("j", 1, pipeline(), single)], 0.0, QueuePolicy.frenzy())
    assert second.placements[0].plan_index == 0 and second.placements[0].plan.parts


def test_ranked_wait_waits_for_a_much_faster_single_plan_whose_gpus_free_soon():
    # 2 busy A100 free in 10 s; the job's best plan (2 A100, 50 s) is ranked first, the mixed plan
    # (1000 s) fits now: waiting finishes in 60 s, far sooner, so the job waits (the same rule)
    a100 = node("a100-0", A100, 2, busy=(0, 1))
    busy = [dataclasses.replace(g, free_at=10.0) for g in a100.gpus]
    view = cluster(NodeView(name="a100-0", gpus=tuple(busy)), free_node("a100-1", 2, n=2),
                   free_node("l4-0", 4, n=4, gpu_type=L4), free_node("l4-1", 4, n=4, gpu_type=L4))
    fast = PlanOption(A100, 2, 1, 2, 40 * GiB, runtime_s=50.0)  # 4 A100: two busy ones needed
    result = schedule(view, [job("j", 1, fast, pipeline(runtime=1000.0))], 0.0, QueuePolicy.frenzy())
    assert not result.placements and "waiting for" in result.pending["j"].summary
    # with a mixed plan close enough (within wait_slack) it starts now on the mix
    result = schedule(view, [job("j", 1, fast, pipeline(runtime=62.0))], 0.0, QueuePolicy.frenzy())
    assert result.placements and result.placements[0].plan.parts


def test_no_mixed_plans_no_change_to_the_pass():
    view = fragmented()
    queue = [job(f"j{i}", i, plan(L4, dp=2 + i % 3, gib=10), plan(A10G, dp=2, gib=10)) for i in range(8)]
    for name in ("frenzy", "frenzy-ranked", "frenzy-completion", "frenzy-paper"):
        on = schedule(view, queue, 0.0, QueuePolicy.named(name))
        off = schedule(view, queue, 0.0, QueuePolicy.named(name, mixed_plans=False))
        assert on == off


def test_a_plan_part_must_be_whole_tp_groups_and_add_up():
    import pytest
    with pytest.raises(ValueError):
        PlanPart(0, L4, 3, 2, GiB)
    with pytest.raises(ValueError):
        PlanOption(f"{A100}+{L4}", 2, 2, 1, GiB, parts=(PlanPart(0, A100, 2, 2, GiB),))
    assert isinstance(job("j", 1, pipeline()), QueuedJob)
