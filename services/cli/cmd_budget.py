"""``frenzy budget set|show|clear``: per-user GPU-hour and dollar budgets (issue 35), set by operators.

Like ``frenzy queue`` these commands talk to the cluster's Redis with an operator's credentials
(the ``{p}:usage:budgets`` hash); every scheduler reads a user's budget at each of their
submissions and refuses one that would take them over it (RESOURCE_EXHAUSTED over gRPC, 429 over
REST, with "To fix:"). A budget is per UTC day, week (from Monday) or month; user ``*`` is the
budget of every user without one of their own.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, PrefixOpt, RedisOpt, echo_json, fail, operator_redis, redis_errors

budget_app = typer.Typer(help="Per-user GPU-hour and dollar budgets (operators).", no_args_is_help=True)
PANEL = "Operate a cluster"


def _ledger(redis_url: str, prefix: str):  # -> UsageLedger
    from frenzy.state.keys import Keys
    from frenzy.state.usage import UsageLedger

    return UsageLedger(operator_redis(redis_url), Keys(prefix))


@budget_app.command("set")
def set_budget(
    user: Annotated[str, typer.Argument(help="The user ('*': everyone without a budget of their own).")],
    gpu_hours: Annotated[float, typer.Option("--gpu-hours", help="GPU-hours per period (0: no limit).")] = 0.0,
    usd: Annotated[float, typer.Option("--usd", help="Dollars per period (0: no limit).")] = 0.0,
    period: Annotated[str, typer.Option(help="day, week (from Monday) or month; UTC.")] = "week",
    redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy",
) -> None:
    """Limit a user's GPU-hours and/or dollars per period.

    \b
    Examples:
      frenzy budget set alice --gpu-hours 100 --period week
      frenzy budget set '*' --usd 500 --period month
    """
    from frenzy.state.usage_rows import Budget

    if not user.strip() or len(user) > 256:
        fail("USER: give 1 to 256 characters", 2)
    try:
        budget = Budget(gpu_hours=gpu_hours, usd=usd, period=period.strip().lower())
    except ValueError as exc:
        fail(f"--{str(exc).replace('_', '-')}", 2)
    if not budget.limited:
        fail("give --gpu-hours or --usd (above 0). To fix: `frenzy budget clear USER` removes a budget", 2)
    redis_errors(_ledger(redis_url, prefix).set_budget)(user, budget)
    render.console().print(f"budget for {render.user_text(user)}: {_describe(budget)}")


@budget_app.command("clear")
def clear_budget(user: Annotated[str, typer.Argument(help="The user ('*': the default budget).")],
                 redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy") -> None:
    """Remove a user's budget (they fall back to '*', if set)."""
    gone = redis_errors(_ledger(redis_url, prefix).clear_budget)(user)
    render.console().print(f"budget for {render.user_text(user)} removed" if gone
                           else f"{render.user_text(user)} had no budget")


@budget_app.command("show")
def show_budgets(redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy", as_json: JsonOpt = False) -> None:
    """Every budget, with what its user has used this period."""
    ledger = _ledger(redis_url, prefix)
    budgets = redis_errors(ledger.budgets)()
    now = time.time()
    rows = []
    for user, b in sorted(budgets.items()):
        used = ledger.spent_this_period(user, b.period, now) if user != "*" else None
        rows.append({"user": user, "gpu_hours": b.gpu_hours, "usd": b.usd, "period": b.period,
                     "used_gpu_hours": None if used is None else round(used.gpu_hours, 6),
                     "used_usd": None if used is None else round(used.usd, 6)})
    if as_json:
        echo_json({"budgets": rows})
        return
    from rich.table import Table

    table = Table(title="Budgets", title_justify="left")
    for c in ("USER", "PERIOD", "GPU-HOURS", "DOLLARS", "USED GPU-H", "USED $"):
        table.add_column(c)
    for r in rows:
        table.add_row(render.user_text(r["user"]), r["period"], f"{r['gpu_hours']:g}" if r["gpu_hours"] else "-",
                      render.money(r["usd"]), "-" if r["used_gpu_hours"] is None else f"{r['used_gpu_hours']:.2f}",
                      "-" if r["used_usd"] is None else render.money(r["used_usd"]))
    render.console().print(table)


def _describe(b) -> str:  # noqa: ANN001
    parts = ([f"{b.gpu_hours:g} GPU-hours"] if b.gpu_hours else []) + ([render.money(b.usd)] if b.usd else [])
    return " and ".join(parts) + f" per {b.period} (UTC)"


def register(app: typer.Typer) -> None:
    app.add_typer(budget_app, name="budget", rich_help_panel=PANEL)
