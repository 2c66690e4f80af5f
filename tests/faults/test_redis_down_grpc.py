"""issue 14 D3: with Redis down, every Scheduler RPC answers UNAVAILABLE with a clean message.

Before: an RPC whose token was still cached reached the servicer, whose Redis call raised;
grpc answered UNKNOWN "Exception calling application: Error 111 connecting to
127.0.0.1:<port>. Connection refused." (the Redis address, to any client). Now the answer
is UNAVAILABLE "state store unavailable, try again", and it comes back once Redis does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frenzy.devstack.redis_server import RedisProcess, start_redis
from frenzy.rpc.errors import STORE_UNAVAILABLE
from frenzy.v1 import scheduler_pb2
from support.servers import running_servers
from support.state import make_spec


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisProcess]:  # noqa: ANN001 — a Redis this test may stop
    server = start_redis(workdir=str(tmp_path / "redis"))
    try:
        yield server
    finally:
        server.stop()


REQUESTS = {
    "SubmitJob": scheduler_pb2.SubmitJobRequest(spec=make_spec("down")),
    "GetJob": scheduler_pb2.GetJobRequest(job_id="job-000000000000"),
    "ListJobs": scheduler_pb2.ListJobsRequest(),
    "CancelJob": scheduler_pb2.CancelJobRequest(job_id="job-000000000000"),
    "WatchJob": scheduler_pb2.WatchJobRequest(job_id="job-000000000000"),
    "ListNodes": scheduler_pb2.ListNodesRequest(),
    "StreamLogs": scheduler_pb2.StreamLogsRequest(job_id="job-000000000000"),
    "HasCode": scheduler_pb2.HasCodeRequest(sha256="0" * 64),
    "GetUsage": scheduler_pb2.GetUsageRequest(),
    "UploadCode": [scheduler_pb2.CodeChunk(sha256="0" * 64, size=3, data=b"abc")],  # client-streamed
}


def test_every_rpc_answers_unavailable_without_internals_while_redis_is_down(own_redis: RedisProcess,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    service = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
    assert {m.name for m in service.methods} == set(REQUESTS)
    port = own_redis.url.rsplit(":", 1)[-1].split("/")[0]
    with running_servers(own_redis.url, "d3") as servers:
        servers.stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)  # the token is now cached
        own_redis.stop()
        t0 = time.monotonic()
        for name, request in REQUESTS.items():
            with pytest.raises(grpc.RpcError) as err:
                result = getattr(servers.stub, name)(iter(request) if isinstance(request, list) else request,
                                                     timeout=10)
                if not hasattr(result, "ListFields"):
                    list(result)
            details = err.value.details() or ""
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (name, details)
            assert details == STORE_UNAVAILABLE, (name, details)
            assert port not in details and "127.0.0.1" not in details and "Error" not in details
        assert time.monotonic() - t0 < 10
        # Health needs no Redis: it still answers.
        with grpc.insecure_channel(servers.scheduler_addr) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    # One warning for the whole outage, not one per call.
    outage_lines = [r for r in caplog.records if "state store unavailable" in r.getMessage()]
    assert len(outage_lines) == 1
