"""A job's packed code outlives its TTL while the job waits or runs (issue 20): the reaper renews
the ``code:{sha256}`` blob of every queued and active job every TTL/8, in one round trip, and
leaves the code of no job alone to expire. Real Redis; TTLs shortened to seconds and read back
with PTTL (no sleeping past a TTL)."""

from __future__ import annotations

import hashlib

import pytest
import redis

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from support.placed import run_on
from support.state import GiB, add_node, make_plan, make_spec

TTL_S = 60.0


def blob(client: redis.Redis, keys: Keys, text: str, ttl_ms: int = 500) -> str:
    """Store a fake code blob with ``ttl_ms`` left, as if its last use was long ago."""
    sha = hashlib.sha256(text.encode()).hexdigest()
    client.set(keys.code(sha), text, px=ttl_ms)
    return sha


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    add_node(redis_client, keys, "a", "A100-80GB", 1)
    return SchedulerLoop(redis_client, keys, dead_after_s=30.0, code_ttl_s=TTL_S)


def submit(loop: SchedulerLoop, name: str, sha: str, peak_gib: int) -> str:
    spec = make_spec(name)
    spec.command[:] = ["python", "train.py"]
    spec.code_sha256 = sha
    job_id, _ = loop.store.submit(spec, [make_plan("A100-80GB", peak=peak_gib * GiB)], "gpt2-124m", 1)
    return job_id


def test_the_code_of_waiting_and_running_jobs_is_renewed_and_no_other(
        loop: SchedulerLoop, redis_client: redis.Redis, keys: Keys) -> None:
    running_code, waiting_code, orphan_code = (blob(redis_client, keys, t) for t in ("run", "wait", "gone"))
    running = submit(loop, "runs", running_code, 10)
    job = run_on(loop, running, make_plan("A100-80GB", peak=10 * GiB))
    # Waits behind it: the one GPU is taken (and stays PENDING through the tick).
    waiting = submit(loop, "waits", waiting_code, 10)
    loop.tick()
    assert loop.store.get(waiting).state == JobState.PENDING  # type: ignore[union-attr]
    assert job.state == JobState.RUNNING
    for sha in (running_code, waiting_code, orphan_code):  # as if the submissions were days ago
        redis_client.pexpire(keys.code(sha), 500)

    loop.reap()
    assert redis_client.pttl(keys.code(running_code)) > 50_000
    assert redis_client.pttl(keys.code(waiting_code)) > 50_000
    assert 0 < redis_client.pttl(keys.code(orphan_code)) <= 500  # no job of it waits or runs: it expires

    # Not again before TTL/8: the reaper runs every few seconds, the renewal once in 7.5 s here.
    assert loop.code_renew_interval() == pytest.approx(TTL_S / 8)
    redis_client.pexpire(keys.code(waiting_code), 500)
    loop.reap()
    assert redis_client.pttl(keys.code(waiting_code)) <= 500


def test_no_renewal_before_the_first_queue_read(loop: SchedulerLoop, redis_client: redis.Redis,
                                                keys: Keys) -> None:
    sha = blob(redis_client, keys, "early")
    submit(loop, "early", sha, 10)
    loop.reap()  # a tenure's first reap comes before its first tick: nothing known to renew yet
    assert redis_client.pttl(keys.code(sha)) <= 500
    loop.tick()
    loop.reap()
    assert redis_client.pttl(keys.code(sha)) > 50_000
