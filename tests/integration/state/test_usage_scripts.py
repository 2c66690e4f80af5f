"""The usage charge the scripts that end an attempt write (lua/lib/usage_record.lua, issue 35): a
requeue after a node loss charges the attempt it ends (once: a repeated call charges nothing), each
node's GPUs at its own price_per_gpu_hour where it carries one, and the next attempt separately."""

from __future__ import annotations

import time

import pytest
import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.usage import UsageLedger
from frenzy.state.usage_rows import aggregate, day_index
from marp.prices import list_price
from support.placed import place
from support.state import add_node, make_plan, make_spec


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    return SchedulerLoop(redis_client, keys, dead_after_s=5.0, max_attempts=3, orphan_release_s=60.0,
                         master_ports=(30000, 30010))


def test_a_requeue_charges_the_attempt_it_ends_at_each_nodes_price(loop: SchedulerLoop, redis_client: redis.Redis,
                                                                   keys: Keys) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    add_node(redis_client, keys, "b", "A100-80GB", 2)
    redis_client.hset(keys.node("b"), "price_per_gpu_hour", "1.5")  # an operator's rate on node b
    store = loop.store
    job_id, _ = store.submit(make_spec(), [make_plan("A100-80GB", dp=4)], "gpt2-124m", 1, user="alice")
    ok, why = place(loop, job_id, [("a", [0, 1]), ("b", [0, 1])])
    assert ok, why
    job = store.get(job_id)
    assert job is not None
    redis_client.hset(keys.job(job_id), "reserved_at", repr(time.time() - 1800))  # it held them half an hour
    moved = store.requeue(job, ["b"], "node b lost", max_attempts=3)
    assert moved.done and moved.state == JobState.PENDING
    assert not store.requeue(job, ["b"], "node b lost", max_attempts=3).done  # stale: nothing more charged

    ledger = UsageLedger(redis_client, keys)
    [entry] = list(ledger.entries())
    assert (entry.user, entry.job, entry.attempt, entry.gpu_type, entry.gpus) == ("alice", job_id, 1, "A100-80GB", 4)
    assert entry.gpu_hours == pytest.approx(4 * 0.5, rel=1e-3)
    assert entry.cost_usd == pytest.approx(2 * 0.5 * list_price("A100-80GB") + 2 * 0.5 * 1.5, rel=1e-3)
    assert entry.price == pytest.approx(entry.cost_usd / entry.gpu_hours)  # what was charged, kept with it
    assert entry.outcome.startswith("requeued: node b lost")
    now = time.time()
    assert ledger.spent("alice", now, now + 86400).gpu_hours == pytest.approx(2.0, rel=1e-3)
    assert ledger.totals()[("h", "alice", "A100-80GB")] == pytest.approx(2.0, rel=1e-3)
    assert day_index(entry.end) == day_index(now)

    # The next attempt (node a's GPUs stay held until its agent reports the exit) is charged on its
    # own when it ends.
    add_node(redis_client, keys, "c", "A100-80GB", 2)
    ok, why = place(loop, job_id, [("b", [0, 1]), ("c", [0, 1])])
    assert ok, why
    job = store.get(job_id)
    assert job is not None and job.attempt == 2
    for node in ("b", "c"):
        counted = store.run_call(store.record_exit_call(job, 2, node, 0, "exited"))
    assert counted.state == JobState.SUCCEEDED
    rows = aggregate(ledger.entries(), ["job"])
    assert rows[0]["attempts"] == 2 and rows[0]["gpu_hours"] == pytest.approx(2.0, rel=1e-2)
