"""schemathesis against the REST API's own OpenAPI schema (issue 14): requests generated from the
schema, sent in-process to the FastAPI app in front of a real scheduler and predictor (loopback gRPC,
real Redis), never get a 5xx, and the answers the app declares conform to the schema.

Once as the admin token, so every route is reached, and once without a token, where every /api
route answers 401. The schema's own generator seldom writes a job the scheduler takes: the jobs
that reach it are test_rest_submit_fuzz.py's."""

from __future__ import annotations

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance

from support.servers import Servers

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
# Bounded: at most this many generated requests per operation, reproducible from run to run.
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def api_schema(app: FastAPI):  # -> schemathesis' OpenAPI schema, requests sent to the app in-process
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@SETTINGS
def test_as_admin_no_5xx_and_declared_answers_conform(case, servers: Servers) -> None:  # noqa: ANN001
    case.call_and_validate(headers={"Authorization": f"Bearer {servers.token}"}, checks=CHECKS)


@schema.parametrize()
@SETTINGS
def test_without_a_token_every_api_route_is_401(case) -> None:  # noqa: ANN001
    response = case.call_and_validate(checks=[not_a_server_error])
    if not case.operation.path.startswith("/api/"):
        return  # /healthz is open
    sent_type = (response.request.headers.get("Content-Type") or "").split(";")[0].strip()
    seen = (case.operation.label, case.method, sent_type, response.status_code, response.text[:300])
    # schemathesis also sends other methods, and writes whose body is not JSON or absent: those are
    # refused before any route is chosen (405, and the web guard's 415), without a token too.
    method = case.method.upper()
    reaches_the_route = method == case.operation.method.upper() and (
        sent_type == "application/json" or (method == "GET" and not sent_type))
    assert response.status_code == 401 if reaches_the_route else response.status_code in (401, 405, 415), seen
