"""issue 14 item 8: batch records expire; a rejected batch's records do not stay in Redis forever.

The worker's task body (``process_entry``) against a real scheduler and predictor on loopback
and a real Redis. Before: ``{p}:batch:{id}`` had no TTL and ``{p}:batches`` only grew."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from frenzy.state.keys import Keys
from frenzy.worker import app as worker_app
from frenzy.worker import batch as B
from support.servers import Servers, running_servers
from support.state import add_node

GiB = 1024**3


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "l4-0", "L4", 2, memory=23 * GiB)
    with running_servers(redis_url, prefix) as s:
        yield s


def _entry(name: str, **over: object) -> dict:
    return {"name": name, "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "true", **over}


def test_a_rejected_batch_expires(servers: Servers, redis_client: redis.Redis, keys: Keys,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRENZY_BATCH_TTL_S", "2")
    entries = [_entry("bad", global_batch=-1), _entry("unknown", model="llama-9-7b"),
               _entry("too-big", model="llama-2-70b", seq_len=4096)]
    batch_id = B.new_batch_id()
    B.init_batch(redis_client, keys, batch_id, entries)
    assert 0 < redis_client.ttl(keys.batch(batch_id)) <= 2
    for i, entry in enumerate(entries):
        out = worker_app.process_entry(batch_id, i, entry, scheduler=servers.scheduler_addr, client=redis_client,
                                       keys=keys)
        assert out.status in (B.INVALID, B.REJECTED), out
        assert 0 < redis_client.ttl(keys.batch(batch_id)) <= 2  # every write keeps the expiry
    assert batch_id in dict(B.list_batches(redis_client, keys))

    time.sleep(2.2)
    assert not redis_client.exists(keys.batch(batch_id))
    assert B.read_batch(redis_client, keys, batch_id) == []
    # The index forgets it with the next batch written.
    later = B.new_batch_id()
    B.init_batch(redis_client, keys, later, entries[:1])
    assert list(dict(B.list_batches(redis_client, keys))) == [later]


def test_batch_records_live_seven_days_by_default(redis_client: redis.Redis, keys: Keys,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRENZY_BATCH_TTL_S", raising=False)
    batch_id = B.new_batch_id()
    B.init_batch(redis_client, keys, batch_id, [_entry("one")])
    B.record_outcome(redis_client, keys, batch_id, B.Outcome(index=0, status=B.INVALID, error="x", at=time.time()))
    assert 7 * 24 * 3600 - 60 < redis_client.ttl(keys.batch(batch_id)) <= 7 * 24 * 3600
    monkeypatch.setenv("FRENZY_BATCH_TTL_S", "soon")
    with pytest.raises(ValueError, match="FRENZY_BATCH_TTL_S"):
        B.batch_ttl_s()
