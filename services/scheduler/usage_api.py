"""The scheduler's side of usage accounting (issue 35): the ``GetUsage`` answer and the budget check
``SubmitJob`` makes before it writes a job.

Who sees what follows ``ListJobs``: a user their own usage, an admin everyone's (or one user's).
A budget (``frenzy budget set``; the ``{p}:usage:budgets`` hash) limits a user's GPU-hours and/or
dollars per UTC day, week or month: a submission is refused when what the user's ended attempts
used this period plus the new job's smallest plan would exceed it. Jobs still queued or running
count once they end (their attempts are charged then), not before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import redis
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from frenzy.rpc.listing import MAX_SUMMARY_TEXT
from frenzy.state.keys import Keys
from frenzy.state.usage import UsageLedger
from frenzy.state.usage_rows import Spent, aggregate, budget_refusal, check_groups
from frenzy.v1 import scheduler_pb2, types_pb2

MAX_USAGE_ROWS = 10_000  # rows in one answer (grouping by job over a long range can be many)


class UsageRefused(Exception):
    """A GetUsage request that is refused: ``code`` names the gRPC status ("INVALID_ARGUMENT",
    "PERMISSION_DENIED"), the text says why."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


class UsageDesk:
    """GetUsage answers and budget checks over one Redis."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.ledger = UsageLedger(client, keys)

    def answer(self, request: scheduler_pb2.GetUsageRequest, owner: str | None) -> scheduler_pb2.GetUsageResponse:
        """``owner``: the only user the caller may see (None: an admin, everyone). Raises UsageRefused."""
        for name in ("since", "until"):
            value = getattr(request, name)
            if not (math.isfinite(value) and value >= 0):  # (also NaN)
                raise UsageRefused("INVALID_ARGUMENT", f"{name}: must be a unix time >= 0 (got {value})")
        if len(request.user) > MAX_SUMMARY_TEXT:
            raise UsageRefused("INVALID_ARGUMENT", f"user: at most {MAX_SUMMARY_TEXT} characters")
        try:
            by = check_groups(request.by)
        except ValueError as exc:
            raise UsageRefused("INVALID_ARGUMENT", f"by: {exc}") from None
        if request.user:
            if owner is not None and request.user != owner:
                raise UsageRefused("PERMISSION_DENIED",
                                   f"user: only admins may see another user's usage; this token is for {owner!r}. "
                                   "To fix: leave the user out (your own usage) or use an admin token")
            owner = request.user
        until = request.until or time.time()
        rows = aggregate(self.ledger.entries(request.since, until, user=owner), by)[:MAX_USAGE_ROWS]
        return scheduler_pb2.GetUsageResponse(
            rows=[scheduler_pb2.UsageRow(**{k: v for k, v in r.items()}) for r in rows],
            all_users=owner is None, since=request.since, until=until, by=list(by))

    def refusal(self, user: str, plans: list[types_pb2.Plan], now: float | None = None) -> str | None:
        """Why ``user`` may not submit a job with these ranked ``plans`` under their budget, or None."""
        budget = self.ledger.budget(user)
        if budget is None or not budget.limited or not plans:
            return None
        now = time.time() if now is None else now
        used = self.ledger.spent_this_period(user, budget.period, now)
        need = Spent(min(max(p.gpu_hours, 0.0) for p in plans), min(max(p.cost_usd, 0.0) for p in plans))
        return budget_refusal(user, budget, used, Spent(), need, now)


class UsageCollector(Collector):
    """``frenzy_gpu_hours_total{user,gpu_type}`` and ``frenzy_dollars_total{user}``: everything ever
    charged, read from Redis (``{p}:usage:totals``) at scrape time, so they survive restarts and
    failovers. Every scheduler process of one Redis serves the same numbers: aggregate them with
    ``max by (user, gpu_type)``, not ``sum``."""

    def __init__(self, ledger: UsageLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        hours = CounterMetricFamily("frenzy_gpu_hours", "GPU-hours charged to ended attempts, by user and GPU type "
                                    "(from the reservation to the attempt's end).", labels=["user", "gpu_type"])
        dollars = CounterMetricFamily("frenzy_dollars", "Dollars charged to ended attempts, by user (GPU-hours x "
                                      "the price per GPU-hour in force then).", labels=["user"])
        try:
            totals = self.ledger.totals()
        except redis.RedisError:
            totals = {}
        per_user: dict[str, float] = {}
        for (what, user, gpu_type), value in sorted(totals.items()):
            if what == "h":
                hours.add_metric([user, gpu_type], value)
            elif what == "usd":
                per_user[user] = per_user.get(user, 0.0) + value
        for user, value in per_user.items():
            dollars.add_metric([user], value)
        yield from (hours, dollars)


__all__ = ["MAX_USAGE_ROWS", "UsageCollector", "UsageDesk", "UsageRefused"]
