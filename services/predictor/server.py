"""The Predictor gRPC service: MARP behind the wire contract. Stateless.

Bad input (unknown model, malformed config, bad batch, unknown GPU type)
comes back as INVALID_ARGUMENT whose message starts with the field path. The
request's numbers are checked against JobEntry's bounds first
(``frenzy.rpc.spec_limits``), so a seq_len of 2^40 is "recipe.seq_len: out of
range", not an int64 overflow inside MARP; anything else that fails is INTERNAL
with the detail in the log only (``frenzy.rpc.errors.CleanErrors``).
"""

from __future__ import annotations

import logging

import grpc

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


class PredictorServicer(predictor_pb2_grpc.PredictorServicer):
    def Predict(self, request: predictor_pb2.PredictRequest, context: grpc.ServicerContext) -> predictor_pb2.PredictResponse:
        try:
            return predict(request)
        except marp.MarpError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable")


def serve(address: str = "127.0.0.1:50052", tls: ServerTls | None = None) -> tuple[grpc.Server, int, object]:
    """Start the predictor. It holds no state and no secret; in a cluster keep it on a private
    address, or give it ``--tls-ca`` so that only holders of a client certificate (the
    scheduler) reach it."""
    return start_server(
        [lambda s: predictor_pb2_grpc.add_PredictorServicer_to_server(PredictorServicer(), s)],
        [SERVICE_NAME], address, tls=tls,
    )
