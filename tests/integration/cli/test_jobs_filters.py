"""`frenzy jobs --user/--name/--since`, the USER column, and `frenzy job`'s who/what/when (issue 30).

A real scheduler and predictor on loopback and a real Redis; two users (alice, bob) submit through
the REST gateway with their own tokens, as they would. The filters are the scheduler's: `--limit`
counts matching jobs, GET /api/jobs takes the same ones as query parameters and `frenzy jobs --json`
prints what it returns; a non-admin naming another user is refused.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
import redis
from typer.testing import CliRunner

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy import Client
from frenzy.api.app import create_app
from frenzy.auth.roles import Role
from frenzy.cli.main import app as cli
from frenzy.sdk import InvalidSpec, PermissionDenied
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.v1 import scheduler_pb2
from support.servers import Servers, running_servers
from support.state import add_node, send_event
from support.waiting import wait_for

JOB = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "python train.py"}


@dataclass
class Cluster:
    servers: Servers
    alice: str  # tokens (role submit)
    bob: str
    ids: dict[str, str]  # job name -> id
    between: float  # a time after alice's "sweep-2" was submitted and before "sweep-3"


def api(servers: Servers, token: str) -> TestClient:
    return TestClient(create_app(servers.scheduler_addr), base_url="http://localhost",
                      headers={"authorization": f"Bearer {token}"})


def jobs_cli(*args: str, token: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["jobs", *args], env={"FRENZY_TOKEN": token, "COLUMNS": "200"})
    return res.exit_code, res.output


def listed(servers: Servers, *args: str, token: str | None = None) -> list[dict]:
    code, out = jobs_cli(*args, "--json", "--scheduler", servers.scheduler_addr, token=token or servers.token)
    assert code == 0, out
    return json.loads(out)["jobs"]


@pytest.fixture
def cluster(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Cluster]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 1)
    with running_servers(redis_url, prefix) as servers:
        alice, _ = servers.scheduler.tokens.create("alice", Role.SUBMIT)
        bob, _ = servers.scheduler.tokens.create("bob", Role.SUBMIT)
        ids: dict[str, str] = {}
        between = 0.0
        # Oldest first: alice's three sweeps and an eval, then bob's sweep, the newest job of all.
        with api(servers, alice) as as_alice, api(servers, bob) as as_bob:
            for name, client in (("sweep-1", as_alice), ("sweep-2", as_alice), ("Sweep-3", as_alice),
                                 ("eval", as_alice), ("sweep-bob", as_bob)):
                if name == "Sweep-3":
                    # The jobs zset is scored by submission time: leave a clear gap around `between`.
                    time.sleep(0.05)
                    between = time.time()
                    time.sleep(0.05)
                resp = client.post("/api/jobs", json={**JOB, "name": name})
                assert resp.status_code == 200, resp.text
                ids[name] = resp.json()["id"]
        yield Cluster(servers, alice, bob, ids, between)


def test_admin_sees_every_user_with_a_user_column(cluster: Cluster) -> None:
    s, ids = cluster.servers, cluster.ids
    rows = listed(s)
    assert [r["id"] for r in rows] == [ids[n] for n in ("sweep-bob", "eval", "Sweep-3", "sweep-2", "sweep-1")]
    assert {r["user"] for r in rows} == {"alice", "bob"}
    code, table = jobs_cli("--scheduler", s.scheduler_addr, token=s.token)
    assert code == 0, table
    assert "USER" in table and re.search(r"sweep-bob\s+│\s+bob\b", table), table
    # One user's jobs only: the admin names alice (one user's rows: no USER column).
    only_alice = listed(s, "--user", "alice")
    assert [r["id"] for r in only_alice] == [ids[n] for n in ("eval", "Sweep-3", "sweep-2", "sweep-1")]
    code, table = jobs_cli("--user", "alice", "--scheduler", s.scheduler_addr, token=s.token)
    assert code == 0 and "sweep-bob" not in table and ids["eval"] in table and "USER" not in table, table
    # An admin's listing of every user keeps the column even when its rows happen to be one user's.
    code, table = jobs_cli("--name", "sweep-bob", "--scheduler", s.scheduler_addr, token=s.token)
    assert code == 0 and "USER" in table and "bob" in table, table


def test_the_scheduler_checks_the_filters(cluster: Cluster) -> None:
    s = cluster.servers
    for req, field in ((scheduler_pb2.ListJobsRequest(name="x" * 300), "name"),
                       (scheduler_pb2.ListJobsRequest(user="x" * 300), "user"),
                       (scheduler_pb2.ListJobsRequest(since=float("nan")), "since"),
                       (scheduler_pb2.ListJobsRequest(since=-1.0), "since")):
        with pytest.raises(grpc.RpcError) as err:
            s.stub.ListJobs(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(f"{field}:")
    assert s.stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).all_users
    assert not s.stub.ListJobs(scheduler_pb2.ListJobsRequest(user="bob"), timeout=10).all_users
    assert not s.stub_for(cluster.bob).ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).all_users


def test_filters_are_applied_before_the_limit(cluster: Cluster) -> None:
    s, ids = cluster.servers, cluster.ids
    # The two newest jobs are bob's and alice's eval: a limit applied before the filters would
    # leave nothing of alice's sweeps.
    rows = listed(s, "--user", "alice", "--name", "SWEEP", "--limit", "2")
    assert [r["id"] for r in rows] == [ids["Sweep-3"], ids["sweep-2"]]
    assert [r["id"] for r in listed(s, "--name", "sweep-b")] == [ids["sweep-bob"]]  # a substring
    assert listed(s, "--name", "nothing-like-it") == []
    with_state = listed(s, "--name", "eval", "--state", "pending", "--state", "launching")
    assert [r["id"] for r in with_state] == [ids["eval"]]


def test_since_takes_a_date_or_a_duration(cluster: Cluster) -> None:
    s, ids = cluster.servers, cluster.ids
    iso = dt.datetime.fromtimestamp(cluster.between).isoformat()  # local time, as a user types it
    assert [r["id"] for r in listed(s, "--since", iso)] == [ids[n] for n in ("sweep-bob", "eval", "Sweep-3")]
    assert len(listed(s, "--since", "1h")) == 5
    tomorrow = (dt.date.today() + dt.timedelta(days=1)).isoformat()
    assert listed(s, "--since", tomorrow) == []
    code, out = jobs_cli("--since", "yesterday", "--scheduler", s.scheduler_addr, token=s.token)
    assert code == 2 and "--since" in out and "'yesterday'" in out, out


def test_a_user_sees_only_their_own_and_may_not_name_another(cluster: Cluster) -> None:
    s, ids = cluster.servers, cluster.ids
    mine = listed(s, token=cluster.alice)
    assert {r["user"] for r in mine} == {"alice"} and len(mine) == 4
    code, table = jobs_cli("--scheduler", s.scheduler_addr, token=cluster.alice)
    assert code == 0 and "USER" not in table and "sweep-bob" not in table, table  # one user's jobs: no column
    assert [r["id"] for r in listed(s, "--user", "alice", "--name", "eval", token=cluster.alice)] == [ids["eval"]]
    code, out = jobs_cli("--user", "bob", "--scheduler", s.scheduler_addr, token=cluster.alice)
    assert code != 0 and "PERMISSION_DENIED" in out and "only admins" in out, out
    with api(s, cluster.alice) as as_alice:
        refused = as_alice.get("/api/jobs", params={"user": "bob"})
    assert refused.status_code == 403 and "only admins" in refused.text


def test_get_api_jobs_takes_the_same_filters(cluster: Cluster) -> None:
    s, ids = cluster.servers, cluster.ids
    since = dt.datetime.fromtimestamp(cluster.between).isoformat()
    params = {"user": "alice", "name": "sweep", "since": since, "limit": "5"}
    with api(s, s.token) as admin:
        # The scheduler's ticks rewrite the pending reasons: compare when the API read the same twice.
        for _ in range(20):
            got = admin.get("/api/jobs", params=params)
            code, out = jobs_cli("--user", "alice", "--name", "sweep", "--since", since, "--limit", "5", "--json",
                                 "--scheduler", s.scheduler_addr, token=s.token)
            assert got.status_code == 200 and code == 0, (got.text, out)
            if admin.get("/api/jobs", params=params).json() == got.json():
                break
        else:
            pytest.fail("GET /api/jobs never read the same twice around `frenzy jobs --json`")
        assert json.loads(out) == got.json()
        assert [r["id"] for r in got.json()["jobs"]] == [ids["Sweep-3"]]
        bad = admin.get("/api/jobs", params={"since": "soon"})
        assert bad.status_code == 400 and bad.json()["detail"].startswith("since: 'soon'")


def test_sdk_jobs_takes_the_same_filters(cluster: Cluster) -> None:
    s, ids = cluster.servers, cluster.ids
    with Client(s.scheduler_addr, s.token) as admin:
        assert [j.id for j in admin.jobs(user="alice", name="sweep", limit=2)] == [ids["Sweep-3"], ids["sweep-2"]]
        assert [j.id for j in admin.jobs(since=dt.datetime.fromtimestamp(cluster.between))] == [
            ids["sweep-bob"], ids["eval"], ids["Sweep-3"]]
        assert len(admin.jobs(since=dt.timedelta(hours=1))) == 5
        with pytest.raises(InvalidSpec, match="since: 'soon'"):
            admin.jobs(since="soon")
    with Client(s.scheduler_addr, cluster.alice) as alice, pytest.raises(PermissionDenied, match="only admins"):
        alice.jobs(user="bob")


def test_job_shows_who_what_where_and_when(redis_url: str, prefix: str, redis_client: redis.Redis,
                                           keys: Keys) -> None:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 1)
    with running_servers(redis_url, prefix) as s:
        alice, _ = s.scheduler.tokens.create("alice", Role.SUBMIT)
        with api(s, alice) as as_alice:
            job_id = as_alice.post("/api/jobs", json={**JOB, "name": "shown", "workdir": "/shared/proj",
                                                      "command": ["python", "train.py", "--note", "two words"]}
                                   ).json()["id"]
            waiting = as_alice.post("/api/jobs", json={**JOB, "name": "waits"}).json()["id"]
            wait_for(lambda: as_alice.get(f"/api/jobs/{job_id}").json()["state"] == "LAUNCHING", what="placement")
        fence = int(redis_client.hget(keys.job(job_id), "fence"))
        send_event(redis_client, keys, AgentEvent(kind=EventKind.RUNNING, job_id=job_id, attempt=1, node="a100-0",
                                                  fence=fence, pid=7))
        time.sleep(0.3)  # some run time to show
        send_event(redis_client, keys, AgentEvent(kind=EventKind.EXITED, job_id=job_id, attempt=1, node="a100-0",
                                                  fence=fence, exit_code=0))
        with api(s, s.token) as admin:
            wait_for(lambda: admin.get(f"/api/jobs/{job_id}").json()["state"] == "SUCCEEDED", what="the exit")
        res = CliRunner().invoke(cli, ["job", job_id, "--scheduler", s.scheduler_addr], env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        out = res.output
        today = dt.date.today().isoformat()
        assert re.search(rf"user alice\s+submitted {today} \d\d:\d\d:\d\d\s+started {today} \d\d:\d\d:\d\d "
                         rf"\(queued [\d.]+ (s|min)\)\s+ended {today} \d\d:\d\d:\d\d\s+ran (0\.[3-9]\d|[1-9][\d.]*) s",
                         out), out
        assert "command: python train.py --note 'two words'" in out, out
        assert "workdir: /shared/proj (on the nodes)" in out, out
        # The history's times: today's as a time of day (no milliseconds), with +S for the detail.
        assert re.search(r"│ \d\d:\d\d:\d\d\s+│\s+0\.00 │ PENDING", out), out
        # A pending job has not started.
        res = CliRunner().invoke(cli, ["job", waiting, "--scheduler", s.scheduler_addr])
        assert res.exit_code == 0 and "started -" in res.output and "ran -" in res.output, res.output


def test_token_expiry_carries_its_date(redis_url: str, prefix: str) -> None:
    runner = CliRunner()
    common = ["--redis-url", redis_url, "--prefix", prefix]
    made = runner.invoke(cli, ["token", "create", "--user", "carol", "--ttl", "30d", *common])
    expiry = dt.datetime.fromtimestamp(time.time() + 30 * 86400)
    assert made.exit_code == 0 and f"expires {expiry:%Y-%m-%d} " in made.output, made.output
    listed_tokens = runner.invoke(cli, ["token", "list", *common], env={"COLUMNS": "200"})
    assert listed_tokens.exit_code == 0, listed_tokens.output
    row = next(line for line in listed_tokens.output.splitlines() if "carol" in line)
    # Created today: the time of day; the expiry 30 days on: its date, not the same time of day alone.
    assert re.search(rf"│ \d\d:\d\d:\d\d\s+│ {expiry:%Y-%m-%d} \d\d:\d\d\s", row), row
