"""Every Frenzy gRPC server answers standard health checks and reflection,
so grpc_health_probe, grpcurl and compose health checks work unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from support.servers import Servers, running_servers


@pytest.fixture
def servers(redis_url: str, prefix: str) -> Iterator[Servers]:
    with running_servers(redis_url, prefix) as s:
        yield s


def _services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        resp = next(iter(stub.ServerReflectionInfo(iter([req]), timeout=5)))
        return {s.name for s in resp.list_services_response.service}


def _health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_scheduler_and_predictor_serve_health_and_reflection(servers: Servers) -> None:
    for address, name in ((servers.scheduler_addr, "frenzy.v1.Scheduler"),
                          (servers.predictor_addr, "frenzy.v1.Predictor")):
        assert _health(address, "") == health_pb2.HealthCheckResponse.SERVING
        assert _health(address, name) == health_pb2.HealthCheckResponse.SERVING
        names = _services(address)
        assert {name, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    with pytest.raises(grpc.RpcError) as info:
        _health(servers.scheduler_addr, "frenzy.v1.Nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
