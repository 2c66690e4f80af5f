"""Deadlines and dollars in the simulator (issue 35): the trace's deadline_s and objective columns,
the seeded rule that draws them (``has.sim.traces.with_goals``), and every policy's deadline misses
and dollars (GPU-hours held x the type's price per GPU-hour, ``marp.prices`` or the cluster file's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from unit.has.test_has_sim import SMALL

from has.cluster_spec import parse_cluster
from has.sim.baselines import BASELINE_NAMES, make_policy
from has.sim.engine import ProfileBook, Simulator, gpu_prices
from has.sim.results import JobOutcome, SimResult
from has.sim.traces import TraceError, force_objective, read_trace, synthetic, with_goals, write_trace
from marp.prices import list_price

POLICIES = ("frenzy", "frenzy-paper", "frenzy-blind", *BASELINE_NAMES)


@pytest.fixture(scope="module")
def book() -> ProfileBook:
    return ProfileBook(SMALL)


def test_goals_are_drawn_per_job_and_leave_the_jobs_as_they_were(tmp_path: Path) -> None:
    plain = synthetic(30, seed=4)
    drawn = synthetic(30, seed=4, deadline_share=0.5, cost_share=0.3)
    assert [dataclasses.replace(j, deadline_s=None, objective="time") for j in drawn] == plain
    with_deadline = [j for j in drawn if j.deadline_s is not None]
    assert 5 <= len(with_deadline) <= 25 and all(j.deadline_s > 0 for j in with_deadline)
    assert {j.objective for j in drawn} == {"time", "cost"}
    # the same rule for any trace: a job's draw depends on the seed and its id only
    assert with_goals(plain[10:], 4, 0.5, 0.3) == drawn[10:]
    # the columns round-trip; a trace without them is written as before
    write_trace(drawn, tmp_path / "g.csv")
    assert read_trace(tmp_path / "g.csv") == [dataclasses.replace(j, origin=f"g.csv:{j.job_id}") for j in drawn]
    assert "deadline_s" not in write_trace(plain)
    assert {j.objective for j in force_objective(drawn, "cost")} == {"cost"}
    text = write_trace(drawn).replace(",cost\n", ",dollars\n", 1)
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(TraceError, match="field objective"):
        read_trace(tmp_path / "bad.csv")


def test_prices_are_the_list_prices_under_the_cluster_files() -> None:
    spec = parse_cluster({"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8, "price_per_gpu_hour": 1.8},
                                    {"gpu": "L4", "count": 1, "gpus_per_node": 4}]})  # fmt: skip
    prices = gpu_prices(spec)
    assert prices["A100-80GB"] == 1.8 and prices["L4"] == list_price("L4")


def test_misses_and_dollars_are_counted_from_what_happened() -> None:
    jobs = [JobOutcome("a", 0.0, 0.0, 100.0, deadline_s=150.0, gpu_hours=2.0, cost_usd=5.0),
            JobOutcome("b", 0.0, 0.0, 200.0, deadline_s=150.0, gpu_hours=1.0, cost_usd=1.0),
            JobOutcome("c", 0.0, None, None, deadline_s=1e9),  # unfinished: missed
            JobOutcome("d", 0.0, 0.0, 50.0)]  # fmt: skip
    m = SimResult("p", 8, jobs, [], [(0.0, 0)], 0, 0, []).metrics()
    assert (m["deadline_jobs"], m["deadline_misses"]) == (3, 2)
    assert m["deadline_miss_rate"] == pytest.approx(2 / 3)
    assert (m["gpu_hours"], m["cost_usd"]) == (3.0, 6.0)


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_reports_deadline_misses_and_dollars(name: str, book: ProfileBook) -> None:
    jobs = synthetic(12, seed=5, jobs_per_hour=30.0, median_gpu_hours=2.0, deadline_share=0.7, cost_share=0.5)
    sim = Simulator(SMALL, jobs, make_policy(name), profiles=book)
    res = sim.run()
    m = res.metrics()
    assert m["deadline_jobs"] == sum(1 for j in jobs if j.deadline_s is not None) > 0
    assert 0 <= m["deadline_misses"] <= m["deadline_jobs"]
    # every GPU-hour a job held is charged at its type's price: the busy timeline's area is the same
    area = sum(busy * (t1 - t0) for (t0, busy), (t1, _) in zip(res.busy_timeline, res.busy_timeline[1:], strict=False))
    assert m["gpu_hours"] == pytest.approx(area / 3600.0, rel=1e-6)
    prices = gpu_prices(SMALL)
    assert m["cost_usd"] > 0
    assert min(prices.values()) * m["gpu_hours"] <= m["cost_usd"] <= max(prices.values()) * m["gpu_hours"]
    for o in res.jobs:
        assert (o.deadline_s is None) == (dict((j.job_id, j.deadline_s) for j in jobs)[o.job_id] is None)


def test_frenzy_spends_less_with_cost_objectives_at_no_more_misses(book: ProfileBook) -> None:
    jobs = synthetic(30, seed=2, jobs_per_hour=8.0, median_gpu_hours=2.0, deadline_share=0.6)
    runs = {o: Simulator(SMALL, force_objective(jobs, o), make_policy("frenzy"), profiles=book).run().metrics()
            for o in ("time", "cost")}  # fmt: skip
    assert runs["cost"]["cost_usd"] < runs["time"]["cost_usd"]
    assert runs["cost"]["deadline_misses"] <= runs["time"]["deadline_misses"]
