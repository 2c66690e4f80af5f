"""The whole path as separate processes: predictor, scheduler and several
fake-GPU agents started by LocalStack, a submission over gRPC, the launched
command's exit code and log, and every GPU free afterwards."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import grpc
import pytest

from frenzy.devstack.stack import LocalStack
from frenzy.rpc.auth import with_token
from frenzy.rpc.jobspec import parse_entry
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from has.cluster_spec import parse_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = {"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 2, "name_prefix": "big"},
                     {"gpu": "L4", "count": 2, "gpus_per_node": 2, "name_prefix": "small"}]}


@pytest.fixture
def stack(redis_url: str, prefix: str, tmp_path: Path):
    s = LocalStack.create(parse_cluster(CLUSTER), run_dir=str(tmp_path / "run"), redis_url=redis_url,
                          prefix=prefix, with_worker=False, heartbeat_s=0.5, ttl_s=3)
    s.start()
    yield s
    s.stop()


def _wait_final(stub: scheduler_pb2_grpc.SchedulerStub, job_id: str, timeout_s: float = 60) -> types_pb2.Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)
        if job.state in (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def test_job_flows_through_every_service(stack: LocalStack) -> None:
    script = "import os; print('hello from', os.environ['FRENZY_NODE_RANK'], os.environ['CUDA_VISIBLE_DEVICES'])"
    spec = parse_entry({"name": "e2e", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "micro_batch": 4,
                        "command": [sys.executable, "-c", script]}).to_proto()
    with grpc.insecure_channel(stack.scheduler_addr) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(with_token(ch, stack.token))
        nodes = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes
        assert sorted(n.name for n in nodes) == ["big-0", "small-0", "small-1"]
        resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
        assert resp.job.state == types_pb2.JOB_STATE_PENDING and resp.job.candidate_plans
        states = [u.transition.state for u in stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=resp.job.id),
                                                             timeout=60)]
        job = _wait_final(stub, resp.job.id)
        assert job.state == types_pb2.JOB_STATE_SUCCEEDED, job
        assert states[0] == types_pb2.JOB_STATE_PENDING and states[-1] == types_pb2.JOB_STATE_SUCCEEDED
        assert types_pb2.JOB_STATE_RESERVED in states and types_pb2.JOB_STATE_LAUNCHING in states
        assert set(job.exit_codes.values()) == {0}
        assert job.log_paths
        for path in job.log_paths.values():
            text = Path(path).read_text()
            assert "hello from" in text, text
        placed_nodes = {a.node for a in job.placement}
        assert placed_nodes <= {"big-0", "small-0", "small-1"}
        after = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes
        assert all(not g.owner for n in after for g in n.gpus)


def test_failing_command_ends_failed_and_frees_gpus(stack: LocalStack) -> None:
    spec = parse_entry({"name": "bad", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8,
                        "command": [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]}).to_proto()
    with grpc.insecure_channel(stack.scheduler_addr) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(with_token(ch, stack.token))
        resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
        job = _wait_final(stub, resp.job.id)
        assert job.state == types_pb2.JOB_STATE_FAILED
        assert 3 in job.exit_codes.values()
        after = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes
        assert all(not g.owner for n in after for g in n.gpus)
