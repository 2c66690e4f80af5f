"""Start a gRPC server the way every Frenzy server starts: loopback or any
address, a thread pool, standard health checking and reflection.

Every server gets the same two guards (issue 14): ``CleanErrors`` outermost, so
nothing but a clean status leaves a servicer (UNAVAILABLE when Redis is down,
never an exception's text), and ``StreamLimit`` innermost, so open streams never
hold more than ``StreamCaps.total`` of the ``max_workers`` threads and unary calls
and health checks always find one. Extra interceptors (the token check) run
between the two, which is what lets the stream cap count per user.

Health: the overall service ("") and each named service report SERVING once
the servicers are added, NOT_SERVING during shutdown, so `grpc_health_probe`
and compose health checks work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from frenzy.rpc.errors import CleanErrors
from frenzy.rpc.limits import DEFAULT_WORKERS, StreamCaps, StreamLimit, StreamSlots
from frenzy.rpc.tls import ServerTls


def start_server(
    add_servicers: Sequence[Callable[[grpc.Server], None]],
    service_names: Sequence[str],
    address: str = "127.0.0.1:0",
    max_workers: int = DEFAULT_WORKERS,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    stream_caps: StreamCaps | None = None,
    tls: ServerTls | None = None,
    token_alive: Callable[[str], bool] | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """Build, bind and start a server (TLS when ``tls``, mutual when it has a client CA).
    ``token_alive`` (token id -> still valid, read afresh): open streams of a revoked or
    expired token are ended within a second or so (``frenzy.rpc.limits``).
    -> (server, bound port, health servicer)"""
    caps = stream_caps or StreamCaps()
    if caps.total >= max_workers:
        raise ValueError(f"the stream cap ({caps.total}) must be below the thread pool ({max_workers} workers), "
                         "or open streams can take every thread")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         interceptors=[CleanErrors(), *interceptors, StreamLimit(StreamSlots(caps, token_alive))])
    for add in add_servicers:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"could not bind gRPC server to {address}")
    server.start()
    for name in ("", *service_names):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer


def stop_server(server: grpc.Server, health_servicer: health.HealthServicer, grace_s: float = 2.0) -> None:
    health_servicer.enter_graceful_shutdown()
    server.stop(grace_s).wait()
