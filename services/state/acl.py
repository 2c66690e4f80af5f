"""Redis ACL rules for each Frenzy role: who may touch which keys with which commands.

Pure: it turns a role, the stack's key prefix (and an agent's node name) into the arguments of
``ACL SETUSER`` or a line of an ACL file; ``frenzy.devstack.redis_server`` applies them. The key
layout they confine is ``frenzy.state.keys``.

Roles, least privilege first:

* ``agent`` (one user per node n): only node n's records (``node:{n}``, its lease ``node:{n}:alive``,
  ``gpu:{n}:*``, its signing key ``node:{n}:key`` to read), the ``nodes`` set, its own node's job
  output (``node:{n}:logs:*``: each job's stream and offsets of node n; no other node's, and not the
  one ``logs:{job}`` stream of every node that jobs had before issue 34), its own launch stream
  (read and acknowledge), the events stream (append) and the
  jobs' packed code (``code:*``, read: GET, GETRANGE, STRLEN, EXISTS), with
  only the commands the agent and its Lua scripts (register_node, heartbeat, append_log,
  set_draining) call. No job record, no other node, no token, no queue.
* ``worker`` (Celery's batch worker): kombu's and Celery's own keys (``_kombu.*``, ``unacked*``,
  ``celery-task-meta-*``, its pidbox queue and the remote-control reply queues
  ``<id>.reply.celery.pidbox``), the batch queue, ``batch:*`` and ``batches``.
* ``scheduler``: every key under the prefix, but no administration (FLUSHALL, CONFIG, KEYS,
  SHUTDOWN, DEBUG, ACL, MONITOR, SCRIPT FLUSH, ...).
* ``operator`` (``frenzy token``, ``frenzy secrets``, ``frenzy batch``, ``frenzy agent --drain``):
  the scheduler's rights plus what a batch client uses of Celery's keys, and every channel.

Why key patterns carry the weight: commands that Lua scripts run are checked against the caller's
ACL (command and keys), so a user allowed EVALSHA may run any loaded script, yet every
``redis.call`` in it fails on a key outside the user's patterns. An agent may call scripts but not
load them (no EVAL, no SCRIPT): Redis 6.2's ACLs cannot name a script, so what it may run is what the
trusted side loaded (``frenzy.state.scripts.ensure_loaded``), Frenzy's own scripts only.

Redis 6.2 (the embedded server) has no per-key command sets, so there an agent's command list
applies to all its keys: it could XADD to its own launch stream and read or acknowledge the events
stream, rewrite its own signing key and overwrite a code blob (harmless to other nodes: every agent
checks a blob's sha256 before it unpacks it, so a changed blob is refused, never run). On Redis 7.0
and later (``selectors=True``) its launch stream lives in a selector that only reads, acknowledges
and creates its consumer group, the events stream in one that only appends, its signing key and the
code blobs in ones that only read.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum

# redis-py's connection handshake and the SELECT of a URL's database (HELLO and AUTH need no right).
_CONNECTION = ("+ping", "+select")
# Scripts are loaded and called by SHA only (redis-py's Script); SCRIPT FLUSH / KILL are not theirs.
_SCRIPTS = ("+evalsha", "+script|load", "+script|exists")
# An agent only calls scripts the trusted side loaded (frenzy.state.scripts.AGENT_SCRIPTS): no EVAL,
# no SCRIPT LOAD, so a node's credential cannot run code of its own inside Redis (issue 34: a Lua
# busy loop froze Redis for every node and user).
_AGENT_SCRIPTS = ("+evalsha",)
# What the agent and its scripts call on its node's keys and the log streams.
# (+type: the scripts' key-type check before their first write, lua/lib/check_types.lua)
_AGENT_COMMANDS = ("+time", "+exists", "+type", "+get", "+set", "+hget", "+hmget", "+hset", "+hsetnx", "+hdel",
                   "+hincrby", "+sadd", "+xadd", "+pexpire")
_LAUNCH_READ = ("+xreadgroup", "+xack", "+xgroup|create")
# What the agent reads of a job's packed code (frenzy.state.code_store.CodeReader): in ranges, never writes.
_CODE_READ = ("+get", "+getrange", "+strlen", "+exists")
# Everything a data-plane client may need, without administering the server.
_NO_ADMIN = ("+@all", "-@dangerous", "-@admin", "-@pubsub", "-script", *_SCRIPTS)
_NO_FUNCTIONS = ("-function",)  # Redis 7.0+: FUNCTION FLUSH / DELETE are not @dangerous


class RedisRole(StrEnum):
    SCHEDULER = "scheduler"
    AGENT = "agent"
    WORKER = "worker"
    OPERATOR = "operator"


def glob_escape(text: str) -> str:
    """``text`` as a literal inside an ACL key or channel pattern (``*?[]\\`` escaped)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def supports_selectors(redis_version: str) -> bool:
    """Whether a server of ``redis_version`` (INFO's ``redis_version``) has ACL selectors (7.0+)."""
    try:
        return int(redis_version.split(".", 1)[0]) >= 7
    except ValueError:
        return False


def password_hash(password: str) -> str:
    """The ``#<sha256>`` form Redis stores a password as, so the password itself is never sent."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def user_name(role: RedisRole, prefix: str, node: str | None = None) -> str:
    """The Redis user of ``role`` for the stack on ``prefix`` (one per node for agents)."""
    if role is RedisRole.AGENT:
        if not node:
            raise ValueError("an agent's Redis user is per node: give the node name")
        return f"{prefix}-agent-{node}"
    return f"{prefix}-{role.value}"


def _keys(*patterns: str) -> tuple[str, ...]:
    return tuple(f"~{p}" for p in patterns)


def role_rules(role: RedisRole, prefix: str, node: str | None = None, *, db: int = 0,
               selectors: bool = False) -> tuple[str, ...]:
    """The ACL rules (``ACL SETUSER`` arguments after the password) of ``role``.

    ``db``: the database number in the stack's redis:// URL (kombu names its channels after it);
    ``selectors``: the server is Redis 7.0+ (see the module docstring)."""
    p = glob_escape(prefix)
    functions = _NO_FUNCTIONS if selectors else ()
    if role is RedisRole.SCHEDULER:
        return ("resetchannels", *_keys(f"{p}:*"), *_NO_ADMIN, *functions)
    if role is RedisRole.OPERATOR:
        return ("allchannels", *_keys(f"{p}:*", "_kombu.*", "celery-task-meta-*"),
                *(r for r in _NO_ADMIN if r != "-@pubsub"), *functions)
    if role is RedisRole.WORKER:
        return ("resetchannels",
                *_keys(f"{p}:batch:*", f"{p}:batches", f"{p}:batch-queue*", "_kombu.*", "unacked", "unacked_index",
                       "unacked_mutex", "celery-task-meta-*", "frenzy-worker@*.celery.pidbox*",
                       # remote-control replies (`celery inspect ping`, its health check): a queue per caller
                       "*.reply.celery.pidbox*"),
                # kombu PSUBSCRIBEs its pidbox channel by its exact name (ACL compares patterns literally).
                f"&/{db}.celery.pidbox", f"&/{db}.celeryev/*", "&celery-task-meta-*",
                *(r for r in _NO_ADMIN if r != "-@pubsub"), *functions)
    if role is RedisRole.AGENT:
        if not node:
            raise ValueError("an agent's Redis rules are per node: give the node name")
        n = glob_escape(node)
        own = _keys(f"{p}:node:{n}", f"{p}:node:{n}:alive", f"{p}:gpu:{n}:*", f"{p}:nodes",
                    # node n's output of each job. The node comes first in these names: node names
                    # have no ':', so no other node's key matches. (A pattern ending in the node,
                    # logs:*:{n}, would not do: `*` matches ':' too, so a node named "offsets" would
                    # reach every node's logs:{job}:{node}:offsets.)
                    f"{p}:node:{n}:logs:*")
        launch, events, signing_key = f"{p}:launch:{n}", f"{p}:events", f"{p}:node:{n}:key"
        code = f"{p}:code:*"
        base = ("resetchannels", "-@all", *_CONNECTION, *_AGENT_SCRIPTS, *_AGENT_COMMANDS)
        if not selectors:
            return (*base, *_LAUNCH_READ, *_CODE_READ, *own, *_keys(launch, events, signing_key, code))
        return (*base, *own,
                f"(~{launch} resetchannels -@all {' '.join(_LAUNCH_READ)})",
                f"(~{events} resetchannels -@all +xadd)",
                f"(~{signing_key} resetchannels -@all +hget +hmget)",
                f"(~{code} resetchannels -@all {' '.join(_CODE_READ)})")
    raise ValueError(f"unknown role {role!r}")


def setuser_args(user: str, password: str, rules: tuple[str, ...]) -> list[str]:
    """``ACL SETUSER`` arguments that (re)define ``user`` from nothing: on, ``password`` (as its
    hash), then ``rules``."""
    return [user, "reset", "on", password_hash(password), *rules]


def acl_file_line(user: str, password: str, rules: tuple[str, ...]) -> str:
    """The same user as one line of an ACL file (``aclfile``)."""
    return " ".join(["user", *setuser_args(user, password, rules)])
