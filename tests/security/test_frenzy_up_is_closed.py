"""issue 14 "Done when", end to end: with `frenzy up` running, as its user would meet it.

Redis refuses a client without credentials; every Scheduler RPC without a token answers
UNAUTHENTICATED; the CLI with a wrong token fails and says so; REST without a token is 401 and
a cross-site text/plain POST is refused; a job submitted with the default credentials (the file
`frenzy up` wrote, nothing typed) succeeds, and its environment shows no Redis address, no
password and no token."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import grpc
import httpx
import pytest
import redis

from frenzy.v1 import scheduler_pb2
from support.processes import interrupt_group

FRENZY = [sys.executable, "-m", "frenzy.cli.main"]
ENV_DUMP = "import json, os; print('ENV=' + json.dumps(dict(os.environ)))"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("up")
    cluster = tmp / "cluster.yaml"
    cluster.write_text("nodes:\n  - {gpu: L4, count: 1, gpus_per_node: 2}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FRENZY_TOKEN", "FRENZY_CREDENTIALS")}
    env["XDG_CONFIG_HOME"] = str(tmp / "config")  # where `frenzy up` writes, and the CLI reads, credentials
    proc = subprocess.Popen([*FRENZY, "up", "--cluster", str(cluster), "--run-dir", str(tmp / "run"), "--no-worker"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    out, deadline = "", time.monotonic() + 120
    assert proc.stdout is not None
    try:
        while time.monotonic() < deadline and "Ctrl-C" not in out and proc.poll() is None:
            out += proc.stdout.readline()
        assert "Ctrl-C" in out, out
        creds = json.loads((tmp / "config" / "frenzy" / "credentials.json").read_text())
        redis_url = creds["redis"]  # the operator's URL: `frenzy up` keeps it in the 0600 credentials file
        yield {"env": env, "creds": creds, "redis_url": redis_url, "out": out}
    finally:
        interrupt_group(proc)


def frenzy(up: dict, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FRENZY, *args], capture_output=True, text=True, timeout=120, env={**up["env"], **env},
                          stdin=subprocess.DEVNULL)


def test_redis_refuses_a_client_without_credentials(up: dict) -> None:
    url = urlsplit(up["redis_url"])
    client = redis.Redis(host=url.hostname, port=url.port, socket_timeout=5)
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        client.keys("*")
    assert redis.Redis.from_url(up["redis_url"]).ping()  # the operator's URL (in the credentials file) works


def test_every_scheduler_rpc_without_a_token_is_unauthenticated(up: dict) -> None:
    with grpc.insecure_channel(up["creds"]["scheduler"]) as channel:
        calls = {"SubmitJob": scheduler_pb2.SubmitJobRequest(), "GetJob": scheduler_pb2.GetJobRequest(job_id="x"),
                 "ListJobs": scheduler_pb2.ListJobsRequest(), "CancelJob": scheduler_pb2.CancelJobRequest(job_id="x"),
                 "WatchJob": scheduler_pb2.WatchJobRequest(job_id="x"), "ListNodes": scheduler_pb2.ListNodesRequest(),
                 "StreamLogs": scheduler_pb2.StreamLogsRequest(job_id="x"),
                 "HasCode": scheduler_pb2.HasCodeRequest(sha256="0" * 64), "GetUsage": scheduler_pb2.GetUsageRequest(),
                 "UploadCode": scheduler_pb2.CodeChunk(sha256="0" * 64, size=3, data=b"abc")}
        service = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
        assert {m.name for m in service.methods} == set(calls)
        for method in service.methods:
            streaming = method.server_streaming
            if method.client_streaming:
                fn = channel.stream_unary(f"/{service.full_name}/{method.name}",
                                          request_serializer=lambda m: m.SerializeToString(),
                                          response_deserializer=lambda b: b)
            else:
                fn = (channel.unary_stream if streaming else channel.unary_unary)(
                    f"/{service.full_name}/{method.name}", request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as err:
                request = iter([calls[method.name]]) if method.client_streaming else calls[method.name]
                result = fn(request, timeout=10)
                if streaming:
                    list(result)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method.name


def test_the_cli_with_a_wrong_token_fails_and_says_so(up: dict) -> None:
    res = frenzy(up, "jobs", FRENZY_TOKEN="frz_0123456789ab_" + "A" * 43)
    assert res.returncode != 0 and "UNAUTHENTICATED" in res.stderr and "token" in res.stderr


def test_rest_without_a_token_is_401_and_a_cross_site_post_is_refused(up: dict) -> None:
    api = up["creds"]["api"]
    job = {"name": "x", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "command": "true"}
    assert httpx.get(f"{api}/api/jobs", timeout=10).status_code == 401
    assert httpx.post(f"{api}/api/jobs", json=job, timeout=10).status_code == 401
    token = {"authorization": f"Bearer {up['creds']['token']}"}
    r = httpx.post(f"{api}/api/jobs", content=json.dumps(job), timeout=10,
                   headers={"content-type": "text/plain", "origin": "http://evil.example", **token})
    assert r.status_code in (403, 415), r.text
    listed = httpx.get(f"{api}/api/jobs", headers=token, timeout=10)
    assert listed.status_code == 200 and listed.json()["jobs"] == []  # nothing got in


def test_a_job_with_the_default_credentials_runs_and_sees_no_secret(up: dict) -> None:
    res = frenzy(up, "submit", "--model", "gpt2-124m", "--seq-len", "512", "--global-batch", "8", "--wait",
                 "--", sys.executable, "-c", ENV_DUMP)
    assert res.returncode == 0, res.stdout + res.stderr
    job_id = re.search(r"(job-[0-9a-f]{12})", res.stdout + res.stderr).group(1)  # type: ignore[union-attr]
    logs = frenzy(up, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    env = json.loads(re.search(r"ENV=(\{.*\})", logs.stdout).group(1))  # type: ignore[union-attr]
    password = urlsplit(up["redis_url"]).password
    text = json.dumps(env)
    assert "REDIS_URL" not in env and "FRENZY_TOKEN" not in env and "FRENZY_CREDENTIALS" not in env
    assert password not in text and up["creds"]["token"] not in text and "redis://" not in text
    assert env["FRENZY_JOB_ID"] == job_id  # it is the job's own environment


def test_the_stack_s_predictor_refuses_a_caller_without_its_token(up: dict) -> None:
    """issue 34 item 8: before, the predictor of `frenzy up` answered anyone on the host (a job, too)."""
    from frenzy.v1 import predictor_pb2, predictor_pb2_grpc, types_pb2

    address = re.search(r"predictor\s+(\S+) \(healthy\)", up["out"])
    assert address, up["out"]
    request = predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
                                           recipe=types_pb2.TrainingRecipe(seq_len=1024, global_batch=8))
    with grpc.insecure_channel(address.group(1)) as channel:
        stub = predictor_pb2_grpc.PredictorStub(channel)
        for metadata in ((), (("authorization", f"Bearer {up['creds']['token']}"),)):  # none; the admin's API token
            with pytest.raises(grpc.RpcError) as err:
                stub.Predict(request, metadata=metadata, timeout=10)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED, err.value.details()


def test_the_stack_s_redis_bounds_memory_and_never_evicts(up: dict) -> None:
    """issue 34: a maxmemory with the one policy that drops no job, node or token."""
    client = redis.Redis.from_url(up["redis_url"], decode_responses=True)
    try:
        got = client.config_get("maxmemory*")
        assert got["maxmemory-policy"] == "noeviction"
        assert int(got["maxmemory"]) > 0
    finally:
        client.close()
