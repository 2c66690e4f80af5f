"""issue 14 D1: a scheduler stopped between ``reserve_gpus.lua`` and ``dispatch_job.lua``.

Before: the job stayed RESERVED forever, holding its GPUs; nothing recovered it, neither a
restarted scheduler nor the reaper. Now the next scheduler rolls it back into the queue on
start (and runs it), and a running scheduler's reaper rolls back a reservation left by
another one once it has waited ``reservation_timeout_s``; a job is launched once.

Real parts: Redis, a scheduler (gRPC, predictor, loop) and a fake-GPU agent running the job's
command as a process. The stopped scheduler is played by running ``reserve_gpus.lua`` alone: what a
kill between the two scripts leaves in Redis. (Since the batched placement path, ``place_jobs.lua``
reserves and launches in one call, so a scheduler of today cannot leave a job like this; the
recovery stays for a Redis written by an older one, and for the reaper's own safety.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from faults import scheduler_support
from faults.scheduler_support import Agents, marking_command, runs

from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import decode_command
from frenzy.state.store import StateStore
from has import Placement, PlanOption
from support.servers import running_servers
from support.state import GiB, make_plan, make_spec
from support.waiting import wait_for

make_agents = scheduler_support.make_agents  # the fixture


def _launches(client: redis.Redis, keys: Keys, node: str, job_id: str) -> int:
    return sum(1 for _, fields in client.xrange(keys.launch_stream(node))
               if (cmd := decode_command(fields)).kind == "launch" and cmd.job_id == job_id)


def test_a_restarted_scheduler_runs_the_job_its_predecessor_reserved_but_never_dispatched(
        redis_url: str, redis_client: redis.Redis, prefix: str, tmp_path: Path,
        make_agents: Callable[[str, Keys], Agents]) -> None:
    keys = Keys(prefix)
    make_agents(redis_url, keys).start("n1")
    marker = tmp_path / "runs"
    spec = make_spec("d1")
    spec.command[:] = marking_command(marker, "ran")
    store = StateStore(redis_client, keys)
    job_id, _ = store.submit(spec, [make_plan("A100-80GB")], "gpt2-124m", 1)

    # What a scheduler of the two-step path (reserve_gpus.lua, then dispatch_job.lua) killed
    # between the two scripts leaves in Redis. Today's loop reserves and launches in one call
    # (place_jobs.lua) and cannot leave it; a Redis written by an older one still may.
    wait_for(lambda: redis_client.exists(keys.node_alive("n1")), timeout=10, what="the agent's lease")
    option = PlanOption(gpu_type="A100-80GB", tp=1, pp=1, dp=1, bytes_per_gpu=GiB)
    ok, fence = store.reserve(Placement(job_id, 0, option, (("n1", (0,)),)), make_plan("A100-80GB"))
    assert ok, fence
    stuck = store.get(job_id)
    assert stuck is not None and stuck.state == JobState.RESERVED
    assert redis_client.hget(keys.gpu("n1", 0), "owner") == job_id

    with running_servers(redis_url, prefix):
        done = wait_for(lambda: (j := store.get(job_id)) and j.state == JobState.SUCCEEDED and j, timeout=10,
                        what="the stuck job to run to the end under the next scheduler")
    assert done.attempt == 1  # it never ran: the rollback costs no attempt
    assert any("never dispatched" in h.get("reason", "") for h in done.history), done.history
    assert runs(marker) == ["ran"]
    assert _launches(redis_client, keys, "n1", job_id) == 1
    assert redis_client.hget(keys.gpu("n1", 0), "owner") == ""


def test_the_reaper_rolls_back_a_reservation_another_scheduler_left(
        redis_url: str, redis_client: redis.Redis, prefix: str, make_agents: Callable[[str, Keys], Agents]) -> None:
    keys = Keys(prefix)
    make_agents(redis_url, keys).start("n1")
    store = StateStore(redis_client, keys)
    with running_servers(redis_url, prefix) as servers:
        servers.scheduler.loop.reservation_timeout_s = 1.0
        # After its start-up recovery (which rolls back at once what it finds reserved): what
        # follows is the reaper's timeout at work, not that.
        wait_for(lambda: servers.scheduler.loop.recovered.is_set(), 10, "the scheduler's start-up recovery")
        # Plans for a GPU type this cluster lacks: the running scheduler never places the job
        # itself, so only the reservation another scheduler made (and died) holds it.
        plan = make_plan("H100-80GB")
        job_id, _ = store.submit(make_spec("d1-reaper"), [plan], "gpt2-124m", 1)
        option = PlanOption(gpu_type="A100-80GB", tp=1, pp=1, dp=1, bytes_per_gpu=GiB)
        ok, fence = store.reserve(Placement(job_id, 0, option, (("n1", (0,)),)), plan)
        assert ok, fence
        assert store.get(job_id).state == JobState.RESERVED  # type: ignore[union-attr]
        back = wait_for(lambda: (j := store.get(job_id)) and j.state == JobState.PENDING and j, timeout=8,
                        what="the reaper to roll the reservation back")
    assert back.attempt == 1 and back.fence == 0 and back.placement == []
    # Rolled back by the reaper ("never dispatched for N s") or, when the reservation landed before
    # this scheduler's first pass, by its start-up recovery ("... when the scheduler started"); the
    # history keeps why (the pending reason is the next pass's to overwrite).
    assert "never dispatched" in back.history[-1]["reason"], back.history
    assert redis_client.hget(keys.gpu("n1", 0), "owner") == ""
    assert redis_client.hgetall(keys.ports("n1")) == {}
    assert _launches(redis_client, keys, "n1", job_id) == 0
