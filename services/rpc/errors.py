"""Clean statuses for failures a servicer did not answer itself (issue 14 item 10 and D3).

Without this, grpc answers an exception escaping a servicer with UNKNOWN and
"Exception calling application: <the exception's text>", which hands clients a
Redis address, a Redis command or a library's message. ``CleanErrors`` is the
outermost server interceptor on every Frenzy server and maps:

    redis ConnectionError / TimeoutError  -> UNAVAILABLE "state store unavailable, try again"
    anything else unexpected               -> INTERNAL "internal error (logged on the server)"

A status the servicer chose (``context.abort`` or ``set_code``) passes untouched.
The detail goes to the server's log: the first failure of a Redis outage once,
then nothing until a call succeeds again (an outage must not flood the log);
every unexpected exception with its traceback, since each is a bug.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import redis

from frenzy.rpc.handlers import rewrapped

log = logging.getLogger(__name__)

STORE_UNAVAILABLE = "state store unavailable, try again"
INTERNAL = "internal error (logged on the server)"


class _Outage:
    """Whether the state store is known down, so its failure is logged once per outage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down = False

    def failed(self, method: str, exc: BaseException) -> None:
        with self._lock:
            first, self._down = not self._down, True
        if first:
            log.warning("state store unavailable (%s on %s): answering UNAVAILABLE until it is back",
                        type(exc).__name__, method)

    def succeeded(self) -> None:
        if self._down:
            with self._lock:
                self._down = False
            log.info("state store reachable again")


def _answer(outage: _Outage, method: str, exc: Exception, context: grpc.ServicerContext) -> None:
    """Replace ``exc`` by a clean status, unless the servicer already chose one."""
    if context.code() not in (None, grpc.StatusCode.OK):
        raise exc  # context.abort(): the status is set, the exception only unwinds
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        outage.failed(method, exc)
        context.abort(grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE)
    log.exception("unexpected failure in %s", method)
    context.abort(grpc.StatusCode.INTERNAL, INTERNAL)


def _unary(outage: _Outage, method: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            response = behaviour(request, context)
        except Exception as exc:  # noqa: BLE001 — mapped to a status, detail logged
            _answer(outage, method, exc, context)
            raise
        outage.succeeded()
        return response
    return call


def _streaming(outage: _Outage, method: str, behaviour: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def gen(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behaviour(request, context)
        except Exception as exc:  # noqa: BLE001 — mapped to a status, detail logged
            _answer(outage, method, exc, context)
            raise
        outage.succeeded()
    return gen


class CleanErrors(grpc.ServerInterceptor):
    """Map what escapes a servicer to a clean status; see the module docstring."""

    def __init__(self) -> None:
        self.outage = _Outage()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        return rewrapped(handler, lambda behaviour, streaming: (_streaming if streaming else _unary)(
            self.outage, method, behaviour))
