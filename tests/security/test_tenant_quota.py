"""issue 34 item 4: the per-user GPU quota holds at placement, not only at submission.

Measured before: with ``--max-gpus-per-user 2`` one user held 6 GPUs at once. The quota was
checked when a job was submitted (refused while the user held 2 or more), so jobs admitted while
the user held nothing were all placed together. Against real scheduler and predictor servers and
a real Redis: six 1-GPU jobs queued while the queue is held (as jobs submitted in one burst are
admitted before any placement), then released; the user never holds more than 2 GPUs and the
others wait with a reason naming the quota. Fails on the old code (6 GPUs held).
"""

from __future__ import annotations

import time

import grpc
import redis

from frenzy.auth.roles import Role
from frenzy.rpc.auth import with_token
from frenzy.scheduler.service import UserQuotas
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc
from support.servers import running_servers
from support.state import add_node, make_spec
from support.waiting import wait_for


def _held_by(client: redis.Redis, keys: Keys, user: str, nodes: dict[str, int]) -> int:
    held = 0
    for node, count in nodes.items():
        for i in range(count):
            owner = client.hget(keys.gpu(node, i), "owner")
            if owner and client.hget(keys.job(owner), "user") == user:
                held += 1
    return held


def test_a_user_capped_at_2_gpus_never_holds_more_than_2(redis_url: str, prefix: str, redis_client: redis.Redis,
                                                         keys: Keys) -> None:
    nodes = {"n0": 4, "n1": 4}
    for node, count in nodes.items():
        add_node(redis_client, keys, node, "A100-80GB", count)
    with running_servers(redis_url, prefix, quotas=UserQuotas(max_gpus=2)) as servers:
        token, _ = servers.scheduler.tokens.create("alice", Role.SUBMIT)
        bob_token, _ = servers.scheduler.tokens.create("bob", Role.SUBMIT)
        alice = scheduler_pb2_grpc.SchedulerStub(with_token(grpc.insecure_channel(servers.scheduler_addr), token))
        bob = scheduler_pb2_grpc.SchedulerStub(with_token(grpc.insecure_channel(servers.scheduler_addr), bob_token))
        redis_client.set(keys.queue_hold(), "test: admit a burst before any placement")
        spec = make_spec("a")
        spec.recipe.seq_len = 512
        spec.limits.max_gpus = 1  # one GPU a job: six jobs would hold six GPUs
        ids = [alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id for _ in range(6)]
        bob_job = bob.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
        redis_client.delete(keys.queue_hold())
        servers.scheduler.loop.wake.set()

        def placed() -> int:
            return sum(1 for j in ids if alice.GetJob(scheduler_pb2.GetJobRequest(job_id=j), timeout=5).placement)

        wait_for(lambda: placed() >= 2, timeout=15, what="alice's first two jobs placed")
        wait_for(lambda: bob.GetJob(scheduler_pb2.GetJobRequest(job_id=bob_job), timeout=5).placement,
                 timeout=15, what="bob's job placed (alice's quota is not his)")
        deadline = time.monotonic() + 2.0  # several ticks (0.05 s each)
        while time.monotonic() < deadline:
            assert _held_by(redis_client, keys, "alice", nodes) <= 2
            time.sleep(0.1)
        assert placed() == 2
        waiting = [j for j in ids if not alice.GetJob(scheduler_pb2.GetJobRequest(job_id=j), timeout=5).placement]
        assert len(waiting) == 4

        def reason() -> str:
            return alice.GetJob(scheduler_pb2.GetJobRequest(job_id=waiting[0]), timeout=5).pending_reason

        wait_for(lambda: "quota" in reason(), timeout=5, what="the pending reason to name the quota")
        why = reason()
        assert "alice" in why and "holds 2 GPUs" in why and "limit is 2" in why, why
