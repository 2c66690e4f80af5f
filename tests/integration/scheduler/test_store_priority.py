"""A job's priority in Redis: written as a job hash field at submission, read by the queue read
into ``QueuedJob.priority`` (no spec parsing) and by the cluster read into
``RunningJob.priority`` for preemption; a job written before priorities existed reads as 0."""

from __future__ import annotations

import time

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore
from has import QueuePolicy
from support.placed import place
from support.state import add_node, make_plan, make_spec


def test_priority_is_written_once_and_read_by_the_queue_and_cluster_reads(
    store: StateStore, redis_client: redis.Redis, keys: Keys
) -> None:
    add_node(redis_client, keys, "a0", "A100-80GB", 2)
    spec = make_spec("urgent")
    spec.priority = 7
    urgent, _ = store.submit(spec, [make_plan("A100-80GB")], "m", 1, user="u")
    plain, _ = store.submit(make_spec("plain"), [make_plan("A100-80GB")], "m", 1, user="u")
    assert redis_client.hget(keys.job(urgent), "priority") == "7"
    assert {q.job_id: q.priority for q in store.queue().jobs} == {urgent: 7, plain: 0}
    assert store.get(urgent).spec.priority == 7  # type: ignore[union-attr]

    # a job hash from before priorities (no field): normal
    redis_client.hdel(keys.job(plain), "priority")
    assert {q.job_id: q.priority for q in StateStore(redis_client, keys).queue().jobs} == {urgent: 7, plain: 0}

    # once it holds GPUs, preemption sees its priority
    ok, why = place(SchedulerLoop(redis_client, keys), urgent, [("a0", [0])])
    assert ok, why
    running = store.cluster().weighed(QueuePolicy.named("frenzy-completion"), time.time())
    assert [(r.job_id, r.priority) for r in running] == [(urgent, 7)]
