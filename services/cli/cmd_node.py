"""``frenzy node join`` and ``frenzy node key create|rotate|show``: setting up a cluster node.

``join`` gives a new node everything it needs in one file (like ``kubeadm token create
--print-join-command``): its own Redis user (``frenzy.state.acl``'s agent rules) and signing key.

Every launch and cancel the scheduler sends a node, and every event the node's agent
sends back, is signed with that node's key (``frenzy.state.signing``); an agent does not
start without one. Like ``frenzy token`` these commands talk to the cluster's Redis
directly (operators' credentials), not to the Scheduler API. A key is never printed
unless asked with ``--reveal``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit, urlunsplit

import typer

from frenzy.cli import render
from frenzy.cli.output import (
    JsonOpt,
    PrefixOpt,
    RedisOpt,
    echo_json,
    fail,
    operator_redis,
    operator_redis_url,
    redis_errors,
)

if TYPE_CHECKING:  # annotations only; imported where the command runs
    import redis

node_app = typer.Typer(help="Cluster nodes as an operator sets them up.", no_args_is_help=True)
key_app = typer.Typer(help="A node's signing key: what its launches and events are signed with.",
                      no_args_is_help=True)
node_app.add_typer(key_app, name="key")

NodeArg = Annotated[str, typer.Argument(help="The node's name (its agent's --node).")]


def _client(redis_url: str) -> redis.Redis:
    return operator_redis(redis_url)


def _checked(node: str) -> str:
    from frenzy.state.messages import is_safe_name

    if not is_safe_name(node):
        fail(f"node name {render.user_text(node)!r}: use letters, digits, '.', '_' and '-' (at most 128)", 2)
    return node


@key_app.command("create")
def create(nodes: Annotated[list[str], typer.Argument(help="The nodes' names (their agents' --node).")],
           force: Annotated[bool, typer.Option(
               "--force", help="Replace an existing key (what is in flight signed with it is refused).")] = False,
           redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy") -> None:
    """Give each NODE a signing key (before its agent starts). Keeps an existing one unless --force.

    \b
    Examples:
      frenzy node key create gpu-017          # then start: frenzy agent --node gpu-017
      frenzy node key create gpu-017 gpu-018  # several at once
      frenzy node key create gpu-017 --force  # a key leaked: cut it off now
    """
    from frenzy.state import node_keys
    from frenzy.state.keys import Keys

    client = _client(redis_url)
    for node in nodes:
        made = redis_errors(node_keys.create)(client, Keys(prefix), _checked(node), force=force)
        render.console().print(f"node {node}: " + ("new signing key made" if made else
                                                   "already has a signing key (kept; --force replaces it)"))


@key_app.command("rotate")
def rotate(node: NodeArg, redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy") -> None:
    """Give NODE a new key; the old one stays accepted as the previous key, so nothing in flight is lost.

    The agent and the scheduler pick it up within seconds, without a restart. Rotate again no
    sooner than a minute later (the previous key is then replaced)."""
    from frenzy.state import node_keys
    from frenzy.state.keys import Keys
    from frenzy.state.node_keys import NodeKeyMissing
    from frenzy.state.signing import SWITCH_AFTER_S

    try:
        redis_errors(node_keys.rotate)(_client(redis_url), Keys(prefix), _checked(node))
    except NodeKeyMissing as exc:
        fail(str(exc), 4)
    render.console().print(f"node {node}: key rotated; signers switch to it after {SWITCH_AFTER_S:.0f} s, "
                           "the old one is accepted until the next rotation")


@key_app.command("show")
def show(node: NodeArg, reveal: Annotated[bool, typer.Option(
             "--reveal", help="Also print the keys (hex). Anyone with a node's key can run jobs on it.")] = False,
         redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy",
         as_json: JsonOpt = False) -> None:
    """Whether NODE has a key and when it was made or last rotated (the key itself only with --reveal)."""
    from frenzy.state import node_keys
    from frenzy.state.keys import Keys

    client = _client(redis_url)
    info = redis_errors(node_keys.info)(client, Keys(prefix), _checked(node))
    if info is None:
        fail(f"node {node} has no signing key. To fix: frenzy node key create {node}", 4)
    out: dict[str, str] = dict(info)
    if reveal:
        ring = redis_errors(node_keys.read)(client, Keys(prefix), node)
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


def _with_host(url: str, host: str) -> str:
    """``url`` pointing at ``host`` (same port, user and database)."""
    parts = urlsplit(url)
    auth, _, hostport = parts.netloc.rpartition("@")
    port = f":{parts.port}" if parts.port else ""
    name = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return urlunsplit((parts.scheme, f"{auth}@{name}{port}" if auth else f"{name}{port}", parts.path, parts.query,
                       parts.fragment))


def _ttl_seconds(text: str) -> float:
    """A join file's --ttl: seconds, or a number with s, m, h or d (one unit)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if not m:
        raise ValueError("not a duration")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not 60 <= seconds <= 30 * 86400:
        raise ValueError("must be 1 minute to 30 days")
    return seconds


@node_app.command("join")
def join(node: NodeArg, redis_url: RedisOpt = "", prefix: PrefixOpt = "frenzy",
         out: Annotated[Path | None, typer.Option(
             "--out", help="Where to write the join file (0600). Default: ./frenzy-join-NODE.json.")] = None,
         redis_host: Annotated[str | None, typer.Option(
             "--redis-host", help="Host the node reaches Redis at (default: --redis-url's host).")] = None,
         print_file: Annotated[bool, typer.Option(
             "--print", help="Also print the join file (it holds the node's Redis password).")] = False,
         host: Annotated[str | None, typer.Option(
             "--host", help="The host the file is for (its hostname or fully qualified name): an agent on any "
                            "other host refuses it. Default: NODE.")] = None,
         ttl: Annotated[str, typer.Option(
             "--ttl", help="How long the file may wait for its first use (12h, 30m, 2d or seconds): an agent "
                           "refuses it afterwards unless its host used it before.")] = "24h") -> None:
    """Make NODE's Redis user (agent rights only, a fresh password) and signing key, and write a join
    file for its agent: copy it to the node and run `frenzy agent --join-file FILE`.

    Running join again for the same node rotates its Redis password: the old file stops working and
    an agent connected with it is disconnected (restart it with the new file). The signing key is
    kept (rotate it with `frenzy node key rotate`). --redis-url must be an admin's (ACL SETUSER).

    The file names the host it is for (--host, default NODE) and expires unused after --ttl (24h):
    an agent on another host, or first started after that, refuses it.

    \b
    Examples:
      frenzy node join gpu-017 --redis-url "$ADMIN_REDIS_URL" --redis-host redis.internal
      scp frenzy-join-gpu-017.json gpu-017:/etc/frenzy/join.json    # keep it 0600
      frenzy agent --join-file /etc/frenzy/join.json                # on gpu-017
    """
    import redis

    from frenzy.auth.credentials import write_private
    from frenzy.devstack.redis_server import reset_agent_user
    from frenzy.state import node_keys
    from frenzy.state.keys import Keys

    _checked(node)
    for_host = (host or node).strip()
    if not for_host or any(c.isspace() or c in "/@:" for c in for_host) or len(for_host) > 253:
        fail(f"--host {for_host!r}: not a host name. To fix: give the node's hostname (`hostname` on it)", 2)
    try:
        ttl_s = _ttl_seconds(ttl)
    except ValueError as exc:
        fail(f"--ttl {ttl!r}: {exc}. To fix: a duration such as 30m, 12h or 2d", 2)
    path = out or Path(f"frenzy-join-{node}.json")
    # Checked before the password changes, so a bad --out never leaves the node with no usable file.
    if path.is_dir() or not os.access(path.parent or Path("."), os.W_OK):
        fail(f"--out {path}: cannot write a file there. To fix: give a writable file path", 2)
    try:
        url = redis_errors(reset_agent_user)(operator_redis_url(redis_url), prefix, node)
        redis_errors(node_keys.create)(_client(redis_url), Keys(prefix), node)
    except redis.ResponseError as exc:
        fail(f"Redis refused to make the node's user ({exc}). To fix: --redis-url must be an admin's "
             "(allowed ACL SETUSER and CLIENT KILL)", 1)
    if redis_host:
        url = _with_host(url, redis_host)
    expires_at = int(time.time() + ttl_s)
    text = json.dumps({"node": node, "redis_url": url, "prefix": prefix, "host": for_host,
                       "expires_at": expires_at}, indent=2) + "\n"
    write_private(path, text)
    con = render.console()
    con.print(f"node {node}: Redis user and signing key ready; join file written to {path} (0600, holds the "
              f"node's Redis password), for host {for_host} only, to be first used before "
              f"{render.when(expires_at, date=True)}. On the node: frenzy agent --join-file {path.name}", markup=False,
              highlight=False)
    if print_file:
        typer.echo(text, nl=False)


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node", rich_help_panel=PANEL)
