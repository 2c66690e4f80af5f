"""Usage accounting end to end (issue 35): the stack `frenzy up` runs (real scheduler, predictor and
fake-GPU agents as separate processes), jobs that are real processes, two users.

Three jobs of two users end (one of them failing); `frenzy usage --by user --json` with the admin
token gives each user's GPU-hours and dollars, equal to the sum over their attempts recomputed
here from each job's own history (its plan's GPUs from the reservation to the end, at the price
the cluster file sets for its L4s, which reaches the agents as --price-per-gpu-hour and prices the
plans too); a plain user's `frenzy usage` shows their own rows only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import grpc
import pytest
import redis
from e2e.test_agents_e2e import DONE, Stack, make_stack  # noqa: F401 (the fixture)
from e2e.test_priority_e2e import _cli

from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.rpc.auth import with_token
from frenzy.rpc.jobspec import parse_entry
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from marp.prices import list_price

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PRICE = 2.5  # the cluster file's own rate for its L4s, not the catalog's list price
TWO_L4 = {"nodes": [{"gpu": "L4", "count": 2, "gpus_per_node": 1, "name_prefix": "l4", "price_per_gpu_hour": PRICE}]}
JOB = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "max_gpus": 1}
ERR = 1e-6  # GPU-hours: the history's times are kept to 0.1 ms


def gpu_hours(job: types_pb2.Job) -> float:
    reserved = [h.at for h in job.history if h.state == types_pb2.JOB_STATE_RESERVED]
    ended = [h.at for h in job.history if h.state in DONE]
    assert len(reserved) == 1 and len(ended) == 1, job.history
    return job.plan.num_gpus * (ended[0] - reserved[0]) / 3600


def test_usage_by_user_is_the_sum_of_the_attempts_and_a_user_sees_their_own(
        make_stack: Callable[..., Stack], redis_url: str, prefix: str) -> None:  # noqa: F811
    s = make_stack(TWO_L4)
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        tokens = {u: TokenStore(client, Keys(prefix)).create(u, Role.SUBMIT)[0] for u in ("alice", "bob")}
    ids: dict[str, list[str]] = {"alice": [], "bob": []}
    for user, code in (("alice", 0), ("alice", 3), ("bob", 0)):
        spec = parse_entry({**JOB, "name": f"{user}-{code}",
                            "command": [sys.executable, "-c", f"import time, sys; time.sleep(0.5); sys.exit({code})"]})
        with grpc.insecure_channel(s.stack.scheduler_addr) as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(with_token(ch, tokens[user]))
            ids[user].append(stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec.to_proto()), timeout=30).job.id)
    ended = {user: [s.wait_state(j, DONE, timeout=90) for j in jobs] for user, jobs in ids.items()}
    assert [j.state for j in ended["alice"]] == [types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED]
    price = PRICE
    assert list_price("L4") != PRICE
    first = ended["bob"][0]
    assert first.plan.cost_usd == pytest.approx(first.plan.num_gpus * PRICE * first.plan.completion_s / 3600)
    expected = {user: sum(gpu_hours(j) for j in jobs) for user, jobs in ended.items()}

    shown = _cli(s, "usage", "--by", "user", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {r["user"]: r for r in json.loads(shown.stdout)["rows"]}
    assert set(rows) == {"alice", "bob"}, rows
    for user, hours in expected.items():
        assert hours > 0 and rows[user]["gpu_hours"] == pytest.approx(hours, abs=ERR)
        assert rows[user]["cost_usd"] == pytest.approx(hours * price, abs=ERR * price)
    assert rows["alice"]["attempts"] == 2 and rows["bob"]["attempts"] == 1

    mine = _cli(s, "usage", "--json", token=tokens["bob"])
    assert mine.returncode == 0, mine.stderr
    assert {r["user"] for r in json.loads(mine.stdout)["rows"]} == {"bob"}
