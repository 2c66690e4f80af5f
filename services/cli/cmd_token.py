"""``frenzy token create|list|revoke``: API tokens, managed by an operator on the cluster's Redis.

Like ``kubeadm token`` these commands talk to the state store directly (they need the
Redis credentials, which only operators have), not to the Scheduler API. A token is
shown once, when it is made; Redis keeps only a hash of it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, PrefixOpt, RedisOpt, echo_json, fail, operator_redis, redis_errors

if TYPE_CHECKING:  # annotations only; imported where the command runs
    from frenzy.auth.tokens import TokenStore

token_app = typer.Typer(help="API tokens: who may call the scheduler, and as which role.", no_args_is_help=True)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A token's lifetime unless --ttl says otherwise (issue 34: none expired by default before);
# `frenzy up`'s own tokens (the local admin's, the batch worker's) never expire.
DEFAULT_TTL = "90d"


def parse_ttl(text: str) -> float:
    """'0' (never), '90s', '30m', '12h', '30d' -> seconds."""
    text = text.strip().lower()
    if text in ("0", "never", ""):
        return 0.0
    unit = text[-1] if text[-1] in _UNITS else "s"
    number = text[:-1] if text[-1] in _UNITS else text
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--ttl: {text!r} is not a duration (e.g. 12h, 30d, 0 for never)") from None
    if value <= 0 or value != value:
        raise ValueError(f"--ttl: must be positive (got {text!r}); 0 means never")
    return value * _UNITS[unit]


def _store(redis_url: str, prefix: str) -> TokenStore:
    from frenzy.auth.tokens import TokenStore
    from frenzy.state.keys import Keys

    return TokenStore(operator_redis(redis_url), Keys(prefix))


@token_app.command("create")
def create(
    user: Annotated[str, typer.Option(help="Who the token is for (owns the jobs it submits).")],
    role: Annotated[str, typer.Option(help="read, submit or admin (node: agents).")] = "submit",
    ttl: Annotated[str, typer.Option(help="Lifetime: 12h, 30d, ... or 0 for never.")] = DEFAULT_TTL,
    note: Annotated[str, typer.Option(help="What it is for (shown by list).")] = "",
    redis_url: RedisOpt = "",
    prefix: PrefixOpt = "frenzy",
    as_json: JsonOpt = False,
) -> None:
    """Make a token and print it once (keep it: it cannot be shown again).

    \b
    Examples:
      frenzy token create --user alice     # submits; sees and cancels her own jobs; 90 days
      frenzy token create --user ops --role admin --ttl 0   # never expires (say why in --note)
      frenzy token create --user ci --role read --ttl 30d --note "dashboards"
      FRENZY_TOKEN=frz_... frenzy jobs                  # use it
    """
    from frenzy.auth.roles import Role

    try:
        parsed_role, seconds = Role.parse(role), parse_ttl(ttl)
        token, info = redis_errors(_store(redis_url, prefix).create)(user, parsed_role, note=note, ttl_s=seconds)
    except ValueError as exc:
        fail(str(exc), 2)
    if as_json:
        echo_json({"token": token, "id": info.token_id, "user": info.user, "role": info.role.value,
                   "expires_at": info.expires_at})
        return
    con = render.console()
    con.print(f"token for {render.user_text(info.user)} ({info.role.value}), id {info.token_id}"
              + (f", expires {render.when(info.expires_at, date=True)}" if info.expires_at else ", never expires"))
    con.print(token, soft_wrap=True, markup=False, highlight=False)
    con.print("[dim]shown once; Redis keeps only its hash. Use it as FRENZY_TOKEN or "
              "'Authorization: Bearer <token>'.[/]")


@token_app.command("list")
def list_tokens(redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy",
                as_json: JsonOpt = False) -> None:
    """Every token: id, user, role, created, expires (never the secret). A token expired over a
    week ago is removed (Redis drops it; this and every scheduler sweep what is left)."""
    infos = redis_errors(_store(redis_url, prefix).list)()
    if as_json:
        echo_json([{"id": t.token_id, "user": t.user, "role": t.role.value, "created_at": t.created_at,
                    "expires_at": t.expires_at, "note": t.note} for t in infos])
        return
    from rich.table import Table

    table = Table("ID", "USER", "ROLE", "CREATED", "EXPIRES", "NOTE")
    now = time.time()
    for t in infos:
        # An expiry always carries its date: a 30-day token's would otherwise read as a time today.
        expires = ("never" if not t.expires_at else
                   f"expired {render.when(t.expires_at, date=True)}" if t.expired(now) else
                   render.when(t.expires_at, date=True))
        table.add_row(t.token_id, render.user_text(t.user), t.role.value, render.when(t.created_at, now=now), expires,
                      render.user_text(t.note))
    render.console().print(table)


@token_app.command("revoke")
def revoke(token_id: Annotated[str, typer.Argument(help="The token's id (from list), or the token itself.")],
           redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy") -> None:
    """Revoke a token; servers stop accepting it within a few seconds."""
    from frenzy.auth.tokens import AuthError

    try:
        found = redis_errors(_store(redis_url, prefix).revoke)(token_id)
    except AuthError as exc:
        fail(str(exc), 2)
    if not found:
        fail(f"no token with id {render.user_text(token_id)!r}. To fix: see `frenzy token list`", 4)
    render.console().print(f"revoked {render.user_text(token_id)}")


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token", rich_help_panel=PANEL)
