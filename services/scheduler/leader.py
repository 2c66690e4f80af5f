"""Which scheduler places jobs: a leader lease in Redis, so a standby takes over within seconds.

Several ``frenzy scheduler`` processes may run against one Redis. Every one serves the gRPC API
(submissions, listings and cancels are plain reads and atomic scripts, safe from any of them);
only the holder of the lease runs the placement loop, consumes the agents' events and reaps
dead nodes. The lease is a key with a time to live (``acquire_lease.lua``) that its holder
renews every third of it (``renew_lease.lua``); when the holder dies or stalls, the key expires
and the first standby to try takes it, with a new epoch. The value names the tenure
("epoch:holder"), and the scripts that act for the leader (``place_jobs.lua``,
``declare_node_dead.lua``) refuse a value that is no longer the lease's: a leader that paused
past its lease (a long GC, a stopped VM) and wakes up places nothing — the fencing the lease
alone cannot give (Kleppmann, "How to do distributed locking", 2016).

Redis' own clock runs the TTL, so the holders' clocks need not agree; this module only counts
its own renewals on the monotonic clock, to stop acting at once when renewing is overdue.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable

import redis

from frenzy.state import scripts
from frenzy.state.keys import Keys

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 3.0


def holder_id() -> str:
    """This process, as the lease names it: host, pid and a random part (a restarted process on
    the same host and pid is another holder)."""
    return f"{socket.gethostname()[:64]}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class LeaderLease:
    """The leader lease as one scheduler process holds it. Not thread-safe: one thread calls ``hold``."""

    def __init__(self, client: redis.Redis, keys: Keys, holder: str | None = None, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 0:
            raise ValueError(f"leader lease ttl_s must be > 0 (got {ttl_s})")
        self.keys = keys
        self.holder = holder or holder_id()
        self.ttl_s = ttl_s
        self.value = ""  # "epoch:holder" while held, "" otherwise
        self._clock = clock
        self._renewed_at = -math.inf
        self._acquire = scripts.register(client, "acquire_lease")
        self._renew = scripts.register(client, "renew_lease")

    @property
    def epoch(self) -> int:
        return int(self.value.split(":", 1)[0]) if self.value else 0

    def hold(self) -> bool:
        """Renew the lease when a third of it has passed, or try to take it. -> held now.

        Call at least every ``ttl_s / 3``. A renewal that finds the lease gone (it expired while
        this process stalled, and perhaps another took it) lets it go: the caller stops acting."""
        now = self._clock()
        ttl_ms = str(max(1, int(self.ttl_s * 1000)))
        if self.value:
            if now - self._renewed_at < self.ttl_s / 3:
                return True
            if int(self._renew(keys=[self.keys.leader()], args=[self.value, ttl_ms])) == 1:
                self._renewed_at = now
                return True
            log.warning("lost the leader lease %s (renewal %.1f s late); standing by", self.value,
                        max(0.0, now - self._renewed_at - self.ttl_s / 3))
            self.value = ""
        got = self._acquire(keys=[self.keys.leader(), self.keys.leader_epoch()], args=[self.holder, ttl_ms])
        if not got:
            return False
        self.value = str(got)
        self._renewed_at = now
        log.info("leader lease taken: epoch %d (%s)", self.epoch, self.holder)
        return True

    def release(self) -> None:
        """Give the lease up now (a clean stop), so a standby need not wait for it to expire."""
        if self.value:
            try:
                self._renew(keys=[self.keys.leader()], args=[self.value, "0"])
            except redis.RedisError as exc:  # it expires on its own
                log.info("could not release the leader lease (%s); it expires in %.0f s", exc, self.ttl_s)
            self.value = ""
