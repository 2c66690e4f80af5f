"""Limits that keep one caller from taking a gRPC server from everyone (issue 14 items 7 and 8).

Streams: grpc's Python server runs each call on a thread of a fixed pool, and a
streaming call (WatchJob, StreamLogs, UploadCode, health Watch, reflection) holds its
thread for as long as it stays open. ``StreamLimit`` caps how many streams are open at
once, in total, per user and per connection, below the pool size, so unary calls and health
checks always find a free thread. A stream over a cap is answered
RESOURCE_EXHAUSTED naming the cap, before it takes anything. A few of the total are kept for
admins (issue 34 item 5: 16 streams of anonymous health watches and three users locked the
admin's WatchJob and the dashboard out): users and unauthenticated callers share the total
less ``StreamCaps.admin_reserve``. A stream whose token is revoked or expires is ended
within ``REVOCATION_CHECK_S`` (UNAUTHENTICATED): each open stream's token is looked up afresh
in Redis once a second (one read per distinct token), not through the check cache.

Submissions: ``SubmitRate`` is a token bucket per user (a sustained rate and a
burst), checked by the scheduler's SubmitJob.

Both keep their counts in this process: one scheduler serves the API, so a count
in Redis would buy nothing but a round trip per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from frenzy.auth.roles import Role
from frenzy.rpc.auth import current_identity
from frenzy.rpc.handlers import rewrapped

# Defaults: a pool twice the stream cap leaves half the threads to unary calls and health.
DEFAULT_WORKERS = 32
DEFAULT_MAX_STREAMS = 16
DEFAULT_MAX_STREAMS_PER_USER = 4
DEFAULT_MAX_STREAMS_PER_CONNECTION = 8
DEFAULT_ADMIN_STREAMS = 4  # of the total, kept for admins (at most a quarter of it)
REVOCATION_CHECK_S = 1.0  # how often open streams' tokens are looked up afresh
ANONYMOUS = ""  # streams on open methods (health Watch, reflection) share one per-user count


@dataclass(frozen=True)
class StreamCaps:
    """How many streaming calls may be open at once: in all, per user and per connection
    (client address and port); ``admin_reserve`` of the total (at most a quarter of it) only
    admins may take."""

    total: int = DEFAULT_MAX_STREAMS
    per_user: int = DEFAULT_MAX_STREAMS_PER_USER
    per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    admin_reserve: int = DEFAULT_ADMIN_STREAMS

    def __post_init__(self) -> None:
        if self.total < 1 or self.per_user < 1 or self.per_connection < 1 or self.admin_reserve < 0:
            raise ValueError(f"stream caps must be >= 1 and the admin reserve >= 0 (got total={self.total}, "
                             f"per_user={self.per_user}, per_connection={self.per_connection}, "
                             f"admin_reserve={self.admin_reserve})")

    @property
    def reserve(self) -> int:
        """The streams kept for admins: ``admin_reserve``, at most a quarter of the total."""
        return min(self.admin_reserve, self.total // 4)


class StreamSlots:
    """Counts of open streams, in total, per user and per connection; a slot is taken before a
    stream starts. ``token_alive`` (token id -> still valid, read afresh): with it, every open
    stream of a token that is no longer valid is ended (``watch``)."""

    def __init__(self, caps: StreamCaps, token_alive: Callable[[str], bool] | None = None,
                 check_s: float = REVOCATION_CHECK_S) -> None:
        self.caps = caps
        self._lock = threading.Lock()
        self._total = 0
        self._per_user: dict[str, int] = {}
        self._per_peer: dict[str, int] = {}
        self._token_alive = token_alive
        self._check_s = check_s
        self._watched: dict[int, tuple[str, grpc.ServicerContext]] = {}
        self._next = 0
        self._checker: threading.Thread | None = None

    def take(self, user: str, admin: bool = False, peer: str = "") -> str | None:
        """Take a slot for ``user`` (an admin or not) on connection ``peer``. -> None when taken,
        else why not (the cap, named)."""
        caps = self.caps
        with self._lock:
            held = self._per_user.get(user, 0)
            if held >= caps.per_user:
                who = f"user {user!r}" if user else "unauthenticated callers"
                return (f"too many open streams: {who} already has {held}, the limit is {caps.per_user} "
                        "per user (scheduler option --max-streams-per-user). To fix: close a `frenzy watch` "
                        "or `frenzy logs -f` first")
            on_peer = self._per_peer.get(peer, 0)
            if peer and on_peer >= caps.per_connection:
                return (f"too many open streams on this connection: it has {on_peer}, the limit is "
                        f"{caps.per_connection} per connection. To fix: close one first")
            limit = caps.total if admin else caps.total - caps.reserve
            if self._total >= limit:
                kept = f" ({caps.reserve} more are kept for admins)" if not admin and caps.reserve else ""
                return (f"too many open streams: the server has {self._total}, the limit is {limit} "
                        f"in all{kept} (scheduler option --max-streams). Try again later")
            self._total += 1
            self._per_user[user] = held + 1
            if peer:
                self._per_peer[peer] = on_peer + 1
            return None

    def give_back(self, user: str, peer: str = "") -> None:
        with self._lock:
            self._total -= 1
            for counts, key in ((self._per_user, user), (self._per_peer, peer)):
                if key or counts is self._per_user:
                    left = counts.get(key, 1) - 1
                    if left > 0:
                        counts[key] = left
                    else:
                        counts.pop(key, None)

    @property
    def open(self) -> int:
        with self._lock:
            return self._total

    # ---- ending the streams of revoked tokens

    def watch(self, token_id: str, context: grpc.ServicerContext) -> int | None:
        """Watch an open stream's token; -> a key for ``unwatch`` (None without ``token_alive``)."""
        if self._token_alive is None:
            return None
        with self._lock:
            key = self._next
            self._next += 1
            self._watched[key] = (token_id, context)
            if self._checker is None:
                self._checker = threading.Thread(target=self._check_loop, name="stream-token-check", daemon=True)
                self._checker.start()
        return key

    def unwatch(self, key: int | None) -> None:
        if key is not None:
            with self._lock:
                self._watched.pop(key, None)

    def _check_loop(self) -> None:
        while True:
            time.sleep(self._check_s)
            try:
                self.check_tokens()
            except Exception:  # noqa: BLE001 — Redis out of reach: keep the streams, look again
                continue

    def check_tokens(self) -> int:
        """End the open streams whose token is no longer valid (UNAUTHENTICATED). -> how many."""
        assert self._token_alive is not None
        with self._lock:
            watched = list(self._watched.items())
        verdict: dict[str, bool] = {}
        ended = 0
        for key, (token_id, context) in watched:
            if token_id not in verdict:
                verdict[token_id] = self._token_alive(token_id)
            if not verdict[token_id]:
                self.unwatch(key)
                _end(context, grpc.StatusCode.UNAUTHENTICATED,
                     "the token of this stream was revoked or has expired; the stream is closed")
                ended += 1
        return ended


def _end(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End a call from another thread than its handler's, with ``code`` when grpc allows it."""
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)  # type: ignore[union-attr]  # (cygrpc: with a status)
    except Exception:  # noqa: BLE001 — another grpc build: a plain cancel (CANCELLED)
        context.cancel()  # type: ignore[attr-defined]


def _caller(context: grpc.ServicerContext) -> tuple[str, bool, str, str | None]:
    """(user, admin, connection, token id) of the call this thread serves."""
    who = current_identity()
    try:
        peer = context.peer() or ""
    except Exception:  # noqa: BLE001
        peer = ""
    if who is None:
        return ANONYMOUS, False, peer, None
    return who.user, who.role is Role.ADMIN, peer, who.token_id


def _limited(slots: StreamSlots, behaviour: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def gen(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        user, admin, peer, token_id = _caller(context)
        refusal = slots.take(user, admin, peer)
        if refusal is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        key = slots.watch(token_id, context) if token_id else None
        try:
            yield from behaviour(request, context)
        finally:
            slots.unwatch(key)
            slots.give_back(user, peer)
    return gen


def _limited_unary(slots: StreamSlots, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """A client-streaming call (UploadCode) holds its thread while the client sends: a slot too."""
    def call(request_iterator: Any, context: grpc.ServicerContext) -> Any:
        user, admin, peer, token_id = _caller(context)
        refusal = slots.take(user, admin, peer)
        if refusal is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        key = slots.watch(token_id, context) if token_id else None
        try:
            return behaviour(request_iterator, context)
        finally:
            slots.unwatch(key)
            slots.give_back(user, peer)
    return call


def _wrap_behaviour(handler: Any, slots: StreamSlots) -> grpc.RpcMethodHandler:
    if not (handler.response_streaming or handler.request_streaming):
        return handler  # unary calls hold no thread for long
    return rewrapped(handler, lambda behaviour, streaming: (_limited if streaming else _limited_unary)(
        slots, behaviour))


class StreamLimit(grpc.ServerInterceptor):
    """Cap streaming-response calls per user and in total. Must run inside the token check
    (later in the interceptor list), which is what makes the caller's identity known."""

    def __init__(self, slots: StreamSlots) -> None:
        self.slots = slots

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or not (handler.response_streaming or handler.request_streaming):
            return handler
        return _wrap_behaviour(handler, self.slots)


@dataclass(frozen=True)
class RateLimit:
    """``per_s`` submissions a second sustained, up to ``burst`` at once."""

    per_s: float = 20.0
    burst: int = 200

    def __post_init__(self) -> None:
        if self.per_s <= 0 or self.burst < 1:
            raise ValueError(f"submit rate must be > 0 and burst >= 1 (got {self.per_s}/s, burst {self.burst})")


class SubmitRate:
    """A token bucket per user: each submission takes one token; tokens come back at ``per_s``."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, at)

    def take(self, user: str) -> str | None:
        """One submission for ``user``. -> None when allowed, else why not (the limit, named)."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(user, (float(self.limit.burst), now))
            tokens = min(float(self.limit.burst), tokens + (now - at) * self.limit.per_s)
            if tokens < 1.0:
                self._buckets[user] = (tokens, now)
                wait = (1.0 - tokens) / self.limit.per_s
                return (f"submission rate limit: at most {self.limit.per_s:g} jobs a second per user "
                        f"(bursts of {self.limit.burst}; scheduler options --submit-rate/--submit-burst). "
                        f"Try again in {wait:.1f} s")
            self._buckets[user] = (tokens - 1.0, now)
            if len(self._buckets) > 10_000:  # forget full buckets so the table stays small
                full = [u for u, (t, a) in self._buckets.items()
                        if t + (now - a) * self.limit.per_s >= self.limit.burst]
                for u in full:
                    del self._buckets[u]
            return None
