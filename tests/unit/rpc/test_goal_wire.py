"""A job's objective, deadline and budget on every front door and across the wire (issue 35): the
CLI / REST / batch entry (JobEntry) -> JobSpec.goal -> the predictor (priced plans, dropped ones
with their reason) -> the SDK's dataclasses; bad values are refused naming the field."""

from __future__ import annotations

import pytest

from frenzy.predictor.planning import predict
from frenzy.rpc import convert
from frenzy.rpc.jobspec import JobEntry, JobSpecError, parse_entry
from frenzy.rpc.spec_limits import check_goal, check_pools, check_spec
from frenzy.sdk.models import Job, Plan
from frenzy.v1 import predictor_pb2, types_pb2
from frenzy.worker.batch import load_yaml, parse_batch

ENTRY = {"model": "llama-3.1-8b", "seq_len": 4096, "global_batch": 64, "command": "true"}
POOLS = [types_pb2.GpuPool(gpu_type="A100-80GB", total_gpus=8, gpus_per_node=8),
         types_pb2.GpuPool(gpu_type="L4", total_gpus=16, gpus_per_node=8, price_per_gpu_hour=0.2)]


def test_the_entry_carries_the_goal_to_the_proto_and_back() -> None:
    spec = parse_entry({**ENTRY, "objective": "cost", "deadline": "1h30m", "budget": "$250"}).to_proto()
    assert spec.goal == types_pb2.JobGoal(objective=types_pb2.OBJECTIVE_COST, deadline_s=5400, budget_usd=250)
    goal = convert.goal_from_proto(spec.goal)
    assert (goal.objective, goal.deadline_s, goal.budget_usd) == ("cost", 5400, 250)
    assert convert.goal_to_proto(goal) == spec.goal
    assert spec == types_pb2.JobSpec.FromString(spec.SerializeToString())
    # REST and YAML give numbers too: seconds and dollars.
    assert parse_entry({**ENTRY, "deadline": 7200, "budget": 99.5}).to_proto().goal.deadline_s == 7200
    # The default stays off the wire: a job without a goal is the job of before issue 35.
    assert not parse_entry(ENTRY).to_proto().HasField("goal")
    assert convert.goal_from_proto(types_pb2.JobGoal()).is_default


@pytest.mark.parametrize(("extra", "needle"), [
    ({"deadline": "12"}, "deadline: '12' has no unit"),
    ({"deadline": "soon"}, "deadline: 'soon' is not a duration"),
    ({"deadline": -60}, "deadline: must be a positive duration"),
    ({"budget": -5}, "budget: must be a positive number of dollars, got -5"),
    ({"budget": "lots"}, "budget: must be a number of dollars"),
    ({"objective": "money"}, "objective: Input should be 'time', 'cost' or 'gpu-hours'"),
])  # fmt: skip
def test_bad_values_name_the_field(extra: dict, needle: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_entry({**ENTRY, **extra})
    assert needle in str(err.value)


def test_a_grpc_client_sending_the_proto_straight_is_checked_too() -> None:
    spec = parse_entry(ENTRY).to_proto()
    spec.goal.deadline_s = -1
    with pytest.raises(ValueError, match=r"spec\.goal\.deadline_s: must be 0 \(none\)"):
        check_spec(spec)
    with pytest.raises(ValueError, match=r"goal\.budget_usd"):
        check_goal(types_pb2.JobGoal(budget_usd=float("nan")))
    with pytest.raises(ValueError, match=r"goal\.objective: unknown value 9"):
        check_goal(types_pb2.JobGoal(objective=9))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pools\[0\]\.price_per_gpu_hour"):
        check_pools([types_pb2.GpuPool(gpu_type="L4", total_gpus=1, gpus_per_node=1, price_per_gpu_hour=-2)])


def _request(**goal: float) -> predictor_pb2.PredictRequest:
    spec = parse_entry(ENTRY).to_proto()
    return predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits, pools=POOLS,
                                        goal=types_pb2.JobGoal(**goal))  # type: ignore[arg-type]


def test_the_predictor_prices_every_plan_at_the_pools_prices() -> None:
    resp = predict(_request())
    assert resp.plans and not resp.dropped
    for p in resp.plans:
        price = 0.2 if p.gpu_type == "L4" else 3.43  # the pool's own rate, else the list price
        assert p.cost_usd == pytest.approx(p.gpu_hours * price)


def test_the_predictor_drops_plans_over_the_goal_and_orders_by_it() -> None:
    plans = list(predict(_request(objective=types_pb2.OBJECTIVE_COST)).plans)
    assert [p.cost_usd for p in plans] == sorted(p.cost_usd for p in plans)
    assert [p.rank for p in plans] == list(range(1, len(plans) + 1))
    cheapest = plans[0]
    deadline = min(p.completion_s for p in plans if p.completion_s < cheapest.completion_s) + 1
    resp = predict(_request(objective=types_pb2.OBJECTIVE_COST, deadline_s=deadline))
    assert all(p.completion_s <= deadline for p in resp.plans)
    label = f"{cheapest.num_gpus}x {cheapest.gpu_type}: finishes in"
    assert any(d.startswith(label) and "> the deadline" in d for d in resp.dropped), resp.dropped
    budget = predict(_request(budget_usd=cheapest.cost_usd * 1.01))
    assert all(p.cost_usd <= cheapest.cost_usd * 1.01 for p in budget.plans) and budget.dropped


def test_the_sdk_reads_cost_and_goal() -> None:
    proto = types_pb2.Plan(gpu_type="L4", num_gpus=4, completion_s=3600, cost_usd=3.24, gpu_hours=4)
    plan = Plan.from_proto(proto)
    assert plan.cost_usd == 3.24 and plan.runtime_s == 3600
    spec = parse_entry({**ENTRY, "objective": "gpu-hours", "deadline": "2d"}).to_proto()
    job = Job.from_proto(types_pb2.Job(id="j1", spec=spec))
    assert (job.objective, job.deadline_s, job.budget_usd) == ("gpu-hours", 172800, None)
    assert Job.from_proto(types_pb2.Job(id="j2", spec=parse_entry(ENTRY).to_proto())).objective == "time"


def test_the_batch_file_and_the_rest_schema_take_the_same_options() -> None:
    doc = load_yaml("defaults: {command: 'true', objective: cost}\n"
                    "jobs:\n  - {model: gpt2-124m, seq_len: 128, global_batch: 8, deadline: 90m, budget: 20}\n")
    (entry,) = parse_batch(doc)
    goal = parse_entry(entry).to_proto().goal
    assert (goal.objective, goal.deadline_s, goal.budget_usd) == (types_pb2.OBJECTIVE_COST, 5400, 20)
    props = JobEntry.model_json_schema()["properties"]  # POST /api/jobs's request body
    assert props["objective"]["enum"] == ["time", "cost", "gpu-hours"]
    assert "12h" in props["deadline"]["description"] and "dollars" in props["budget"]["description"]
