"""Objectives, deadlines and budgets over ranked plans (issue 35): what a plan costs in dollars,
which plans a job's limits drop (with the reason for each), and the order the objective gives
the rest. Pure: plans in, plans out; no numpy, no I/O.

For a plan *p* with ``n_t`` GPUs of each type *t* (one type, or two for a mixed plan), a predicted
step time ``s_p`` and ``N`` optimizer steps (SkyPilot's optimizer writes its objectives the same
way, ``sky/optimizer.py``; docs/cost.md)::

    T_p   = N * s_p                                  runtime_s (Plan.completion_s), seconds
    GPUh_p = (sum_t n_t) * T_p / 3600                Plan.gpu_hours
    $_p   = (sum_t n_t * price_t) * T_p / 3600       cost_usd; price_t per GPU-hour (price_table)

    feasible(p) = T_p <= deadline  and  $_p <= budget          (each limit only when set)
    time:       the planner's own order (soonest completion; near-ties by GPU-hours)
    cost:       min $_p, then T_p, then GPU count
    gpu-hours:  min GPUh_p, then GPU count, then T_p

Unlike SkyPilot, which ranks by cost *or* time and takes no limit, a deadline and a budget drop
plans before the objective orders the rest (Sailor's "min cost s.t. throughput" shape). The
deadline counts from submission; the planner knows no queue wait, so ``T_p`` is a lower bound on
the finish (HAS keeps the deadline while the job waits, issue 35 part B).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from marp.errors import MarpError
from marp.prices import LIST_PRICES

if TYPE_CHECKING:
    from marp.plans import Plan

OBJECTIVES: tuple[str, ...] = ("time", "cost", "gpu-hours")
MAX_DEADLINE_S = 10 * 366 * 86400.0  # ten years: any longer is a typo, and keeps datetimes sane
MAX_BUDGET_USD = 1e12
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?\s*[dhms]\s*)+")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
DURATION_EXAMPLES = "e.g. 12h, 90m, 1h30m or 2d"


def parse_duration(value: object, field: str = "deadline") -> float:
    """A duration in seconds: text with units ("12h", "90m", "1h30m", "1.5d", "45s") or a number of
    seconds (a JSON / YAML value). Refused, naming ``field``: no unit, zero, negative, over ten years."""
    if isinstance(value, bool):
        raise MarpError(field, f"must be a duration, {DURATION_EXAMPLES}; got {value!r}.")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"[+-]?\d+(\.\d+)?", text):
            raise MarpError(field, f"{value!r} has no unit; write {DURATION_EXAMPLES}.")
        if text.startswith("-"):
            raise MarpError(field, f"must be positive, got {value!r}.")
        if not _DURATION.fullmatch(text):
            raise MarpError(field, f"{value[:64]!r} is not a duration; write {DURATION_EXAMPLES}.")
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    else:
        raise MarpError(field, f"must be a duration, {DURATION_EXAMPLES}; got a {type(value).__name__}.")
    if not math.isfinite(seconds) or seconds <= 0:
        raise MarpError(field, f"must be a positive duration, got {value!r}.")
    if seconds > MAX_DEADLINE_S:
        raise MarpError(field, f"{value!r} is over ten years; write {DURATION_EXAMPLES}.")
    return seconds


def parse_budget(value: object, field: str = "budget") -> float:
    """Dollars: a positive number, as a number or text ("250", "$250", "1e3")."""
    amount: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        amount = float(value)
    elif isinstance(value, str):
        try:
            amount = float(value.strip().removeprefix("$").replace(",", ""))
        except ValueError:
            amount = None
    if amount is None:
        raise MarpError(field, f"must be a number of dollars (e.g. 250 or $250), got {value!r}.")
    if not math.isfinite(amount) or amount <= 0:
        raise MarpError(field, f"must be a positive number of dollars, got {value!r}.")
    if amount > MAX_BUDGET_USD:
        raise MarpError(field, f"must be at most {MAX_BUDGET_USD:.0e} dollars, got {value!r}.")
    return amount


def format_duration(seconds: float) -> str:
    """Short and readable: "45 s", "90 min", "14.2 h", "3.1 d"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@dataclass(frozen=True)
class Goal:
    """What a job optimises and the limits its plan must meet. None: no such limit."""

    objective: str = "time"
    deadline_s: float | None = None
    budget_usd: float | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise MarpError("objective", f"must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}.")
        if self.deadline_s is not None:
            object.__setattr__(self, "deadline_s", parse_duration(self.deadline_s))
        if self.budget_usd is not None:
            object.__setattr__(self, "budget_usd", parse_budget(self.budget_usd))

    @property
    def is_default(self) -> bool:
        """Time, no deadline, no budget: the ranking of before issue 35."""
        return self.objective == "time" and self.deadline_s is None and self.budget_usd is None

    def describe(self) -> str:
        """ "cheapest first, within 12.0 h and $250.00" (the plan table's title). """
        order = {"time": "fastest completion first", "cost": "cheapest first",
                 "gpu-hours": "fewest GPU-hours first"}[self.objective]  # fmt: skip
        limits = []
        if self.deadline_s is not None:
            limits.append(f"finishing within {format_duration(self.deadline_s)}")
        if self.budget_usd is not None:
            limits.append(f"costing at most ${self.budget_usd:,.2f}")
        return order + (", " + " and ".join(limits) if limits else "")


def price_table(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """GPU type -> dollars per GPU-hour: the catalog's list prices, with ``overrides`` (a cluster
    file's ``price_per_gpu_hour``, by catalog name) on top. Refuses a negative or non-finite price."""
    prices = {name: p.usd_per_gpu_hour for name, p in LIST_PRICES.items()}
    for name, price in (overrides or {}).items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
            raise MarpError("price_per_gpu_hour", f"{name}: must be a number of dollars >= 0, got {price!r}.")
        prices[name] = float(price)
    return prices


def plan_cost(plan: Plan, prices: Mapping[str, float]) -> float:
    """$_p: every GPU type's GPUs x its price x the runtime, in dollars (0 for a type without a price)."""
    per_hour = sum(n * prices.get(t, 0.0) for t, n in plan.gpus_by_type.items())
    return per_hour * plan.completion_s / 3600.0


@dataclass(frozen=True)
class Dropped:
    """A plan a limit dropped, and why ("8x L4: finishes in 14.2 h > the deadline 12.0 h")."""

    plan: Plan
    reason: str
    cost_usd: float


@dataclass
class GoalResult:
    """The plans that meet the goal, in its order and ranked 1..n, and the dropped ones."""

    plans: list[Plan] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


def _why(plan: Plan, cost: float, goal: Goal) -> str:
    parts = []
    if goal.deadline_s is not None and plan.completion_s > goal.deadline_s:
        parts.append(f"finishes in {format_duration(plan.completion_s)} > the deadline "
                     f"{format_duration(goal.deadline_s)}")  # fmt: skip
    if goal.budget_usd is not None and cost > goal.budget_usd:
        parts.append(f"costs ${cost:,.2f} > the budget ${goal.budget_usd:,.2f}")
    return "; ".join(parts)


def _label(plan: Plan) -> str:
    return " + ".join(f"{n}x {t}" for t, n in plan.gpus_by_type.items())


def apply_goal(plans: Iterable[Plan], goal: Goal, prices: Mapping[str, float]) -> GoalResult:
    """Drop the plans over the deadline or budget (each with its reason), order the rest by the
    objective (``time``: the order given, the planner's) and number them 1..n."""
    kept: list[tuple[Plan, float]] = []
    dropped: list[Dropped] = []
    for p in plans:
        cost = plan_cost(p, prices)
        why = _why(p, cost, goal)
        if why:
            dropped.append(Dropped(p, f"{_label(p)}: {why}", cost))
        else:
            kept.append((p, cost))
    if goal.objective == "cost":
        kept.sort(key=lambda pc: (pc[1], pc[0].completion_s, pc[0].num_gpus))
    elif goal.objective == "gpu-hours":
        kept.sort(key=lambda pc: (pc[0].gpu_hours, pc[0].num_gpus, pc[0].completion_s))
    return GoalResult([replace(p, rank=i + 1) for i, (p, _) in enumerate(kept)], dropped)


def unmet_text(dropped: list[Dropped], goal: Goal, deadline_flag: str = "deadline",
               budget_flag: str = "budget") -> str:  # fmt: skip
    """Why no plan is left, and the smallest limit that would keep one ("To fix: ...")."""
    if not dropped:
        return "no plan to rank."
    lines = [f"no plan meets the {' and the '.join(_limits(goal))}:"]
    fixes = []
    if goal.deadline_s is not None:
        fastest = min(dropped, key=lambda d: d.plan.completion_s)
        lines.append(f"the fastest plan, {_label(fastest.plan)}, needs {format_duration(fastest.plan.completion_s)}")
        if fastest.plan.completion_s > goal.deadline_s:
            fixes.append(f"raise {deadline_flag} to at least {_ceil_duration(fastest.plan.completion_s)}")
    if goal.budget_usd is not None:
        cheapest = min(dropped, key=lambda d: d.cost_usd)
        lines.append(f"the cheapest, {_label(cheapest.plan)}, costs ${cheapest.cost_usd:,.2f}")
        if cheapest.cost_usd > goal.budget_usd:
            fixes.append(f"raise {budget_flag} to at least ${math.ceil(cheapest.cost_usd * 100) / 100:,.2f}")
    if goal.deadline_s is not None and goal.budget_usd is not None and len(fixes) < 2:
        fixes.append(f"raise {deadline_flag} or {budget_flag} (no plan is both fast and cheap enough)")
    return (lines[0] + " " + "; ".join(lines[1:]) + ".\nTo fix: " + ", or ".join(fixes)
            + ", or allow more GPUs or GPU types.")


def _limits(goal: Goal) -> list[str]:
    out = []
    if goal.deadline_s is not None:
        out.append(f"deadline ({format_duration(goal.deadline_s)})")
    if goal.budget_usd is not None:
        out.append(f"budget (${goal.budget_usd:,.2f})")
    return out


def _ceil_duration(seconds: float) -> str:
    """A flag value just above ``seconds``: whole minutes under 2 h, else whole hours ("15h")."""
    if seconds < 2 * 3600:
        return f"{math.ceil(seconds / 60)}m"
    return f"{math.ceil(seconds / 3600)}h"


__all__ = ["OBJECTIVES", "Dropped", "Goal", "GoalResult", "apply_goal", "format_duration", "parse_budget",
           "parse_duration", "plan_cost", "price_table", "unmet_text"]
