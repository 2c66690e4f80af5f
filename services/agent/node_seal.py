"""This node's signing keys on the agent's side: read from Redis at start, again with every
heartbeat (a rotation reaches a running agent), and again when a launch-stream entry's seal does
not verify (at most once a second: perhaps rotated since); checks each launch-stream entry's seal
(signature, expiry, replay: ``frenzy.state.signing.Verifier``) and seals the agent's own events.
A key removed from Redis while the agent runs is kept in use (one warning): only
``frenzy node key create --force`` or a rotation replaces it."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from frenzy.state import node_keys
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, encode, sealed
from frenzy.state.signing import EVENT_TTL_S, KeyRing, Refusal, Verifier

log = logging.getLogger(__name__)


class NodeSeal:
    """The key ring of ``node`` as last read, and the launch stream's verifier."""

    def __init__(self, client: redis.Redis, keys: Keys, node: str) -> None:
        self._redis, self._keys, self.node = client, keys, node
        self.ring: KeyRing | None = None  # None until a key was read
        self._read_at = float("-inf")  # monotonic time of the last read
        self._verifier = Verifier()

    def read(self) -> None:
        """Read this node's key ring (cheap: one HMGET)."""
        ring = node_keys.read(self._redis, self._keys, self.node)
        self._read_at = time.monotonic()
        if ring is None:
            if self.ring is not None:
                log.warning("node %s: its signing key is gone from Redis; still using the last one read. "
                            "To fix: frenzy node key create %s", self.node, self.node)
            return
        if self.ring is not None and ring.current != self.ring.current:
            log.info("node %s: signing key rotated", self.node)
        self.ring = ring

    def check(self, obj: dict[str, Any], entry_id: str) -> Refusal | None:
        """Whether a launch-stream entry is sealed with this node's key, in time and new (None: it is)."""
        refusal = self._verifier.check(obj, self.ring, entry_id)
        if refusal == Refusal.FORGED and time.monotonic() - self._read_at >= 1.0:
            self.read()  # perhaps rotated since the last heartbeat (at most one read a second)
            refusal = self._verifier.check(obj, self.ring, entry_id)
        return refusal

    def seal(self, event: AgentEvent) -> dict[str, str]:
        """``event`` sealed now with this node's key, as the events stream entry's fields (a retry
        after an outage is sealed afresh)."""
        assert self.ring is not None  # the agent does not start without a key
        now = time.time()
        return encode(sealed(event, self.ring.signing_key(now), now, ttl_s=EVENT_TTL_S))
