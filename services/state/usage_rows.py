"""Usage accounting, the pure part (issue 35): what an ended attempt's usage entry says, the sums
``frenzy usage`` and ``GET /api/usage`` show, budget periods, and whether a submission fits a budget.

No Redis and no clock it does not take as an argument: ``frenzy.state.usage`` reads the entries
``lua/lib/usage_record.lua`` writes (one per GPU type of an attempt) and hands them here.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

GROUPS = ("user", "type", "day", "job")  # what `--by` may name
DEFAULT_GROUPS = ("user", "type")
ALL = "*"  # a row's value for a dimension it does not group by
PERIODS = ("day", "week", "month")
MAX_BUDGET = 1e12  # dollars or GPU-hours
_EPS = 1e-9


@dataclass(frozen=True)
class UsageEntry:
    """What one GPU type of one ended attempt used: ``gpus`` GPUs from ``start`` (its reservation)
    to ``end``, at ``price`` dollars per GPU-hour (the price in force then)."""

    job: str
    user: str
    attempt: int
    gpu_type: str
    gpus: int
    price: float
    start: float
    end: float
    gpu_hours: float
    cost_usd: float
    name: str = ""
    outcome: str = ""

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> UsageEntry:
        """An entry as the usage stream stores it (every value a string)."""
        return cls(job=f.get("job", ""), user=f.get("user", ""), attempt=int(_num(f.get("attempt"))),
                   gpu_type=f.get("gpu_type", ""), gpus=int(_num(f.get("gpus"))), price=_num(f.get("price")),
                   start=_num(f.get("start")), end=_num(f.get("end")), gpu_hours=_num(f.get("gpu_hours")),
                   cost_usd=_num(f.get("cost_usd")), name=f.get("name", ""), outcome=f.get("outcome", ""))

    @property
    def day(self) -> str:
        """The UTC date the attempt ended (an attempt is charged to the day it ends)."""
        return utc_day(self.end)


def _num(text: str | None) -> float:
    try:
        value = float(text or 0)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def utc_day(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).date().isoformat()


def check_groups(by: Iterable[str]) -> tuple[str, ...]:
    """``by`` checked and deduplicated, in the order given (empty: user and type). ValueError naming
    the first unknown one."""
    out: list[str] = []
    for g in by:
        name = g.strip().lower()
        if name == "gpu_type":
            name = "type"
        if name not in GROUPS:
            raise ValueError(f"unknown grouping {g!r}; one of {', '.join(GROUPS)}")
        if name not in out:
            out.append(name)
    return tuple(out) or DEFAULT_GROUPS


def aggregate(entries: Iterable[UsageEntry], by: Sequence[str] = DEFAULT_GROUPS) -> list[dict[str, Any]]:
    """Sum GPU-hours and dollars per group. Every row has ``user`` and ``gpu_type`` ("*" where it does
    not group by them), ``day`` / ``job`` when it groups by them, ``gpu_hours``, ``cost_usd`` and
    ``attempts`` (the attempts that contributed). Rows sorted by their group values."""
    groups = check_groups(by)
    sums: dict[tuple[str, ...], list[Any]] = {}
    for e in entries:
        values = {"user": e.user, "type": e.gpu_type, "day": e.day, "job": e.job}
        key = tuple(values[g] for g in groups)
        acc = sums.setdefault(key, [0.0, 0.0, set()])
        acc[0] += e.gpu_hours
        acc[1] += e.cost_usd
        acc[2].add((e.job, e.attempt))
    rows = []
    for key in sorted(sums):
        h, usd, attempts = sums[key]
        named = dict(zip(groups, key, strict=True))
        row: dict[str, Any] = {"user": named.get("user", ALL), "gpu_type": named.get("type", ALL)}
        for extra in ("day", "job"):
            if extra in named:
                row[extra] = named[extra]
        row.update(gpu_hours=h, cost_usd=usd, attempts=len(attempts))
        rows.append(row)
    return rows


# ---- budgets ----------------------------------------------------------------------------------


class Spent(NamedTuple):
    gpu_hours: float = 0.0
    usd: float = 0.0


@dataclass(frozen=True)
class Budget:
    """A user's GPU-hour and/or dollar budget per period (0: that one is unlimited)."""

    gpu_hours: float = 0.0
    usd: float = 0.0
    period: str = "week"

    def __post_init__(self) -> None:
        for name in ("gpu_hours", "usd"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value <= MAX_BUDGET):  # also refuses NaN
                raise ValueError(f"{name}: must be 0..{MAX_BUDGET:.0e} (got {value!r}; 0: no limit)")
        if self.period not in PERIODS:
            raise ValueError(f"period: one of {', '.join(PERIODS)} (got {self.period!r})")

    @property
    def limited(self) -> bool:
        return self.gpu_hours > 0 or self.usd > 0

    def to_json(self) -> str:
        return json.dumps({"gpu_hours": self.gpu_hours, "usd": self.usd, "period": self.period})

    @classmethod
    def from_json(cls, text: str | bytes) -> Budget:
        raw = json.loads(text)
        return cls(gpu_hours=float(raw.get("gpu_hours", 0) or 0), usd=float(raw.get("usd", 0) or 0),
                   period=str(raw.get("period", "week")))


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """The UTC calendar ``period`` (day, week from Monday, month) holding ``now``: (start, next start)."""
    today = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = today, today + dt.timedelta(days=1)
    elif period == "week":
        start = today - dt.timedelta(days=today.weekday())
        end = start + dt.timedelta(days=7)
    elif period == "month":
        start = today.replace(day=1)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"period: one of {', '.join(PERIODS)} (got {period!r})")
    return start.timestamp(), end.timestamp()


def day_index(t: float) -> int:
    """The UTC day of ``t`` as the per-user usage hash counts it (days since 1970-01-01)."""
    return math.floor(t / 86400)


def spent_in(day_fields: Mapping[str, str], first_day: int, last_day: int) -> Spent:
    """The sum of a user's per-day hash (``"{day}|h"``, ``"{day}|usd"``) over days first..last."""
    h = usd = 0.0
    for field, value in day_fields.items():
        day, _, what = field.partition("|")
        try:
            d = int(day)
        except ValueError:
            continue
        if first_day <= d <= last_day:
            if what == "h":
                h += _num(value)
            elif what == "usd":
                usd += _num(value)
    return Spent(h, usd)


def budget_refusal(user: str, budget: Budget, used: Spent, committed: Spent, need: Spent, now: float) -> str | None:
    """Why a submission of ``user`` is refused under ``budget``, or None: what they used this period
    (ended attempts), what their queued and running jobs are predicted to use (``committed``) and
    the new job's least (``need``: its smallest plan) together exceed a limit."""
    _, renews = period_bounds(budget.period, now)
    when = dt.datetime.fromtimestamp(renews, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    for limit, unit, u, c, n, flag in (
            (budget.gpu_hours, "GPU-hours", used.gpu_hours, committed.gpu_hours, need.gpu_hours, "--gpu-hours"),
            (budget.usd, "dollars", used.usd, committed.usd, need.usd, "--usd")):
        if limit > 0 and (u + c + n > limit + _EPS or u >= limit):
            return (f"budget: user {user!r} has used {u:.2f} of {limit:.2f} {unit} this {budget.period}, their "
                    f"queued and running jobs are predicted to use {c:.2f} more, and this job needs at least "
                    f"{n:.2f} (its smallest plan): over the budget. To fix: submit a smaller job (fewer "
                    f"--train-steps or GPUs), wait until the budget renews ({when}), cancel a queued job, or "
                    f"ask an admin to raise it (frenzy budget set {user} {flag} N)")
    return None


__all__ = ["ALL", "DEFAULT_GROUPS", "GROUPS", "PERIODS", "Budget", "Spent", "UsageEntry", "aggregate",
           "budget_refusal", "check_groups", "day_index", "period_bounds", "spent_in", "utc_day"]
