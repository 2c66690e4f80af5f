"""marp.objectives and marp.prices (issue 35): every catalog GPU has a price with its source, a plan's
dollars, the deadline and budget dropping plans with their reason, and the objective's order."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import marp
from marp.objectives import (
    Goal,
    apply_goal,
    format_duration,
    parse_budget,
    parse_duration,
    plan_cost,
    price_table,
    unmet_text,
)
from marp.prices import LIST_PRICES


@dataclass(frozen=True)
class FakePlan:
    """What objectives reads of a marp.Plan: its GPUs by type, runtime, GPU-hours and rank."""

    gpus_by_type: dict[str, int]
    completion_s: float
    rank: int = 0
    name: str = ""
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus_by_type.values())

    @property
    def gpu_hours(self) -> float:
        return self.num_gpus * self.completion_s / 3600


PRICES = {"A100-80GB": 3.0, "L4": 0.5, "H100-80GB": 7.0}
H = 3600.0


def test_every_catalog_gpu_has_a_list_price_with_source_and_date() -> None:
    for gpu in marp.list_gpus():
        price = LIST_PRICES[gpu.name]
        assert gpu.price_per_gpu_hour == price.usd_per_gpu_hour > 0
        assert price.source and len(price.as_of) == 7 and price.as_of.startswith("202")
        assert gpu.to_dict()["price_per_gpu_hour"] == price.usd_per_gpu_hour
    # The figures (on-demand, 2025-26).
    assert {n: LIST_PRICES[n].usd_per_gpu_hour for n in ("H100-80GB", "A100-80GB", "L40S", "L4", "T4")} == {
        "H100-80GB": 6.88, "A100-80GB": 3.43, "L40S": 1.86, "L4": 0.81, "T4": 0.53}


def test_price_table_overrides_and_refuses_bad_prices() -> None:
    table = price_table({"L4": 0.25})
    assert table["L4"] == 0.25 and table["A100-80GB"] == 3.43
    assert price_table({"L4": 0})["L4"] == 0.0  # owned hardware may be free
    for bad in (-1.0, float("nan"), float("inf"), True, "3"):
        with pytest.raises(marp.MarpError, match="price_per_gpu_hour"):
            price_table({"L4": bad})  # type: ignore[dict-item]


def test_plan_cost_is_gpus_times_price_times_runtime() -> None:
    assert plan_cost(FakePlan({"A100-80GB": 4}, 2 * H), PRICES) == pytest.approx(4 * 3.0 * 2)
    mixed = FakePlan({"A100-80GB": 4, "L4": 16}, 0.5 * H)
    assert plan_cost(mixed, PRICES) == pytest.approx((4 * 3.0 + 16 * 0.5) * 0.5)
    assert plan_cost(FakePlan({"T4": 2}, H), PRICES) == 0.0  # no price known: free, not an error


@pytest.mark.parametrize(("text", "seconds"), [("12h", 12 * H), ("90m", 5400), ("1h30m", 5400), ("2d", 172800),
                                               ("45s", 45), ("1.5h", 5400), (" 12H ", 12 * H), (3600, 3600),
                                               (90.5, 90.5)])  # fmt: skip
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("value", "needle"), [("12", "has no unit"), ("-3h", "must be positive"),
                                               ("12x", "is not a duration"), ("", "is not a duration"),
                                               (0, "positive"), (-5, "positive"), (True, "must be a duration"),
                                               ("99999d", "over ten years"), (None, "must be a duration")])  # fmt: skip
def test_bad_durations_name_the_field_and_what_is_wrong(value: object, needle: str) -> None:
    with pytest.raises(marp.MarpError, match=needle) as err:
        parse_duration(value, "--deadline")
    assert str(err.value).startswith("--deadline: ")


def test_budgets() -> None:
    assert parse_budget("250") == parse_budget("$250") == parse_budget(250) == 250.0
    assert parse_budget("1,000.50") == 1000.5
    for bad, needle in ((-5, "positive"), ("-5", "positive"), (0, "positive"), ("abc", "number of dollars"),
                        (float("nan"), "positive"), (True, "number of dollars"), (1e13, "at most")):
        with pytest.raises(marp.MarpError, match=needle) as err:
            parse_budget(bad, "--budget")
        assert str(err.value).startswith("--budget: ")


def test_goal_validates_its_fields() -> None:
    assert Goal().is_default and not Goal("cost").is_default and not Goal(deadline_s=60).is_default
    assert Goal(deadline_s="12h").deadline_s == 12 * H  # type: ignore[arg-type]
    with pytest.raises(marp.MarpError, match="objective"):
        Goal("money")
    with pytest.raises(marp.MarpError, match="budget"):
        Goal(budget_usd=-1)
    assert Goal("cost", 12 * H, 250).describe() == "cheapest first, finishing within 12.0 h and costing at most $250.00"


# Ranked as the planner ranks by time: fastest first.
FAST = FakePlan({"H100-80GB": 8}, 2 * H, rank=1, name="fast")  # $112, 16 GPU-h
MID = FakePlan({"A100-80GB": 4}, 6 * H, rank=2, name="mid")  # $72, 24 GPU-h
SLOW = FakePlan({"L4": 4}, 20 * H, rank=3, name="slow")  # $40, 80 GPU-h: the cheapest, and too slow for 12 h


def _names(plans: list) -> list[str]:
    return [p.name for p in plans]


def test_time_keeps_the_planners_order_and_cost_orders_by_dollars() -> None:
    plans = [FAST, MID, SLOW]
    assert _names(apply_goal(plans, Goal(), PRICES).plans) == ["fast", "mid", "slow"]
    assert _names(apply_goal(plans, Goal("cost"), PRICES).plans) == ["slow", "mid", "fast"]
    assert _names(apply_goal(plans, Goal("gpu-hours"), PRICES).plans) == ["fast", "mid", "slow"]
    ranked = apply_goal(plans, Goal("cost"), PRICES).plans
    assert [p.rank for p in ranked] == [1, 2, 3]


def test_a_cheaper_but_too_slow_plan_is_dropped_with_its_reason() -> None:
    got = apply_goal([FAST, MID, SLOW], Goal("cost", deadline_s=12 * H), PRICES)
    assert _names(got.plans) == ["mid", "fast"] and [p.rank for p in got.plans] == [1, 2]
    (dropped,) = got.dropped
    assert dropped.plan is SLOW and dropped.cost_usd == pytest.approx(40.0)
    assert dropped.reason == "4x L4: finishes in 20.0 h > the deadline 12.0 h"


def test_a_budget_drops_the_dear_plans_and_both_reasons_show() -> None:
    got = apply_goal([FAST, MID, SLOW], Goal("time", budget_usd=80), PRICES)
    assert _names(got.plans) == ["mid", "slow"]
    assert [d.reason for d in got.dropped] == ["8x H100-80GB: costs $112.00 > the budget $80.00"]
    both = apply_goal([SLOW], Goal("cost", deadline_s=H, budget_usd=10), PRICES)
    assert both.dropped[0].reason == "4x L4: finishes in 20.0 h > the deadline 60 min; costs $40.00 > the budget $10.00"


def test_when_nothing_is_left_the_message_names_the_limit_that_would_keep_a_plan() -> None:
    goal = Goal("cost", deadline_s=H)
    got = apply_goal([FAST, MID, SLOW], goal, PRICES)
    assert got.plans == []
    text = unmet_text(got.dropped, goal, "--deadline", "--budget")
    assert "no plan meets the deadline (60 min)" in text and "the fastest plan, 8x H100-80GB, needs 2.0 h" in text
    assert "To fix: raise --deadline to at least 2h" in text
    goal = Goal(budget_usd=5)
    text = unmet_text(apply_goal([FAST, MID, SLOW], goal, PRICES).dropped, goal, "--deadline", "--budget")
    assert "the cheapest, 4x L4, costs $40.00" in text and "raise --budget to at least $40.00" in text


def test_format_duration() -> None:
    assert [format_duration(s) for s in (45, 5400, 12 * H, 3 * 86400)] == ["45 s", "90 min", "12.0 h", "3.0 d"]


def test_real_plans_are_priced_by_their_gpu_type() -> None:
    model = marp.get_model("gpt2-124m")
    recipe = marp.TrainingRecipe(seq_len=256, global_batch=8)
    plans = marp.enumerate_plans(model, recipe, [marp.GpuPool("L4", 4, 4), marp.GpuPool("A100-80GB", 4, 4)]).plans
    prices = price_table()
    for p in plans:
        assert plan_cost(p, prices) == pytest.approx(p.gpu_hours * prices[p.gpu_type])
    cheapest = apply_goal(plans, Goal("cost"), prices).plans
    costs = [plan_cost(p, prices) for p in cheapest]
    assert costs == sorted(costs)
