"""When an agent cut off from Redis stops its own jobs (frenzy.agent.fencing, pure)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from frenzy.agent.fencing import fence_deadline_s, to_fence


@dataclass
class Job:
    node_dead_after_s: float
    fenced: bool = False
    exited: threading.Event = field(default_factory=threading.Event)


def test_the_sigkill_lands_a_heartbeat_before_the_scheduler_runs_the_job_elsewhere() -> None:
    deadline = fence_deadline_s(30.0, cancel_grace_s=10.0, heartbeat_s=2.0)
    assert deadline == 16.0 and deadline + 10.0 + 2.0 < 30.0


def test_never_sooner_than_three_heartbeats_and_never_without_the_schedulers_word() -> None:
    assert fence_deadline_s(4.0, cancel_grace_s=10.0, heartbeat_s=0.5) == 1.5
    assert fence_deadline_s(0.0, cancel_grace_s=10.0, heartbeat_s=0.5) is None


def test_only_running_jobs_past_their_deadline_not_stopped_already() -> None:
    late, early, old_scheduler, done, stopping = Job(20.0), Job(60.0), Job(0.0), Job(20.0), Job(20.0, fenced=True)
    done.exited.set()
    chosen = to_fence([late, early, old_scheduler, done, stopping], silent_s=15.0, cancel_grace_s=3.0, heartbeat_s=1.0)
    assert chosen == [late]
    assert to_fence([late], silent_s=14.9, cancel_grace_s=3.0, heartbeat_s=1.0) == []


def test_a_refused_connection_is_redis_down_a_timeout_is_not() -> None:
    import socket

    import redis

    from frenzy.agent.fencing import redis_is_down

    with socket.socket() as s:  # a port bound but not listening: the host refuses
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        try:
            redis.Redis(port=port, socket_connect_timeout=2).ping()
        except redis.RedisError as exc:
            assert redis_is_down(exc)
    assert redis_is_down(redis.BusyLoadingError("loading"))
    assert not redis_is_down(redis.TimeoutError("Timeout reading from socket"))
    assert not redis_is_down(redis.ConnectionError("Connection reset by peer"))


def test_never_while_the_lease_still_holds() -> None:
    # no scheduler declares a node dead while its lease lives: fencing sooner only loses work
    assert fence_deadline_s(4.0, cancel_grace_s=1.0, heartbeat_s=0.25, lease_s=3.0) == 3.0
