"""``has.sim.scale``: the states decision time is measured on (bench/has_decision.py and
``frenzy simulate --decision-sizes``), and the timing of each policy's decision on them."""

from __future__ import annotations

import pytest

from has.sim.engine import SimView
from has.sim.scale import MAX_GPUS, MIN_GPUS, build_state, cluster_of, time_decisions


@pytest.mark.parametrize("gpus", [100, 1000, 10_000])
def test_cluster_of_has_about_that_many_gpus_of_four_types(gpus: int) -> None:
    spec = cluster_of(gpus)
    total = sum(n["count"] * n["gpus_per_node"] for n in spec["nodes"])
    assert abs(total - gpus) <= 8  # whole nodes
    assert [n["gpu"] for n in spec["nodes"]] == ["H100-80GB", "A100-80GB", "A100-40GB", "L4"]


def test_state_is_about_60_percent_busy_with_the_queue_waiting_and_deterministic() -> None:
    sim, now = build_state(64, seed=3, queued=30)
    busy = len(sim.owner) / sim.total_gpus
    assert 0.4 <= busy <= 0.75, busy
    assert len(sim.queue) == 30 and all(j.startswith("q-") for j in sim.queue)
    assert all(j.startswith("run-") for j in sim.running)
    again, _ = build_state(64, seed=3, queued=30)
    assert again.owner == sim.owner and list(again.queue) == list(sim.queue)
    assert SimView(sim, now).cluster.free_count() == sim.total_gpus - len(sim.owner)


@pytest.mark.parametrize(("gpus", "queued"), [(MIN_GPUS - 1, 10), (MAX_GPUS + 1, 10), (64, -1)])
def test_bad_sizes_are_refused_naming_the_value(gpus: int, queued: int) -> None:
    with pytest.raises(ValueError, match=str(gpus if queued >= 0 else queued)):
        build_state(gpus, seed=0, queued=queued)


def test_time_decisions_times_every_policy_on_the_same_unchanged_state() -> None:
    seen: list[str] = []
    rows = time_decisions(["frenzy", "opportunistic"], [32, 64], queued=25, reps=3, progress=seen.append)
    assert [(r["policy"], r["reps"]) for r in rows] == [("frenzy", 3), ("opportunistic", 3)] * 2
    assert sorted({r["gpus"] for r in rows}) == sorted({build_state(g, 0, 0)[0].total_gpus for g in (32, 64)})
    for r in rows:
        assert r["decision_ms_median"] > 0 and r["queued_jobs"] == 25
    # the decisions were not applied: each policy started the same jobs on the same state
    frenzy = [r for r in rows if r["policy"] == "frenzy"]
    assert all(r["started"] >= 1 for r in frenzy)
    assert len(seen) == len(rows) and "GPUs, frenzy:" in seen[0]


def test_a_slow_policy_gets_fewer_reps_within_the_budget() -> None:
    rows = time_decisions(["frenzy"], [32], queued=10, reps=50, budget_s=0.0)
    assert rows[0]["reps"] == 1  # at least one decision, then the budget stops it
