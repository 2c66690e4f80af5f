"""Limits that keep one caller from taking a gRPC server from everyone (issue 14 items 7 and 8).

Streams: grpc's Python server runs each call on a thread of a fixed pool, and a
streaming call (WatchJob, StreamLogs, UploadCode, health Watch, reflection) holds its
thread for as long as it stays open. ``StreamLimit`` caps how many streams are open at
once, in total and per user, below the pool size, so unary calls and health
checks always find a free thread. A stream over a cap is answered
RESOURCE_EXHAUSTED naming the cap, before it takes anything.

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

from frenzy.rpc.auth import current_identity
from frenzy.rpc.handlers import rewrapped

# Defaults: a pool twice the stream cap leaves half the threads to unary calls and health.
DEFAULT_WORKERS = 32
DEFAULT_MAX_STREAMS = 16
DEFAULT_MAX_STREAMS_PER_USER = 4
ANONYMOUS = ""  # streams on open methods (health Watch, reflection) share one per-user count


@dataclass(frozen=True)
class StreamCaps:
    """How many streaming calls may be open at once: in all, and per user."""

    total: int = DEFAULT_MAX_STREAMS
    per_user: int = DEFAULT_MAX_STREAMS_PER_USER

    def __post_init__(self) -> None:
        if self.total < 1 or self.per_user < 1:
            raise ValueError(f"stream caps must be >= 1 (got total={self.total}, per_user={self.per_user})")


class StreamSlots:
    """Counts of open streams, in total and per user; a slot is taken before a stream starts."""

    def __init__(self, caps: StreamCaps) -> None:
        self.caps = caps
        self._lock = threading.Lock()
        self._total = 0
        self._per_user: dict[str, int] = {}

    def take(self, user: str) -> str | None:
        """Take a slot for ``user``. -> None when taken, else why not (the cap, named)."""
        with self._lock:
            held = self._per_user.get(user, 0)
            if held >= self.caps.per_user:
                who = f"user {user!r}" if user else "unauthenticated callers"
                return (f"too many open streams: {who} already has {held}, the limit is {self.caps.per_user} "
                        "per user (scheduler option --max-streams-per-user). To fix: close a `frenzy watch` "
                        "or `frenzy logs -f` first")
            if self._total >= self.caps.total:
                return (f"too many open streams: the server has {self._total}, the limit is {self.caps.total} "
                        "in all (scheduler option --max-streams). Try again later")
            self._total += 1
            self._per_user[user] = held + 1
            return None

    def give_back(self, user: str) -> None:
        with self._lock:
            self._total -= 1
            left = self._per_user.get(user, 1) - 1
            if left > 0:
                self._per_user[user] = left
            else:
                self._per_user.pop(user, None)

    @property
    def open(self) -> int:
        with self._lock:
            return self._total


def _limited(slots: StreamSlots, behaviour: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def gen(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        who = current_identity()
        user = who.user if who is not None else ANONYMOUS
        refusal = slots.take(user)
        if refusal is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            yield from behaviour(request, context)
        finally:
            slots.give_back(user)
    return gen


def _limited_unary(slots: StreamSlots, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """A client-streaming call (UploadCode) holds its thread while the client sends: a slot too."""
    def call(request_iterator: Any, context: grpc.ServicerContext) -> Any:
        who = current_identity()
        user = who.user if who is not None else ANONYMOUS
        refusal = slots.take(user)
        if refusal is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            return behaviour(request_iterator, context)
        finally:
            slots.give_back(user)
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
