"""SubmitJob's refusal when no plan exists, over real gRPC with the real predictor (issue 20): a
--gpu-type the cluster lacks is named with the types it has; T4 with bf16 is told --precision fp16.
Neither says "lower micro_batch"."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import redis

from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, types_pb2
from support.servers import Servers, running_servers
from support.state import GiB, add_node, make_spec


@pytest.fixture
def servers(redis_url: str, prefix: str) -> Iterator[Servers]:
    with running_servers(redis_url, prefix) as s:
        yield s


def refusal(servers: Servers, spec: types_pb2.JobSpec) -> str:
    with pytest.raises(grpc.RpcError) as info:
        servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
    return info.value.details()


def test_a_gpu_type_the_cluster_lacks_and_bf16_on_t4_say_what_to_change(
        servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "t4-0", "T4", 2, memory=15 * GiB)
    add_node(redis_client, keys, "l4-0", "L4", 1, memory=23 * GiB)
    spec = make_spec("h100")
    spec.limits.allowed_gpu_types.append("H100-80GB")
    text = refusal(servers, spec)
    assert "no node has H100-80GB" in text and "2 x T4" in text and "1 x L4" in text
    assert "To fix: submit with --gpu-type" in text and "micro_batch" not in text

    spec = make_spec("t4")
    spec.limits.allowed_gpu_types.append("T4")
    spec.recipe.precision = types_pb2.PRECISION_BF16
    text = refusal(servers, spec)
    assert text.startswith("spec: T4 cannot run bf16") and "To fix: submit with --precision fp16" in text
    assert "micro_batch" not in text
    assert redis_client.zcard(keys.jobs()) == 0


def test_a_goal_no_plan_meets_is_refused_with_each_plans_miss_and_a_goal_some_meet_orders_by_dollars(
        servers: Servers, redis_client: redis.Redis, keys: Keys) -> None:
    """Issue 35: SubmitJob hands the job's goal to the predictor. A deadline no plan can keep is
    refused before anything is stored, quoting the plans it dropped; with an objective of cost
    the job's plans are stored cheapest first."""
    add_node(redis_client, keys, "h100-0", "H100-80GB", 4, memory=80 * GiB)
    add_node(redis_client, keys, "l4-0", "L4", 4, memory=23 * GiB)
    spec = make_spec("late")
    spec.goal.deadline_s = 1.0
    text = refusal(servers, spec)
    assert text.startswith("spec.goal: no plan meets the job's deadline or budget"), text
    assert "> the deadline" in text and "To fix: raise --deadline" in text
    assert redis_client.zcard(keys.jobs()) == 0

    spec = make_spec("cheap")
    spec.goal.objective = types_pb2.OBJECTIVE_COST
    spec.goal.deadline_s = 30 * 24 * 3600.0
    made = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    costs = [p.cost_usd for p in made.job.candidate_plans]
    assert len(costs) > 1 and all(c > 0 for c in costs)
    assert costs == sorted(costs), costs
