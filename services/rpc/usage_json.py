"""``GetUsage``'s answer as JSON (issue 35): what ``frenzy usage --json`` prints and ``GET /api/usage``
returns, one shape for both (client side: no server package)."""

from __future__ import annotations

from typing import Any

from frenzy.v1 import scheduler_pb2


def usage_row(row: scheduler_pb2.UsageRow, by: list[str]) -> dict[str, Any]:
    """One group's sums: ``user`` and ``gpu_type`` ("*" where not grouped by), ``day`` / ``job`` when
    grouped by them, ``gpu_hours``, ``cost_usd`` and ``attempts``."""
    out: dict[str, Any] = {"user": row.user, "gpu_type": row.gpu_type}
    if "day" in by:
        out["day"] = row.day
    if "job" in by:
        out["job"] = row.job
    out.update(gpu_hours=row.gpu_hours, cost_usd=row.cost_usd, attempts=row.attempts)
    return out


def usage_json(resp: scheduler_pb2.GetUsageResponse) -> dict[str, Any]:
    by = list(resp.by)
    rows = [usage_row(r, by) for r in resp.rows]
    return {"rows": rows, "by": by, "since": resp.since, "until": resp.until, "all_users": resp.all_users,
            "total": {"gpu_hours": sum(r.gpu_hours for r in resp.rows),
                      "cost_usd": sum(r.cost_usd for r in resp.rows)}}


__all__ = ["usage_json", "usage_row"]
