"""The atomic reservation: all or nothing, never a GPU held by two jobs."""

from __future__ import annotations

import random
import threading

import redis

from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore
from has import Placement, PlanOption
from support.state import GiB, add_node, make_plan, make_spec


def _placement(job_id: str, nodes: list[tuple[str, list[int]]], tp: int = 1) -> Placement:
    n = sum(len(g) for _, g in nodes)
    return Placement(job_id=job_id, plan_index=0, plan=PlanOption(gpu_type="A100-80GB", tp=tp, pp=1, dp=n // tp,
                                                                   bytes_per_gpu=GiB),
                     nodes=tuple((name, tuple(g)) for name, g in nodes))


def test_reserve_takes_every_gpu_and_moves_job(store: StateStore, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 4)
    job_id, dup = store.submit(make_spec(), [make_plan("A100-80GB", dp=2)], "gpt2-124m", 124_000_000)
    assert not dup and store.get(job_id).state == JobState.PENDING
    ok, fence = store.reserve(_placement(job_id, [("n0", [1, 2])]), make_plan("A100-80GB", dp=2))
    assert ok and int(fence) > 0
    job = store.get(job_id)
    assert job.state == JobState.RESERVED and job.placement == [("n0", [1, 2])] and job.fence == fence
    owners = [redis_client.hget(keys.gpu("n0", i), "owner") for i in range(4)]
    assert owners == ["", job_id, job_id, ""]
    assert redis_client.zscore(keys.queue(), job_id) is None
    assert [h["state"] for h in job.history] == ["PENDING", "RESERVED"]


def test_reserve_is_all_or_nothing(store: StateStore, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    add_node(redis_client, keys, "dead", "A100-80GB", 2, alive=False)
    a, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    b, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=2)], "m", 1)
    c, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=3)], "m", 1)
    assert store.reserve(_placement(a, [("n0", [1])]), make_plan("A100-80GB"))[0]
    # b wants GPU 0 (free) and GPU 1 (held by a): nothing may be written.
    ok, why = store.reserve(_placement(b, [("n0", [0, 1])]), make_plan("A100-80GB", dp=2))
    assert not ok and "held by" in why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == ""
    assert store.get(b).state == JobState.PENDING
    # c includes a dead node: refused, nothing written.
    ok, why = store.reserve(_placement(c, [("n0", [0]), ("dead", [0, 1])]), make_plan("A100-80GB", dp=3))
    assert not ok and "dead" in why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == ""
    assert redis_client.hget(keys.gpu("dead", 0), "owner") == ""
    # too little free memory on a GPU (a foreign process holds it): refused.
    redis_client.hset(keys.gpu("n0", 0), "memory_free", 5 * GiB)
    ok, why = store.reserve(_placement(b, [("n0", [0])]), make_plan("A100-80GB", peak=10 * GiB))
    assert not ok and "bytes free" in why


def test_cancelled_job_cannot_be_reserved(store: StateStore, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 1)
    a, _ = store.submit(make_spec(), [make_plan("A100-80GB")], "m", 1)
    moved, _ = store.transition(store.get(a), JobState.CANCELLED, "user")
    assert moved
    ok, why = store.reserve(_placement(a, [("n0", [0])]), make_plan("A100-80GB"))
    assert not ok and "CANCELLED" in why
    assert redis_client.hget(keys.gpu("n0", 0), "owner") == ""


def test_concurrent_overlapping_reservations_never_double_book(redis_url: str, keys: Keys) -> None:
    """Many clients race for overlapping GPU sets; every GPU ends with at most one owner,
    and the winners' placements are pairwise disjoint."""
    setup = redis.Redis.from_url(redis_url, decode_responses=True)
    nodes = {f"n{i}": 4 for i in range(3)}
    for name, count in nodes.items():
        add_node(setup, keys, name, "A100-80GB", count)
    store0 = StateStore(setup, keys)
    rng = random.Random(7)
    attempts = []
    for _ in range(60):
        k = rng.choice([1, 2, 3, 4])
        chosen: dict[str, list[int]] = {}
        for gpu in rng.sample([(n, i) for n, c in nodes.items() for i in range(c)], k):
            chosen.setdefault(gpu[0], []).append(gpu[1])
        job_id, _ = store0.submit(make_spec(), [make_plan("A100-80GB", dp=k)], "m", 1)
        attempts.append((job_id, sorted((n, sorted(g)) for n, g in chosen.items()), k))

    barrier = threading.Barrier(12)
    results: dict[str, bool] = {}
    lock = threading.Lock()

    def worker(batch: list) -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        store = StateStore(client, keys)
        barrier.wait()
        for job_id, placement, k in batch:
            ok, _ = store.reserve(_placement(job_id, placement), make_plan("A100-80GB", dp=k))
            with lock:
                results[job_id] = ok
        client.close()

    threads = [threading.Thread(target=worker, args=(attempts[i::12],)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == len(attempts)
    winners = [(j, p) for j, p, _ in attempts if results[j]]
    assert winners, "at least one reservation must succeed"
    taken: dict[tuple[str, int], str] = {}
    for job_id, placement in winners:
        for node, idxs in placement:
            for i in idxs:
                assert (node, i) not in taken, f"GPU {node}:{i} reserved by {taken[(node, i)]} and {job_id}"
                taken[(node, i)] = job_id
    for (node, i), job_id in taken.items():
        assert setup.hget(keys.gpu(node, i), "owner") == job_id
    for name, count in nodes.items():
        for i in range(count):
            if (name, i) not in taken:
                assert setup.hget(keys.gpu(name, i), "owner") == ""
    for job_id, _, _ in attempts:
        state = store0.get(job_id).state
        assert state == (JobState.RESERVED if results[job_id] else JobState.PENDING)
    setup.close()
