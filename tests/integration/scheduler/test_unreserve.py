"""``unreserve_job.lua`` on a real Redis: a reservation never dispatched goes back to the queue
under its fence only; the stopped scheduler's late dispatch then sends nothing (issue 14 D1)."""

from __future__ import annotations

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from has import Placement, PlanOption
from support.state import GiB, add_node, make_plan, make_spec


def test_unreserve_is_fenced_and_a_late_dispatch_sends_nothing(redis_client: redis.Redis, keys: Keys) -> None:
    loop = SchedulerLoop(redis_client, keys, master_ports=(30100, 30101))
    store = loop.store
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=2)], "m", 1)
    option = PlanOption(gpu_type="A100-80GB", tp=1, pp=1, dp=2, bytes_per_gpu=GiB)
    ok, fence = store.reserve(Placement(job_id, 0, option, (("a", (0, 1)),)), make_plan("A100-80GB", dp=2),
                              loop.master_ports)
    assert ok
    job = store.get(job_id)
    assert job is not None and job.state == JobState.RESERVED
    rev = redis_client.hget(keys.node("a"), "rev")
    # Under another fence: nothing happens.
    stale = job.__class__(**{**job.__dict__, "fence": int(fence) + 1})
    assert store.unreserve(stale, "x") == (False, JobState.RESERVED.value)
    assert store.unreserve(job, "requeued: never dispatched") == (True, JobState.PENDING.value)
    back = store.get(job_id)
    assert back is not None and (back.state, back.attempt, back.fence, back.placement) == (JobState.PENDING, 1, 0, [])
    assert back.pending_reason == "requeued: never dispatched" and back.history[-1]["state"] == "PENDING"
    assert [q.job_id for q in store.queue()] == [job_id]
    assert [redis_client.hget(keys.gpu("a", i), "owner") for i in (0, 1)] == ["", ""]
    assert redis_client.hgetall(keys.ports("a")) == {} and redis_client.hget(keys.node("a"), "rev") != rev
    # The scheduler that reserved it wakes up late: its dispatch is refused, no launch is sent.
    assert store.dispatch(job_id, int(fence), loop.launch_messages(job, int(fence)))[0] is False
    assert redis_client.xlen(keys.launch_stream("a")) == 0
    assert store.unreserve(job, "again") == (False, JobState.PENDING.value)  # repeated: a no-op
