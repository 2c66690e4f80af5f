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
"""

from __future__ import annotations

import logging
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

import marp
from frenzy.rpc import convert
from frenzy.rpc.server import start_server
from frenzy.rpc.spec_limits import check_limits, check_model, check_pools, check_recipe
from frenzy.rpc.tls import ServerTls
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name


def predict(request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse:
    """Pure translation around marp.enumerate_plans; raises marp.MarpError on bad input."""
    try:
        check_model(request.model)
        check_recipe(request.recipe)
        check_limits(request.limits)
        check_pools(list(request.pools))
    except ValueError as exc:
        raise marp.InvalidRecipeError(str(exc), field=str(exc).partition(":")[0]) from None
    if request.max_plans < 0:
        raise marp.InvalidRecipeError(f"max_plans: must be >= 0 (got {request.max_plans})", field="max_plans")
    model = convert.model_from_proto(request.model)
    recipe = convert.recipe_from_proto(request.recipe, request.limits)
    pools = convert.pools_from_proto(list(request.pools), list(request.limits.allowed_gpu_types))
    kwargs = {}
    if request.safety_margin:
        if not 0 <= request.safety_margin < 1:
            raise marp.InvalidRecipeError(
                f"safety_margin: must be in [0, 1) (got {request.safety_margin})", field="safety_margin")
        kwargs["safety_margin"] = request.safety_margin
    if request.max_plans:
        kwargs["max_plans"] = request.max_plans
    plan_set = marp.enumerate_plans(model, recipe, pools, **kwargs)
    return predictor_pb2.PredictResponse(
        plans=[convert.plan_to_proto(p) for p in plan_set.plans], rejected=list(plan_set.rejected),
        model_name=model.name, parameter_count=model.param_count(),
    )


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
    def __init__(self, metrics: PredictorMetrics | None = None) -> None:
        self.metrics = metrics or PredictorMetrics()

    def Predict(self, request: predictor_pb2.PredictRequest, context: grpc.ServicerContext) -> predictor_pb2.PredictResponse:
        started = time.perf_counter()
        outcome = "error"  # until shown otherwise: an exception escaping here becomes INTERNAL
        try:
            answer = predict(request)
            outcome = "ok"
            self.metrics.plans.observe(len(answer.plans))
            return answer
        except marp.MarpError as exc:
            outcome = "invalid"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            self.metrics.requests.labels(outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - started)
        raise AssertionError("unreachable")


def serve(address: str = "127.0.0.1:50052", tls: ServerTls | None = None,
          metrics: PredictorMetrics | None = None) -> tuple[grpc.Server, int, object]:
    """Start the predictor. It holds no state and no secret; in a cluster keep it on a private
    address, or give it ``--tls-ca`` so that only holders of a client certificate (the
    scheduler) reach it. ``metrics``: where its calls are counted (serve its ``registry``
    with ``frenzy.metrics_http.serve_metrics``)."""
    servicer = PredictorServicer(metrics)
    return start_server(
        [lambda s: predictor_pb2_grpc.add_PredictorServicer_to_server(servicer, s)],
        [SERVICE_NAME], address, tls=tls,
    )
