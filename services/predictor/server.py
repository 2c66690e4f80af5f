"""The Predictor gRPC service: MARP behind the wire contract. Stateless.

Bad input (unknown model, malformed config, bad batch, unknown GPU type)
comes back as INVALID_ARGUMENT whose message starts with the field path.
"""

from __future__ import annotations

import logging

import grpc

import marp
from frenzy.rpc import convert
from frenzy.rpc.server import start_server
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name


def predict(request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse:
    """Pure translation around marp.enumerate_plans; raises marp.MarpError on bad input."""
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


def serve(address: str = "127.0.0.1:50052") -> tuple[grpc.Server, int, object]:
    return start_server(
        [lambda s: predictor_pb2_grpc.add_PredictorServicer_to_server(PredictorServicer(), s)],
        [SERVICE_NAME], address,
    )
