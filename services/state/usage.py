"""Usage accounting, the Redis side (issue 35): reads what ``lua/lib/usage_record.lua`` writes when an
attempt ends, and keeps the per-user budgets.

Every script that ends an attempt holding GPUs (``record_exit``, ``requeue_job``,
``finish_from_earlier_attempt``, ``transition_job`` releasing a reserved job) charges it in the same
atomic step: one entry per GPU type on the ``usage`` stream (kept ``RETENTION_DAYS``, whatever
happens to the job's own record), running totals per user and type (Prometheus), and per-user
per-day sums (budgets). The sums and checks are pure (``frenzy.state.usage_rows``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import redis

from frenzy.state.keys import Keys
from frenzy.state.usage_rows import Budget, Spent, UsageEntry, day_index, period_bounds, spent_in

RETENTION_DAYS = 400  # usage entries and per-day sums are kept this long (a year and a margin)
RETENTION_S = RETENTION_DAYS * 86400
EVERYONE = "*"  # the budget of every user who has none of their own
_CHUNK = 5000  # stream entries per XRANGE
MAX_ENTRIES = 2_000_000  # entries one read goes through at most


@cache
def usage_prices_lua() -> str:
    """The Lua prelude lib/usage_record.lua includes: the catalog's list prices and the retention."""
    from marp.prices import LIST_PRICES

    prices = ", ".join(f"[{json.dumps(name)}] = {p.usd_per_gpu_hour!r}" for name, p in sorted(LIST_PRICES.items()))
    return "\n".join([
        "-- list prices per GPU-hour and usage retention, from frenzy.state.usage (generated at load)",
        f"local USAGE_PRICES = {{{prices}}}",
        f"local USAGE_RETENTION_S = {RETENTION_S}",
    ])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class UsageLedger:
    """What was charged, and the budgets: reads of ``{p}:usage*`` and writes of the budgets."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def entries(self, since: float = 0.0, until: float = 0.0, user: str | None = None) -> Iterator[UsageEntry]:
        """The usage entries of attempts that ended from ``since`` (unix time, 0: the oldest kept)
        to ``until`` (0: now), of ``user`` only when given. Read in chunks, oldest first."""
        low = f"{int(since * 1000)}" if since > 0 else "-"
        high = f"{int(until * 1000)}" if until > 0 else "+"
        seen = 0
        while seen < MAX_ENTRIES:
            chunk = self.r.xrange(self.k.usage_stream(), min=low, max=high, count=_CHUNK)
            for _entry_id, raw in chunk:
                fields = {_text(k): _text(v) for k, v in raw.items()}
                if user is None or fields.get("user") == user:
                    yield UsageEntry.from_fields(fields)
            seen += len(chunk)
            if len(chunk) < _CHUNK:
                return
            low = "(" + _text(chunk[-1][0])

    def spent(self, user: str, since: float, until: float) -> Spent:
        """``user``'s charges on the UTC days from ``since``'s to the one before ``until``'s."""
        fields = {_text(k): _text(v) for k, v in self.r.hgetall(self.k.usage_user(user)).items()}
        return spent_in(fields, day_index(since), day_index(until) - 1)

    def spent_this_period(self, user: str, period: str, now: float) -> Spent:
        start, end = period_bounds(period, now)
        return self.spent(user, start, end)

    def totals(self) -> dict[tuple[str, str, str], float]:
        """Everything ever charged: (what "h" or "usd", user, GPU type) -> GPU-hours or dollars."""
        out: dict[tuple[str, str, str], float] = {}
        for k, v in self.r.hgetall(self.k.usage_totals()).items():
            what, _, rest = _text(k).partition("|")
            user, _, gpu_type = rest.rpartition("|")
            try:
                out[(what, user, gpu_type)] = float(_text(v))
            except ValueError:
                continue
        return out

    # ---- budgets ----------------------------------------------------------------------------

    def budget(self, user: str) -> Budget | None:
        """``user``'s budget: their own, else everyone's (``*``), else None."""
        own, every = self.r.hmget(self.k.usage_budgets(), [user, EVERYONE])
        for raw in (own, every):
            if raw:
                try:
                    return Budget.from_json(raw)
                except (ValueError, TypeError, AttributeError):
                    continue
        return None

    def budgets(self) -> dict[str, Budget]:
        out = {}
        for k, v in self.r.hgetall(self.k.usage_budgets()).items():
            try:
                out[_text(k)] = Budget.from_json(v)
            except (ValueError, TypeError, AttributeError):
                continue
        return out

    def set_budget(self, user: str, budget: Budget) -> None:
        self.r.hset(self.k.usage_budgets(), user, budget.to_json())

    def clear_budget(self, user: str) -> bool:
        return bool(self.r.hdel(self.k.usage_budgets(), user))


__all__ = ["EVERYONE", "RETENTION_DAYS", "RETENTION_S", "UsageLedger", "usage_prices_lua"]
