"""``RedisContact``: one log line when an outage starts, one when it ends, and the reaper told once."""

from __future__ import annotations

import logging

import pytest
import redis

from frenzy.scheduler.outage import RedisContact


def test_one_line_per_outage_however_many_failures(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    contact = RedisContact(clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="frenzy.scheduler.outage")
    assert contact.reached() is None and not contact.take_recovery()  # no outage: nothing said
    error = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.\nmore")
    for where in ("scheduling loop", "event consumer", "scheduling loop"):
        contact.lost(where, error)
        now[0] += 1.5
    assert not contact.reachable
    assert contact.reached() == pytest.approx(4.5)
    assert contact.reached() is None and contact.reachable
    assert [r.getMessage() for r in caplog.records] == [
        "Redis unreachable (scheduling loop: ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection "
        "refused.); retrying quietly until it answers",
        "Redis reachable again after 4.5 s out of reach",
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert contact.take_recovery() and not contact.take_recovery()
    contact.lost("reaper", redis.TimeoutError())
    contact.reached()
    assert contact.outages == 2 and caplog.records[-2].getMessage().startswith("Redis unreachable (reaper: TimeoutError)")
