"""``frenzy node key create|rotate|show``: the per-node keys that sign control messages.

Every launch and cancel the scheduler sends a node, and every event the node's agent
sends back, is signed with that node's key (``frenzy.state.signing``); an agent does not
start without one. Like ``frenzy token`` these commands talk to the cluster's Redis
directly (operators' credentials), not to the Scheduler API. A key is never printed
unless asked with ``--reveal``.
"""

from __future__ import annotations

import re
import time
from typing import Annotated

import redis
import typer

from frenzy.cli import render
from frenzy.cli.cmd_token import PrefixOpt, RedisOpt, _redis_errors
from frenzy.cli.output import JsonOpt, echo_json, fail
from frenzy.state import node_keys
from frenzy.state.keys import Keys
from frenzy.state.messages import SAFE_NAME
from frenzy.state.node_keys import NodeKeyMissing
from frenzy.state.signing import SWITCH_AFTER_S

node_app = typer.Typer(help="Cluster nodes as an operator sets them up.", no_args_is_help=True)
key_app = typer.Typer(help="A node's signing key: what its launches and events are signed with.",
                      no_args_is_help=True)
node_app.add_typer(key_app, name="key")

NodeArg = Annotated[str, typer.Argument(help="The node's name (its agent's --node).")]


def _client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)


def _checked(node: str) -> str:
    if not re.fullmatch(SAFE_NAME, node) or ".." in node:
        fail(f"node name {render.user_text(node)!r}: use letters, digits, '.', '_' and '-' (at most 128)", 2)
    return node


@key_app.command("create")
def create(nodes: Annotated[list[str], typer.Argument(help="The nodes' names (their agents' --node).")],
           force: Annotated[bool, typer.Option(
               "--force", help="Replace an existing key (what is in flight signed with it is refused).")] = False,
           redis_url: RedisOpt = "redis://127.0.0.1:6379/0", prefix: PrefixOpt = "frenzy") -> None:
    """Give each NODE a signing key (before its agent starts). Keeps an existing one unless --force.

    \b
    Examples:
      frenzy node key create gpu-017          # then start: frenzy agent --node gpu-017
      frenzy node key create gpu-017 gpu-018  # several at once
      frenzy node key create gpu-017 --force  # a key leaked: cut it off now
    """
    client = _client(redis_url)
    for node in nodes:
        made = _redis_errors(node_keys.create)(client, Keys(prefix), _checked(node), force=force)
        render.console().print(f"node {node}: " + ("new signing key made" if made else
                                                   "already has a signing key (kept; --force replaces it)"))


@key_app.command("rotate")
def rotate(node: NodeArg, redis_url: RedisOpt = "redis://127.0.0.1:6379/0", prefix: PrefixOpt = "frenzy") -> None:
    """Give NODE a new key; the old one stays accepted as the previous key, so nothing in flight is lost.

    The agent and the scheduler pick it up within seconds, without a restart. Rotate again no
    sooner than a minute later (the previous key is then replaced)."""
    try:
        _redis_errors(node_keys.rotate)(_client(redis_url), Keys(prefix), _checked(node))
    except NodeKeyMissing as exc:
        fail(str(exc), 4)
    render.console().print(f"node {node}: key rotated; signers switch to it after {SWITCH_AFTER_S:.0f} s, "
                           "the old one is accepted until the next rotation")


@key_app.command("show")
def show(node: NodeArg, reveal: Annotated[bool, typer.Option(
             "--reveal", help="Also print the keys (hex). Anyone with a node's key can run jobs on it.")] = False,
         redis_url: RedisOpt = "redis://127.0.0.1:6379/0", prefix: PrefixOpt = "frenzy",
         as_json: JsonOpt = False) -> None:
    """Whether NODE has a key and when it was made or last rotated (the key itself only with --reveal)."""
    client = _client(redis_url)
    info = _redis_errors(node_keys.info)(client, Keys(prefix), _checked(node))
    if info is None:
        fail(f"node {node} has no signing key. To fix: frenzy node key create {node}", 4)
    out: dict[str, str] = dict(info)
    if reveal:
        ring = _redis_errors(node_keys.read)(client, Keys(prefix), node)
        if ring is not None:
            out["current"] = ring.current.hex()
            out["previous"] = ring.previous.hex() if ring.previous else ""
    if as_json:
        echo_json(out)
        return
    at = float(out.get("rotated_at") or 0)
    con = render.console()
    con.print(f"node {node}: signing key since {render.when(at) if at else 'unknown'} "
              f"({time.time() - at:.0f} s ago); previous key kept: {out['has_previous']}" if at else
              f"node {node}: has a signing key; previous key kept: {out['has_previous']}")
    if reveal:
        con.print(f"current  {out['current']}", markup=False, highlight=False)
        con.print(f"previous {out['previous'] or '-'}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
