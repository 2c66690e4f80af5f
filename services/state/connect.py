"""Redis clients that fail within seconds behind a silent partition, not after TCP gives up (issue 37).

redis-py waits forever on a socket by default: behind a partition that drops packets silently, a
call sits until the network heals or the kernel abandons the connection (``tcp_retries2``, about
15 minutes). The scheduler and the agents therefore read and connect with timeouts chosen from the
deadlines they already keep (pure: ``scheduler_timeouts``, ``agent_timeouts``), turn TCP keepalive
on, and PING a connection that sat idle before reusing it (redis-py's ``health_check_interval``):

* **blocking reads** (the agent's XREADGROUP BLOCK, the scheduler's events XREADGROUP and its wake
  BLPOP) wait up to their block time for an answer by design, so the read timeout is always the
  longest block plus ``BLOCK_MARGIN_S``;
* **the scheduler** leads by a lease of ``lease_ttl_s`` (``scheduler.leader``), renewed every third
  of it: a call that hangs longer than the lease has lost it anyway (``place_jobs.lua`` refuses the
  old holder), so the read timeout is the lease -- a leader cut off learns it within one lease and
  its API threads answer UNAVAILABLE instead of hanging;
* **an agent** heartbeats every ``heartbeat_s`` under a lease of ``ttl_s`` and fences its jobs no
  sooner than the lease (``agent.fencing``): the read timeout is a heartbeat (never less than the
  block plus the margin), so a hung heartbeat fails and the next one is tried on a fresh connection
  while the lease still holds (``heartbeat_s + timeout < ttl_s`` with the defaults: 2 + 2 < 10).

A timeout is a ``redis.TimeoutError`` (a ``RedisError``): every loop already rides it out as an
outage, and the fence watchdog counts it as silence (``fencing.redis_is_down`` is false for it).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import redis

BLOCK_MARGIN_S = 1.0  # a blocking read's answer comes within its block time plus this
HEALTH_CHECK_S = 10.0  # a connection idle this long is PINGed before it carries a command
# The scheduler's longest blocking read: the wake list's BLPOP (SchedulerLoop._wakes_forever, 0.5 s;
# the events XREADGROUP blocks 0.2 s).
SCHEDULER_BLOCK_S = 0.5


@dataclass(frozen=True)
class Timeouts:
    """What one client waits for: a reply (``socket_timeout``), a connection (``connect_timeout``), and
    after how long idle a connection is PINGed before use (``health_check_s``)."""

    socket_timeout: float
    connect_timeout: float
    health_check_s: float = HEALTH_CHECK_S


def scheduler_timeouts(lease_ttl_s: float, longest_block_s: float = SCHEDULER_BLOCK_S) -> Timeouts:
    """A scheduler's: a reply within its leader lease (at least its longest block plus the margin)."""
    read = max(lease_ttl_s, longest_block_s + BLOCK_MARGIN_S)
    return Timeouts(read, min(read, 5.0))


def agent_timeouts(heartbeat_s: float, ttl_s: float, block_s: float) -> Timeouts:
    """An agent's: a reply within a heartbeat (at least its launch stream's block plus the margin)."""
    read = max(heartbeat_s, block_s + BLOCK_MARGIN_S)
    return Timeouts(read, min(read, ttl_s, 5.0))


def _keepalive() -> dict[int, int]:
    """TCP keepalive: first probe after 5 s idle, then every 2 s, the connection dropped after 3 unanswered
    (where the platform names these options)."""
    wanted = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3}
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def client(url: str, timeouts: Timeouts, **kwargs: Any) -> redis.Redis:
    """``redis.Redis.from_url(url, **kwargs)`` with ``timeouts``, keepalive and health checks."""
    return redis.Redis.from_url(url, socket_timeout=timeouts.socket_timeout,
                                socket_connect_timeout=timeouts.connect_timeout,
                                health_check_interval=timeouts.health_check_s, socket_keepalive=True,
                                socket_keepalive_options=_keepalive(), **kwargs)
