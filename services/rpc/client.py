"""gRPC client helpers shared by the CLI, the batch worker and the API gateway."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frenzy.auth.credentials import DEFAULT_SCHEDULER as DEFAULT_SCHEDULER  # re-exported for the CLI options
from frenzy.auth.credentials import read_credentials, resolve_scheduler, resolve_token
from frenzy.rpc.bearer import with_token
from frenzy.rpc.tls import ClientTls, open_channel
from frenzy.v1 import scheduler_pb2_grpc

DEFAULT_PREDICTOR = "127.0.0.1:50052"


def scheduler_address(explicit: str | None = None) -> str:
    """--scheduler, else FRENZY_SCHEDULER, else the credentials file, else 127.0.0.1:50051."""
    return resolve_scheduler(explicit)


@contextmanager
def scheduler_stub(address: str | None = None, token: str | None = None,
                   ) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    """A Scheduler stub whose calls carry the caller's token (``token``, else FRENZY_TOKEN, else the
    credentials file; see frenzy.auth.credentials)."""
    channel = with_token(open_channel(scheduler_address(address), client_tls()), resolve_token(token))
    try:
        yield scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        channel.close()


def client_tls() -> ClientTls | None:
    """TLS for calls to Frenzy's servers: FRENZY_TLS_CA (else the credentials file's ``ca``), with
    FRENZY_TLS_CERT/FRENZY_TLS_KEY for mutual TLS; None (plaintext) when no CA is configured."""
    return ClientTls.from_env(read_credentials().ca)


def wait_healthy(address: str, timeout_s: float = 20.0, service: str = "", tls: ClientTls | None = None) -> bool:
    """True once the server at ``address`` answers SERVING to a health check."""
    import time

    deadline = time.monotonic() + timeout_s
    with open_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False
