"""issue 34, the smaller fixes: what one tenant could learn of another, and what a page could do.

Measured before: NOT_FOUND for an absent job but PERMISSION_DENIED for another user's told
whether a job id exists; an unknown token id was answered faster than a known one (1.36 vs
1.82 ms: no record read, no digest); no anti-framing or nosniff header on the dashboard; a write
whose Origin named the API's host on another port passed; `/healthz` and the OpenAPI page showed
the scheduler's internal address. Against real scheduler and predictor servers, a real Redis,
and the REST gateway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterator

import grpc
import pytest
import redis
from fastapi.testclient import TestClient

from frenzy.api.app import create_app, dashboard_html
from frenzy.auth import tokens as tokens_module
from frenzy.auth.roles import Role
from frenzy.auth.tokens import AuthError
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2
from support.servers import Servers, running_servers
from support.state import add_node, make_spec


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    with running_servers(redis_url, prefix) as s:
        yield s


@pytest.fixture
def api(servers: Servers) -> TestClient:
    return TestClient(create_app(servers.scheduler_addr), base_url="http://localhost:8080")


def test_another_users_job_is_answered_as_one_that_does_not_exist(servers: Servers) -> None:
    alice = servers.stub_for(servers.scheduler.tokens.create("alice", Role.SUBMIT)[0])
    bob = servers.stub_for(servers.scheduler.tokens.create("bob", Role.SUBMIT)[0])
    job = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("a")), timeout=30).job
    answers = []
    for job_id in (job.id, "job-000000000000"):
        with pytest.raises(grpc.RpcError) as err:
            bob.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10)
        answers.append((err.value.code(), err.value.details().replace(job_id, "ID")))
    assert answers[0] == answers[1] and answers[0][0] == grpc.StatusCode.NOT_FOUND, answers


def test_unknown_and_known_token_ids_are_checked_the_same_way(servers: Servers,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Same steps, whichever: a record read, a SHA-256 of the secret, a constant-time compare."""
    store = servers.scheduler.tokens
    token, info = store.create("alice", Role.SUBMIT)
    wrong_secret = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    unknown_id = "frz_000000000000_" + token[len("frz_000000000000_"):]
    counts: dict[str, int] = {}
    real_load, real_compare = store._load, hmac.compare_digest

    def load(token_id: str):  # noqa: ANN202
        counts["load"] = counts.get("load", 0) + 1
        return real_load(token_id)

    def compare(a, b) -> bool:  # noqa: ANN001
        counts["compare"] = counts.get("compare", 0) + 1
        return real_compare(a, b)

    monkeypatch.setattr(store, "_load", load)
    monkeypatch.setattr(tokens_module.hmac, "compare_digest", compare)
    seen = []
    for candidate in (wrong_secret, unknown_id):
        store._cache.clear()
        counts.clear()
        with pytest.raises(AuthError) as err:
            store.verify(candidate)
        seen.append((dict(counts), str(err.value)))
    assert seen[0] == seen[1] == ({"load": 1, "compare": 1}, "token is unknown or revoked"), seen


def test_the_dashboard_and_the_api_send_security_headers(api: TestClient) -> None:
    for path in ("/", "/docs", "/api/jobs", "/healthz", "/openapi.json"):
        r = api.get(path)
        assert r.headers.get("x-frame-options") == "DENY", path
        assert r.headers.get("x-content-type-options") == "nosniff", path
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp, (path, csp)
    # the dashboard's policy lets its own inline script and style run, nothing else inline
    csp = api.get("/").headers["content-security-policy"]
    html = dashboard_html()
    for tag, directive in (("script", "script-src"), ("style", "style-src")):
        (body,) = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in csp
    assert "unsafe-inline" not in csp and "default-src 'none'" in csp


def test_an_origin_on_another_port_is_another_origin(api: TestClient, servers: Servers) -> None:
    auth = {"Authorization": f"Bearer {servers.token}"}
    body = {"model": "gpt2-124m", "seq_len": 128, "global_batch": 8, "command": ["true"]}
    r = api.post("/api/jobs", json=body, headers={**auth, "origin": "http://localhost:9999"})
    assert r.status_code == 403, r.text
    r = api.post("/api/jobs", json=body, headers={**auth, "origin": "http://localhost:8080"})
    assert r.status_code != 403, r.text


def test_open_pages_name_no_internal_address(api: TestClient, servers: Servers) -> None:
    address = servers.scheduler_addr
    host, port = address.rsplit(":", 1)
    for path in ("/healthz", "/openapi.json", "/docs"):
        text = api.get(path).text
        assert address not in text and f":{port}" not in text, path
