"""``GET /api/usage`` (issue 35): GPU-hours and dollars of ended attempts, as ``frenzy usage --json``.

The scheduler decides who sees what (``GetUsage`` with the caller's token): a user their own usage,
an admin everyone's. Mounted by ``frenzy.api.app.create_app``.
"""

# (no `from __future__ import annotations`: FastAPI reads the route's annotations, and ``caller`` is
# a parameter of add_usage_routes, not a module name)
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from frenzy.rpc.listing import SINCE_HELP, since_time
from frenzy.rpc.usage_json import usage_json
from frenzy.v1 import scheduler_pb2


def add_usage_routes(api: APIRouter, link: Any, caller: Any, timeout_s: float) -> None:
    """/api/usage on ``api``, calling the scheduler through ``link`` (``SchedulerLink``) with the
    token the ``caller`` dependency gives."""

    @api.get("/usage", tags=["usage"])
    def get_usage(token: caller,  # type: ignore[valid-type]
                  user: str = Query(default="", max_length=256,
                                    description="one user's usage (admins; others may name only themselves)"),
                  since: str = Query(default="7d", max_length=64,
                                     description=f"attempts that ended since: {SINCE_HELP}; 'all': all kept"),
                  by: list[str] = Query(default=[], max_length=4,  # noqa: B006
                                        description="group by user, type, day or job (repeatable; "
                                                    "default: user and type)"),
                  ) -> dict[str, Any]:
        """GPU-hours and dollars of ended attempts: `{"rows": [{"user", "gpu_type", "gpu_hours",
        "cost_usd", "attempts"}], "total": {...}}` ("*" for a dimension not grouped by)."""
        try:
            since_at = 0.0 if since.strip().lower() in ("", "all") else since_time(since)
        except ValueError as exc:
            raise HTTPException(400, detail=f"since: {exc}") from None
        req = scheduler_pb2.GetUsageRequest(user=user, since=since_at, by=by)
        return usage_json(link.call(token, lambda st: st.GetUsage(req, timeout=timeout_s)))
