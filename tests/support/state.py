"""Helpers for scheduler tests: a StateStore on the real test Redis, and a
way to put nodes and GPUs into Redis exactly as an agent registers them."""

from __future__ import annotations

import json
import time

import redis

from frenzy.state import node_keys
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, encode, sealed
from frenzy.v1 import types_pb2

GiB = 1024**3


def add_node(client: redis.Redis, keys: Keys, node: str, gpu_type: str, count: int,
             memory: int = 80 * GiB, alive: bool = True) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.node(node), mapping={"name": node, "addr": "127.0.0.1", "gpu_count": count,
                                        "gpu_types": gpu_type, "draining": "0", "heartbeat_at": time.time()})
    for i in range(count):
        pipe.hset(keys.gpu(node, i), mapping={"node": node, "index": i, "uuid": f"GPU-{node}-{i}", "type": gpu_type,
                                              "nvml_name": gpu_type, "memory_total": memory, "memory_free": memory,
                                              "healthy": "1", "owner": "", "fence": 0})
    pipe.hincrby(keys.node(node), "rev", 1)  # as register_node does
    pipe.sadd(keys.nodes(), node)
    if alive:
        pipe.set(keys.node_alive(node), "1", ex=60)
    pipe.execute()
    node_keys.create(client, keys, node)  # as an operator does before starting its agent


def send_event(client: redis.Redis, keys: Keys, event: AgentEvent, signed: bool = True) -> str:
    """XADD ``event`` to the events stream as the agent of ``event.node`` does: signed with its key."""
    if signed:
        ring = node_keys.read(client, keys, event.node)
        assert ring is not None, f"node {event.node} has no key (add_node makes one)"
        event = sealed(event, ring.current)
    return client.xadd(keys.events_stream(), encode(event))


def set_gpu(client: redis.Redis, keys: Keys, node: str, index: int, **fields: object) -> None:
    """Write GPU fields as Frenzy's scripts do: together with a bump of the node's ``rev``, so a
    scheduler that already read the node sees the change (a bare HSET would wait for its next
    full read)."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.gpu(node, index), mapping=fields)  # type: ignore[arg-type]
    pipe.hincrby(keys.node(node), "rev", 1)
    pipe.execute()


def make_plan(gpu_type: str, tp: int = 1, dp: int = 1, peak: int = 10 * GiB) -> types_pb2.Plan:
    return types_pb2.Plan(gpu_type=gpu_type, num_gpus=tp * dp, peak_bytes_per_gpu=peak, gpu_memory_bytes=80 * GiB,
                          layout=types_pb2.Layout(tp=tp, pp=1, dp=dp, zero_stage=0, micro_batch=1, grad_accum=1,
                                                  recompute="none"),
                          step_time_s=1.0, gpu_hours=1.0, rank=1)


def make_spec(name: str = "t") -> types_pb2.JobSpec:
    return types_pb2.JobSpec(name=name, model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
                             recipe=types_pb2.TrainingRecipe(seq_len=128, global_batch=8),
                             command=["true"])


def place_on(client: redis.Redis, keys: Keys, job_id: str, *nodes: str) -> None:
    """Record ``job_id`` as placed on ``nodes`` (one GPU each) as place_jobs.lua does: the placement
    and a RESERVED history entry naming the nodes. StreamLogs reads the log streams of the nodes a
    job was placed on, in any attempt (frenzy.state.job_logs), so a test that ships output for a
    node places the job there first."""
    from frenzy.state.job_states import JobState
    from frenzy.state.records import history_entry

    client.hset(keys.job(job_id), "placement", json.dumps([[n, [0]] for n in nodes]))
    client.rpush(keys.job_history(job_id), history_entry(JobState.RESERVED, f"{len(nodes)} x A100-80GB on "
                                                         + ", ".join(nodes)))
