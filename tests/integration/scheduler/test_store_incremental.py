"""The scheduler's per-tick reads reuse what has not changed, and never serve a stale answer.

``StateStore.queue`` keeps each waiting job's parsed plans (the same ``QueuedJob`` object
while it waits); ``StateStore.cluster`` keeps each unchanged node's ``NodeView`` and builds
the next ``ClusterView`` from the last one. After each change a live cluster makes —
reservations, releases, expected ends, heartbeats, health, draining, death, new and removed
nodes, requeues with new plans — the result must equal what a store with no history reads.
"""

from __future__ import annotations

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.outcomes import Moved
from frenzy.state.store import StateStore
from has import ClusterView
from support.placed import place
from support.state import GiB, add_node, make_plan, make_spec, set_gpu


def _fresh(client: redis.Redis, keys: Keys) -> StateStore:
    return StateStore(client, keys)  # no history: reads everything anew


def _same_view(a: ClusterView, b: ClusterView) -> None:
    assert a.nodes == b.nodes
    for t in sorted(a.gpu_types() | b.gpu_types()):
        assert list(a.free_by_node(t).items()) == list(b.free_by_node(t).items())
        assert list(a.healthy_by_node(t).items()) == list(b.healthy_by_node(t).items())
        assert a.free_buckets(t) == b.free_buckets(t)
        assert a.release_times(t, 1, 0.0) == b.release_times(t, 1, 0.0)
        assert a.release_runs(t, 1, 0.0) == b.release_runs(t, 1, 0.0)
        assert a.drain_inventory(t) == b.drain_inventory(t)
    assert a.free_summary() == b.free_summary()
    assert a.gpus_by_owner() == b.gpus_by_owner()  # what preemption reads (was frozen once)


def _place(client: redis.Redis, keys: Keys, job_id: str, node: str, gpus: list[int]) -> None:
    """Place the job as a scheduler does (place_jobs.lua; another store than the one under test)."""
    ok, why = place(SchedulerLoop(client, keys), job_id, [(node, gpus)])
    assert ok, why


def test_the_cluster_view_follows_every_change_and_reuses_untouched_nodes(
    store: StateStore, redis_client: redis.Redis, keys: Keys
) -> None:
    r = redis_client
    for n in ("a0", "a1", "a2"):
        add_node(r, keys, n, "A100-80GB", 4)
    add_node(r, keys, "l0", "L4", 2, memory=24 * GiB)
    first = store.cluster().view
    _same_view(first, _fresh(r, keys).cluster().view)
    assert store.cluster().view is first  # nothing changed: the very same view

    job, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=2)], "m", 1)
    _place(r, keys, job, "a1", [0, 1])
    second = store.cluster().view
    _same_view(second, _fresh(r, keys).cluster().view)
    assert second.free_count("A100-80GB") == 10
    assert second.node("a0") is first.node("a0") and second.node("l0") is first.node("l0")
    assert second.node("a1") is not first.node("a1")

    # The expected end arrives in a separate write (after the reservation): it must show.
    store.set_fields(job, est_end="5000.5")
    third = store.cluster().view
    _same_view(third, _fresh(r, keys).cluster().view)
    assert [g.free_at for g in third.node("a1").gpus if g.owner] == [5000.5, 5000.5]
    assert third.release_times("A100-80GB", 1, 0.0)[-2:] == [5000.5, 5000.5]

    changes = [
        lambda: set_gpu(r, keys, "a0", 3, memory_free=3 * GiB),  # a foreign process (heartbeat)
        lambda: set_gpu(r, keys, "a0", 3, utilization=77),  # not read by the scheduler: no change
        lambda: set_gpu(r, keys, "a2", 0, healthy="0"),
        lambda: r.hset(keys.node("a2"), "draining", "1"),
        lambda: r.delete(keys.node_alive("l0")),  # lease gone: not schedulable
        lambda: add_node(r, keys, "a05", "A100-80GB", 2),  # sorts between a0 and a1
        lambda: set_gpu(r, keys, "a1", 0, owner="", fence=0),  # released
        lambda: r.srem(keys.nodes(), "a2"),  # removed from the cluster
        lambda: store.set_fields(job, est_end="10.0"),
        lambda: r.hset(keys.node("a2"), "draining", "0") and r.sadd(keys.nodes(), "a2"),  # back
        lambda: add_node(r, keys, "h0", "H100-80GB", 8),  # a new GPU type
    ]
    before = store.cluster().view
    for change in changes:
        change()
        now = store.cluster().view
        _same_view(now, _fresh(r, keys).cluster().view)
        untouched = [n.name for n in before.nodes if n.name in {x.name for x in now.nodes} and n == now.node(n.name)]
        # a node whose state did not change keeps its object (nothing rebuilt for it)
        assert all(now.node(name) is before.node(name) for name in untouched if name != "a1"), change
        before = now


def test_the_queue_keeps_parsed_jobs_and_picks_up_requeues_with_new_plans(
    store: StateStore, redis_client: redis.Redis, keys: Keys
) -> None:
    a, _ = store.submit(make_spec("a"), [make_plan("A100-80GB", dp=2)], "m", 1)
    b, _ = store.submit(make_spec("b"), [make_plan("L4")], "m", 1)
    first = store.queue().jobs
    assert [j.job_id for j in first] == [a, b]
    again = store.queue().jobs
    assert all(x is y for x, y in zip(first, again, strict=True))  # parsed once
    assert again == _fresh(redis_client, keys).queue().jobs

    add_node(redis_client, keys, "n0", "A100-80GB", 4)
    _place(redis_client, keys, a, "n0", [0, 1])
    assert [j.job_id for j in store.queue().jobs] == [b]

    # Node loss: the job is requeued for attempt 2 with plans for what is left.
    job = store.get(a)
    assert job is not None
    assert store.requeue(job, ["n0"], "node n0 lost", 3, plans=[make_plan("L4", dp=4)]) == Moved(True, JobState.PENDING)
    queue = store.queue().jobs
    assert queue == _fresh(redis_client, keys).queue().jobs
    requeued = next(j for j in queue if j.job_id == a)
    assert [(p.gpu_type, p.num_gpus) for p in requeued.plans] == [("L4", 4)]
    assert next(j for j in queue if j.job_id == b) is next(j for j in first if j.job_id == b)

    # A cancelled job leaves the queue; the cache does not bring it back.
    assert store.transition(store.get(b), JobState.CANCELLED, "cancelled by the user").done  # type: ignore[arg-type]
    assert [j.job_id for j in store.queue().jobs] == [a]


def test_a_job_with_unreadable_plans_is_skipped_not_fatal(
    store: StateStore, redis_client: redis.Redis, keys: Keys
) -> None:
    a, _ = store.submit(make_spec("a"), [make_plan("L4")], "m", 1)
    b, _ = store.submit(make_spec("b"), [make_plan("L4")], "m", 1)
    redis_client.hset(keys.job(a), "plans", '[{"gpuType": "L4", "layout": {"tp": "x"}}]')
    assert [j.job_id for j in store.queue().jobs] == [b]
    redis_client.hset(keys.job(a), "plans", "not json")
    assert [j.job_id for j in _fresh(redis_client, keys).queue().jobs] == [b]
