"""Usage accounting and budgets on a live stack (issue 35): a real scheduler and predictor on loopback,
a real Redis, the agents played through the events stream.

Three jobs of two users run and end; `frenzy usage --by user --json` (and GET /api/usage, and the
Prometheus counters) give the GPU-hours and dollars their attempts used, recomputed here from each
job's own history (reserved at .. ended at, GPUs of its plan, the A100-80GB list price); a plain user
sees only their own. A budget of 1 GPU-hour refuses, over gRPC and REST, the submission that would
exceed it, with "To fix:".
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator

import grpc
import pytest
import redis
from prometheus_client import generate_latest
from typer.testing import CliRunner

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app
from frenzy.auth.roles import Role
from frenzy.cli.main import app as cli
from frenzy.rpc.jobspec import parse_entry
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.usage import UsageLedger
from frenzy.state.usage_rows import Budget
from frenzy.v1 import scheduler_pb2, types_pb2
from marp.prices import list_price
from support.servers import Servers, running_servers
from support.state import add_node, send_event
from support.waiting import wait_for

JOB = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "python train.py", "max_gpus": 2}
PRICE = list_price("A100-80GB")
# The history's times are JSON numbers of 14 digits (cjson): 0.1 ms at today's unix times. A charge
# from RUNNING rather than from the reservation, or to the last event rather than the end, is off by
# the 0.2 s `finish` waits between them: 500 times this.
TIME_ERR = 1e-7  # GPU-hours (0.36 ms of one GPU)


def api(servers: Servers, token: str) -> TestClient:
    return TestClient(create_app(servers.scheduler_addr), base_url="http://localhost",
                      headers={"authorization": f"Bearer {token}"})


def usage_cli(servers: Servers, *args: str, token: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["usage", *args, "--scheduler", servers.scheduler_addr],
                             env={"FRENZY_TOKEN": token, "COLUMNS": "200"})
    return res.exit_code, res.output


def spec(**over: object) -> types_pb2.JobSpec:
    return parse_entry({**JOB, **over}).to_proto()


def job_of(servers: Servers, job_id: str) -> types_pb2.Job:
    return servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10)


def placed(servers: Servers, job_id: str) -> str:
    wait_for(lambda: job_of(servers, job_id).state == types_pb2.JOB_STATE_LAUNCHING, timeout=15,
             what=f"{job_id} placed")
    return job_id


def finish(servers: Servers, client: redis.Redis, keys: Keys, job_id: str, code: int = 0) -> types_pb2.Job:
    """Report the job RUNNING then EXITED on each of its nodes, as its agents would; wait for its end."""
    rec = servers.scheduler.loop.store.get(job_id)
    assert rec is not None and rec.placement
    for kind, extra in ((EventKind.RUNNING, {"pid": 100}), (EventKind.EXITED, {"exit_code": code})):
        for node, _ in rec.placement:
            send_event(client, keys, AgentEvent(kind=kind, job_id=job_id, attempt=rec.attempt, node=node,
                                                fence=rec.fence, **extra))  # type: ignore[arg-type]
        time.sleep(0.2)
    wait_for(lambda: job_of(servers, job_id).state in (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED),
             timeout=15, what=f"{job_id} ended")
    return job_of(servers, job_id)


def used_by_history(job: types_pb2.Job) -> float:
    """GPU-hours from the job's own record: its plan's GPUs from the RESERVED entry to the end."""
    reserved = [t.at for t in job.history if t.state == types_pb2.JOB_STATE_RESERVED]
    ended = [t.at for t in job.history if t.state in (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED)]
    assert len(reserved) == 1 and len(ended) == 1, job.history
    return job.plan.num_gpus * (ended[0] - reserved[0]) / 3600


@pytest.fixture
def stack(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 8)
    with running_servers(redis_url, prefix) as servers:
        yield servers


def test_usage_sums_the_attempts_and_users_see_their_own(stack: Servers, redis_client: redis.Redis,
                                                          keys: Keys) -> None:
    s = stack
    alice, _ = s.scheduler.tokens.create("alice", Role.SUBMIT)
    bob, _ = s.scheduler.tokens.create("bob", Role.SUBMIT)
    ids = {}
    for name, token in (("a1", alice), ("a2", alice), ("b1", bob)):
        ids[name] = s.stub_for(token).SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(name=name)),
                                                timeout=30).job.id
    ended = {name: finish(s, redis_client, keys, placed(s, job_id), code=1 if name == "a2" else 0)
             for name, job_id in ids.items()}
    expected = {"alice": used_by_history(ended["a1"]) + used_by_history(ended["a2"]),
                "bob": used_by_history(ended["b1"])}
    assert all(h > 0 for h in expected.values())

    code, out = usage_cli(s, "--by", "user", "--json", token=s.token)  # an admin: everyone
    assert code == 0, out
    data = json.loads(out)
    rows = {r["user"]: r for r in data["rows"]}
    assert set(rows) == {"alice", "bob"} and data["all_users"]
    for user, hours in expected.items():
        assert rows[user]["gpu_type"] == "*"
        assert rows[user]["gpu_hours"] == pytest.approx(hours, abs=TIME_ERR)
        assert rows[user]["cost_usd"] == pytest.approx(hours * PRICE, abs=TIME_ERR * PRICE)
    assert rows["alice"]["attempts"] == 2 and rows["bob"]["attempts"] == 1

    # A plain user sees only their own, by CLI and REST; naming another user is refused.
    code, out = usage_cli(s, "--json", token=bob)
    assert code == 0, out
    mine = json.loads(out)["rows"]
    assert [(r["user"], r["gpu_type"]) for r in mine] == [("bob", "A100-80GB")] and not json.loads(out)["all_users"]
    assert mine[0]["gpu_hours"] == pytest.approx(expected["bob"], abs=TIME_ERR)
    code, out = usage_cli(s, "--user", "alice", token=bob)
    assert code != 0 and "only admins" in out, out
    with api(s, bob) as as_bob:
        resp = as_bob.get("/api/usage", params={"by": "user"})
        assert resp.status_code == 200, resp.text
        assert [r["user"] for r in resp.json()["rows"]] == ["bob"]
        assert as_bob.get("/api/usage", params={"user": "alice"}).status_code == 403
    with api(s, s.token) as as_admin:
        by_job = as_admin.get("/api/usage", params={"by": "job"}).json()["rows"]
        assert {r["job"] for r in by_job} == set(ids.values())

    # The table, and the Prometheus counters (read from Redis at scrape time).
    code, table = usage_cli(s, "--since", "1h", token=s.token)
    assert code == 0 and "alice" in table and "A100-80GB" in table and "$" in table, table
    text = generate_latest(s.scheduler.loop.metrics.registry).decode()
    for user, hours in expected.items():
        line = next(ln for ln in text.splitlines()
                    if ln.startswith("frenzy_gpu_hours_total{") and f'user="{user}"' in ln)
        assert float(line.split()[-1]) == pytest.approx(hours, abs=TIME_ERR)
        line = next(ln for ln in text.splitlines() if ln.startswith(f'frenzy_dollars_total{{user="{user}"}}'))
        assert float(line.split()[-1]) == pytest.approx(hours * PRICE, abs=TIME_ERR * PRICE)

    # Kept after the jobs' own records are gone.
    for job_id in ids.values():
        redis_client.delete(keys.job(job_id), keys.job_history(job_id))
    code, out = usage_cli(s, "--by", "user", "--json", token=s.token)
    assert code == 0 and {r["user"]: r["gpu_hours"] for r in json.loads(out)["rows"]} == pytest.approx(
        expected, abs=TIME_ERR)


def test_a_budget_refuses_the_submission_that_would_exceed_it(stack: Servers, redis_client: redis.Redis,
                                                              keys: Keys) -> None:
    s = stack
    carol, _ = s.scheduler.tokens.create("carol", Role.SUBMIT)
    dave, _ = s.scheduler.tokens.create("dave", Role.SUBMIT)
    UsageLedger(redis_client, keys).set_budget("carol", Budget(gpu_hours=1.0, period="week"))
    as_carol = s.stub_for(carol)

    # A job whose smallest plan alone needs more than the budget is refused outright.
    with pytest.raises(grpc.RpcError) as err:
        as_carol.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(name="huge", train_steps=10_000_000)), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "budget" in err.value.details() and "To fix:" in err.value.details(), err.value.details()

    # A small one runs; it held its GPUs for an hour (its reservation moved back an hour).
    job_id = as_carol.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(name="small")), timeout=30).job.id
    placed(s, job_id)
    redis_client.hset(keys.job(job_id), "reserved_at", repr(time.time() - 3600))
    finish(s, redis_client, keys, job_id)
    used = UsageLedger(redis_client, keys).spent_this_period("carol", "week", time.time())
    assert used.gpu_hours >= 1.0

    # Now every further submission of carol's would exceed it: refused over gRPC and REST.
    with pytest.raises(grpc.RpcError) as err:
        as_carol.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(name="next")), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"has used {used.gpu_hours:.2f} of 1.00 GPU-hours this week" in err.value.details()
    assert "To fix:" in err.value.details()
    with api(s, carol) as rest:
        resp = rest.post("/api/jobs", json={**JOB, "name": "next"})
        assert resp.status_code == 429 and "To fix:" in resp.json()["detail"], resp.text
    # Another user, without a budget, is not affected.
    with api(s, dave) as rest:
        assert rest.post("/api/jobs", json={**JOB, "name": "daves"}).status_code == 200
