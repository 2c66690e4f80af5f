"""HTTP gateway and dashboard: a thin FastAPI layer over the Scheduler's gRPC API.

    GET  /                       the dashboard (one static HTML file, no CDN)
    GET  /healthz                200 when the scheduler answers its health check, else 503
    GET  /api/jobs               ?state=PENDING&state=RUNNING&limit=100 -> {"jobs": [row, ...]}: what
                                 `frenzy jobs --json` prints (one serializer: frenzy.rpc.job_json)
    GET  /api/jobs/{id}          the whole job: spec, plan, placement, history, candidate plans, and
                                 per attempt the predicted against observed peak memory (``memory``)
    POST /api/jobs               body: a job entry as `frenzy submit` takes it (see the OpenAPI schema)
    POST /api/jobs/{id}/cancel   body (optional): {"reason": "..."}
    GET  /api/nodes              ?include_dead=true -> {"nodes": [...]}
    GET  /docs                   the API's documentation (Swagger UI) from files shipped in the
                                 fastapi-offline package (/static-offline-docs): FastAPI's own page
                                 loads them from a CDN, which an air-gapped cluster cannot reach

gRPC status codes become HTTP ones: INVALID_ARGUMENT 400 (the message names the
field), NOT_FOUND 404, FAILED_PRECONDITION and ALREADY_EXISTS 409,
RESOURCE_EXHAUSTED 429 (the scheduler's own messages), UNAVAILABLE 503 and
DEADLINE_EXCEEDED 504 (a fixed message), anything else 502 "internal error, see
the server log": no Redis command, traceback, file name or exception text ever
reaches a client (issue 14 item 10); the details go to the server log. Error
bodies are ``{"detail": "<message>"}``. JSON mirrors the proto field names; enums
are short names (``"PENDING"``, ``"BF16"``) and 64-bit integers are numbers.

Before any route, ``guard.WebGuard`` checks the Host header, refuses non-JSON and
cross-origin writes and caps bodies. Job ids are checked here (a safe charset, a
bounded length) before anything reaches the scheduler; a `model` given as a path
is refused unopened. Every /api route hangs off one router whose dependencies
(``api_dependencies``) are declared in one place, where authentication goes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from functools import cache
from importlib import resources
from typing import Annotated, Any, TypeVar

import grpc
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.params import Depends as Dependency
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi_offline import FastAPIOffline
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.concurrency import run_in_threadpool

from frenzy.api.guard import DEFAULT_MAX_BODY_BYTES, WebGuard, allowed_host_names
from frenzy.api.metrics import ApiMetrics, RequestMetrics
from frenzy.api.usage_routes import add_usage_routes
from frenzy.auth.tokens import AuthError, bearer, parse_token
from frenzy.rpc.auth import with_token
from frenzy.rpc.job_json import job_detail, job_list
from frenzy.rpc.jobspec import MAX_JSON_DEPTH, JobEntry, JobSpecError, json_depth, parse_entry
from frenzy.rpc.listing import SINCE_HELP, since_time
from frenzy.rpc.protojson import to_json
from frenzy.rpc.tls import ClientTls, open_channel
from frenzy.state.messages import SAFE_NAME_RE
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

T = TypeVar("T")
log = logging.getLogger(__name__)

# Codes whose messages the scheduler writes for the caller (they name a field, a job, a limit).
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}
# Codes answered with a fixed message: their details can carry addresses and exception text.
FIXED_ANSWER = {
    grpc.StatusCode.UNAVAILABLE: (503, "scheduler unavailable, try again later (details in the server log)"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "the scheduler did not answer in time"),
}
INTERNAL_ERROR = "internal error, see the server log"
MAX_DETAIL_CHARS = 2000
MAX_REASON_CHARS = 1024
JOB_ID = SAFE_NAME_RE  # one rule for job ids: frenzy.state.messages
READ_TIMEOUT_S = 10.0
MAX_INT32 = 2**31 - 1  # the proto's int32 fields: a larger query value would not fit the request
SUBMIT_TIMEOUT_S = 60.0  # the scheduler asks the predictor before answering


# ---- the app ----------------------------------------------------------------------------------


@cache
def dashboard_html() -> str:
    return resources.files("frenzy.api").joinpath("static", "index.html").read_text(encoding="utf-8")


@cache
def dashboard_csp() -> str:
    """The dashboard's content security policy: its own inline script and style by hash, requests
    to this origin only, no framing (issue 34)."""
    html = dashboard_html()
    hashes = {}
    for tag in ("script", "style"):
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        hashes[tag] = " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'" for body in found)
    return (f"default-src 'none'; script-src {hashes['script']}; style-src {hashes['style']}; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _header_int(meta: dict[str, Any], name: str) -> int:
    raw = meta.get(name, "0")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else 0


def _http_error(exc: grpc.RpcError) -> HTTPException:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    if code in HTTP_STATUS:
        headers = {"WWW-Authenticate": "Bearer"} if code == grpc.StatusCode.UNAUTHENTICATED else None
        return HTTPException(status_code=HTTP_STATUS[code], detail=(details or code.name)[:MAX_DETAIL_CHARS],
                             headers=headers)
    log.warning("scheduler call failed: %s: %s", getattr(code, "name", code), details)
    status, message = FIXED_ANSWER.get(code, (502, INTERNAL_ERROR))
    return HTTPException(status_code=status, detail=message)


def checked_job_id(job_id: str = Path(description="a job id as SubmitJob returned it (job-...)")) -> str:
    """A job id as the scheduler makes them; anything else (a Redis key, a path) never leaves the API."""
    if JOB_ID.fullmatch(job_id) is None:
        raise HTTPException(400, detail="job_id: letters, digits, '.', '_' and '-' only (at most 128), "
                                        "starting with a letter or digit")
    return job_id


JobIdPath = Depends(checked_job_id)


def read_json(raw: bytes) -> object:
    """The body as JSON; 400 naming `body` for bad syntax, an integer of thousands of digits or deep nesting."""
    try:
        data = json.loads(raw or b"null")
    except RecursionError:
        raise HTTPException(400, detail=f"body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError; so is a 5000-digit int
        raise HTTPException(400, detail=f"body: not valid JSON ({str(exc)[:200]})") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise HTTPException(400, detail=f"body: nested deeper than {MAX_JSON_DEPTH} levels")
    return data


def caller_token(authorization: str | None = Header(default=None, include_in_schema=False)) -> str:
    """The caller's token from ``Authorization: Bearer <token>`` (401 without one).

    Only a header counts, never a cookie: a browser sends cookies with any cross-site request,
    while a header has to be set by the page's own script (issue 14 item 5, CSRF). Whether the
    token is good is the scheduler's to say (it answers UNAUTHENTICATED -> 401,
    PERMISSION_DENIED -> 403), so the API holds no credential of its own."""
    try:
        token = bearer(authorization)
        parse_token(token)
    except AuthError as exc:
        raise HTTPException(401, detail=f"{exc}. To fix: send 'Authorization: Bearer <token>' "
                                        "(`frenzy token create`, or the token `frenzy up` wrote)",
                            headers={"WWW-Authenticate": "Bearer"}) from None
    return token


Caller = Annotated[str, Depends(caller_token)]


def api_dependencies(extra: Sequence[Dependency] = ()) -> list[Dependency]:
    """What every /api route depends on, in one place: a bearer token, then ``extra``."""
    return [Depends(caller_token), *extra]


# FastAPIOffline is FastAPI with /docs pointed at the Swagger UI files inside the fastapi-offline
# package, served under /static-offline-docs (no CDN). No /redoc: ReDoc 2.5 always loads its sidebar
# logo from cdn.redoc.ly, a request out of the cluster for every reader
# (tests/e2e/test_dashboard_browser.py caught it). No validator badge: Swagger UI would send the
# schema's URL to validator.swagger.io whenever the host is not loopback.
OFFLINE_DOCS: dict[str, Any] = {"redoc_url": None, "swagger_ui_parameters": {"validatorUrl": None}}


def _job_states(names: Sequence[str]) -> list[int]:
    """``?state=`` values as JobState numbers; 400 naming an unknown one."""
    states = []
    for given in names:
        name = f"JOB_STATE_{given.strip().upper()}"
        if name not in types_pb2.JobState.keys() or name == "JOB_STATE_UNSPECIFIED":
            allowed = ", ".join(n.removeprefix("JOB_STATE_") for n in types_pb2.JobState.keys()[1:])
            raise HTTPException(400, detail=f"state: unknown state {given!r} (one of {allowed})")
        states.append(types_pb2.JobState.Value(name))
    return states


def _logs_answer(job_id: str, chunks: Sequence[Any], meta: dict[str, Any], whole: bool) -> dict[str, Any]:
    """GET /api/jobs/{id}/logs's body: the chunks, the caps the scheduler reported in its headers,
    and (``whole``: every line asked for) each node and attempt whose first bytes are gone."""
    dropped: list[dict[str, Any]] = []
    if whole:
        seen: set[tuple[str, int]] = set()
        for c in chunks:
            if (c.node, c.attempt) not in seen:
                seen.add((c.node, c.attempt))
                if c.offset > 0:
                    dropped.append({"node": c.node, "attempt": c.attempt, "bytes": c.offset})
    return {"job_id": job_id, "cap_bytes": _header_int(meta, "frenzy-log-cap-bytes"),
            "file_cap_bytes": _header_int(meta, "frenzy-log-file-cap-bytes"), "dropped": dropped, "chunks": [
        {"node": c.node, "attempt": c.attempt, "offset": c.offset, "text": c.text, "at": c.at} for c in chunks
    ]}


class SchedulerLink:
    """An app's one gRPC channel to the scheduler, opened at its first use and closed with the app;
    calls go out as the caller (their token), their gRPC errors come back as HTTP ones."""

    def __init__(self, address: str, tls: ClientTls | None) -> None:
        self.address, self.tls = address, tls
        self._channel: grpc.Channel | None = None

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = open_channel(self.address, self.tls)
        return self._channel

    def stub(self, token: str) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(with_token(self.channel(), token))

    def call(self, token: str, fn: Callable[[scheduler_pb2_grpc.SchedulerStub], T]) -> T:
        """``fn`` on a stub that calls as the caller (their token), gRPC errors as HTTP ones."""
        try:
            return fn(self.stub(token))
        except grpc.RpcError as exc:
            raise _http_error(exc) from None

    def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            channel.close()


def create_app(scheduler_address: str, *, bind_host: str = "127.0.0.1", allowed_hosts: Sequence[str] = (),
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, dependencies: Sequence[Dependency] = (),
               scheduler_tls: ClientTls | None = None, metrics: ApiMetrics | None = None) -> FastAPI:
    """The gateway for the scheduler at ``scheduler_address`` (host:port). One gRPC channel per app.

    Host headers allowed: localhost, 127.0.0.1, ::1, ``bind_host`` (unless a wildcard) and
    ``allowed_hosts``. Bodies over ``max_body_bytes`` are refused (413). ``dependencies`` run
    before every /api route. Every request is counted in ``metrics`` (``app.state.metrics``;
    a new ``ApiMetrics`` when None), which ``frenzy api --metrics-address`` serves."""
    link = SchedulerLink(scheduler_address, scheduler_tls)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Iterator[None]:  # type: ignore[misc]
        yield
        link.close()

    app = FastAPIOffline(
        **OFFLINE_DOCS, title="Frenzy", version="0.1.0", lifespan=lifespan,
        # (no address of the scheduler: the page is open to anyone who reaches the API, issue 34)
        description="Submit LLM training jobs by model and recipe; Frenzy picks the GPUs.",
    )
    app.state.scheduler_address = scheduler_address
    app.add_middleware(WebGuard, allowed_hosts=allowed_host_names(bind_host, allowed_hosts),
                       max_body_bytes=max_body_bytes, page_policies={"/": dashboard_csp()})
    # Added last, so outside the guard: refused requests are counted too.
    app.state.metrics = metrics or ApiMetrics()
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    api = APIRouter(prefix="/api", dependencies=api_dependencies(dependencies))
    _add_pages(app, link)
    _add_job_routes(api, link)
    _add_node_routes(api, link)
    add_usage_routes(api, link, Caller, READ_TIMEOUT_S)  # GET /api/usage (issue 35)
    app.include_router(api)
    return app


def _add_pages(app: FastAPI, link: SchedulerLink) -> None:
    """What is outside /api: the error handler of last resort, the dashboard and /healthz."""

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in the API", exc_info=exc)
        return JSONResponse({"detail": INTERNAL_ERROR}, status_code=500)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html())

    @app.get("/healthz", tags=["health"])
    def healthz() -> JSONResponse:
        """200 when the scheduler answers SERVING to a gRPC health check, else 503."""
        try:
            resp = health_pb2_grpc.HealthStub(link.channel()).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3)
            serving = resp.status == health_pb2.HealthCheckResponse.SERVING
            why = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        except grpc.RpcError as exc:
            serving, why = False, exc.code().name  # the details can name addresses: the log has them
            log.warning("scheduler health check failed: %s: %s", exc.code().name, exc.details())
        # (no scheduler address: /healthz is open to anyone who reaches the API, issue 34)
        body = {"ok": serving, "scheduler_status": why}
        return JSONResponse(body, status_code=200 if serving else 503)


def _add_job_routes(api: APIRouter, link: SchedulerLink) -> None:
    """/api/jobs: list, read, submit, cancel and read a job's output."""

    @api.get("/jobs", tags=["jobs"])
    def list_jobs(token: Caller,
                  state: list[str] = Query(default=[], description="PENDING, RUNNING, ... (repeatable)"),  # noqa: B006
                  limit: int = Query(default=100, ge=1, le=10_000),
                  user: str = Query(default="", max_length=256,
                                    description="one user's jobs (admins; others may name only themselves)"),
                  name: str = Query(default="", max_length=256,
                                    description="jobs whose name contains this, ignoring case"),
                  since: str = Query(default="", max_length=64, description=f"jobs submitted since: {SINCE_HELP}"),
                  ) -> dict[str, Any]:
        """Jobs, newest first, as summaries (GET /api/jobs/{id} has the whole record). The filters
        are the scheduler's: `limit` counts matching jobs (what `frenzy jobs` takes as flags)."""
        try:
            since_at = since_time(since)
        except ValueError as exc:
            raise HTTPException(400, detail=f"since: {exc}") from None
        req = scheduler_pb2.ListJobsRequest(states=_job_states(state), limit=limit, user=user, name=name,
                                             since=since_at)
        resp = link.call(token, lambda st: st.ListJobs(req, timeout=READ_TIMEOUT_S))
        return job_list(resp.jobs)

    @api.get("/jobs/{job_id}", tags=["jobs"])
    def get_job(token: Caller, job_id: str = JobIdPath) -> dict[str, Any]:
        job = link.call(token, lambda st: st.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=READ_TIMEOUT_S))
        return job_detail(job)

    @api.post("/jobs", tags=["jobs"], openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": JobEntry.model_json_schema()}}}})
    async def submit_job(request: Request, token: Caller) -> dict[str, Any]:
        """Submit one job: the model and the recipe, never GPUs. 400 names the bad field; 409 when no GPU
        type in the cluster can hold the job. With the same `idempotency_key`, the same job comes back
        (`duplicate: true`). `model` is a catalog name or the config as a JSON object, never a path:
        the server opens no file for a client."""
        data = read_json(await request.body())
        try:
            spec = parse_entry(data).to_proto(read_model_files=False)
        except JobSpecError as exc:
            raise HTTPException(400, detail=str(exc)) from None
        req = scheduler_pb2.SubmitJobRequest(spec=spec)
        resp = await run_in_threadpool(link.call, token, lambda st: st.SubmitJob(req, timeout=SUBMIT_TIMEOUT_S))
        return {**job_detail(resp.job), "duplicate": resp.duplicate}

    @api.post("/jobs/{job_id}/cancel", tags=["jobs"])
    async def cancel_job(request: Request, token: Caller, job_id: str = JobIdPath) -> dict[str, Any]:
        """Cancel a job (body optional: {"reason": "..."}). 409 when it has already ended."""
        reason = ""
        raw = await request.body()
        if raw.strip():
            body = read_json(raw)
            if not isinstance(body, dict) or not isinstance(body.get("reason", ""), str):
                raise HTTPException(400, detail='body: expected {"reason": "<text>"}')
            if len(body.get("reason", "")) > MAX_REASON_CHARS:
                raise HTTPException(400, detail=f"reason: at most {MAX_REASON_CHARS} characters")
            reason = body.get("reason", "")
        resp = await run_in_threadpool(link.call, token, lambda st: st.CancelJob(
            scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason), timeout=READ_TIMEOUT_S))
        return job_detail(resp.job)

    @api.get("/jobs/{job_id}/logs", tags=["jobs"])
    def job_logs(
        token: Caller,
        job_id: str = JobIdPath,
        node: str = Query(default="", max_length=256, description="one node's output (empty: every node)"),
        attempt: int = Query(default=0, ge=0, le=MAX_INT32, description="one attempt (0: every attempt)"),
        tail_lines: int = Query(default=200, ge=0, le=100_000,
                                description="the last lines, of every node together (0: all kept)"),
    ) -> dict[str, Any]:
        """The job's output as the agents shipped it (stdout and stderr together), per node and
        attempt, oldest first — what `frenzy logs` prints, without following: each node's stream
        of the job, merged in time order. `cap_bytes`: what a node's log stream of the job keeps
        (its newest output; per node), `file_cap_bytes`: what a node's log file keeps (0: no cap).
        With `tail_lines=0`, `dropped` lists each node and attempt whose first bytes the stream no
        longer holds (`bytes`: how many); output a file cap dropped shows in place, as a chunk
        whose text says so."""

        def read(st: scheduler_pb2_grpc.SchedulerStub) -> tuple[list[Any], dict[str, Any]]:
            stream = st.StreamLogs(scheduler_pb2.StreamLogsRequest(
                job_id=job_id, node=node, attempt=attempt, tail_lines=tail_lines), timeout=READ_TIMEOUT_S)
            chunks = list(stream)
            return chunks, dict(stream.initial_metadata() or ())

        chunks, meta = link.call(token, read)
        return _logs_answer(job_id, chunks, meta, whole=not tail_lines)


def _add_node_routes(api: APIRouter, link: SchedulerLink) -> None:
    """/api/nodes."""

    @api.get("/nodes", tags=["nodes"])
    def list_nodes(token: Caller, include_dead: bool = False) -> dict[str, Any]:
        """Nodes and their GPUs; `owner` is the job id holding a GPU ("" when free)."""
        resp = link.call(token, lambda st: st.ListNodes(scheduler_pb2.ListNodesRequest(include_dead=include_dead),
                                            timeout=READ_TIMEOUT_S))
        return {"nodes": [to_json(n) for n in resp.nodes]}
