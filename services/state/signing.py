"""Signed control messages: HMAC-SHA256 with a per-node key, a nonce and an expiry (pure, no I/O).

Anyone who can write a Redis stream could otherwise start any command on any node
(a forged launch) or end a running job (a forged ``exited`` event). So every launch
and cancel the scheduler writes to ``launch:{node}``, and every event an agent writes
to ``events``, is sealed with the key of the node it goes to or comes from:

* the canonical bytes of a message are its JSON object without ``sig``, keys sorted,
  fixed separators (``canonical_bytes``); ``sig`` is the hex HMAC-SHA256 of them;
* ``nonce`` (16 random bytes, hex) makes every sealed message unique, ``expires_at``
  (unix seconds) bounds how long it may be acted on;
* a reader checks the signature against the node's current key, then its previous one
  (a rotation's grace), then the expiry, then that the nonce is new (``Verifier``).

Expiry is judged on the time the entry was *written to the stream* (its Redis entry
id, ``entry_time``), not on when it is read: a scheduler or agent that was down reads
its backlog and still acts on what was sent in time, while a copy re-added later (a
replay) or a message sealed to expire in the past is refused. Stream ids only grow, so
once an entry written at T was read, no later entry can carry a nonce that expired
before T: the guard forgets such nonces (``ReplayGuard``), its size bounded by the
messages of one expiry window.

What is covered: every field of the message (node, job, attempt, fence, command, env,
GPUs, ...), the nonce and the expiry. What is not: which stream it was found in; the
message names its node, and the agent and scheduler check that name against the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

KEY_BYTES = 32
NONCE_BYTES = 16
LAUNCH_TTL_S = 120.0  # a launch or cancel is acted on only if written within this of being sealed
EVENT_TTL_S = 120.0  # the same for an agent's event (sealed when it is sent, also after a retry)
# After a rotation, signers keep signing with the previous key this long: every reader's cached
# ring (KeyCache.max_age_s, the agent's re-read each heartbeat) knows the new key by then.
SWITCH_AFTER_S = 15.0
SIGNED_FIELDS = ("nonce", "expires_at", "sig")


class Refusal(StrEnum):
    """Why a sealed message is not acted on (the words a log line says)."""

    UNSIGNED = "unsigned"
    NO_KEY = "no key for the node it names"
    FORGED = "bad signature (forged, altered, or signed with another key)"
    EXPIRED = "expired"
    REPLAYED = "replayed (its nonce was seen before)"


@dataclass(frozen=True)
class KeyRing:
    """One node's keys: the newest, and the one before a rotation (still accepted); ``rotated_at``
    (unix seconds, 0: never) is when ``current`` became the newest."""

    current: bytes
    previous: bytes | None = None
    rotated_at: float = 0.0

    def __post_init__(self) -> None:
        if len(self.current) < 16 or (self.previous is not None and len(self.previous) < 16):
            raise ValueError("a node key must be at least 16 bytes")

    @classmethod
    def from_hex(cls, current: str, previous: str | None = None, rotated_at: float = 0.0) -> KeyRing:
        return cls(bytes.fromhex(current), bytes.fromhex(previous) if previous else None, rotated_at)

    def signing_key(self, now: float, switch_after_s: float = SWITCH_AFTER_S) -> bytes:
        """The key to sign with at ``now``: the previous one for ``switch_after_s`` after a rotation,
        so a reader whose cached ring predates the rotation still accepts what is signed."""
        if self.previous is not None and now - self.rotated_at < switch_after_s:
            return self.previous
        return self.current


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def canonical_bytes(payload: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the message without ``sig``, as sorted, compact JSON."""
    body = {k: v for k, v in payload.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def signature(payload: Mapping[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical_bytes(payload), hashlib.sha256).hexdigest()


def seal(payload: Mapping[str, Any], key: bytes, now: float, ttl_s: float,
         nonce: str | None = None) -> dict[str, Any]:
    """``payload`` with a fresh nonce, ``expires_at`` = now + ttl_s (whole seconds, rounded up) and its ``sig``."""
    out = {k: v for k, v in payload.items() if k not in SIGNED_FIELDS}
    out["nonce"] = nonce if nonce is not None else secrets.token_hex(NONCE_BYTES)
    out["expires_at"] = int(now + ttl_s) + 1
    out["sig"] = signature(out, key)
    return out


def entry_time(entry_id: str) -> float:
    """When Redis added a stream entry, from its id ("<ms>-<seq>"), in unix seconds."""
    ms, _, _ = str(entry_id).partition("-")
    return int(ms) / 1000.0


def check_signature(payload: Mapping[str, Any], ring: KeyRing | None) -> Refusal | None:
    """Whether ``payload`` was sealed with the ring's current or previous key (expiry and replay aside)."""
    sig = payload.get("sig")
    if not isinstance(sig, str) or not sig or not payload.get("nonce") or "expires_at" not in payload:
        return Refusal.UNSIGNED
    if ring is None:
        return Refusal.NO_KEY
    try:
        body = canonical_bytes(payload)
    except (TypeError, ValueError):
        return Refusal.FORGED
    for key in (ring.current, ring.previous):
        if key is not None and hmac.compare_digest(hmac.new(key, body, hashlib.sha256).hexdigest(), sig):
            return None
    return Refusal.FORGED


class ReplayGuard:
    """The nonces seen, each kept until no entry written later could still be in time with it.

    ``admit`` is told the entry id too: the same entry read again (a redelivery after a
    crash or an outage) is not a replay; the same nonce in another entry is."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, str]] = {}  # nonce -> (expires_at, entry id)
        self._horizon = float("-inf")  # newest entry time read: nonces that expired before it are dropped
        self._next_purge = float("-inf")

    def admit(self, nonce: str, expires_at: float, entry_id: str, written_at: float) -> bool:
        self._forget(written_at)
        seen = self._seen.get(nonce)
        if seen is not None:
            return seen[1] == entry_id
        self._seen[nonce] = (expires_at, entry_id)
        return True

    def _forget(self, written_at: float) -> None:
        self._horizon = max(self._horizon, written_at)
        if self._horizon < self._next_purge:
            return
        self._next_purge = self._horizon + 1.0  # at most one sweep a second of stream time
        horizon = self._horizon
        self._seen = {n: v for n, v in self._seen.items() if v[0] >= horizon}

    def __len__(self) -> int:
        return len(self._seen)


class Verifier:
    """Checks sealed messages in stream order: signature (current, then previous key), expiry, replay."""

    def __init__(self) -> None:
        self.guard = ReplayGuard()

    def check(self, payload: Mapping[str, Any], ring: KeyRing | None, entry_id: str) -> Refusal | None:
        problem = check_signature(payload, ring)
        if problem is not None:
            return problem
        written_at = entry_time(entry_id)
        try:
            expires_at = float(payload["expires_at"])
        except (TypeError, ValueError, OverflowError):  # an int past any float is no expiry
            return Refusal.FORGED  # cannot be: it was signed so; refused all the same
        if written_at > expires_at:
            return Refusal.EXPIRED
        if not self.guard.admit(str(payload["nonce"]), expires_at, entry_id, written_at):
            return Refusal.REPLAYED
        return None


KeyFetch = Callable[[list[str]], Mapping[str, KeyRing | None]]


class KeyCache:
    """Nodes' key rings as last read, re-read when older than ``max_age_s`` (a rotation reaches
    signers within that) — so sealing a message costs no Redis round trip on the hot path.

    ``fetch`` reads the rings of the nodes it is given (one round trip); ``clock`` is
    monotonic seconds."""

    def __init__(self, fetch: KeyFetch, clock: Callable[[], float], max_age_s: float = 5.0) -> None:
        self._fetch = fetch
        self._clock = clock
        self.max_age_s = max_age_s
        self._rings: dict[str, tuple[float, KeyRing | None]] = {}

    def rings(self, nodes: Iterable[str]) -> dict[str, KeyRing | None]:
        now = self._clock()
        wanted = list(dict.fromkeys(nodes))
        stale = [n for n in wanted if (hit := self._rings.get(n)) is None or now - hit[0] > self.max_age_s]
        if stale:
            fresh = self._fetch(stale)
            for n in stale:
                self._rings[n] = (now, fresh.get(n))
        return {n: self._rings[n][1] for n in wanted}

    def ring(self, node: str) -> KeyRing | None:
        return self.rings([node])[node]

    def refresh(self, node: str, min_age_s: float = 1.0) -> KeyRing | None:
        """Read ``node``'s ring again now (a signature failed: it may have been rotated) unless it
        was read less than ``min_age_s`` ago (forged messages must not turn into a flood of reads)."""
        hit = self._rings.get(node)
        if hit is not None and self._clock() - hit[0] < min_age_s:
            return hit[1]
        self._rings.pop(node, None)
        return self.ring(node)
