"""The scheduler re-reads only nodes whose ``rev`` moved — so every script that changes a GPU
the way the scheduler reads it must bump it, and a stale node must heal.

Each step runs one of Frenzy's real scripts (through the store, or with the agent's own
arguments) on a store that has already cached the cluster, then compares its view with a
store that has no history. A script that forgot to bump ``rev`` fails here: the cached store
would keep serving the node as it was.
"""

from __future__ import annotations

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state import scripts
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.outcomes import ExitCounted, ExitStatus, Moved
from frenzy.state.store import StateStore
from has import ClusterView
from support.placed import place
from support.state import GiB, add_node, make_plan, make_spec


def _same(cached: StateStore, client: redis.Redis, keys: Keys) -> ClusterView:
    view = cached.cluster().view
    fresh = StateStore(client, keys).cluster().view
    assert view.nodes == fresh.nodes
    return view


def _reserved(store: StateStore, node: str, gpus: list[int]) -> str:
    """A job placed on ``node``'s ``gpus`` by a scheduler (place_jobs.lua)."""
    job, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=len(gpus))], "m", 1)
    ok, why = place(SchedulerLoop(store.r, store.k), job, [(node, gpus)])
    assert ok, why
    return job


def _rev(client: redis.Redis, keys: Keys, node: str) -> int:
    return int(client.hget(keys.node(node), "rev") or 0)


def _heartbeat(client: redis.Redis, keys: Keys, node: str, memory_free: list[int], healthy: list[int]) -> None:
    """One beat with the agent's own script and argument layout."""
    args: list[object] = [60_000, "agent-1", ""]
    for free, ok in zip(memory_free, healthy, strict=True):
        args += [free, ok, "", 0, "[]"]
    keys_ = [keys.node(node), keys.node_alive(node), *[keys.gpu(node, i) for i in range(len(memory_free))]]
    assert scripts.register(client, "heartbeat")(keys=keys_, args=args) == 1


def test_every_script_that_changes_a_gpu_is_seen_by_a_store_that_cached_the_node(
    store: StateStore, redis_client: redis.Redis, keys: Keys
) -> None:
    r = redis_client
    for n in ("a0", "a1"):
        add_node(r, keys, n, "A100-80GB", 4)
    store.full_read_s = 1e9  # only rev may trigger a re-read in this test
    first = _same(store, r, keys)
    assert store.cluster().view is first

    # place_jobs
    done = _reserved(store, "a0", [0, 1])
    assert _same(store, r, keys).free_count("A100-80GB") == 6

    # record_exit: the last node's exit releases the job's GPUs
    job = store.get(done)
    assert job is not None
    assert store.run_call(store.record_exit_call(job, job.attempt, "a0", 0, "done")) == ExitCounted(
        ExitStatus.FINISHED, JobState.SUCCEEDED)
    assert _same(store, r, keys).free_count("A100-80GB") == 8

    # transition_job with release (what a cancel of a job holding GPUs before its launch released)
    cancelled = _reserved(store, "a1", [0])
    assert _same(store, r, keys).free_count("A100-80GB") == 7
    assert store.transition(store.get(cancelled), JobState.CANCELLED, "cancelled", release=True).done  # type: ignore[arg-type]
    assert _same(store, r, keys).free_count("A100-80GB") == 8

    # requeue_job: GPUs on the lost node are released; the job is pending again
    lost = _reserved(store, "a1", [0, 1, 2, 3])
    assert _same(store, r, keys).free_count("A100-80GB") == 4
    assert store.requeue(store.get(lost), ["a1"], "node lost", 3) == Moved(True, JobState.PENDING)  # type: ignore[arg-type]
    assert _same(store, r, keys).free_count("A100-80GB") == 8

    # release_stale: a requeue leaves a still-stopping node's GPUs held under the old fence;
    # the agent's exit report frees exactly those
    stopping = _reserved(store, "a0", [2, 3])
    job = store.get(stopping)
    assert job is not None
    assert store.requeue(job, [], "launch failed on the host", 3).done
    assert _same(store, r, keys).free_count("A100-80GB") == 6  # still held: not released yet
    assert store.release_stale(stopping, "a0", job.fence) == 2
    assert _same(store, r, keys).free_count("A100-80GB") == 8

    # heartbeat: a free GPU's memory moves (a foreign process), then a GPU turns unhealthy
    _heartbeat(r, keys, "a1", [80 * GiB, 80 * GiB, 2 * GiB, 80 * GiB], [1, 1, 1, 1])
    assert [g.memory_free for g in _same(store, r, keys).node("a1").gpus][2] == 2 * GiB
    _heartbeat(r, keys, "a1", [80 * GiB, 80 * GiB, 2 * GiB, 80 * GiB], [1, 0, 1, 1])
    assert not _same(store, r, keys).node("a1").gpus[1].healthy


def test_a_heartbeat_that_changes_nothing_the_scheduler_reads_does_not_bump_rev(
    redis_client: redis.Redis, keys: Keys
) -> None:
    add_node(redis_client, keys, "a0", "A100-80GB", 2)
    redis_client.hset(keys.gpu("a0", 1), "owner", "job-x")  # busy: its memory is not read
    _heartbeat(redis_client, keys, "a0", [80 * GiB, 80 * GiB], [1, 1])
    rev = _rev(redis_client, keys, "a0")
    _heartbeat(redis_client, keys, "a0", [80 * GiB, 3 * GiB], [1, 1])  # the busy GPU's memory moved
    assert _rev(redis_client, keys, "a0") == rev
    _heartbeat(redis_client, keys, "a0", [79 * GiB, 3 * GiB], [1, 1])  # the free one's moved
    assert _rev(redis_client, keys, "a0") == rev + 1


def test_a_write_that_bypassed_the_scripts_heals_on_a_lost_race_or_the_next_full_read(
    store: StateStore, redis_client: redis.Redis, keys: Keys
) -> None:
    r = redis_client
    add_node(r, keys, "a0", "A100-80GB", 2)
    store.full_read_s = 1e9
    assert store.cluster().view.free_count("A100-80GB") == 2
    r.hset(keys.gpu("a0", 0), "owner", "intruder")  # no rev bump: the store cannot know
    assert store.cluster().view.free_count("A100-80GB") == 2  # stale, by design of the contract
    store.forget_nodes(["a0"])  # what the loop does when a reservation there lost a race
    assert store.cluster().view.free_count("A100-80GB") == 1

    r.hset(keys.gpu("a0", 1), "owner", "intruder")
    assert store.cluster().view.free_count("A100-80GB") == 1
    store.full_read_s = 0.0  # the periodic full read comes due
    assert store.cluster().view.free_count("A100-80GB") == 0
