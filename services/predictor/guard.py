"""Who may call the predictor, and how much one call may cost (issue 34 item 8).

The scheduler is the predictor's only client, so the predictor does not need the token store:
it shares one secret with the scheduler, the **predictor token** (``frzp_`` + 43 random
characters), like Ray's cluster token or a kubelet's bootstrap token. ``frenzy up`` makes one
per stack (``<run dir>/predictor-token``, 0600), ``frenzy secrets init`` one per compose
deployment (``/secrets/predictor-token``); both sides read it from ``FRENZY_PREDICTOR_TOKEN_FILE``
(a 0600 file), or ``FRENZY_PREDICTOR_TOKEN``; never from a command line. ``PredictorAuth``
refuses every call but health checks and reflection without ``authorization: Bearer <token>``
(UNAUTHENTICATED), comparing in constant time. ``frenzy predictor`` will not start with neither
a token nor ``--tls-ca`` (mutual TLS): there is no switch that leaves it open.

``PredictLimits`` bounds each call's work before MARP runs: the request's size, the pools (at
most ``max_pools``, one per GPU type), the plans asked for (``max_plans``), and how many calls
run at once (``max_concurrent``; a call waits up to ``wait_s`` for a slot, then
RESOURCE_EXHAUSTED). MARP itself bounds what a model may be (``marp.hf_config``: layers, widths,
experts) and the GPU counts it searches, so one call's time is bounded by its inputs; a call
running past ``slow_s`` is logged.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from frenzy.auth.roles import is_open
from frenzy.rpc.handlers import rewrapped
from frenzy.v1 import predictor_pb2

log = logging.getLogger(__name__)

TOKEN_ENV = "FRENZY_PREDICTOR_TOKEN"
TOKEN_FILE_ENV = "FRENZY_PREDICTOR_TOKEN_FILE"
TOKEN_PREFIX = "frzp_"
MIN_TOKEN_CHARS = 24
TOKEN_FILE = "predictor-token"  # its name in `frenzy up`'s run directory and `frenzy secrets init`'s

HOW_TO_FIX = ("To fix: give the scheduler the predictor's token (FRENZY_PREDICTOR_TOKEN_FILE, the same file "
              "`frenzy predictor` reads; `frenzy up` and `frenzy secrets init` write one)")


class PredictorTokenError(ValueError):
    """A predictor token that cannot be used (the message says which and the fix)."""


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise PredictorTokenError(f"{where}: not a predictor token (at least {MIN_TOKEN_CHARS} characters, no "
                                  "spaces). To fix: write one with `frenzy secrets init` or "
                                  "python -c 'import secrets; print(\"frzp_\" + secrets.token_urlsafe(32))'")
    return token


def read_token_file(path: Path) -> str:
    """The token in ``path``; refused when group or others may read it (as ssh refuses a private key)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise PredictorTokenError(f"predictor token file {path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PredictorTokenError(f"predictor token file {path}: not a regular file")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise PredictorTokenError(f"predictor token file {path}: its mode is {stat.S_IMODE(info.st_mode):04o}, "
                                      f"so other users may read it. To fix: chmod 600 {path}")
        raw = fh.read(4096).decode("utf-8", "replace")
    return _checked(raw.splitlines()[0] if raw.strip() else "", f"predictor token file {path}")


def token_from_env(environ: dict[str, str] | None = None) -> str | None:
    """``FRENZY_PREDICTOR_TOKEN_FILE``'s token, else ``FRENZY_PREDICTOR_TOKEN``, else None."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_FILE_ENV):
        return read_token_file(Path(env[TOKEN_FILE_ENV]))
    if env.get(TOKEN_ENV):
        return _checked(env[TOKEN_ENV], TOKEN_ENV)
    return None


def _bearer(details: grpc.HandlerCallDetails) -> str:
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    return rewrapped(handler, lambda _behaviour, _streaming: deny)


class PredictorAuth(grpc.ServerInterceptor):
    """Every call but health and reflection carries the predictor token, or is UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._token = _checked(token, "predictor token").encode()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or is_open(handler_call_details.method):
            return handler
        given = _bearer(handler_call_details)
        if not given:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"the predictor answers only the scheduler: no token. {HOW_TO_FIX}")
        if not hmac.compare_digest(given.encode(), self._token):
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"the predictor answers only the scheduler: wrong token. {HOW_TO_FIX}")
        return handler


@dataclass(frozen=True)
class PredictLimits:
    """One Predict call's bounds (see the module docstring)."""

    max_request_bytes: int = 2 * 1024 * 1024  # a 1 MiB model config and a few hundred pools fit
    max_pools: int = 64  # the scheduler sends one pool per GPU type its live nodes have
    max_plans: int = 200  # the scheduler asks for the default (50)
    max_concurrent: int = 2  # MARP holds the GIL: more at once only makes each slower
    wait_s: float = 10.0  # how long a call waits for a slot (or its own deadline, if sooner)
    slow_s: float = 5.0  # a call this long is logged

    def problem(self, request: predictor_pb2.PredictRequest) -> str:
        """Why ``request`` is more work than one call may be ("" when it is within bounds)."""
        size = request.ByteSize()
        if size > self.max_request_bytes:
            return f"request: {size} bytes; the limit is {self.max_request_bytes}"
        if len(request.pools) > self.max_pools:
            return f"pools: {len(request.pools)} pools; the limit is {self.max_pools} (one per GPU type)"
        types = [p.gpu_type for p in request.pools]
        if len(set(types)) != len(types):
            return "pools: a GPU type given twice; give one pool per GPU type"
        if request.max_plans > self.max_plans:
            return f"max_plans: {request.max_plans}; the limit is {self.max_plans}"
        return ""


class CallSlots:
    """At most ``limits.max_concurrent`` Predict calls at once; a call waits up to ``wait_s``."""

    def __init__(self, limits: PredictLimits) -> None:
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_concurrent)

    def acquire(self, context: grpc.ServicerContext) -> bool:
        remaining = context.time_remaining()
        wait = self.limits.wait_s if remaining is None else max(0.0, min(self.limits.wait_s, remaining))
        return self._slots.acquire(timeout=wait)

    def release(self) -> None:
        self._slots.release()
