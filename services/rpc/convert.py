"""Translate between the wire contract (frenzy.v1 protos) and MARP's types.

Validation errors raised here are ``marp.MarpError``s whose ``field`` names
the offending input as a path in the JobSpec (``recipe.global_batch``), so
gRPC, the CLI and the batch worker report bad input the same way.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import marp
from frenzy.v1 import types_pb2

if TYPE_CHECKING:
    from marp.mixed import MixedLayout

# Wire enum <-> MARP's policy names (marp.recipe.PRECISIONS / OPTIMIZERS).
PRECISION_BY_NAME = {
    "fp32": types_pb2.PRECISION_FP32, "fp16": types_pb2.PRECISION_FP16, "bf16": types_pb2.PRECISION_BF16,
    "master-fp16": types_pb2.PRECISION_FP16, "master-bf16": types_pb2.PRECISION_BF16,
    "amp-fp16": types_pb2.PRECISION_AMP_FP16, "amp-bf16": types_pb2.PRECISION_AMP_BF16,
    "pure-bf16": types_pb2.PRECISION_PURE_BF16, "fsdp-bf16": types_pb2.PRECISION_FSDP_BF16,
}
OPTIMIZER_BY_NAME = {
    "adamw": types_pb2.OPTIMIZER_ADAMW, "adam": types_pb2.OPTIMIZER_ADAM, "sgd": types_pb2.OPTIMIZER_SGD,
    "sgd-momentum": types_pb2.OPTIMIZER_SGD_MOMENTUM, "adam8bit": types_pb2.OPTIMIZER_ADAM8BIT,
}
_PRECISION = {types_pb2.PRECISION_UNSPECIFIED: "bf16", types_pb2.PRECISION_FP16: "fp16",
              types_pb2.PRECISION_BF16: "bf16"}
_PRECISION.update({v: k for k, v in PRECISION_BY_NAME.items() if not k.startswith("master-")
                   and v not in _PRECISION})
_OPTIMIZER = {types_pb2.OPTIMIZER_UNSPECIFIED: "adamw", **{v: k for k, v in OPTIMIZER_BY_NAME.items()}}
FINETUNE_BY_NAME = {"full": types_pb2.FINETUNE_FULL, "lora": types_pb2.FINETUNE_LORA,
                    "qlora": types_pb2.FINETUNE_QLORA}
_FINETUNE = {types_pb2.FINETUNE_UNSPECIFIED: "full", **{v: k for k, v in FINETUNE_BY_NAME.items()}}
DEFAULT_LORA_RANK = 16  # marp.TrainingRecipe's
DEFAULT_LORA_TARGETS = ("q", "k", "v", "o")  # marp.TrainingRecipe's
# String recipe fields whose empty wire value is MARP's default, with the names MARP takes.
CHOICE_FIELDS: dict[str, tuple[str, ...]] = {
    "lora_adapter_dtype": marp.recipe.LORA_ADAPTER_DTYPES, "fsdp_reshard": marp.recipe.FSDP_RESHARDS,
    "qlora_backend": marp.recipe.QLORA_BACKENDS, "main_grad_dtype": marp.recipe.MAIN_GRAD_DTYPES,
}
CHOICE_DEFAULTS: dict[str, str] = {f.name: str(f.default) for f in dataclasses.fields(marp.TrainingRecipe)
                                   if f.name in CHOICE_FIELDS}  # fmt: skip
# A job's objective (marp.objectives.OBJECTIVES) on the wire.
OBJECTIVE_BY_NAME = {"time": types_pb2.OBJECTIVE_TIME, "cost": types_pb2.OBJECTIVE_COST,
                     "gpu-hours": types_pb2.OBJECTIVE_GPU_HOURS}
_OBJECTIVE = {types_pb2.OBJECTIVE_UNSPECIFIED: "time", **{v: k for k, v in OBJECTIVE_BY_NAME.items()}}


def goal_to_proto(goal: marp.objectives.Goal) -> types_pb2.JobGoal:
    """The wire form of a job's goal (0: no deadline / no budget)."""
    return types_pb2.JobGoal(objective=OBJECTIVE_BY_NAME[goal.objective], deadline_s=goal.deadline_s or 0.0,
                             budget_usd=goal.budget_usd or 0.0)


def goal_from_proto(goal: types_pb2.JobGoal) -> marp.objectives.Goal:
    """A job's goal from the wire; MarpError naming ``goal.*`` for an unknown objective or a bad limit."""
    name = _OBJECTIVE.get(goal.objective)
    if name is None:
        raise marp.InvalidRecipeError(f"goal.objective: unknown value {goal.objective}", field="goal.objective")
    try:
        return marp.objectives.Goal(name, goal.deadline_s or None, goal.budget_usd or None)
    except marp.MarpError as exc:
        raise marp.InvalidRecipeError(f"goal.{exc}", field=f"goal.{exc.field}") from None


def pool_prices(pools: list[types_pb2.GpuPool]) -> dict[str, float]:
    """GPU type -> dollars per GPU-hour: the catalog's list prices, over them the pools' own
    (``price_per_gpu_hour`` > 0; the highest where two pools of one type differ)."""
    own: dict[str, float] = {}
    for p in pools:
        if p.price_per_gpu_hour > 0:
            name = marp.get_gpu(p.gpu_type).name
            own[name] = max(own.get(name, 0.0), p.price_per_gpu_hour)
    return marp.objectives.price_table(own)


def model_from_proto(model: types_pb2.ModelSpec) -> marp.ModelSpec:
    which = model.WhichOneof("source")
    if which == "catalog_name":
        return marp.get_model(model.catalog_name)
    if which == "config_json":
        return marp.model_from_json(model.config_json, name=model.display_name or "custom")
    raise marp.UnknownModelError(
        "model: no model given. To fix: set model.catalog_name (see `frenzy models`) or model.config_json",
        field="model",
    )


def recipe_from_proto(recipe: types_pb2.TrainingRecipe, limits: types_pb2.JobLimits | None = None) -> marp.TrainingRecipe:
    if recipe.precision not in _PRECISION:
        raise marp.InvalidRecipeError(f"recipe.precision: unknown value {recipe.precision}", field="recipe.precision")
    if recipe.optimizer not in _OPTIMIZER:
        raise marp.InvalidRecipeError(f"recipe.optimizer: unknown value {recipe.optimizer}", field="recipe.optimizer")
    if recipe.finetune not in _FINETUNE:
        raise marp.InvalidRecipeError(f"recipe.finetune: unknown value {recipe.finetune}", field="recipe.finetune")
    for name in ("lora_rank", "ep", "etp"):
        if getattr(recipe, name) < 0:
            raise marp.InvalidRecipeError(f"recipe.{name}: must be >= 0 (got {getattr(recipe, name)}; 0: the default)",
                                          field=f"recipe.{name}")  # fmt: skip
    if not 0.0 <= recipe.lora_dropout < 1.0:  # also refuses NaN
        raise marp.InvalidRecipeError(f"recipe.lora_dropout: must be in [0, 1) (got {recipe.lora_dropout})",
                                      field="recipe.lora_dropout")  # fmt: skip
    for name, choices in CHOICE_FIELDS.items():
        if getattr(recipe, name) not in ("", *choices):
            raise marp.InvalidRecipeError(f"recipe.{name}: must be one of {', '.join(choices)} (got "
                                          f"{getattr(recipe, name)!r}; empty: {CHOICE_DEFAULTS[name]})",
                                          field=f"recipe.{name}")  # fmt: skip
    max_gpus = limits.max_gpus if limits is not None and limits.max_gpus else None
    if limits is not None and limits.max_gpus < 0:
        raise marp.InvalidRecipeError(f"limits.max_gpus: must be >= 0 (got {limits.max_gpus})", field="limits.max_gpus")
    min_gpus = limits.min_gpus if limits is not None and limits.min_gpus else None
    if limits is not None and limits.min_gpus < 0:
        raise marp.InvalidRecipeError(f"limits.min_gpus: must be >= 0 (got {limits.min_gpus})", field="limits.min_gpus")
    if min_gpus is not None and max_gpus is not None and min_gpus > max_gpus:
        raise marp.InvalidRecipeError(f"limits.min_gpus: {min_gpus} is above limits.max_gpus {max_gpus}. "
                                      "To fix: set min_gpus <= max_gpus", field="limits.min_gpus")
    return marp.TrainingRecipe(
        seq_len=int(recipe.seq_len),
        global_batch=int(recipe.global_batch),
        micro_batch=int(recipe.micro_batch) if recipe.micro_batch else None,
        precision=_PRECISION[recipe.precision],
        optimizer=_OPTIMIZER[recipe.optimizer],
        allow_recompute=recipe.allow_recompute if recipe.HasField("allow_recompute") else True,
        flash_attention=recipe.flash_attention if recipe.HasField("flash_attention") else True,
        zero_stages=tuple(int(z) for z in recipe.zero_stages) or (0, 1, 2, 3),
        train_steps=int(recipe.train_steps) or 1000,
        max_gpus=max_gpus,
        min_gpus=min_gpus,
        finetune=_FINETUNE[recipe.finetune],  # type: ignore[arg-type]
        lora_rank=int(recipe.lora_rank) or DEFAULT_LORA_RANK,
        weight_decay=float(recipe.weight_decay) if recipe.HasField("weight_decay") else None,
        ep=int(recipe.ep) or 1,
        pp_layers=tuple(int(n) for n in recipe.pp_layers) or None,
        etp=int(recipe.etp) or None,
        lora_targets=tuple(recipe.lora_targets) or DEFAULT_LORA_TARGETS,
        compile=bool(recipe.compile),
        float8=bool(recipe.float8),
        lora_dropout=float(recipe.lora_dropout),
        **{name: getattr(recipe, name) or CHOICE_DEFAULTS[name] for name in CHOICE_FIELDS},
    )


def pools_from_proto(pools: list[types_pb2.GpuPool], allowed: list[str] | None = None) -> list[marp.GpuPool] | None:
    """GPU pools to plan for; validates GPU type names. None means the whole catalog."""
    allowed_names = {marp.get_gpu(a).name for a in allowed} if allowed else None
    if not pools:
        if allowed_names is None:
            return None
        return [marp.GpuPool(gpu_type=n, total_gpus=64, gpus_per_node=8) for n in sorted(allowed_names)]
    out = []
    for p in pools:
        name = marp.get_gpu(p.gpu_type).name
        if allowed_names is not None and name not in allowed_names:
            continue
        out.append(marp.GpuPool(gpu_type=name, total_gpus=int(p.total_gpus), gpus_per_node=int(p.gpus_per_node)))
    return out


def recipe_to_proto(recipe: marp.TrainingRecipe) -> types_pb2.TrainingRecipe:
    """The wire form of a recipe (the fields the TrainingRecipe proto carries)."""
    out = types_pb2.TrainingRecipe(
        seq_len=recipe.seq_len, global_batch=recipe.global_batch, micro_batch=recipe.micro_batch or 0,
        precision=PRECISION_BY_NAME[recipe.precision], optimizer=OPTIMIZER_BY_NAME[recipe.optimizer],
        allow_recompute=recipe.allow_recompute, flash_attention=recipe.flash_attention,
        train_steps=recipe.train_steps, zero_stages=list(recipe.zero_stages),
        finetune=FINETUNE_BY_NAME[recipe.finetune], lora_rank=recipe.lora_rank, ep=recipe.ep,
        pp_layers=list(recipe.pp_layers or ()), etp=recipe.etp or 0, lora_targets=list(recipe.lora_targets),
        compile=recipe.compile, float8=recipe.float8, lora_dropout=recipe.lora_dropout,
    )  # fmt: skip
    if recipe.weight_decay is not None:
        out.weight_decay = recipe.weight_decay
    for name, default in CHOICE_DEFAULTS.items():
        if getattr(recipe, name) != default:  # the default stays empty on the wire
            setattr(out, name, getattr(recipe, name))
    return out


def layout_to_proto(layout: marp.Layout) -> types_pb2.Layout:
    return types_pb2.Layout(tp=layout.tp, pp=layout.pp, dp=layout.dp, zero_stage=layout.zero_stage,
                            micro_batch=layout.micro_batch, grad_accum=layout.grad_accum, recompute=layout.recompute,
                            vpp=layout.vpp)  # fmt: skip


def memory_to_proto(mem: marp.MemoryBreakdown) -> types_pb2.MemoryBreakdown:
    return types_pb2.MemoryBreakdown(
        parameters=mem.parameters, gradients=mem.gradients, optimizer_states=mem.optimizer_states,
        activations=mem.activations, logits=mem.logits, runtime_reserve=mem.runtime_reserve, total=mem.total,
        buffers=mem.buffers, transient=mem.transient, fragmentation=mem.fragmentation,
        peak_allocated=mem.peak_allocated, reserved=mem.reserved, phase=mem.phase,
    )


def plan_to_proto(plan: marp.Plan) -> types_pb2.Plan:
    """The wire form of a plan; a mixed one (``plan.mixed``) carries its stages and shares too."""
    if plan.mixed is not None:
        return _mixed_to_proto(plan, plan.mixed)
    gpu = marp.get_gpu(plan.gpu_type)
    return types_pb2.Plan(
        gpu_type=plan.gpu_type, num_gpus=plan.num_gpus, layout=layout_to_proto(plan.layout),
        memory=memory_to_proto(plan.memory), peak_bytes_per_gpu=plan.memory.total,
        gpu_memory_bytes=gpu.memory_bytes, headroom_bytes=plan.headroom_bytes, step_time_s=plan.step_time_s,
        tokens_per_s=plan.tokens_per_s, gpu_hours=plan.gpu_hours, rank=plan.rank,
        completion_s=plan.completion_s or 0.0, explanation=plan.explanation or "",
    )


def _mixed_to_proto(plan: marp.Plan, lay: MixedLayout) -> types_pb2.Plan:
    """A mixed plan: ``gpu_type`` the types sorted and '+'-joined, ``memory`` / ``peak_bytes_per_gpu`` /
    ``gpu_memory_bytes`` the tightest rank's (``MixedLayout.tightest``), then every stage's shares."""
    tight = lay.tightest
    stages = [types_pb2.PlanStage(
        index=st.index, first_layer=st.first_layer, last_layer=st.last_layer, tp=st.tp,
        shares=[types_pb2.TypeShare(gpu_type=s.gpu_type, gpus=s.gpus, micro_batch=s.micro_batch,
                                    grad_accum=s.grad_accum, peak_bytes=s.peak_bytes) for s in st.shares],
    ) for st in lay.stages]  # fmt: skip
    return types_pb2.Plan(
        gpu_type=lay.type_key, num_gpus=lay.num_gpus, layout=layout_to_proto(plan.layout),
        memory=memory_to_proto(tight.memory), peak_bytes_per_gpu=tight.peak_bytes,
        gpu_memory_bytes=tight.gpu_memory_bytes, headroom_bytes=tight.headroom_bytes, step_time_s=plan.step_time_s,
        tokens_per_s=plan.tokens_per_s, gpu_hours=plan.gpu_hours, rank=plan.rank,
        completion_s=plan.completion_s or 0.0, explanation=plan.explanation or "",
        gpus_by_type=lay.gpus_by_type, kind=lay.kind, micro_batches=lay.micro_batches, stages=stages,
    )  # fmt: skip


def is_mixed(plan: types_pb2.Plan) -> bool:
    """A plan over several GPU types (it has stages)."""
    return len(plan.stages) > 0


def mixed_from_proto(plan: types_pb2.Plan) -> MixedLayout:
    """MARP's ``MixedLayout`` of a mixed wire plan (``plan_to_proto``'s inverse for what the wire
    keeps): stages, shares, the step time. What the wire does not carry comes back empty: each
    share's memory is its peak alone (as ``transient``), the micro-batch and busy seconds and the
    links' seconds 0. Raises ``marp.InvalidRecipeError`` for a plan without stages."""
    if not plan.stages:
        raise marp.InvalidRecipeError("plan.stages: not a mixed plan (no stages)", field="plan.stages")
    from marp.mixed import MixedLayout, MixedStage, TypeShare
    last = len(plan.stages) - 1
    stages = []
    for st in plan.stages:
        shares = tuple(TypeShare(
            gpu_type=s.gpu_type, gpus=s.gpus, micro_batch=s.micro_batch, grad_accum=s.grad_accum,
            memory=marp.MemoryBreakdown(0, 0, 0, 0, 0, 0, transient=int(s.peak_bytes)),
            gpu_memory_bytes=marp.get_gpu(s.gpu_type).memory_bytes, micro_batch_s=0.0, busy_s=0.0,
        ) for s in st.shares)  # fmt: skip
        stages.append(MixedStage(index=st.index, first_layer=st.first_layer, last_layer=st.last_layer, tp=st.tp,
                                 shares=shares, embeddings=st.index == 0, head=st.index == last))  # fmt: skip
    widths = {(st.tp, st.num_gpus) for st in stages}
    return MixedLayout(
        kind=plan.kind or ("pipeline" if len(stages) > 1 else "data"), stages=tuple(stages),
        zero_stage=plan.layout.zero_stage, recompute=plan.layout.recompute or "none",
        micro_batches=plan.micro_batches, link_s=(0.0,) * last, link_kind=("",) * last,
        step_time_s=plan.step_time_s, rectangular=len(widths) == 1,
    )  # fmt: skip
