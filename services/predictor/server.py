"""The Predictor gRPC service: MARP behind the wire contract. Stateless.

Bad input (unknown model, malformed config, bad batch, unknown GPU type)
comes back as INVALID_ARGUMENT whose message starts with the field path. The
request's numbers are checked against JobEntry's bounds first
(``frenzy.rpc.spec_limits``), so a seq_len of 2^40 is "recipe.seq_len: out of
range", not an int64 overflow inside MARP; anything else that fails is INTERNAL
with the detail in the log only (``frenzy.rpc.errors.CleanErrors``).

``PredictorMetrics`` counts every Predict call by outcome (ok, invalid: the caller's input,
error: anything else) and times it; ``frenzy predictor --metrics-address`` serves them
(``frenzy.metrics_http``). Labels name no model or user.

Only the scheduler may call it: ``frenzy predictor`` checks the predictor token on every call
(``frenzy.predictor.guard.PredictorAuth``) and bounds each call's work (``PredictLimits``) before
MARP runs (issue 34 item 8).
"""

from __future__ import annotations

import logging
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

import marp
from frenzy.predictor.guard import CallSlots, PredictLimits, PredictorAuth
from frenzy.predictor.planning import predict as predict  # re-exported: the servicer's one call
from frenzy.rpc.server import start_server
from frenzy.rpc.tls import ServerTls
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name


PREDICT_OUTCOMES = ("ok", "invalid", "error")
# Seconds: a catalog model on one GPU type plans in milliseconds; a 400B model over several
# pools and the full layout grid takes seconds.
PREDICT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PredictorMetrics:
    """The predictor's counters, in a registry of their own (several predictors in one test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("frenzy_predictor_requests", "Predict calls by outcome (ok; invalid: the request "
                                "was refused as bad input; error: the predictor failed).", ["outcome"],
                                registry=self.registry)
        self.latency = Histogram("frenzy_predictor_latency_seconds", "Time to answer one Predict call (MARP's "
                                 "plan enumeration and ranking), whatever the outcome.", buckets=PREDICT_BUCKETS,
                                 registry=self.registry)
        self.plans = Histogram("frenzy_predictor_plans", "Plans in one answer.",
                               buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200), registry=self.registry)
        for outcome in PREDICT_OUTCOMES:
            self.requests.labels(outcome)


class PredictorServicer(predictor_pb2_grpc.PredictorServicer):
    def __init__(self, metrics: PredictorMetrics | None = None, limits: PredictLimits | None = None) -> None:
        self.metrics = metrics or PredictorMetrics()
        self.limits = limits or PredictLimits()
        self.slots = CallSlots(self.limits)

    def Predict(self, request: predictor_pb2.PredictRequest, context: grpc.ServicerContext) -> predictor_pb2.PredictResponse:
        started = time.perf_counter()
        outcome = "error"  # until shown otherwise: an exception escaping here becomes INTERNAL
        too_much = self.limits.problem(request)  # before any of MARP's work (issue 34 item 8)
        if too_much:
            self.metrics.requests.labels("invalid").inc()
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{too_much}: more than one Predict call may do")
        if not self.slots.acquire(context):
            self.metrics.requests.labels("error").inc()
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"predictor busy ({self.limits.max_concurrent} calls running); try again")
        try:
            answer = predict(request)
            outcome = "ok"
            self.metrics.plans.observe(len(answer.plans))
            return answer
        except marp.MarpError as exc:
            outcome = "invalid"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            self.slots.release()
            took = time.perf_counter() - started
            if took > self.limits.slow_s:
                log.warning("a Predict call took %.1f s (%d pools)", took, len(request.pools))
            self.metrics.requests.labels(outcome).inc()
            self.metrics.latency.observe(took)
        raise AssertionError("unreachable")


def serve(address: str = "127.0.0.1:50052", tls: ServerTls | None = None,
          metrics: PredictorMetrics | None = None, token: str | None = None,
          limits: PredictLimits | None = None) -> tuple[grpc.Server, int, object]:
    """Start the predictor. It holds no state; ``token``: the predictor token its one client (the
    scheduler) sends, every other caller is UNAUTHENTICATED (``frenzy.predictor.guard``; None:
    no check, for a test's in-process server: ``frenzy predictor`` never starts so). ``tls`` with
    a client CA: only holders of a client certificate reach it. ``limits``: one call's bounds.
    ``metrics``: where its calls are counted (serve its ``registry`` with
    ``frenzy.metrics_http.serve_metrics``)."""
    servicer = PredictorServicer(metrics, limits)
    return start_server(
        [lambda s: predictor_pb2_grpc.add_PredictorServicer_to_server(servicer, s)],
        [SERVICE_NAME], address, tls=tls, interceptors=[PredictorAuth(token)] if token is not None else (),
    )
