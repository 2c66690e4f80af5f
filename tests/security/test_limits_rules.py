"""The pure rules behind the gRPC limits (issue 14 items 7 and 8): stream slots and the
per-user submission token bucket, with a fake clock. No servers, no Redis."""

from __future__ import annotations

import pytest

from frenzy.rpc.limits import RateLimit, StreamCaps, StreamSlots, SubmitRate


def test_stream_slots_cap_per_user_then_in_all_and_come_back() -> None:
    slots = StreamSlots(StreamCaps(total=3, per_user=2))
    assert slots.take("a") is None and slots.take("a") is None
    assert "per user" in (slots.take("a") or "")
    assert slots.take("b") is None
    assert "in all" in (slots.take("c") or "")
    slots.give_back("a")
    assert slots.take("c") is None and slots.open == 3


def test_submit_rate_is_a_token_bucket_per_user() -> None:
    now = [0.0]
    rate = SubmitRate(RateLimit(per_s=2.0, burst=3), clock=lambda: now[0])
    assert [rate.take("a") for _ in range(3)] == [None, None, None]
    why = rate.take("a")
    assert why is not None and "2 jobs a second" in why and "bursts of 3" in why
    assert rate.take("b") is None  # another user's bucket is full
    now[0] += 0.5  # one token back
    assert rate.take("a") is None and rate.take("a") is not None
    now[0] += 100.0  # never more than the burst
    assert [rate.take("a") for _ in range(4)].count(None) == 3


def test_nonsense_limits_are_refused() -> None:
    for bad in (lambda: StreamCaps(0, 1), lambda: StreamCaps(1, 0), lambda: RateLimit(0, 1),
                lambda: RateLimit(1, 0)):
        with pytest.raises(ValueError):
            bad()


def test_a_quarter_of_the_streams_is_kept_for_admins_and_a_connection_holds_its_share() -> None:
    """issue 34 item 5: users and anonymous callers share the total less the admins' reserve."""
    slots = StreamSlots(StreamCaps(total=8, per_user=8, per_connection=3, admin_reserve=4))
    assert slots.caps.reserve == 2  # at most a quarter of the total
    for i in range(6):
        assert slots.take(f"u{i}", peer=f"c{i}") is None
    why = slots.take("u9", peer="c9")
    assert why is not None and "kept for admins" in why and "6" in why
    assert slots.take("root", admin=True, peer="a") is None and slots.take("root", admin=True, peer="b") is None
    assert slots.take("root", admin=True, peer="c") is not None  # the total holds for admins too
    for i in range(6):
        slots.give_back(f"u{i}", f"c{i}")
    assert slots.take("x", peer="same") is None and slots.take("y", peer="same") is None
    assert slots.take("z", peer="same") is None
    why = slots.take("w", peer="same")
    assert why is not None and "per connection" in why
