"""The Scheduler gRPC API against a real Redis and a real Predictor on loopback.

Agents are played by writing their events onto the real events stream (the
same messages an agent sends); the e2e tests run real agent processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest
import redis

from frenzy.state.keys import AGENT_GROUP, Keys
from frenzy.state.messages import AgentEvent, EventKind, command_from, payload
from frenzy.state.store import StateStore
from frenzy.v1 import scheduler_pb2, types_pb2
from support.servers import Servers, running_servers
from support.state import add_node, make_plan, make_spec, send_event, set_gpu

DONE = (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED)


@pytest.fixture
def servers(redis_url: str, prefix: str) -> Iterator[Servers]:
    with running_servers(redis_url, prefix) as s:
        yield s


def _spec(**over: object) -> types_pb2.JobSpec:
    spec = make_spec("api")
    spec.recipe.seq_len = 512
    spec.recipe.global_batch = 8
    for k, v in over.items():
        if k == "model":
            spec.model.catalog_name = v  # type: ignore[assignment]
        elif k == "config_json":
            spec.model.config_json = v  # type: ignore[assignment]
        elif hasattr(spec.recipe, k):
            setattr(spec.recipe, k, v)
        elif k == "gpu_types":
            spec.limits.allowed_gpu_types.extend(v)  # type: ignore[arg-type]
        elif k == "command":
            del spec.command[:]
            spec.command.extend(v)  # type: ignore[arg-type]
        else:
            setattr(spec, k, v)
    return spec


def _wait(stub, job_id: str, states: tuple[int, ...], timeout_s: float = 15) -> types_pb2.Job:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)
        if job.state in states:
            return job
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never reached {states}: {job}")


def _event(client: redis.Redis, keys: Keys, **kw: object) -> None:
    send_event(client, keys, AgentEvent(**kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("over", "code", "field"),
    [
        ({"model": "llama-9-7b"}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ({"config_json": "{not json"}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ({"config_json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})},
         grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ({"global_batch": -4}, grpc.StatusCode.INVALID_ARGUMENT, "global_batch"),
        ({"global_batch": 0}, grpc.StatusCode.INVALID_ARGUMENT, "global_batch"),
        ({"seq_len": 0}, grpc.StatusCode.INVALID_ARGUMENT, "seq_len"),
        ({"micro_batch": 3}, grpc.StatusCode.INVALID_ARGUMENT, "micro_batch"),
        ({"gpu_types": ["B300-1TB"]}, grpc.StatusCode.INVALID_ARGUMENT, "gpu"),
        ({"command": []}, grpc.StatusCode.INVALID_ARGUMENT, "command"),
        ({"model": "llama-2-70b", "seq_len": 4096, "global_batch": 8}, grpc.StatusCode.FAILED_PRECONDITION, "L4"),
    ],
)
def test_bad_input_is_rejected_naming_the_field_and_leaves_no_state(
    servers: Servers, redis_client: redis.Redis, keys: Keys, over: dict, code: grpc.StatusCode, field: str,
) -> None:
    add_node(redis_client, keys, "l4-0", "L4", 1, memory=23 * 1024**3)
    def state() -> set[str]:  # the events stream and the leader lease are the loop's, made at its own pace
        return set(redis_client.keys(f"{keys.prefix}:*")) - {keys.events_stream(), keys.leader(), keys.leader_epoch()}

    before = state()
    with pytest.raises(grpc.RpcError) as info:
        servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(**over)), timeout=30)
    assert info.value.code() == code, info.value.details()
    assert field.lower() in info.value.details().lower(), info.value.details()
    assert state() == before
    assert redis_client.zcard(keys.jobs()) == 0


def test_idempotent_submission_returns_the_same_job(servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 0)  # no GPUs: the job stays pending
    add_node(redis_client, keys, "a-1", "A100-80GB", 1)
    set_gpu(redis_client, keys, "a-1", 0, owner="someone-else")
    first = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(idempotency_key="k1")), timeout=30)
    again = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(idempotency_key="k1")), timeout=30)
    assert not first.duplicate and again.duplicate and first.job.id == again.job.id
    assert redis_client.zcard(keys.jobs()) == 1


def test_pending_reason_names_the_numbers(servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 1)
    set_gpu(redis_client, keys, "a-0", 0, owner="job-other")
    job = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30).job
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        job = servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.id), timeout=5)
        if "GiB" in job.pending_reason:
            break
        time.sleep(0.05)
    assert job.state == types_pb2.JOB_STATE_PENDING
    assert "A100-80GB" in job.pending_reason and "GiB" in job.pending_reason, job.pending_reason


def test_launch_run_exit_cycle_and_cancel(servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 2)
    stub = servers.stub
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(micro_batch=4)), timeout=30).job
    job = _wait(stub, job.id, (types_pb2.JOB_STATE_LAUNCHING,))
    # The launch message is on the node's stream, readable by the agent's consumer group.
    redis_client.xgroup_create(keys.launch_stream("a-0"), AGENT_GROUP, id="0", mkstream=True)
    entries = redis_client.xreadgroup(AGENT_GROUP, "a-0", {keys.launch_stream("a-0"): ">"}, count=10)[0][1]
    launch = command_from(payload(entries[0][1]))
    assert launch.kind == "launch" and launch.job_id == job.id and launch.nnodes == 1
    assert sorted(launch.gpu_indices) == sorted(job.placement[0].gpu_indices)
    assert launch.layout.tp * launch.layout.dp * launch.layout.pp == job.plan.num_gpus
    # Garbage on the events stream is dropped without stopping the consumer.
    redis_client.xadd(keys.events_stream(), {"data": "{garbage"})
    redis_client.xadd(keys.events_stream(), {"nope": "1"})
    _event(redis_client, keys, kind=EventKind.RUNNING, job_id=job.id, attempt=1, node="a-0", pid=123,
           log_path="/tmp/x.log")
    job = _wait(stub, job.id, (types_pb2.JOB_STATE_RUNNING,))
    assert job.log_paths["a-0"] == "/tmp/x.log"
    resp = stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.id, reason="test"), timeout=5)
    assert resp.job.state == types_pb2.JOB_STATE_RUNNING  # stopping: waits for the agent's exit report
    entries = redis_client.xreadgroup(AGENT_GROUP, "a-0", {keys.launch_stream("a-0"): ">"}, count=10)[0][1]
    assert command_from(payload(entries[0][1])).kind == "cancel"
    _event(redis_client, keys, kind=EventKind.EXITED, job_id=job.id, attempt=1, node="a-0", exit_code=-15,
           cancelled=True)
    job = _wait(stub, job.id, DONE)
    assert job.state == types_pb2.JOB_STATE_CANCELLED
    assert all(redis_client.hget(keys.gpu("a-0", i), "owner") == "" for i in range(2))
    # Every event, garbage included, was acknowledged.
    pending = redis_client.xpending(keys.events_stream(), "scheduler")
    assert pending["pending"] == 0
    with pytest.raises(grpc.RpcError) as info:
        stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.id), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_cancel_pending_job_and_unknown_job(servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 1)
    set_gpu(redis_client, keys, "a-0", 0, owner="job-other")
    job = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30).job
    resp = servers.stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.id), timeout=5)
    assert resp.job.state == types_pb2.JOB_STATE_CANCELLED
    assert redis_client.zscore(keys.queue(), job.id) is None
    with pytest.raises(grpc.RpcError) as info:
        servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id="job-nope"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_one_rank_failing_fails_the_job_and_stops_the_others(
    servers: Servers, redis_client: redis.Redis, keys: Keys,
) -> None:
    add_node(redis_client, keys, "a-0", "A100-80GB", 1)
    add_node(redis_client, keys, "a-1", "A100-80GB", 1)
    stub = servers.stub
    # A 2-GPU plan written straight into the store: the live loop must spread it over both nodes.
    store = StateStore(redis_client, keys)
    job_id, _ = store.submit(_spec(), [make_plan("A100-80GB", dp=2)], "gpt2-124m", 124_000_000)
    servers.scheduler.loop.wake.set()
    job = _wait(stub, job_id, (types_pb2.JOB_STATE_LAUNCHING,))
    nodes = [a.node for a in job.placement]
    assert sorted(nodes) == ["a-0", "a-1"]
    _event(redis_client, keys, kind=EventKind.RUNNING, job_id=job.id, attempt=1, node=nodes[0], pid=1)
    _event(redis_client, keys, kind=EventKind.EXITED, job_id=job.id, attempt=1, node=nodes[1], exit_code=2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not redis_client.xlen(keys.launch_stream(nodes[0])) >= 2:
        time.sleep(0.05)
    last = redis_client.xrevrange(keys.launch_stream(nodes[0]), count=1)[0][1]
    assert command_from(payload(last)).kind == "cancel"
    _event(redis_client, keys, kind=EventKind.EXITED, job_id=job.id, attempt=1, node=nodes[0], exit_code=-15,
           cancelled=True)
    job = _wait(stub, job.id, DONE)
    assert job.state == types_pb2.JOB_STATE_FAILED
