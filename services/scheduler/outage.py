"""Whether the scheduler can reach Redis: one log line when an outage starts, one when it ends.

Every thread of the scheduler that talks to Redis (the placement loop, the events consumer,
the reaper) reports its failures (``lost``) and its successes (``reached``) here. During an
outage each of them fails several times a second; only the first failure is logged (no
traceback: the cause is the outage, not the code), and the first success after it logs how
long Redis was out of reach. The reaper also asks ``take_recovery`` whether Redis came back
since it last looked: node leases expired while nobody could reach Redis say nothing about
the nodes, so their death is counted again from that moment (``reaping.decide_reap``).
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class RedisContact:
    """The scheduler's contact with Redis, shared by its threads (thread-safe)."""

    def __init__(self, clock: callable = time.monotonic) -> None:  # type: ignore[valid-type]
        self._clock = clock
        self._lock = threading.Lock()
        self._lost_at: float | None = None  # when the current outage started (clock), None when reachable
        self._recovered = False  # Redis came back since the reaper last asked
        self.outages = 0  # outages seen so far (for tests and tools)

    @property
    def reachable(self) -> bool:
        return self._lost_at is None

    def lost(self, where: str, exc: BaseException) -> None:
        """A Redis call of ``where`` failed: logged once per outage, without a traceback."""
        with self._lock:
            if self._lost_at is not None:
                return
            self._lost_at = self._clock()
            self.outages += 1
        log.warning("Redis unreachable (%s: %s); retrying quietly until it answers", where,
                    _short(exc))

    def reached(self) -> float | None:
        """A Redis call succeeded. -> how long the outage it ends lasted (None: there was none)."""
        if self._lost_at is None:  # the common case, without the lock
            return None
        with self._lock:
            if self._lost_at is None:
                return None
            lasted = self._clock() - self._lost_at
            self._lost_at = None
            self._recovered = True
        log.warning("Redis reachable again after %.1f s out of reach", lasted)
        return lasted

    def take_recovery(self) -> bool:
        """True once after each outage ended (the reaper restarts node death counts then)."""
        with self._lock:
            recovered, self._recovered = self._recovered, False
            return recovered


def _short(exc: BaseException) -> str:
    """The error's class and first line: what an operator needs, not the stack."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
