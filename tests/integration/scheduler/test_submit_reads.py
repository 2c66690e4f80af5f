"""What a submission reads from Redis (issue 15): a handful of commands, not one per node and GPU.

SubmitJob used to read every node and GPU hash for the pools it plans on (``load_nodes``: ~900
commands a submission at 100 nodes). Now the pools come from a recent cluster view. These tests
count the commands a real SubmitJob sends to the real test Redis (every command a connection
packs, pipelined or not), against a real predictor, and check that the pools still follow
nodes dying, draining and joining."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
import redis

from frenzy.agent.drain import drain
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.server import stop_server
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.scheduler.service import SchedulerServicer
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.store import StateStore
from frenzy.v1 import predictor_pb2_grpc, scheduler_pb2, types_pb2
from support.state import add_node, make_spec

NODES, GPUS_PER_NODE = 50, 8


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class Context:
    """The part of grpc.ServicerContext SubmitJob uses: abort."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def counting_client(url: str) -> tuple[redis.Redis, list[str]]:
    """A client on ``url`` and the list each command it sends is appended to (its name)."""
    sent: list[str] = []

    class Packer:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def pack(self, *args: object) -> list[bytes]:
            sent.append(str(args[0]).split()[0].upper())
            return self.inner.pack(*args)  # type: ignore[attr-defined]

    class Counting(redis.Connection):
        def _construct_command_packer(self, packer: object) -> Packer:  # every command, pipelined or not
            return Packer(super()._construct_command_packer(packer))

    pool = redis.ConnectionPool.from_url(url, connection_class=Counting, decode_responses=True)
    return redis.Redis(connection_pool=pool), sent


@pytest.fixture
def predictor_addr() -> Iterator[str]:
    server, port, health = serve_predictor("127.0.0.1:0")
    yield f"127.0.0.1:{port}"
    stop_server(server, health, grace_s=0.5)


@pytest.fixture
def counted(redis_url: str) -> Iterator[tuple[redis.Redis, list[str]]]:
    client, sent = counting_client(redis_url)
    yield client, sent
    client.close()


def _servicer(client: redis.Redis, keys: Keys, predictor_addr: str, **kw: object) -> SchedulerServicer:
    channel = grpc.insecure_channel(predictor_addr)
    return SchedulerServicer(client, keys, predictor_pb2_grpc.PredictorStub(channel), SchedulerLoop(client, keys),
                             **kw)  # type: ignore[arg-type]


def _spec(gpu_type: str = "", name: str = "t") -> types_pb2.JobSpec:
    spec = make_spec(name)
    spec.limits.max_gpus = 1
    if gpu_type:
        spec.limits.allowed_gpu_types.append(gpu_type)
    return spec


def _submit(servicer: SchedulerServicer, spec: types_pb2.JobSpec) -> types_pb2.Job:
    return servicer.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), Context()).job  # type: ignore[arg-type]


def _pools(servicer: SchedulerServicer) -> dict[str, tuple[int, int]]:
    return {p.gpu_type: (p.total_gpus, p.gpus_per_node) for p in servicer.pools.current()}


def test_a_submission_sends_a_handful_of_commands_on_a_50_node_cluster(
        counted: tuple[redis.Redis, list[str]], redis_client: redis.Redis, keys: Keys, predictor_addr: str) -> None:
    client, sent = counted
    for i in range(NODES):
        add_node(redis_client, keys, f"n{i:02d}", "A100-80GB", GPUS_PER_NODE)
    servicer = _servicer(client, keys, predictor_addr)
    client.ping()  # the connection's handshake is not the submission's
    # What the pools used to cost: every node hash and liveness key, then every GPU hash.
    del sent[:]
    StateStore(client, keys).load_nodes()
    per_node_reads = len(sent)
    assert per_node_reads >= NODES * (2 + GPUS_PER_NODE)

    del sent[:]
    first = _submit(servicer, _spec(name="first"))
    on_first = list(sent)
    del sent[:]
    second = _submit(servicer, _spec(name="second"))
    on_second = list(sent)
    assert first.state == second.state == types_pb2.JOB_STATE_PENDING
    assert first.candidate_plans and list(first.candidate_plans) == list(second.candidate_plans)
    # The first reads the cluster once (node heads and every GPU in two scripts); the second,
    # within the view's age, reads nothing for its pools and asks the predictor nothing.
    print(f"\nRedis commands: load_nodes {per_node_reads}, first SubmitJob {len(on_first)} {on_first}, "
          f"second {len(on_second)} {on_second}")
    # (the one HGETALL is the new job's record, read back for the answer)
    assert on_first.count("HGETALL") <= 1 and "EXISTS" not in on_first, on_first
    assert len(on_first) <= 15, on_first
    assert len(on_second) <= 10 and "SMEMBERS" not in on_second, on_second
    assert servicer.pools.reads == 1 and servicer.predictions.hits == 1


def test_the_loops_recent_view_spares_the_submissions_read(
        redis_client: redis.Redis, keys: Keys, predictor_addr: str) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 4)
    servicer = _servicer(redis_client, keys, predictor_addr)
    queued, _ = servicer.store.submit(_spec(), [], "gpt2-124m", 1)  # no plans: it waits, and the tick reads
    assert servicer.store.get(queued).state == JobState.PENDING
    servicer.loop.tick()
    assert servicer.loop.seen.view is not None
    job = _submit(servicer, _spec())
    assert job.candidate_plans and servicer.pools.reads == 0
    assert _pools(servicer) == {"A100-80GB": (4, 4)}


def _eventually_pools(servicer, expected: dict, timeout_s: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while (seen := _pools(servicer)) != expected:
        assert time.monotonic() < deadline, f"pools {seen}, expected {expected}"
        time.sleep(0.02)


def test_pools_follow_nodes_dying_draining_and_joining(
        redis_client: redis.Redis, redis_url: str, keys: Keys, predictor_addr: str) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 8)
    add_node(redis_client, keys, "b", "A100-80GB", 4)
    add_node(redis_client, keys, "l", "L4", 2)
    max_age = 0.3
    servicer = _servicer(redis_client, keys, predictor_addr, pools_max_age_s=max_age)
    assert _pools(servicer) == {"A100-80GB": (12, 8), "L4": (2, 2)}
    assert _submit(servicer, _spec("L4")).candidate_plans[0].gpu_type == "L4"

    # Draining: no new work there, so not planned on once the view is max_age old (and the read
    # that a submission then starts in the background has landed: it is served the older view
    # meanwhile rather than wait).
    assert drain(redis_url, keys, "a", wait=False, say=lambda _: None) == 0  # frenzy agent --drain
    time.sleep(max_age + 0.05)
    _eventually_pools(servicer, {"A100-80GB": (4, 4), "L4": (2, 2)})
    assert drain(redis_url, keys, "a", undrain=True, say=lambda _: None) == 0
    time.sleep(max_age + 0.05)
    _eventually_pools(servicer, {"A100-80GB": (12, 8), "L4": (2, 2)})

    # Dead (its heartbeat lease gone): the L4 pool goes, and a job only L4 can run is refused.
    redis_client.delete(keys.node_alive("l"))
    time.sleep(max_age + 0.05)
    _eventually_pools(servicer, {"A100-80GB": (12, 8)})
    with pytest.raises(Aborted) as refused:
        _submit(servicer, _spec("L4"))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and "A100-80GB" in refused.value.details

    # Joining: a node that registers after the view was taken is looked for before a refusal,
    # even while the view is young (the answer above is not kept past the pools it was for).
    servicer.pools.max_age_s = 60.0
    _pools(servicer)
    add_node(redis_client, keys, "l2", "L4", 2)
    job = _submit(servicer, _spec("L4"))
    assert job.candidate_plans[0].gpu_type == "L4"
    assert _pools(servicer) == {"A100-80GB": (12, 8), "L4": (2, 2)}


def test_a_replan_reads_the_cluster_afresh(redis_client: redis.Redis, keys: Keys, predictor_addr: str) -> None:
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    add_node(redis_client, keys, "l", "L4", 2)
    servicer = _servicer(redis_client, keys, predictor_addr, pools_max_age_s=60.0)
    job = _submit(servicer, _spec())
    assert {p.gpu_type for p in job.candidate_plans} == {"A100-80GB", "L4"}
    redis_client.delete(keys.node_alive("l"))  # died within the view's age
    plans = servicer.replan(servicer.store.get(job.id))
    assert plans and {p.gpu_type for p in plans} == {"A100-80GB"}
