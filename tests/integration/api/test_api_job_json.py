"""`frenzy jobs --json` and GET /api/jobs give the same JSON (issue 20): one serializer
(frenzy.rpc.job_json), checked against a real scheduler and predictor on loopback and a real Redis,
with a job placed (its plan and placement filled) and one that waits."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import pytest
import redis
from typer.testing import CliRunner

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app
from frenzy.cli.main import app as cli
from frenzy.state.keys import Keys
from support.servers import Servers, running_servers
from support.state import add_node
from support.waiting import wait_for

JOB = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "python train.py"}


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 1)
    with running_servers(redis_url, prefix) as s:
        yield s


def test_frenzy_jobs_json_is_get_api_jobs(servers: Servers, monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(create_app(servers.scheduler_addr), base_url="http://localhost",
                    headers={"authorization": f"Bearer {servers.token}"}) as client:
        placed = client.post("/api/jobs", json={**JOB, "name": "placed"}).json()["id"]
        wait_for(lambda: client.get(f"/api/jobs/{placed}").json()["state"] == "LAUNCHING", what="placement")
        waiting = client.post("/api/jobs", json={**JOB, "name": "waits", "priority": -5}).json()["id"]
        monkeypatch.setenv("FRENZY_TOKEN", servers.token)
        # The scheduler's ticks keep writing the waiting job's reason, so the two reads are
        # compared only when GET /api/jobs read the same before and after the CLI's read
        # (a loaded machine can put a tick between them); a few tries, bounded.
        for _ in range(20):
            api = client.get("/api/jobs").json()
            res = CliRunner().invoke(cli, ["jobs", "--json", "--scheduler", servers.scheduler_addr])
            assert res.exit_code == 0, res.output
            if client.get("/api/jobs").json() == api:
                break
        else:
            pytest.fail("GET /api/jobs never read the same twice around `frenzy jobs --json`")
    assert json.loads(res.stdout) == api
    rows = {r["id"]: r for r in api["jobs"]}
    assert set(rows) == {placed, waiting}
    assert rows[placed]["plan"]["gpu_type"] == "A100-80GB" and rows[placed]["placement"][0]["node"] == "a100-0"
    assert rows[waiting]["state"] == "PENDING" and rows[waiting]["plan"] is None and rows[waiting]["priority"] == -5
