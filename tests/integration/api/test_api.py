"""The HTTP gateway (FastAPI TestClient over httpx) against a real scheduler and
predictor on loopback and a real Redis."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import pytest
import redis

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app, to_json
from frenzy.devstack.redis_server import free_port
from frenzy.state import scripts
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk
from frenzy.v1 import types_pb2
from support.servers import Servers, running_servers
from support.state import add_node, place_on, set_gpu

GiB = 1024**3
JSON = {"content-type": "application/json"}
GOOD = {"name": "api-job", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8,
        "command": "python -c 'print(1)'"}


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 4)
    add_node(redis_client, keys, "l4-0", "L4", 2, memory=23 * GiB)
    with running_servers(redis_url, prefix) as s:
        yield s


@pytest.fixture
def client(servers: Servers) -> Iterator[TestClient]:
    with TestClient(create_app(servers.scheduler_addr), base_url="http://localhost",
                    headers={"authorization": f"Bearer {servers.token}"}) as c:
        yield c


def test_health_nodes_and_empty_jobs(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["ok"] is True
    nodes = client.get("/api/nodes").json()["nodes"]
    assert sorted(n["name"] for n in nodes) == ["a100-0", "l4-0"]
    a100 = next(n for n in nodes if n["name"] == "a100-0")
    assert a100["alive"] is True and len(a100["gpus"]) == 4
    gpu = a100["gpus"][0]
    assert gpu["gpu_type"] == "A100-80GB" and gpu["owner"] == "" and gpu["memory_total"] == 80 * GiB
    assert isinstance(gpu["memory_total"], int)  # int64 as a number, not a string
    assert client.get("/api/jobs").json() == {"jobs": []}


def test_submit_get_list_cancel(client: TestClient) -> None:
    r = client.post("/api/jobs", json=GOOD)
    assert r.status_code == 200, r.text
    body = r.json()
    job_id = body["id"]
    assert job_id and body["duplicate"] is False and body["name"] == "api-job"
    assert body["job"]["spec"]["model"] == {"catalog_name": "gpt2-124m", "display_name": ""}
    assert body["job"]["candidate_plans"], "the predictor's plans come back with the job"

    got = client.get(f"/api/jobs/{job_id}").json()
    assert got["id"] == job_id and got["model_name"] == "gpt2-124m"
    assert got["state"] in {"PENDING", "RESERVED", "LAUNCHING"}
    listed = client.get("/api/jobs").json()["jobs"]
    assert [j["id"] for j in listed] == [job_id]
    assert client.get("/api/jobs", params={"state": "SUCCEEDED"}).json() == {"jobs": []}
    assert client.get("/api/jobs", params={"state": "nonsense"}).status_code == 400

    again = client.post("/api/jobs", json={**GOOD, "idempotency_key": "k"}).json()
    dup = client.post("/api/jobs", json={**GOOD, "idempotency_key": "k"}).json()
    assert dup["duplicate"] is True and dup["id"] == again["id"]

    r = client.post(f"/api/jobs/{job_id}/cancel", json={"reason": "test"})
    assert r.status_code == 200, r.text
    assert client.get(f"/api/jobs/{job_id}").json()["state"] in {"CANCELLED", "LAUNCHING", "RESERVED"}


def test_cancel_pending_then_again_is_a_conflict(client: TestClient, redis_client: redis.Redis, keys: Keys) -> None:
    for node, n in (("a100-0", 4), ("l4-0", 2)):  # every GPU is somebody else's: the job stays pending
        for i in range(n):
            set_gpu(redis_client, keys, node, i, owner="job-other")
    job_id = client.post("/api/jobs", json=GOOD).json()["id"]
    first = client.post(f"/api/jobs/{job_id}/cancel", headers=JSON)
    assert first.status_code == 200 and first.json()["state"] == "CANCELLED", first.text
    r = client.post(f"/api/jobs/{job_id}/cancel", json={"reason": "again"})
    assert r.status_code == 409 and "already" in r.json()["detail"], r.text
    assert client.post(f"/api/jobs/{job_id}/cancel", content=b"[1]", headers=JSON).status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({**GOOD, "global_batch": -4}, 400, "global_batch"),
        ({**GOOD, "seq_len": "long"}, 400, "seq_len"),
        ({k: v for k, v in GOOD.items() if k != "command"}, 400, "command"),
        ({**GOOD, "gpus": 8}, 400, "gpus"),  # GPUs are never the user's to choose
        ({**GOOD, "model": "llama-9-7b"}, 400, "model"),  # the predictor's INVALID_ARGUMENT
        ({**GOOD, "model": "llama-2-70b", "seq_len": 4096, "gpu_types": ["L4"]}, 409, "L4"),
        ([1, 2], 400, "<job>"),
    ],
)
def test_bad_jobs_name_the_field(client: TestClient, body: object, status: int, field: str) -> None:
    r = client.post("/api/jobs", json=body)
    assert r.status_code == status, r.text
    assert field in r.json()["detail"], r.json()
    assert client.get("/api/jobs").json() == {"jobs": []}


def test_bad_json_and_unknown_job(client: TestClient) -> None:
    r = client.post("/api/jobs", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "body" in r.json()["detail"]
    r = client.get("/api/jobs/job-does-not-exist")
    assert r.status_code == 404 and "job-does-not-exist" in r.json()["detail"]
    assert client.post("/api/jobs/job-does-not-exist/cancel", headers=JSON).status_code == 404
    # `curl -d @job.json` alone sends a form content type, which a cross-site page can too: refused,
    # and the answer says which header to send.
    r = client.post("/api/jobs", content=json.dumps(GOOD).encode(),
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and "application/json" in r.json()["detail"], r.text


def test_job_logs_per_node_and_attempt_with_a_tail(client: TestClient, redis_client: redis.Redis,
                                                  keys: Keys) -> None:
    job_id = client.post("/api/jobs", json=GOOD).json()["id"]
    assert client.get(f"/api/jobs/{job_id}/logs").json() == {"job_id": job_id, "cap_bytes": 0, "file_cap_bytes": 0,
                                                             "dropped": [], "chunks": []}
    append = scripts.register(redis_client, "append_log")  # as an agent ships its output
    place_on(redis_client, keys, job_id, "a100-0")  # attempt 1 on a100-0, attempt 2 on l4-0
    place_on(redis_client, keys, job_id, "l4-0")
    for node, attempt, text in (("a100-0", 1, "one\ntwo\nthree\n"), ("l4-0", 2, "hello\n")):
        chunk = LogChunk(node=node, attempt=attempt, offset=0, text=text)
        append(keys=[keys.job_logs(job_id, node), keys.job_log_offsets(job_id, node)],
               args=[f"{node}/{attempt}", 0, len(text), 1000, chunk.model_dump_json(), 60_000])
    every = client.get(f"/api/jobs/{job_id}/logs").json()["chunks"]
    assert [(c["node"], c["attempt"], c["text"]) for c in every] == [
        ("a100-0", 1, "one\ntwo\nthree\n"), ("l4-0", 2, "hello\n")]
    tail = client.get(f"/api/jobs/{job_id}/logs", params={"node": "a100-0", "tail_lines": 1}).json()["chunks"]
    assert "".join(c["text"] for c in tail) == "three\n"
    assert client.get(f"/api/jobs/{job_id}/logs", params={"attempt": 2}).json()["chunks"][0]["node"] == "l4-0"
    assert client.get("/api/jobs/job-does-not-exist/logs").status_code == 404
    assert client.get(f"/api/jobs/{job_id}/logs", params={"tail_lines": -1}).status_code == 422


def test_dashboard_and_openapi(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "/api/nodes" in html and "/api/jobs" in html and "setTimeout" in html
    assert "/logs?tail_lines=" in html  # the logs panel reads the endpoint above
    assert "http://" not in html and "https://" not in html  # self-contained: no CDN
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/api/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "global_batch" in body["properties"]


def test_scheduler_down_is_503() -> None:
    with TestClient(create_app(f"127.0.0.1:{free_port()}"), base_url="http://127.0.0.1",
                    headers={"authorization": "Bearer frz_0123456789ab_" + "A" * 43}) as c:
        assert c.get("/healthz").status_code == 503
        r = c.get("/api/nodes")
        assert r.status_code == 503 and "scheduler unavailable" in r.json()["detail"]
        assert c.post("/api/jobs", json=GOOD).status_code == 503
        assert c.get("/").status_code == 200  # the dashboard itself still loads and shows the error


def test_to_json_keeps_proto_names_and_short_enums() -> None:
    job = types_pb2.Job(id="j", state=types_pb2.JOB_STATE_RUNNING, parameter_count=7_000_000_000,
                        spec=types_pb2.JobSpec(model=types_pb2.ModelSpec(display_name="m"),
                                               recipe=types_pb2.TrainingRecipe(precision=types_pb2.PRECISION_FP16)))
    job.exit_codes["n1"] = 0
    out = to_json(job)
    assert out["state"] == "RUNNING" and out["parameter_count"] == 7_000_000_000
    assert out["spec"]["recipe"]["precision"] == "FP16" and out["spec"]["recipe"]["allow_recompute"] is None
    assert out["plan"] is None and out["exit_codes"] == {"n1": 0}
    assert out["spec"]["model"] == {"display_name": "m"}  # an unset oneof shows neither member
