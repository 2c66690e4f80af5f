"""The atomic placement (``place_jobs.lua``): all or nothing per job, never a GPU held by two jobs,
however many schedulers race (tests/integration/scheduler/test_place_batch.py has the batch)."""

from __future__ import annotations

import random
import threading

import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.outcomes import Moved
from support.placed import place
from support.state import GiB, add_node, make_plan, make_spec


def _loop(client: redis.Redis, keys: Keys) -> SchedulerLoop:
    return SchedulerLoop(client, keys, master_ports=(30000, 30999))


def test_a_placement_is_all_or_nothing(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    add_node(redis_client, keys, "dead", "A100-80GB", 2, alive=False)
    loop = _loop(redis_client, keys)
    store = loop.store
    a, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    b, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=2)], "m", 1)
    c, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=3)], "m", 1)
    d, _ = store.submit(make_spec(), [make_plan("A100-80GB", peak=10 * GiB)], "m", 1)
    assert place(loop, a, [("n0", [1])])[0]
    # b wants GPU 0 (free) and GPU 1 (held by a): nothing may be written.
    ok, why = place(loop, b, [("n0", [0, 1])])
    assert not ok and "held by" in why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == ""
    assert store.get(b).state == JobState.PENDING  # type: ignore[union-attr]
    assert [m for _, m in redis_client.xrange(keys.launch_stream("n0"))][1:] == []  # a's launch only
    # c includes a dead node: refused, nothing written.
    ok, why = place(loop, c, [("n0", [0]), ("dead", [0, 1])])
    assert not ok and "dead" in why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == ""
    assert redis_client.hget(keys.gpu("dead", 0), "owner") == ""
    assert redis_client.xlen(keys.launch_stream("dead")) == 0
    # too little free memory on a GPU (a foreign process holds it): refused.
    redis_client.hset(keys.gpu("n0", 0), "memory_free", 5 * GiB)
    ok, why = place(loop, d, [("n0", [0])])
    assert not ok and "bytes free" in why
    assert {store.get(j).state for j in (b, c, d)} == {JobState.PENDING}  # type: ignore[union-attr]


def test_a_job_cancelled_since_the_queue_read_is_not_placed(redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 1)
    loop = _loop(redis_client, keys)
    a, _ = loop.store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    loop.store.queue()
    assert loop.cancel(loop.store.get(a), "user") == Moved(True, JobState.CANCELLED)  # type: ignore[arg-type]
    ok, why = place(loop, a, [("n0", [0])], read_queue=False)
    assert not ok and "CANCELLED" in why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == ""
    assert redis_client.xlen(keys.launch_stream("n0")) == 0


def test_concurrent_overlapping_placements_never_double_book(redis_url: str, keys: Keys) -> None:
    """Many schedulers race for overlapping GPU sets; every GPU ends with at most one owner,
    and the winners' placements are pairwise disjoint."""
    setup = redis.Redis.from_url(redis_url, decode_responses=True)
    nodes = {f"n{i}": 4 for i in range(3)}
    for name, count in nodes.items():
        add_node(setup, keys, name, "A100-80GB", count)
    store0 = _loop(setup, keys).store
    rng = random.Random(7)
    attempts = []
    for _ in range(60):
        k = rng.choice([1, 2, 3, 4])
        chosen: dict[str, list[int]] = {}
        for gpu in rng.sample([(n, i) for n, c in nodes.items() for i in range(c)], k):
            chosen.setdefault(gpu[0], []).append(gpu[1])
        job_id, _ = store0.submit(make_spec(), [make_plan("A100-80GB", dp=k)], "m", 1)
        attempts.append((job_id, sorted((n, sorted(g)) for n, g in chosen.items())))

    barrier = threading.Barrier(12)
    results: dict[str, bool] = {}
    lock = threading.Lock()

    def worker(batch: list) -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        loop = _loop(client, keys)
        loop.store.queue()
        barrier.wait()
        for job_id, placement in batch:
            ok, _ = place(loop, job_id, placement, read_queue=False)
            with lock:
                results[job_id] = ok
        client.close()

    threads = [threading.Thread(target=worker, args=(attempts[i::12],)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == len(attempts)
    winners = [(j, p) for j, p in attempts if results[j]]
    assert winners, "at least one placement must succeed"
    taken: dict[tuple[str, int], str] = {}
    for job_id, placement in winners:
        for node, idxs in placement:
            for i in idxs:
                assert (node, i) not in taken, f"GPU {node}:{i} placed for {taken[(node, i)]} and {job_id}"
                taken[(node, i)] = job_id
    for (node, i), job_id in taken.items():
        assert setup.hget(keys.gpu(node, i), "owner") == job_id
    for name, count in nodes.items():
        for i in range(count):
            if (name, i) not in taken:
                assert setup.hget(keys.gpu(name, i), "owner") == ""
    for job_id, _ in attempts:
        state = store0.get(job_id).state  # type: ignore[union-attr]
        assert state == (JobState.LAUNCHING if results[job_id] else JobState.PENDING)
    setup.close()
