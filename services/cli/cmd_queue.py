"""``frenzy queue hold|release|status``: stop and restart placement without refusing jobs.

An operator holds the queue before maintenance, to let a burst of submissions gather before
any is placed, or to stop new work while something is wrong; jobs are still accepted and wait
PENDING with the hold's reason, and what runs keeps running (Slurm's ``scontrol hold``, Kueue's
``stopPolicy: Hold``). Like ``frenzy node`` these commands talk to the cluster's Redis with an
operator's credentials; the scheduler reads the hold on every tick.
"""

from __future__ import annotations

from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import JsonOpt, PrefixOpt, RedisOpt, echo_json, fail, operator_redis, redis_errors

queue_app = typer.Typer(help="Hold or release the job queue (operators).", no_args_is_help=True)

MAX_REASON_CHARS = 500


def _hold_key(redis_url: str, prefix: str) -> tuple[object, str]:
    from frenzy.state.keys import Keys

    return operator_redis(redis_url), Keys(prefix).queue_hold()


@queue_app.command("hold")
def hold(reason: Annotated[str, typer.Option(help="Shown as every waiting job's pending reason.")] = "held by an operator",
         redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy") -> None:
    """Stop placing jobs: submissions are still accepted and wait PENDING; running jobs go on.

    \b
    Examples:
      frenzy queue hold --reason "switch firmware update until 14:00"
      frenzy queue release
    """
    if not reason.strip() or len(reason) > MAX_REASON_CHARS:
        fail(f"--reason: give 1 to {MAX_REASON_CHARS} characters", 2)
    client, key = _hold_key(redis_url, prefix)
    redis_errors(client.set)(key, reason)  # type: ignore[attr-defined]
    render.console().print(f"queue held: {render.user_text(reason)}. No job is placed until `frenzy queue release`.")


@queue_app.command("release")
def release(redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy") -> None:
    """Place jobs again (the leader scheduler is woken: at once)."""
    from frenzy.state.keys import Keys
    from frenzy.state.store import StateStore

    client, key = _hold_key(redis_url, prefix)
    was = redis_errors(client.delete)(key)  # type: ignore[attr-defined]
    if was:  # the leader's loop places the waiting jobs now, not at its next periodic pass
        StateStore(client, Keys(prefix)).wake_leader()  # type: ignore[arg-type]
    render.console().print("queue released" if was else "the queue was not held")


@queue_app.command("status")
def status(redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy",
           as_json: JsonOpt = False) -> None:
    """Whether the queue is held, why, and how many jobs wait."""
    from frenzy.state.keys import Keys

    client, key = _hold_key(redis_url, prefix)
    reason = redis_errors(client.get)(key)  # type: ignore[attr-defined]
    waiting = redis_errors(client.zcard)(Keys(prefix).queue())  # type: ignore[attr-defined]
    if as_json:
        echo_json({"held": reason is not None, "reason": reason or "", "waiting": int(waiting)})
        return
    render.console().print((f"queue held: {render.user_text(reason)}" if reason is not None else "queue open")
                           + f"; {waiting} job(s) waiting")


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.add_typer(queue_app, name="queue", rich_help_panel=PANEL)
