"""What the Predictor answers, without the server around it: MARP behind the wire contract.

Pure (no I/O, nothing of the server extra), so `frenzy predict` and the SDK's local
predictions on a client-only install call the very function the Predictor service serves.
"""

from __future__ import annotations

import marp
from frenzy.rpc import convert
from frenzy.rpc.spec_limits import check_goal, check_limits, check_model, check_pools, check_recipe
from frenzy.v1 import predictor_pb2

DEFAULT_MAX_PLANS = 50  # marp.enumerate_plans' default


def predict(request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse:
    """Pure translation around marp.enumerate_plans; raises marp.MarpError on bad input."""
    try:
        check_model(request.model)
        check_recipe(request.recipe)
        check_limits(request.limits)
        check_pools(list(request.pools))
        check_goal(request.goal)
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
    # Mixed plans (one job over two GPU types) only when asked for and the pools hold several
    # types; otherwise the very call of before issue 33, so single-type answers are unchanged.
    if request.mixed and pools is not None and len({p.gpu_type for p in pools}) >= 2:
        kwargs["mixed"] = True
    goal = convert.goal_from_proto(request.goal)
    if goal.objective == "gpu-hours":
        kwargs["rank_by"] = "gpu_hours"
    if not goal.is_default and not request.max_plans:
        kwargs["max_plans"] = None  # the goal drops and orders all; the cap applies after it
    plan_set = marp.enumerate_plans(model, recipe, pools, **kwargs)
    # Every plan is priced (catalog list prices, or the pools' own); a goal drops and orders them.
    prices = convert.pool_prices(list(request.pools))
    kept = marp.objectives.apply_goal(plan_set.plans, goal, prices)
    cap = request.max_plans or DEFAULT_MAX_PLANS
    protos = []
    for p in kept.plans[:cap]:
        proto = convert.plan_to_proto(p)
        proto.cost_usd = marp.objectives.plan_cost(p, prices)
        protos.append(proto)
    return predictor_pb2.PredictResponse(
        plans=protos, rejected=list(plan_set.rejected), model_name=model.name,
        parameter_count=model.param_count(), dropped=[d.reason for d in kept.dropped],
    )
