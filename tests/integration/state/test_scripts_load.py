"""Every rendered Lua script compiles on a real Redis and runs by EVALSHA.

The scheduler, agent and worker tests exercise what the scripts do; this checks
the rendering itself on the server: each script loads (a Lua syntax error or an
include left in would fail here), the SHA Redis computes is the one redis-py
calls with, and the generated state tables hold the names of JobState.
"""

from __future__ import annotations

import hashlib

import pytest
import redis

from frenzy.state import scripts
from frenzy.state.job_states import ACTIVE, TERMINAL, JobState


@pytest.mark.parametrize("name", scripts.names())
def test_script_loads_and_is_called_by_its_sha(redis_client: redis.Redis, name: str) -> None:
    source = scripts.script_source(name)
    sha = redis_client.script_load(source)
    assert sha == hashlib.sha1(source.encode()).hexdigest()
    assert sha == scripts.register(redis_client, name).sha


def test_generated_state_tables_run(redis_client: redis.Redis) -> None:
    probe = (
        scripts.job_states_lua()
        + "\n"
        + (
            "local names, ends, live = {}, {}, {}\n"
            "for _, s in ipairs(ARGV) do\n"
            "  names[#names + 1] = JOB_STATE[string.lower(s)]\n"
            "  ends[#ends + 1] = TERMINAL[s] and 1 or 0\n"
            "  live[#live + 1] = ACTIVE[s] and 1 or 0\n"
            "end\n"
            "return {names, ends, live}\n"
        )
    )
    order = list(JobState)
    names, ends, live = redis_client.eval(probe, 0, *[s.value for s in order])
    assert names == [s.value for s in order]
    assert ends == [int(s in TERMINAL) for s in order]
    assert live == [int(s in ACTIVE) for s in order]
