"""Bearer tokens on gRPC: the server-side check and the client-side header.

Server: ``TokenAuth`` is a ``grpc.ServerInterceptor``. Every call except health and
reflection must carry ``authorization: Bearer <token>`` metadata; no or a bad token ->
UNAUTHENTICATED with a message that says how to get one, a role that may not call the
method -> PERMISSION_DENIED. The caller's ``Identity`` is then available to the
servicer through ``current_identity()`` (a context variable set around the handler,
in the thread that runs it), which is how job ownership is checked.

Client: ``with_token(channel, token)`` adds the header to every call on a channel.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import grpc

from frenzy.auth.roles import Role, allows, is_open
from frenzy.auth.tokens import AuthError, Identity, TokenStore, bearer
from frenzy.rpc.bearer import with_token as with_token  # re-exported: the client half lives there
from frenzy.rpc.handlers import rewrapped

HOW_TO_GET_ONE = ("To fix: set FRENZY_TOKEN, or run `frenzy up` (it writes a credentials file the CLI "
                  "finds), or ask an admin for one (`frenzy token create --user NAME --role submit`)")

_identity: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("frenzy_identity", default=None)


def current_identity() -> Identity | None:
    """The identity of the call this thread is serving (None outside a checked call)."""
    return _identity.get()


def _metadata(details: grpc.HandlerCallDetails) -> str | None:
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape that aborts, so streaming clients get a clean status too."""

    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    return rewrapped(handler, lambda _behaviour, _streaming: deny)


def _as(identity: Identity, behaviour: Callable[..., Any], streaming_response: bool) -> Callable[..., Any]:
    """Run ``behaviour`` with ``identity`` as the current one (set in the handler's own thread)."""
    if streaming_response:
        def gen(request: Any, context: grpc.ServicerContext) -> Any:
            token = _identity.set(identity)
            try:
                yield from behaviour(request, context)
            finally:
                _identity.reset(token)
        return gen

    def call(request: Any, context: grpc.ServicerContext) -> Any:
        token = _identity.set(identity)
        try:
            return behaviour(request, context)
        finally:
            _identity.reset(token)
    return call


def _with_identity(handler: grpc.RpcMethodHandler, identity: Identity) -> grpc.RpcMethodHandler:
    return rewrapped(handler, lambda behaviour, streaming: _as(identity, behaviour, streaming))


class TokenAuth(grpc.ServerInterceptor):
    """Check the bearer token and the role of every call but health and reflection."""

    def __init__(self, tokens: TokenStore) -> None:
        self.tokens = tokens

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or is_open(method):
            return handler
        try:
            identity = self.tokens.verify(bearer(_metadata(handler_call_details)))
        except AuthError as exc:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, f"{exc}. {HOW_TO_GET_ONE}")
        except Exception:  # noqa: BLE001 — Redis down: say so without naming it
            return _refusal(handler, grpc.StatusCode.UNAVAILABLE, "cannot check the token right now; try again")
        if not allows(identity.role, method):
            name = method.rsplit("/", 1)[-1]
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED,
                            f"role {identity.role.value!r} of user {identity.user!r} may not call {name}"
                            + (" (it needs 'submit')" if identity.role is Role.READ else ""))
        return _with_identity(handler, identity)
