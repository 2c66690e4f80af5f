"""place_job: plan walk, node choice (best fit, TP groups, fewest nodes), filters, reasons."""

from __future__ import annotations

import pytest
from unit.has.has_builders import A100, H100, L4, GiB, cluster, free_node, node, plan

from has import ClusterView, PendingReason, Placement, PlanOption, WaitKind, place_job


def placed(result: Placement | PendingReason) -> Placement:
    assert isinstance(result, Placement), result
    return result


def pending(result: Placement | PendingReason) -> PendingReason:
    assert isinstance(result, PendingReason), result
    return result


# ----- single node ---------------------------------------------------------


def test_single_node_best_fit_picks_tightest_node() -> None:
    c = cluster(free_node("n-a", 8), free_node("n-b", 4), free_node("n-c", 6), free_node("n-d", 2))
    p = placed(place_job(c, "j", [plan(dp=4)]))
    assert p.nodes == (("n-b", (0, 1, 2, 3)),)
    # Five GPUs: n-b is too small now, n-c (6) is tighter than n-a (8).
    p = placed(place_job(c, "j", [plan(dp=5)]))
    assert [n for n, _ in p.nodes] == ["n-c"]


def test_single_node_tie_breaks_by_name() -> None:
    c = cluster(free_node("z", 4), free_node("m", 4), free_node("b", 8))
    assert placed(place_job(c, "j", [plan(dp=4)])).nodes[0][0] == "m"


def test_single_node_preferred_over_split_even_if_split_is_tighter() -> None:
    c = cluster(free_node("a", 8), free_node("b", 4), free_node("c", 4))
    p = placed(place_job(c, "j", [plan(dp=8)]))
    assert p.nodes == (("a", tuple(range(8))),)


# ----- tensor-parallel groups ---------------------------------------------------


def test_tp_group_never_split_across_nodes() -> None:
    c = cluster(free_node("a", 2), free_node("b", 2))
    r = pending(place_job(c, "j", [plan(tp=4)]))
    assert "TP group" in r.per_plan[0]
    # The same four GPUs work when groups are 2 wide: one group per node.
    p = placed(place_job(c, "j", [plan(tp=2, dp=2)]))
    assert p.nodes == (("a", (0, 1)), ("b", (0, 1)))


def test_node_share_is_multiple_of_tp() -> None:
    # 3 free on each node; tp=2 can only use 2 of each.
    c = cluster(free_node("a", 3), free_node("b", 3), free_node("c", 3))
    p = placed(place_job(c, "j", [plan(tp=2, dp=3)]))
    assert all(len(idx) % 2 == 0 for _, idx in p.nodes)
    assert p.gpu_count == 6 and len(p.nodes) == 3
    r = pending(place_job(c, "j", [plan(tp=2, dp=4)]))
    assert "only 6 of them form whole 2-GPU TP groups" in r.summary


def test_tp_wider_than_any_node_says_so() -> None:
    c = cluster(free_node("a", 4, n=4))
    r = pending(place_job(c, "j", [plan(tp=8)]))
    assert "exceeds the largest A100-80GB node (4 GPUs)" in r.summary


# ----- several nodes -------------------------------------------------------------


def test_multi_node_uses_fewest_nodes() -> None:
    c = cluster(*(free_node(f"s{i}", 4) for i in range(4)), free_node("b1", 8), free_node("b2", 8))
    p = placed(place_job(c, "j", [plan(dp=16)]))
    assert sorted(n for n, _ in p.nodes) == ["b1", "b2"]


def test_multi_node_prefers_equal_split() -> None:
    # 12 GPUs in groups of 2: 8+4 would also be 2 nodes, but 6+6 is even.
    c = cluster(free_node("a", 8), free_node("b", 8), free_node("c", 6))
    p = placed(place_job(c, "j", [plan(tp=2, dp=6)]))
    assert [(n, len(i)) for n, i in p.nodes] == [("a", 6), ("c", 6)]


def test_multi_node_unequal_gives_remainder_to_best_fit() -> None:
    # 10 GPUs, tp=2: 5 per node is not a whole number of groups, so 8 + best-fit 2.
    c = cluster(free_node("a", 8), free_node("b", 4), free_node("c", 2))
    p = placed(place_job(c, "j", [plan(tp=2, dp=5)]))
    assert [(n, len(i)) for n, i in p.nodes] == [("a", 8), ("c", 2)]
    assert p.gpus()[0] == ("a", 0)  # rank 0 on the largest share


# ----- filters ---------------------------------------------------------------------


def test_memory_free_filter_skips_gpus_with_foreign_processes() -> None:
    # GPUs 0-3 are free but 70 GiB of each is held by a process Frenzy did not start.
    busy_mem = {i: 10 * GiB for i in range(4)}
    c = cluster(node("a", mem_free=busy_mem))
    p = placed(place_job(c, "j", [plan(dp=4, gib=40)]))
    assert p.nodes == (("a", (4, 5, 6, 7)),)
    r = pending(place_job(c, "j", [plan(dp=6, gib=40)]))
    assert "4 more free A100-80GB skipped: < 40.0 GiB free memory" in r.summary
    # A small need still uses them.
    assert placed(place_job(c, "j", [plan(dp=8, gib=5)])).gpu_count == 8


def test_unhealthy_dead_and_draining_are_skipped() -> None:
    c = cluster(
        node("a-dead", alive=False),
        node("b-drain", draining=True),
        node("c-sick", unhealthy=range(6)),
        free_node("d-ok", 3),
    )
    p = placed(place_job(c, "j", [plan(dp=2)]))
    assert p.nodes == (("c-sick", (6, 7)),)
    # 2 + 3 usable GPUs: 4 fit split evenly, 6 do not although 24 more sit on bad nodes.
    assert [(n, len(i)) for n, i in placed(place_job(c, "j", [plan(dp=4)])).nodes] == [
        ("c-sick", 2),
        ("d-ok", 2),
    ]
    r = pending(place_job(c, "j", [plan(dp=6)]))
    assert "largest free: 3 × A100-80GB on d-ok; 5 free in total" in r.summary
    assert c.free_summary() == {A100: {"c-sick": 2, "d-ok": 3}}
    assert c.gpu_types() == {A100}


def test_gpu_type_must_match() -> None:
    c = cluster(free_node("a", 8, gpu_type=L4))
    r = pending(place_job(c, "j", [plan(H100)]))
    assert "no schedulable H100-80GB GPUs in the cluster" in r.summary


# ----- plan walk and reasons ---------------------------------------------------


def test_plan_fallback_uses_second_plan() -> None:
    c = cluster(free_node("a", 8, gpu_type=L4), free_node("b", 2))
    plans = [plan(A100, dp=4, gib=60), plan(L4, tp=2, dp=2, gib=20), plan(A100, dp=1)]
    p = placed(place_job(c, "j", plans))
    assert p.plan_index == 1 and p.plan == plans[1]
    assert p.nodes == (("a", (0, 1, 2, 3)),)


def test_first_feasible_plan_wins_even_if_later_is_tighter() -> None:
    c = cluster(free_node("a", 8))
    p = placed(place_job(c, "j", [plan(dp=8), plan(dp=1)]))
    assert p.plan_index == 0


def test_pending_reason_has_the_numbers() -> None:
    c = cluster(free_node("node-1", 1), free_node("node-3", 2), free_node("node-2", 1))
    bpg = int(38.2 * GiB)
    plans = [PlanOption(A100, tp=2, pp=1, dp=2, bytes_per_gpu=bpg), plan(H100, dp=4)]
    r = pending(place_job(c, "j", plans))
    assert r.summary.startswith(
        "needs 4 × ≥38.2 GiB A100-80GB (tp=2 pp=1 dp=2, 2-GPU TP groups within a node)"
    )
    assert "largest free: 2 × A100-80GB on node-3" in r.summary
    assert "4 free in total" in r.summary
    assert "1 fallback plan" in r.summary
    assert len(r.per_plan) == 2
    assert r.per_plan[1].startswith("plan 1: needs 4 × ≥10.0 GiB H100-80GB")
    assert r.kind is WaitKind.NO_FIT


def test_empty_plan_list_says_so() -> None:
    r = pending(place_job(cluster(free_node("a", 8)), "j", []))
    assert "no resource plans" in r.summary and r.per_plan == ()
    assert r.kind is WaitKind.NO_PLANS


# ----- data types -------------------------------------------------------------------


def test_plan_and_placement_validate() -> None:
    with pytest.raises(ValueError):
        plan(tp=0)
    with pytest.raises(ValueError):
        Placement("j", 0, plan(tp=2, dp=2), (("a", (0, 1, 2)), ("b", (0,))))
    assert plan(tp=2, pp=2, dp=3).num_gpus == 12


def test_with_reserved_removes_gpus_and_refuses_double_booking() -> None:
    c = cluster(free_node("a", 8), free_node("b", 8, gpu_type=L4))
    p = placed(place_job(c, "j1", [plan(dp=6)]))
    c2 = c.with_reserved(p)
    assert c2.free_summary() == {A100: {"a": 2}, L4: {"b": 8}}
    assert c.free_summary()[A100] == {"a": 8}  # the original view is untouched
    assert c2.node("a").gpus[0].owner == "j1"
    with pytest.raises(ValueError, match="not free"):
        c2.with_reserved(p)
    # Reserving the rest empties the type's index but keeps the type known.
    c3 = c2.with_reserved(placed(place_job(c2, "j2", [plan(dp=2)])))
    assert c3.free_count(A100) == 0 and c3.gpu_types() == {A100, L4}
    assert pending(place_job(c3, "j3", [plan()])).summary.endswith(
        "largest free: none (A100-80GB free: 0 with enough memory)"
    )


def test_capacity_counts_memory_total_and_whole_tp_groups() -> None:
    small = node("a", n=4, busy=(0, 1))  # 80 GiB each, two busy
    big = ClusterView([small, node("b", L4, n=8, busy=range(8))])
    assert big.capacity_groups(A100, 50 * GiB, 1) == 4  # busy GPUs count: they free up later
    assert big.capacity_groups(A100, 50 * GiB, 4) == 1
    assert big.capacity_groups(A100, 81 * GiB, 1) == 0
    assert big.capacity_groups(L4, 20 * GiB, 2) == 4 and big.capacity_groups(L4, 25 * GiB, 2) == 0
    assert big.capacity_groups(H100, 1, 1) == 0
    # Memo keyed by memory level: a different need in the same band gives the same answer.
    assert big.capacity_groups(A100, 10 * GiB, 4) == big.capacity_groups(A100, 70 * GiB, 4) == 1
