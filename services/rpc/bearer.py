"""The client's half of authentication: ``authorization: Bearer <token>`` on every call.

Apart from ``frenzy.rpc.auth`` (the server's token check, which reads the token store in
Redis) so that a client -- the SDK, the CLI on a laptop -- needs nothing of the server side.
"""

from __future__ import annotations

import grpc


class _BearerHeader(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                    grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [m for m in (details.metadata or ()) if m[0] != "authorization"]
        metadata.append(self._header)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: float | None, metadata: list[tuple[str, str]],
                 credentials: grpc.CallCredentials | None, wait_for_ready: bool | None,
                 compression: grpc.Compression | None) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def with_token(channel: grpc.Channel, token: str | None) -> grpc.Channel:
    """``channel`` with ``authorization: Bearer <token>`` on every call (unchanged if no token)."""
    if not token:
        return channel
    return grpc.intercept_channel(channel, _BearerHeader(token))
