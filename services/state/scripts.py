"""Load the Lua scripts in ``frenzy/state/lua`` and register them on a client.

Each script opens with a header saying what it guarantees; they run with
EVALSHA (Redis 6.2 compatible, no Functions) and take every key they touch in
KEYS so they stay atomic and cluster-friendly.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis


@cache
def script_source(name: str) -> str:
    return resources.files("frenzy.state").joinpath("lua", f"{name}.lua").read_text()


def register(client: redis.Redis, name: str) -> redis.commands.core.Script:
    """A callable Script object for ``lua/{name}.lua`` bound to ``client``."""
    return client.register_script(script_source(name))
