"""issue 14 item 1 (gRPC side): no call without a token, a role per call, jobs per user.

Before: any client that reached the scheduler's port submitted, listed and cancelled anyone's
jobs (and a job is a command run on GPU hosts). Each test here failed on that code."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from frenzy.auth.roles import Role
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, types_pb2
from support.servers import Servers, running_servers
from support.state import add_node, make_spec


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "n0", "A100-80GB", 4)
    with running_servers(redis_url, prefix) as s:
        yield s


def _spec(name: str = "sec") -> types_pb2.JobSpec:
    spec = make_spec(name)
    spec.recipe.seq_len = 512
    spec.recipe.global_batch = 8
    return spec


# One request per RPC of the Scheduler service; a new RPC must be added here (the test below
# checks the list is complete), so none slips out unauthenticated.
REQUESTS = {
    "SubmitJob": scheduler_pb2.SubmitJobRequest(spec=_spec()),
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


def _call(stub, name: str) -> None:  # noqa: ANN001
    request = REQUESTS[name]
    result = getattr(stub, name)(iter(request) if isinstance(request, list) else request, timeout=10)
    if not hasattr(result, "ListFields"):  # a stream: read it to get the status
        list(result)


def test_every_rpc_without_a_token_is_unauthenticated(servers: Servers) -> None:
    service = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
    assert {m.name for m in service.methods} == set(REQUESTS)
    bare = servers.stub_for(None)
    for name in REQUESTS:
        with pytest.raises(grpc.RpcError) as err:
            _call(bare, name)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        assert "FRENZY_TOKEN" in err.value.details()  # says how to get one
    # nothing was submitted
    assert not servers.stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs


def test_forged_malformed_and_revoked_tokens_are_refused(servers: Servers) -> None:
    good, info = servers.scheduler.tokens.create("mallory", Role.SUBMIT)
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    for token in (forged, "frz_000000000000_" + "A" * 43, "not-a-token", good + "x"):
        with pytest.raises(grpc.RpcError) as err:
            servers.stub_for(token).ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert token not in err.value.details()  # never echoed back
    servers.stub_for(good).ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)
    servers.scheduler.tokens.revoke(info.token_id)
    servers.scheduler.tokens._cache.clear()  # the server's cache would hold it a few seconds
    with pytest.raises(grpc.RpcError) as err:
        servers.stub_for(good).ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_roles_and_ownership(servers: Servers) -> None:
    tokens = servers.scheduler.tokens
    alice = servers.stub_for(tokens.create("alice", Role.SUBMIT)[0])
    bob = servers.stub_for(tokens.create("bob", Role.SUBMIT)[0])
    viewer = servers.stub_for(tokens.create("viewer", Role.READ)[0])
    node = servers.stub_for(tokens.create("node-0", Role.NODE)[0])

    job = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec("alices")), timeout=30).job
    assert job.user == "alice"
    # a read token may look but not submit; a node token may do nothing on the API
    with pytest.raises(grpc.RpcError) as err:
        viewer.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        node.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    viewer.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10)
    # bob neither sees, watches, reads the logs of, nor cancels alice's job
    for name, request in (("GetJob", scheduler_pb2.GetJobRequest(job_id=job.id)),
                          ("CancelJob", scheduler_pb2.CancelJobRequest(job_id=job.id)),
                          ("WatchJob", scheduler_pb2.WatchJobRequest(job_id=job.id)),
                          ("StreamLogs", scheduler_pb2.StreamLogsRequest(job_id=job.id))):
        with pytest.raises(grpc.RpcError) as err:
            result = getattr(bob, name)(request, timeout=10)
            if not hasattr(result, "ListFields"):
                list(result)
        # the same answer as for a job that does not exist (issue 34): nothing says it does
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, name
        assert job.id in err.value.details() and "another user" not in err.value.details()
    assert [j.id for j in bob.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs] == []
    assert [j.id for j in alice.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs] == [job.id]
    # the same idempotency key from two users gives two jobs, never the other's
    spec = _spec("idem")
    spec.idempotency_key = "nightly-1"
    a = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    b = bob.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert a.job.id != b.job.id and not b.duplicate
    # the admin sees and cancels everything
    assert job.id in {j.id for j in servers.stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs}
    cancelled = servers.stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.id), timeout=10).job
    assert cancelled.id == job.id  # accepted (placed jobs end CANCELLED once their agents stop them)


def test_health_stays_open(servers: Servers) -> None:
    with grpc.insecure_channel(servers.scheduler_addr) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_cli_with_a_wrong_token_fails_and_says_so(servers: Servers) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FRENZY_TOKEN"}
    env["FRENZY_TOKEN"] = "frz_0123456789ab_" + "A" * 43
    out = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "jobs", "--scheduler", servers.scheduler_addr],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert "UNAUTHENTICATED" in out.stderr and "token is unknown or revoked" in out.stderr
