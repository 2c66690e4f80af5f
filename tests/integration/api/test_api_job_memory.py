"""The job view's memory rows (issue 20): GET /api/jobs/{id} gives, per attempt, MARP's predicted
peak per GPU against the peak the agent reported, as `frenzy accuracy` compares them. A real
scheduler and predictor on loopback, a real Redis; the agent is played by its signed events."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator

import pytest
import redis

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind
from support.servers import running_servers
from support.state import GiB, add_node, send_event

JOB = {"name": "mem", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "python train.py"}


@pytest.fixture
def client(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[TestClient]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 1)
    with running_servers(redis_url, prefix) as s, TestClient(
            create_app(s.scheduler_addr), base_url="http://localhost",
            headers={"authorization": f"Bearer {s.token}"}) as c:
        yield c


def until(client: TestClient, job_id: str, *states: str) -> dict:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        got = client.get(f"/api/jobs/{job_id}").json()
        if got["state"] in states:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never reached {states}: {got['state']}")


def test_the_job_view_has_predicted_against_observed_peak_per_attempt(
        client: TestClient, redis_client: redis.Redis, keys: Keys) -> None:
    job_id = client.post("/api/jobs", json=JOB).json()["id"]
    job = until(client, job_id, "LAUNCHING")
    (placed,) = job["memory"]  # placed: the plan's row, nothing observed yet
    plan = job["job"]["plan"]
    assert placed["attempt"] == 1 and placed["gpu_type"] == "A100-80GB" and placed["num_gpus"] == plan["num_gpus"]
    assert placed["predicted_peak_bytes"] == plan["peak_bytes_per_gpu"] > 0
    assert placed["observed_peak_bytes"] == 0 and placed["error"] is None and placed["gpu_memory_bytes"] == 80 * GiB

    observed = int(placed["predicted_peak_bytes"] * 1.25)
    for kind, extra in ((EventKind.RUNNING, {"pid": 7}), (EventKind.EXITED, {"exit_code": 0,
                                                                          "peak_bytes_per_gpu": observed})):
        send_event(redis_client, keys, AgentEvent(kind=kind, job_id=job_id, attempt=1, node="a100-0",
                                                  fence=int(redis_client.hget(keys.job(job_id), "fence")), **extra))
    (row,) = until(client, job_id, "SUCCEEDED")["memory"]
    assert row["observed_peak_bytes"] == observed and row["error"] == pytest.approx(0.25, abs=1e-6)
    assert row["outcome"] == "succeeded" and row["layout"]["tp"] >= 1
