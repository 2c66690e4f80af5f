"""The HTTP gateway's Prometheus metrics (``frenzy api --metrics-address``): requests by route,
method and status, and their latency by route.

``RequestMetrics`` is a pure ASGI middleware placed outside every other one of ours, so requests
the web guard refuses (421, 413, 415) are counted too. A route is its template
(``/api/jobs/{job_id}``), never the path a client sent: a job id or a probe's random path never
becomes a label. A path no route serves counts as ``unmatched``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"
# Seconds: most routes are one gRPC read (ms); a submission waits for the predictor.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ApiMetrics:
    """The gateway's counters, in a registry of their own (several apps in one test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("frenzy_api_requests", "HTTP requests answered, by route template, method and "
                                "status code.", ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("frenzy_api_request_seconds", "Time from a request's arrival to the end of its "
                                 "response, by route template.", ["route"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)


def route_template(scope: Scope) -> str:
    """The template of the route that served ``scope`` (set by the router), else of the one that
    would have (a request refused before routing), else ``unmatched``."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    router = scope.get("router") or getattr(scope.get("app"), "router", None)
    return _matching_path(getattr(router, "routes", ()), scope) or UNMATCHED


def _matching_path(routes: object, scope: Scope, depth: int = 0) -> str | None:
    """The path template of the first route in ``routes`` that matches ``scope``, looking into
    included routers (FastAPI keeps an included router as one entry whose ``original_router``
    holds the routes, their paths prefixed)."""
    for candidate in routes or ():  # type: ignore[attr-defined]
        try:
            match, _ = candidate.matches(scope)
        except (KeyError, TypeError, AttributeError):
            continue
        if match is Match.NONE:
            continue
        path = getattr(candidate, "path", None)
        if isinstance(path, str):
            return path
        inner = getattr(candidate, "routes", None) or getattr(getattr(candidate, "original_router", None),
                                                              "routes", None)
        if inner and depth < 4:
            found = _matching_path(inner, scope, depth + 1)
            if found:
                return found
    return None


class RequestMetrics:
    """Pure ASGI middleware: counts and times every HTTP request into ``metrics``."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started: the server answers 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = route_template(scope)
            method = str(scope.get("method", "GET")).upper()
            if method not in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
                method = "other"  # a client's made-up method never becomes a label
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
