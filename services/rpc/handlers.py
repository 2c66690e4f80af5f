"""One way to wrap a gRPC method handler's behaviour, for every server interceptor of Frenzy's.

An interceptor that acts inside a call (set the caller's identity, map an escaping exception to a
status, hold a stream slot) must hand grpc a new handler of the same shape — unary or streaming,
each way — with the same (de)serializers. ``rewrapped`` builds it; the interceptor supplies only
how one behaviour becomes another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

# (behaviour, response_streaming) -> the behaviour to run instead
Wrap = Callable[[Callable[..., Any], bool], Callable[..., Any]]


def rewrapped(handler: grpc.RpcMethodHandler, wrap: Wrap) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape whose behaviour is ``wrap(behaviour, response_streaming)``."""
    ser, de = handler.response_serializer, handler.request_deserializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary, False), de, ser)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream, True), de, ser)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary, False), de, ser)
    return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream, True), de, ser)
