"""``frenzy usage``: GPU-hours and dollars of ended attempts, per user, GPU type, day or job (issue 35).

A user's command: it asks the Scheduler (``GetUsage``, with the caller's token) like ``frenzy jobs``
does, so a user sees only their own usage and an admin everyone's; ``--json`` prints what
``GET /api/usage`` returns. Budgets are set by operators with ``frenzy budget`` (cmd_budget.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, SchedulerOpt, echo_json, fail, scheduler_call

PANEL = "Run jobs"
ORDER = 60


def usage(
    user: Annotated[str, typer.Option(help="Only this user's usage (admins: anyone's; others: only their own).",
                                      show_default=False)] = "",
    since: Annotated[str, typer.Option(help="Attempts that ended since then: 30m, 2h, 7d, or a date (2026-11-01, "
                                            "local time); '' or 'all': everything kept (400 days).")] = "7d",
    by: Annotated[list[str] | None, typer.Option(help="Group by user, type, day (UTC) or job (repeat; default: "
                                                      "user and type).", show_default=False)] = None,
    scheduler: SchedulerOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """GPU-hours and dollars used by ended attempts, summed per user and GPU type.

    Every attempt is charged from its reservation to its end, for each GPU it held, at the price
    per GPU-hour in force then (the node's rate, else the catalog's list price; docs/cost.md).
    Yours, or every user's with an admin token.

    \b
    Examples:
      frenzy usage                        # the last 7 days, per user and GPU type
      frenzy usage --by user --json       # {"rows": [{"user", "gpu_type": "*", "gpu_hours", "cost_usd"}, ...]}
      frenzy usage --since 30d --by day
      frenzy usage --user alice --by job  # an admin looking at alice's jobs
    """
    from frenzy.rpc.listing import since_time
    from frenzy.rpc.usage_json import usage_json
    from frenzy.v1 import scheduler_pb2

    try:
        since_at = 0.0 if since.strip().lower() in ("", "all") else since_time(since)
    except ValueError as exc:
        fail(f"--since: {exc}", 2)
    req = scheduler_pb2.GetUsageRequest(user=user, since=since_at, by=[b.strip() for b in by or [] if b.strip()])
    with scheduler_call(scheduler) as stub:
        resp = stub.GetUsage(req, timeout=30)
    data = usage_json(resp)
    if as_json:
        echo_json(data)
        return
    render.console().print(usage_table(data, since))


def usage_table(data: dict, since: str):  # -> rich Table
    from rich.table import Table

    by = data["by"]
    cols = [c for c in ("user", "gpu_type", "day", "job") if (c == "gpu_type" and "type" in by) or c in by]
    window = f"since {since}" if since.strip() and since.strip().lower() != "all" else "all kept"
    table = Table(title=f"Usage ({window})", title_justify="left")
    for c in cols:
        table.add_column("GPU TYPE" if c == "gpu_type" else c.upper())
    for c in ("GPU-HOURS", "COST", "ATTEMPTS"):
        table.add_column(c, justify="right")
    for r in data["rows"]:
        table.add_row(*[render.user_text(r[c]) for c in cols], f"{r['gpu_hours']:,.2f}", render.money(r["cost_usd"]),
                      str(r["attempts"]))
    total = data["total"]
    if len(data["rows"]) > 1:
        table.add_row(*(["total"] + [""] * (len(cols) - 1)), f"{total['gpu_hours']:,.2f}",
                      render.money(total["cost_usd"]), "", style="bold")
    if not data["rows"]:
        table.caption = "no attempt ended in this window"
    return table


def register(app: typer.Typer) -> None:
    app.command("usage", rich_help_panel=PANEL)(usage)
