"""``frenzy agent --drain``: take a node out of scheduling and wait for its jobs to finish.

An operator's client command, not a second agent: it sets the node's
``draining`` flag (``set_draining.lua``), after which HAS places nothing new
there and ``place_jobs.lua`` refuses it, while the running agent goes on
running and reporting the jobs it has. With ``wait`` it returns once no GPU
of the node is held by a job, so ``frenzy agent --drain && systemctl stop
frenzy-agent`` empties a host for maintenance. ``--undrain`` reverses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from frenzy.state import scripts
from frenzy.state.keys import Keys


def held_jobs(client: redis.Redis, keys: Keys, node: str) -> dict[str, list[int]]:
    """Job id -> the node's GPU indices it holds."""
    count = int(client.hget(keys.node(node), "gpu_count") or 0)
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.hget(keys.gpu(node, i), "owner")
    out: dict[str, list[int]] = {}
    for i, owner in enumerate(pipe.execute()):
        if owner:
            out.setdefault(owner, []).append(i)
    return out


def drain(redis_url: str, keys: Keys, node: str, undrain: bool = False, wait: bool = True,
          timeout_s: float = 0.0, poll_s: float = 1.0, say: Callable[[str], None] = print) -> int:
    """Drain (or undrain) ``node``. -> exit code: 0 done, 1 timed out with jobs left, 4 no such node."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        if not int(scripts.register(client, "set_draining")(keys=[keys.node(node)], args=["0" if undrain else "1"])):
            say(f"error: no node {node!r} has registered (prefix {keys.prefix!r}). To fix: give the agent's --node "
                "name and the same --prefix / REDIS_URL as the cluster")
            return 4
        if undrain:
            say(f"node {node} accepts jobs again")
            return 0
        jobs = held_jobs(client, keys, node)
        say(f"node {node} is draining: no new jobs; "
            + (f"waiting for {len(jobs)} running job(s): {', '.join(sorted(jobs))}" if jobs and wait
               else f"{len(jobs)} job(s) still running" if jobs else "no job running"))
        if not wait:
            return 0
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        while jobs:
            if deadline is not None and time.monotonic() >= deadline:
                say(f"timed out after {timeout_s:.0f} s; still running on {node}: {', '.join(sorted(jobs))}")
                return 1
            time.sleep(poll_s)
            now = held_jobs(client, keys, node)
            for done in sorted(set(jobs) - set(now)):
                say(f"  {done} finished")
            jobs = now
        say(f"node {node} is drained: no job holds its GPUs")
        return 0
    finally:
        client.close()
