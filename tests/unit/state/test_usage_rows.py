"""Usage accounting's pure part (issue 35): entries as the stream stores them, sums per group, budget
periods and the budget check."""

from __future__ import annotations

import datetime as dt

import pytest

from frenzy.state.usage import usage_prices_lua
from frenzy.state.usage_rows import (
    ALL,
    Budget,
    Spent,
    UsageEntry,
    aggregate,
    budget_refusal,
    check_groups,
    day_index,
    period_bounds,
    spent_in,
)
from marp.prices import LIST_PRICES

T0 = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC).timestamp()  # a Wednesday


def entry(job: str, user: str, gpu_type: str = "A100-80GB", gpus: int = 2, hours: float = 1.0, price: float = 3.43,
          attempt: int = 1, end: float = T0) -> UsageEntry:
    return UsageEntry(job=job, user=user, attempt=attempt, gpu_type=gpu_type, gpus=gpus, price=price,
                      start=end - hours * 3600, end=end, gpu_hours=gpus * hours, cost_usd=gpus * hours * price)


def test_an_entry_reads_as_the_stream_stores_it() -> None:
    e = UsageEntry.from_fields({"job": "job-1", "user": "alice", "attempt": "2", "gpu_type": "L4", "gpus": "4",
                                "price": "0.81", "start": "100.5", "end": "3700.5", "gpu_hours": "4",
                                "cost_usd": "3.24", "name": "sweep", "outcome": "succeeded"})
    assert (e.attempt, e.gpus, e.gpu_hours, e.cost_usd, e.name) == (2, 4, 4.0, 3.24, "sweep")
    assert e.day == "1970-01-01"
    broken = UsageEntry.from_fields({"gpu_hours": "nan", "cost_usd": "x"})
    assert (broken.gpu_hours, broken.cost_usd, broken.user) == (0.0, 0.0, "")


def test_aggregate_sums_per_group() -> None:
    entries = [entry("j1", "alice"), entry("j1", "alice", attempt=2, hours=0.5),
               entry("j2", "alice", gpu_type="L4", gpus=4, price=0.81),
               entry("j3", "bob", end=T0 + 86400)]
    by_user = aggregate(entries, ["user"])
    assert [(r["user"], r["gpu_type"], r["attempts"]) for r in by_user] == [("alice", ALL, 3), ("bob", ALL, 1)]
    assert by_user[0]["gpu_hours"] == pytest.approx(2 + 1 + 4)
    assert by_user[0]["cost_usd"] == pytest.approx(3 * 3.43 + 4 * 0.81)
    default = aggregate(entries)  # user and type
    assert [(r["user"], r["gpu_type"]) for r in default] == [("alice", "A100-80GB"), ("alice", "L4"),
                                                            ("bob", "A100-80GB")]
    by_type = aggregate(entries, ["type"])
    assert {r["gpu_type"]: r["gpu_hours"] for r in by_type} == pytest.approx({"A100-80GB": 5.0, "L4": 4.0})
    by_day = aggregate(entries, ["day"])
    assert [(r["day"], r["user"]) for r in by_day] == [("2026-11-25", ALL), ("2026-11-26", ALL)]
    by_job = aggregate(entries, ["job"])
    assert {r["job"]: r["attempts"] for r in by_job} == {"j1": 2, "j2": 1, "j3": 1}
    assert aggregate([], ["user"]) == []
    # The total is the same whatever the grouping.
    for by in (["user"], ["type"], ["day"], ["job"], ["user", "type", "day"]):
        assert sum(r["cost_usd"] for r in aggregate(entries, by)) == pytest.approx(3 * 3.43 + 4 * 0.81 + 2 * 3.43)


def test_groups_are_checked() -> None:
    assert check_groups([]) == ("user", "type")
    assert check_groups(["User", "gpu_type", "user"]) == ("user", "type")
    with pytest.raises(ValueError, match="unknown grouping 'node'"):
        check_groups(["node"])


def test_periods_are_utc_calendar_ones() -> None:
    day = period_bounds("day", T0)
    assert day == (dt.datetime(2026, 11, 25, tzinfo=dt.UTC).timestamp(), dt.datetime(2026, 11, 26, tzinfo=dt.UTC).timestamp())
    week = period_bounds("week", T0)
    assert week == (dt.datetime(2026, 11, 23, tzinfo=dt.UTC).timestamp(), dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp())
    month = period_bounds("month", T0)
    assert month == (dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp(), dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp())
    assert period_bounds("month", dt.datetime(2026, 12, 31, 23, tzinfo=dt.UTC).timestamp())[1] == \
        dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()
    with pytest.raises(ValueError, match="period"):
        period_bounds("year", T0)


def test_spent_sums_the_days_of_the_period() -> None:
    today = day_index(T0)
    fields = {f"{today}|h": "1.5", f"{today}|usd": "5", f"{today - 1}|h": "2", f"{today - 1}|usd": "7",
              f"{today - 3}|h": "100", "junk": "1", f"{today}|other": "9"}
    start, end = period_bounds("week", T0)  # Monday: two days back
    assert spent_in(fields, day_index(start), day_index(end) - 1) == Spent(3.5, 12.0)
    assert spent_in(fields, today, today) == Spent(1.5, 5.0)


def test_budget_refusal() -> None:
    b = Budget(gpu_hours=1.0, period="week")
    assert budget_refusal("carol", b, Spent(0.5, 9), Spent(), Spent(0.4, 9), T0) is None
    why = budget_refusal("carol", b, Spent(0.5, 0), Spent(), Spent(0.6, 0), T0)
    assert why is not None and why.startswith("budget: user 'carol' has used 0.50 of 1.00 GPU-hours this week")
    assert "needs at least 0.60" in why and "To fix:" in why and "2026-11-30 00:00 UTC" in why
    # Used up: refused even for a job predicted to need nothing.
    assert budget_refusal("carol", b, Spent(1.0, 0), Spent(), Spent(0, 0), T0) is not None
    dollars = Budget(usd=10.0, period="day")
    assert budget_refusal("d", dollars, Spent(100, 4), Spent(), Spent(100, 5), T0) is None  # hours unlimited
    assert "--usd N" in (budget_refusal("d", dollars, Spent(0, 6), Spent(), Spent(0, 5), T0) or "")


def test_budget_is_checked_and_round_trips() -> None:
    b = Budget(gpu_hours=2.5, usd=0, period="month")
    assert Budget.from_json(b.to_json()) == b and b.limited and not Budget().limited
    for bad in ({"gpu_hours": -1}, {"usd": float("nan")}, {"period": "fortnight"}, {"usd": 1e13}):
        with pytest.raises(ValueError):
            Budget(**bad)  # type: ignore[arg-type]


def test_the_lua_price_table_is_the_catalogs() -> None:
    text = usage_prices_lua()
    for name, price in LIST_PRICES.items():
        assert f'["{name}"] = {price.usd_per_gpu_hour!r}' in text
    assert "USAGE_RETENTION_S = " in text
