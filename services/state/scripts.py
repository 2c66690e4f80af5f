"""Load the Lua scripts in ``frenzy/state/lua`` and register them on a client.

Each script opens with a header saying what it guarantees; they run with
EVALSHA (Redis 6.2 compatible, no Functions) and take every key they touch in
KEYS so they stay atomic and cluster-friendly.

The ``.lua`` files are templates. Redis has no ``require``, so what several
scripts share is inlined here, at load, wherever a script has an include line
(``--#include NAME``):

* ``job_states`` is generated from :mod:`frenzy.state.job_states`, the one
  place the state names and moves are written: ``JOB_STATE.running`` is ``"RUNNING"``,
  ``TERMINAL`` and ``ACTIVE`` are sets (state -> true) of those names, ``MAY_MOVE`` is
  ``ALLOWED`` (from -> set of to), read through ``may_move(from, to)``, and ``set_state(job_key,
  to, field, value, ...)`` is the one way a script writes a job's state: it raises, writing
  nothing, on a move ``ALLOWED`` does not list;
* ``usage_prices`` is generated from :mod:`frenzy.state.usage`: ``USAGE_PRICES`` (catalog GPU type ->
  list price per GPU-hour, ``marp.prices``) and ``USAGE_RETENTION_S`` (how long usage is kept);
* any other NAME is the fragment ``lua/lib/NAME.lua`` (e.g. ``release_gpus``); a fragment may
  include another (``lib/usage_record.lua`` includes ``usage_prices``).

Agents may not load code into Redis (issue 34: a node's credential ran a Lua busy loop that froze
Redis for everyone). Their ACL allows EVALSHA but neither EVAL nor SCRIPT (``frenzy.state.acl``),
so the scripts they call (``AGENT_SCRIPTS``) are loaded by the trusted side: whoever makes the
agents' Redis users (``frenzy up``, ``frenzy node join``), and every scheduler at start and every
few seconds after (``ensure_loaded``: one SCRIPT EXISTS; a restarted Redis has an empty script
cache). An agent calls them through ``LoadedScript``: where redis-py's ``Script`` would load a
missing script itself, an agent's refused load is ``ScriptNotLoaded``, which the agent logs and
retries.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

import redis

from frenzy.state.job_states import ACTIVE, ALLOWED, TERMINAL, JobState

INCLUDE = re.compile(r"^--#include (\S+)[ \t]*$", re.MULTILINE)
GENERATED = "job_states"


def _lua_set(states: Iterable[JobState]) -> str:
    chosen = set(states)
    # JobState order, so the rendered text (and its SHA) is the same on every load.
    members = ", ".join(f"[{json.dumps(s.value)}] = true" for s in JobState if s in chosen)
    return "{" + members + "}"


@cache
def job_states_lua() -> str:
    """The Lua prelude naming the job states and their moves, written from :mod:`job_states`."""
    names = ", ".join(f"{s.name.lower()} = {json.dumps(s.value)}" for s in JobState)
    moves = ", ".join(f"[{json.dumps(s.value)}] = {_lua_set(ALLOWED[s])}" for s in JobState)
    return "\n".join(
        [
            "-- job states, from frenzy.state.job_states (generated at load)",
            f"local JOB_STATE = {{{names}}}",
            "-- the states a job ends in",
            f"local TERMINAL = {_lua_set(TERMINAL)}",
            "-- the states in which a job holds GPUs for a live attempt",
            f"local ACTIVE = {_lua_set(ACTIVE)}",
            "-- the moves a job may make (ALLOWED): MAY_MOVE[from][to]",
            f"local MAY_MOVE = {{ {moves} }}",
            _STATE_FUNCTIONS,
        ]
    )


# (Lua, after the tables above)
_STATE_FUNCTIONS = """\
-- Whether the job state machine lets a job in state `from` move to `to`.
local function may_move(from, to)
  local dests = MAY_MOVE[from]
  return dests ~= nil and dests[to] == true
end

-- Write `to` as the job's state, with the field, value pairs after it, in one HSET. A move the
-- state machine does not allow raises instead: the script's guard let through what it must not
-- (tests/integration/scheduler/test_state_machine.py drives every script from every state). The
-- state and those fields are not written; what the script wrote before stays (Redis does not roll
-- a script back), which is why each script checks its moves in its guard, before any write.
local function set_state(job_key, to, ...)
  local from = redis.call("HGET", job_key, "state")
  if not may_move(from, to) then
    error({err = "ERR job state machine: " .. tostring(from) .. " -> " .. tostring(to)
      .. " is not allowed (frenzy.state.job_states.ALLOWED)"})
  end
  redis.call("HSET", job_key, "state", to, ...)
end"""


def _lua_dir() -> Traversable:
    return resources.files("frenzy.state").joinpath("lua")


def names() -> list[str]:
    """Every script's name (``lua/*.lua``; the ``lib/`` fragments are not scripts)."""
    return sorted(p.name.removesuffix(".lua") for p in _lua_dir().iterdir() if p.name.endswith(".lua"))


def template(name: str) -> str:
    """The text of ``lua/{name}.lua`` as written, include lines unfilled."""
    return _lua_dir().joinpath(f"{name}.lua").read_text()


@cache
def fragment(name: str) -> str:
    """What an ``--#include {name}`` line stands for."""
    if name == GENERATED:
        return job_states_lua()
    if name == "usage_prices":
        from frenzy.state.usage import usage_prices_lua

        return usage_prices_lua()
    lib = _lua_dir().joinpath("lib", f"{name}.lua")
    if not lib.is_file():
        raise ValueError(f"unknown Lua include {name!r}: no lua/lib/{name}.lua")
    return INCLUDE.sub(lambda m: fragment(m.group(1)), lib.read_text().rstrip("\n"))


@cache
def script_source(name: str) -> str:
    """``lua/{name}.lua`` with every include line replaced by its fragment, ready for EVALSHA."""
    return INCLUDE.sub(lambda m: fragment(m.group(1)), template(name))


def register(client: redis.Redis, name: str) -> redis.commands.core.Script:
    """A callable Script object for ``lua/{name}.lua`` bound to ``client``."""
    return client.register_script(script_source(name))


# The scripts an agent calls (``frenzy agent`` and ``frenzy agent --drain`` run with a node's credential).
AGENT_SCRIPTS = ("register_node", "heartbeat", "append_log", "set_draining")


class ScriptNotLoaded(redis.exceptions.NoScriptError):
    """Redis does not hold a script an agent calls (it may not load one itself): a Redis restarted
    since the scheduler last loaded them, or no scheduler running yet. Retry after a while."""


def sha1(name: str) -> str:
    """The SHA1 Redis knows ``lua/{name}.lua`` by (its rendered source)."""
    return hashlib.sha1(script_source(name).encode()).hexdigest()


class LoadedScript:
    """``lua/{name}.lua`` called by EVALSHA, for a client that may not SCRIPT LOAD (an agent).
    redis-py's ``Script`` answers NOSCRIPT with SCRIPT LOAD and a second call; here a refused
    load (NOPERM: an agent's ACL) is ``ScriptNotLoaded``, for the caller to log and retry."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.sha = sha1(name)

    def __call__(self, keys: list[object] | tuple[object, ...] = (), args: list[object] | tuple[object, ...] = (),
                 client: redis.Redis | None = None) -> object:
        c = client or self.client
        try:
            return c.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError as exc:
            try:  # a trusted client (an operator's URL, a test's) may load it; an agent's ACL refuses
                c.script_load(script_source(self.name))
            except redis.exceptions.NoPermissionError:
                raise ScriptNotLoaded(
                    f"Redis does not hold Frenzy's {self.name!r} script (NOSCRIPT) and an agent may not load "
                    f"scripts: a scheduler loads them at start and within {LOAD_EVERY_S:g} s of a Redis restart"
                ) from exc
            return c.evalsha(self.sha, len(keys), *keys, *args)


def register_loaded(client: redis.Redis, name: str) -> LoadedScript:
    """A callable of ``lua/{name}.lua`` for an agent: EVALSHA only (see ``LoadedScript``)."""
    return LoadedScript(client, name)


# How often a scheduler checks that the agents' scripts are still loaded (``ensure_loaded``).
LOAD_EVERY_S = 5.0


def ensure_loaded(client: redis.Redis, names: Iterable[str] = AGENT_SCRIPTS) -> list[str]:
    """Load those of ``names`` that Redis lacks (one SCRIPT EXISTS, a SCRIPT LOAD per missing
    one; needs the scheduler's or the admin's rights). -> the names it loaded."""
    wanted = list(names)
    present = client.script_exists(*(sha1(n) for n in wanted)) if wanted else []
    loaded = []
    for name, there in zip(wanted, present, strict=True):
        if not there:
            client.script_load(script_source(name))
            loaded.append(name)
    return loaded
