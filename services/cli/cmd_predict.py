"""`frenzy predict`: one layout's memory (single-layout mode) or the ranked plans, from MARP, no server.

Single-layout mode starts as soon as any layout flag is given (--dp --tp --pp --vpp --cp --zero
--sequence-parallel --stage --gpu): it always prints the prediction (a table; ``--json`` the JSON
object), also when the layout does not fit (``"fits": false``, then exit 3 with by how much and a
"To fix:" of changes checked with MARP, frenzy.cli.predict_fixes). Without layout flags the ranked
plans are printed; when no GPU type can hold the job, exit 3 names the limits to lift (checked too).
A mixed layout over several GPU types (issue 33, ``marp.mixed``) is given stage by stage,
``--stage GPUS:LAYERS[:tpK]`` in pipeline order; ranked mode with a cluster file of several types
also ranks mixed plans (``--mixed`` / ``--no-mixed``), one row each plus a per-type sub-table.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from frenzy.cli import render
from frenzy.cli.output import echo_json, fail
from frenzy.cli.predict_options import DEFAULT_MIN_SCALING_EFF, PredictArgs  # noqa: F401 - (read by the CLI tests)
from frenzy.cli.typed_options import options_command

if TYPE_CHECKING:  # annotations only; imported where it runs
    import marp

# MARP error fields -> the flag a user typed, so every message names the flag.
FLAG_OF_FIELD: dict[str, str] = {
    "model": "--model", "recipe.seq_len": "--seq-len", "recipe.global_batch": "--global-batch",
    "recipe.micro_batch": "--micro-batch", "recipe.precision": "--precision", "recipe.optimizer": "--optimizer",
    "recipe.optimizer_impl": "--optimizer-impl", "recipe.loss": "--loss", "recipe.dropout": "--dropout",
    "layout.tp": "--tp", "layout.pp": "--pp", "layout.dp": "--dp", "layout.cp": "--cp", "layout.vpp": "--vpp",
    "layout.zero_stage": "--zero", "layout.sp": "--sequence-parallel", "layout.recompute": "--recompute",
    "layout.grad_accum": "--global-batch", "layout.micro_batch": "--micro-batch", "layout.stage": "--stage",
    "gpu_type": "--gpu", "rank_by": "--rank-by", "recipe.finetune": "--finetune", "recipe.lora_rank": "--lora-rank",
    "recipe.weight_decay": "--weight-decay", "recipe.ep": "--ep", "layout.ep": "--ep",
    "recipe.pp_layers": "--pp-layers", "layout.pp_layers": "--pp-layers", "recipe.etp": "--etp",
    "layout.etp": "--etp", "recipe.lora_targets": "--lora-targets", "recipe.compile": "--compile",
    "recipe.float8": "--float8", "recipe.lora_dropout": "--lora-dropout",
    "recipe.lora_adapter_dtype": "--lora-adapter-dtype", "recipe.fsdp_reshard": "--fsdp-reshard",
    "recipe.qlora_backend": "--qlora-backend", "recipe.main_grad_dtype": "--main-grad-dtype",
    "layout.local_micro_batch": "--local-micro-batch",
}  # fmt: skip
SINGLE_PRECISIONS: dict[str, str] = {
    "fp32": "fp32", "amp-fp16": "amp-fp16", "amp-bf16": "amp-bf16", "master-fp16": "master-fp16",
    "master-bf16": "master-bf16", "bf16": "pure-bf16", "fsdp-bf16": "fsdp-bf16", "fp16": "master-fp16",
    "pure-bf16": "pure-bf16",
}  # fmt: skip
RECOMPUTE_CHOICES = ("none", "selective", "full", "op-sac")


PANEL = "Plan a job"


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(predict)


def _flag_error(exc: marp.MarpError) -> str:
    flag = FLAG_OF_FIELD.get(exc.field) or FLAG_OF_FIELD.get(exc.field.split(".")[0], "")
    if not flag and exc.field.startswith("model"):
        flag = "--model"
    return f"{flag}: {exc}" if flag else str(exc)


def _choice(value: str, flag: str, choices: tuple[str, ...] | list[str]) -> str:
    if value not in choices:
        fail(f"{flag}: must be one of {', '.join(choices)}, got {value!r}.", 2)
    return value


@options_command(PredictArgs)
def predict(ctx: typer.Context, a: PredictArgs) -> None:
    """Predict memory per GPU: for one layout, or the ranked plans over GPU types.

    Runs MARP locally; no server needed. Examples:

        frenzy predict --model llama-2-7b --seq-len 4096 --global-batch 64 --micro-batch 1

        frenzy predict --model llama-3-8b --seq-len 8192 --micro-batch 2 --precision fsdp-bf16 \\
            --dp 8 --tp 1 --pp 1 --zero 3 --recompute op-sac --gpu H100-80GB --json

        frenzy predict --model llama-3.1-8b --seq-len 4096 --global-batch 64 --objective cost \\
            --deadline 12h --budget 500 --cluster examples/cluster.yaml
    """
    # (the options checked: a mixed layout, one layout, or the ranked plans)
    stage_specs, stage_pick = _stage_args(a.stage, a.local_micro_batch, {
        "--dp": a.dp, "--tp": a.tp, "--pp": a.pp, "--vpp": a.vpp, "--cp": a.cp, "--gpu": a.gpu,
        "--sequence-parallel": a.sequence_parallel or None, "--mixed": a.mixed, "--min-scaling-eff": a.min_scaling_eff,
        "--gpu-type": a.gpu_types or None, "--max-gpus": a.max_gpus or None, **_goal_flags(a)})  # fmt: skip
    single = any(v is not None for v in (a.dp, a.tp, a.pp, a.vpp, a.cp, a.zero, stage_pick, a.gpu)) or a.sequence_parallel
    tuning = _recipe_tuning(a)
    pp = a.pp
    if tuning["pp_layers"] is not None and pp is None and single:
        per_rank = a.vpp or 1
        if len(tuning["pp_layers"]) % per_rank:
            fail(f"--pp-layers: {len(tuning['pp_layers'])} stages do not split into --vpp {per_rank} chunks per "
                 "pipeline rank.", 2)  # fmt: skip
        pp = len(tuning["pp_layers"]) // per_rank
    if a.inter_node_gbps is not None and not 0.0 < a.inter_node_gbps < 1e6:
        fail(f"--inter-node-gbps: must be a positive number of GB/s per GPU, got {a.inter_node_gbps}.", 2)
    if stage_specs:
        _mixed_layout(a.model, a.seq_len, a.global_batch, a.micro_batch, a.precision, a.optimizer, a.optimizer_impl,
                      a.train_steps, a.recompute or "none", a.flash, a.dropout, a.loss, 0 if a.zero is None else a.zero,
                      stage_specs, a.local_micro_batch or [], a.cluster, a.no_recompute, tuning, a.as_json,
                      a.inter_node_gbps)  # fmt: skip
        return
    if single:
        for flag, value in {"--mixed": a.mixed, "--min-scaling-eff": a.min_scaling_eff, **_goal_flags(a)}.items():
            if value is not None:
                fail(f"{flag}: ranks plans; it contradicts the single-layout flags (--dp/--tp/--pp/--gpu...).", 2)
        _single(a.model, a.seq_len, a.global_batch, a.micro_batch, a.precision, a.optimizer, a.optimizer_impl,
                a.train_steps, a.recompute or "none", a.flash, a.dropout, a.loss, a.dp or 1, a.tp or 1, pp or 1,
                a.vpp or 1, a.cp or 1, 0 if a.zero is None else a.zero, a.sequence_parallel, stage_pick or "max", a.gpu,
                a.cluster, a.gpu_types, a.max_gpus, a.no_recompute, tuning, a.as_json, a.inter_node_gbps)  # fmt: skip
        return
    _ranked(a, tuning)


def _goal_flags(a: PredictArgs) -> dict[str, str | None]:
    """The ranked-mode goal flags that were given (None: not given; --objective time is the default)."""
    return {"--objective": a.objective if a.objective != "time" else None, "--deadline": a.deadline,
            "--budget": a.budget}


def _goal(a: PredictArgs) -> marp.objectives.Goal:
    """--objective / --deadline / --budget (and the older --rank-by) as a Goal; exit 2 naming the flag."""
    import marp

    _choice(a.rank_by, "--rank-by", marp.plans.RANK_BY)
    _choice(a.objective, "--objective", marp.objectives.OBJECTIVES)
    objective = a.objective
    if a.rank_by == "gpu_hours":
        if objective not in ("time", "gpu-hours"):
            fail(f"--rank-by gpu_hours contradicts --objective {objective} (use --objective alone).", 2)
        objective = "gpu-hours"
    try:
        deadline = None if a.deadline is None else marp.objectives.parse_duration(a.deadline, "--deadline")
        budget = None if a.budget is None else marp.objectives.parse_budget(a.budget, "--budget")
    except marp.MarpError as exc:
        fail(str(exc), 2)
    return marp.objectives.Goal(objective, deadline, budget)


def _recipe_tuning(a: PredictArgs) -> dict[str, Any]:
    """The recipe flags checked (exit 2 naming the flag), as TrainingRecipe's tuning fields."""
    import marp

    if a.recompute is not None:
        _choice(a.recompute, "--recompute", RECOMPUTE_CHOICES)
    if a.attention is not None:
        _choice(a.attention, "--attention", ("flash", "eager"))
        if not a.flash and a.attention == "flash":
            fail("--attention: flash contradicts --no-flash.", 2)
        a.flash = a.attention == "flash"
    if a.optimizer_impl is not None:
        _choice(a.optimizer_impl, "--optimizer-impl", marp.recipe.OPTIMIZER_IMPLS)
    if a.loss is not None:
        _choice(a.loss, "--loss", marp.recipe.LOSSES)
    _choice(a.finetune, "--finetune", marp.recipe.FINETUNES)
    if a.lora_rank < 1:
        fail(f"--lora-rank: must be >= 1, got {a.lora_rank}.", 2)
    if not 0.0 <= a.lora_dropout < 1.0:  # also refuses NaN
        fail(f"--lora-dropout: must be in [0, 1), got {a.lora_dropout}.", 2)
    _choice(a.lora_adapter_dtype, "--lora-adapter-dtype", marp.recipe.LORA_ADAPTER_DTYPES)
    _choice(a.fsdp_reshard, "--fsdp-reshard", marp.recipe.FSDP_RESHARDS)
    _choice(a.qlora_backend, "--qlora-backend", marp.recipe.QLORA_BACKENDS)
    _choice(a.main_grad_dtype, "--main-grad-dtype", marp.recipe.MAIN_GRAD_DTYPES)
    if a.ep < 1:
        fail(f"--ep: must be >= 1, got {a.ep}.", 2)
    if a.weight_decay is not None and not 0.0 <= a.weight_decay < 1000.0:
        fail(f"--weight-decay: must be in [0, 1000), got {a.weight_decay}.", 2)
    split = _split(a.pp_layers)
    if a.etp is not None and a.etp < 1:
        fail(f"--etp: must be >= 1, got {a.etp}.", 2)
    tuning: dict[str, Any] = {"finetune": a.finetune, "lora_rank": a.lora_rank, "weight_decay": a.weight_decay,
                              "ep": a.ep, "pp_layers": split, "etp": a.etp, "compile": a.compiled, "float8": a.float8,
                              "lora_dropout": a.lora_dropout, "lora_adapter_dtype": a.lora_adapter_dtype,
                              "fsdp_reshard": a.fsdp_reshard, "qlora_backend": a.qlora_backend,
                              "main_grad_dtype": a.main_grad_dtype}  # fmt: skip
    if a.lora_targets is not None:
        tuning["lora_targets"] = _targets(a.lora_targets)
    return tuning


def _ranked(a: PredictArgs, tuning: dict[str, Any]) -> None:
    """Ranked mode: through the predictor's job-spec path where it has a field for every flag, else MARP
    directly; both priced, and dropped / ordered by the goal."""
    import marp

    goal = _goal(a)
    if not a.global_batch:
        fail("--global-batch: global_batch must be >= 1; it is required without layout flags (the ranked plans "
             "need it).", 2)
    allow_recompute = not a.no_recompute and a.recompute != "none"
    if a.min_scaling_eff is not None and not 0.0 <= a.min_scaling_eff <= 1.0:
        fail(f"--min-scaling-eff: must be in [0, 1], got {a.min_scaling_eff}.", 2)
    try:
        pools = _pools(a.cluster, a.gpu_types)
        prices = _prices(a.cluster)
    except (marp.MarpError, ValueError) as exc:
        fail(_flag_error(exc) if isinstance(exc, marp.MarpError) else str(exc), 2)
    # The predictor service's pools carry no link speed: a cluster file that declares one (and the
    # flags the service has no field for) are planned here, with MARP directly.
    links = any(p.inter_node_gbps is not None for p in pools or [])
    # Mixed plans: on by default with a cluster file of several GPU types (small pools may hold together
    # what none holds alone); planned with MARP directly (the predictor service has no field for them).
    mixed = a.mixed if a.mixed is not None else a.cluster is not None and len({p.gpu_type for p in pools or []}) >= 2
    legacy = (not mixed and a.inter_node_gbps is None and a.min_scaling_eff is None and not links
              and a.precision in ("fp32", "fp16", "bf16") and a.optimizer in ("adamw", "adam", "sgd")
              and a.optimizer_impl is None and a.loss is None and a.dropout is None and goal.is_default)  # fmt: skip
    if legacy:
        _ranked_via_predictor(a, allow_recompute, tuning, prices)
        return
    _ranked_direct(a, tuning, allow_recompute, pools, mixed, goal, prices)


def _ranked_direct(a: PredictArgs, tuning: dict[str, Any], allow_recompute: bool, pools: list[marp.GpuPool] | None,
                   mixed: bool, goal: marp.objectives.Goal, prices: dict[str, float]) -> None:  # fmt: skip
    """Ranked mode with MARP directly (the flags and the plans the predictor service has no field for:
    link speeds, the ranking's knobs, mixed plans, a goal), priced, then dropped and ordered by the goal."""
    import marp
    from frenzy.cli import predict_fixes

    rank_by = "gpu_hours" if goal.objective == "gpu-hours" else "time"
    ranking: dict[str, Any] = {} if a.min_scaling_eff is None else {"min_scaling_eff": a.min_scaling_eff}
    if not goal.is_default:
        ranking["max_plans"] = None  # a goal drops and orders every plan: none is cut before it
    try:
        spec = marp.resolve_model(a.model)
        recipe = marp.TrainingRecipe(
            seq_len=a.seq_len, global_batch=a.global_batch, micro_batch=a.micro_batch or None,
            precision=a.precision, optimizer=a.optimizer, optimizer_impl=a.optimizer_impl,  # type: ignore[arg-type]
            loss=a.loss, dropout=a.dropout, allow_recompute=allow_recompute, flash_attention=a.flash,  # type: ignore[arg-type]
            train_steps=a.train_steps, max_gpus=a.max_gpus or None, **tuning,  # type: ignore[arg-type]
        )  # fmt: skip
        plan_set = marp.enumerate_plans(spec, recipe, pools, rank_by=rank_by, inter_node_gbps=a.inter_node_gbps,
                                        mixed=mixed, **ranking)  # fmt: skip
    except (marp.MarpError, ValueError) as exc:
        fail(_flag_error(exc) if isinstance(exc, marp.MarpError) else str(exc), 2)
    kept = marp.objectives.apply_goal(plan_set.plans, goal, prices)
    if a.as_json:
        echo_json([_plan_json(p, prices) for p in kept.plans])
        for d in kept.dropped:  # stdout stays the JSON list
            render.console(stderr=True).print(f"[yellow]dropped[/] {d.reason}")
    else:
        _print_ranked(spec.name, spec.param_count(), [_plan_proto(p, label=True, prices=prices) for p in kept.plans],
                      plan_set.rejected, a, goal.describe(), [d.reason for d in kept.dropped])  # fmt: skip
        _print_mixed(kept.plans[:a.top])
    if plan_set.plans and not kept.plans:
        fail(marp.objectives.unmet_text(kept.dropped, goal, "--deadline", "--budget"), 3)
    if not plan_set.plans:
        def attempt(ov: dict[str, Any]) -> str | None:
            again = marp.enumerate_plans(
                spec, replace(recipe, **_recipe_overrides(ov)), None if ov.get("all_gpu_types") else pools,
                rank_by=rank_by, inter_node_gbps=a.inter_node_gbps, **ranking)  # fmt: skip
            return _marp_plan_text(again.plans[0]) if again.plans else None

        found = predict_fixes.ranked_fixes(
            attempt, restricted_types=_restricting_flag(a.cluster, a.gpu_types), max_gpus=a.max_gpus,
            micro_batch=a.micro_batch, recompute_forbidden=not allow_recompute, seq_len=a.seq_len)  # fmt: skip
        fail(_no_plan_text(plan_set.rejected, a.as_json) + predict_fixes.ranked_fix_text(found), 3)


def _stage_args(stage: list[str] | None, local: list[str] | None, others: dict[str, Any]) -> tuple[list[str], str | None]:
    """--stage's two meanings: (the GPUS:LAYERS[:tpK] stages of a mixed layout, the single layout's
    first | last | max); a mixed layout refuses the flags of ``others`` that are set (not None)."""
    specs = [s for s in stage or [] if ":" in s or re.match(r"\s*\d+\s*[xX]", s)]
    if specs and len(specs) != len(stage or []):
        fail("--stage: give either one of first | last | max (single layout) or GPUS:LAYERS[:tpK] stages, "
             f"not both (got {', '.join(stage or [])}).", 2)  # fmt: skip
    if not specs and stage is not None and len(stage) > 1:
        fail("--stage: first | last | max is given once (repeat --stage only for GPUS:LAYERS[:tpK] stages).", 2)
    if local and not specs:
        fail("--local-micro-batch: sets a GPU type's micro batch in a mixed layout; give the --stage "
             "GPUS:LAYERS[:tpK] stages too.", 2)  # fmt: skip
    for flag, value in others.items() if specs else ():
        if value is not None:
            fail(f"{flag}: contradicts the --stage GPUS:LAYERS[:tpK] stages (a mixed layout is one layout).", 2)
    return specs, (stage[0] if stage and not specs else None)


def _plan_json(p: marp.Plan, prices: dict[str, float]) -> dict[str, Any]:
    """A ranked plan in --json: the predictor's dialect (with cost_usd), runtime_s, gpus_by_type, and a mixed
    plan's stages."""
    entry = {**render.to_dict(_plan_proto(p, prices=prices)), "gpus_by_type": p.gpus_by_type,
             "explanation": p.explanation, "completion_s": p.completion_s, "runtime_s": p.completion_s}  # fmt: skip
    if p.mixed is not None:
        entry["mixed"] = p.mixed.to_dict()
    return entry


def _plan_proto(p: marp.Plan, label: bool = False, prices: dict[str, float] | None = None) -> Any:
    """The plan as the predictor's proto (render.plan_table and the JSON dialect read it), priced at
    ``prices`` (cost_usd). A mixed plan's ``gpu_type`` is its '+'-joined types (``label``: ``4x A100-80GB
    + 16x L4``, for the table), its memory the tightest rank's, its GPU memory that rank's type's."""
    import marp
    from frenzy.rpc import convert
    from frenzy.v1 import types_pb2

    cost = marp.objectives.plan_cost(p, prices) if prices is not None else 0.0
    if p.mixed is None:
        proto = convert.plan_to_proto(p)
        proto.cost_usd = cost
        return proto
    tight = p.mixed.tightest
    return types_pb2.Plan(
        gpu_type=p.label if label else p.gpu_type, num_gpus=p.num_gpus, layout=convert.layout_to_proto(p.layout),
        memory=convert.memory_to_proto(p.memory), peak_bytes_per_gpu=p.memory.total,
        gpu_memory_bytes=tight.gpu_memory_bytes, headroom_bytes=p.headroom_bytes, step_time_s=p.step_time_s,
        tokens_per_s=p.tokens_per_s, gpu_hours=p.gpu_hours, rank=p.rank, completion_s=p.completion_s,
        explanation=p.explanation, cost_usd=cost,
    )  # fmt: skip


def _print_mixed(plans: list[marp.Plan], limit: int = 3) -> None:
    """A sub-table per mixed plan shown (the first ``limit``): per GPU type its GPUs, layers or micro
    batch, peak GiB and share of the step."""
    from frenzy.cli import predict_fixes

    con = render.console()
    for p in [p for p in plans if p.mixed is not None][:limit]:
        con.print(predict_fixes.mixed_table(p.mixed.to_dict(), title=f"#{p.rank} {p.label}"))


def _no_plan_text(rejected: list[str], as_json: bool) -> str:
    """The error's first line: why each GPU type was rejected (the table printed them already)."""
    if as_json and rejected:
        return "no GPU type can hold this job: " + " | ".join(rejected) + "\n"
    return "no GPU type can hold this job" + (" (the 'no fit' lines above say why).\n" if rejected else ".\n")


def _recipe_overrides(ov: dict[str, Any]) -> dict[str, Any]:
    """ranked_fixes' overrides as TrainingRecipe fields (0: the planner's choice / no limit)."""
    out: dict[str, Any] = {}
    if "max_gpus" in ov:
        out["max_gpus"] = ov["max_gpus"] or None
    if "micro_batch" in ov:
        out["micro_batch"] = ov["micro_batch"] or None
    if "allow_recompute" in ov:
        out["allow_recompute"] = ov["allow_recompute"]
    if "seq_len" in ov:
        out["seq_len"] = ov["seq_len"]
    return out


def _restricting_flag(cluster: Path | None, gpu_types: list[str] | None) -> str | None:
    if cluster is not None:
        return "--cluster"
    return "--gpu-type" if gpu_types else None


def _marp_plan_text(p: marp.Plan) -> str:
    from frenzy.cli import predict_fixes

    lay = p.layout
    return predict_fixes.plan_text(p.gpu_type, lay.num_gpus, lay.tp, lay.pp, lay.dp, lay.zero_stage,
                                   lay.micro_batch, lay.recompute)  # fmt: skip


def _targets(text: str) -> tuple[str, ...]:
    """--lora-targets q,v -> ("q", "v"), each a linear MARP knows, each once."""
    import marp

    targets = tuple(t.strip() for t in text.split(","))
    unknown = [t for t in targets if t not in marp.recipe.LORA_TARGETS]
    if unknown or not targets or len(set(targets)) != len(targets):
        fail(f"--lora-targets: give distinct names from {','.join(marp.recipe.LORA_TARGETS)}, got {text!r}.", 2)
    return targets


def _split(text: str | None) -> tuple[int, ...] | None:
    """--pp-layers 2,4,4,2 -> (2, 4, 4, 2); MARP checks the counts against the model and layout."""
    if text is None:
        return None
    try:
        split = tuple(int(n) for n in text.split(","))
    except ValueError:
        fail(f"--pp-layers: {text!r} is not comma-separated layer counts (e.g. 2,4,4,2).", 2)
    if any(n < 0 for n in split) or sum(split) < 1:
        fail(f"--pp-layers: layer counts must be >= 0 with at least one layer, got {text!r}.", 2)
    return split


def _pools(cluster: Path | None, gpu_types: list[str] | None) -> list[marp.GpuPool] | None:
    import marp

    if cluster is not None:
        from frenzy.devstack.stack import load_cluster_file

        cspec = load_cluster_file(str(cluster))
        per: dict[str, list[int]] = {}
        links: dict[str, float] = {}  # the slowest inter-node link a GPU type's groups declare
        pcie: set[str] = set()  # types some group of which declares a PCIe node
        for g in cspec.groups:
            name = marp.get_gpu(g.gpu).name
            tot, pn = per.get(name, [0, 0])
            per[name] = [tot + g.count * g.gpus_per_node, max(pn, g.gpus_per_node)]
            if g.inter_node_gbps is not None:
                links[name] = min(links.get(name, g.inter_node_gbps), g.inter_node_gbps)
            if g.intra_node_link == "pcie":
                pcie.add(name)
        pools = [marp.GpuPool(k, v[0], v[1], links.get(k), "pcie" if k in pcie else None) for k, v in per.items()]
        if gpu_types:
            allowed = {marp.get_gpu(t).name for t in gpu_types}
            pools = [p for p in pools if p.gpu_type in allowed]
        return pools
    if gpu_types:
        return [marp.GpuPool(marp.get_gpu(t).name, marp.plans.DEFAULT_MAX_GPUS, marp.plans.DEFAULT_GPUS_PER_NODE)
                for t in gpu_types]  # fmt: skip
    return None


def _prices(cluster: Path | None) -> dict[str, float]:
    """GPU type -> dollars per GPU-hour: the catalog's list prices, the cluster file's
    ``price_per_gpu_hour`` over them (the highest where groups of one type differ)."""
    import marp

    if cluster is None:
        return marp.objectives.price_table()
    from frenzy.devstack.stack import load_cluster_file

    own = load_cluster_file(str(cluster)).price_overrides()
    return marp.objectives.price_table({marp.get_gpu(t).name: v for t, v in own.items()})


def _mixed_layout(
    model: str, seq_len: int, global_batch: int, micro_batch: int, precision: str, optimizer: str,
    optimizer_impl: str | None, train_steps: int, recompute: str, flash: bool, dropout: float | None,
    loss: str | None, zero: int, specs: list[str], local: list[str], cluster: Path | None, no_recompute: bool,
    tuning: dict[str, Any], as_json: bool, inter_node_gbps: float | None,
) -> None:  # fmt: skip
    """``--stage GPUS:LAYERS[:tpK]`` ...: one layout over several GPU types (marp.mixed.evaluate_stages):
    every stage's memory per type and the step time; exit 3 when a rank does not fit."""
    import marp
    from frenzy.cli import predict_fixes
    from marp.mixed import evaluate_stages

    if no_recompute and recompute != "none":
        fail(f"--no-recompute contradicts --recompute {recompute}.", 2)
    if micro_batch < 0:
        fail(f"--micro-batch: must be >= 1, got {micro_batch}.", 2)
    if precision not in SINGLE_PRECISIONS:
        fail(f"--precision: must be one of {', '.join(k for k in SINGLE_PRECISIONS if k != 'pure-bf16')}, "
             f"got {precision!r}.", 2)  # fmt: skip
    if zero not in (0, 1, 2, 3):
        fail(f"--zero: must be 0, 1, 2 or 3, got {zero}.", 2)
    stages = [_parse_stage(text, i) for i, text in enumerate(specs)]
    local_mb = _parse_local(local)
    mb = micro_batch or 1
    try:
        names = {marp.get_gpu(n).name for st in stages for n, _ in st.groups}
    except marp.MarpError as exc:
        fail(f"--stage: {exc}", 2)
    try:
        per_type = {marp.get_gpu(k).name: v for k, v in local_mb.items()}
    except marp.MarpError as exc:
        fail(f"--local-micro-batch: {exc}", 2)
    links = None
    if cluster is not None:
        pools = _pools(cluster, None) or []
        have = {p.gpu_type: p for p in pools}
        missing = sorted(names - set(have))
        if missing:
            fail(f"--stage: {', '.join(missing)} is not in the cluster file {cluster}.", 2)
        used: dict[str, int] = {}
        for st in stages:
            for n, c in st.groups:
                used[marp.get_gpu(n).name] = used.get(marp.get_gpu(n).name, 0) + c
        over = [f"{n} {c} > {have[n].total_gpus}" for n, c in used.items() if c > have[n].total_gpus]
        if over:
            fail(f"--stage: the stages use more GPUs than {cluster} has ({'; '.join(over)}).", 2)
        links = {p.gpu_type: marp.mixed.PoolLinks(p.gpus_per_node, p.inter_node_gbps, p.intra_node_link)
                 for p in pools}  # fmt: skip
    first = stages[0]
    gb = global_batch or sum((c // max(first.tp, 1)) * per_type.get(marp.get_gpu(n).name, mb) for n, c in first.groups)
    try:
        spec = marp.resolve_model(model)
        recipe = marp.TrainingRecipe(
            seq_len=seq_len, global_batch=gb, micro_batch=mb, precision=SINGLE_PRECISIONS[precision],  # type: ignore[arg-type]
            optimizer=optimizer, optimizer_impl=optimizer_impl, loss=loss, dropout=dropout,  # type: ignore[arg-type]
            flash_attention=flash, train_steps=train_steps, **tuning,
        )  # fmt: skip
        lay = evaluate_stages(spec, recipe, stages, local_micro_batch=per_type, zero_stage=zero, recompute=recompute,
                              links=links, inter_node_gbps=inter_node_gbps)  # fmt: skip
    except marp.MarpError as exc:
        fail(_flag_error(exc), 2)
    over = [(st.index, s) for st in lay.stages for s in st.shares if s.peak_bytes > s.gpu_memory_bytes]
    out = {"fits": not over, "model": spec.name, "parameters": spec.param_count(), "recipe": recipe.to_dict(),
           "tokens_per_s": recipe.tokens_per_step / lay.step_time_s, **lay.to_dict()}  # fmt: skip
    if as_json:
        echo_json(out)
    else:
        con = render.console()
        con.print(f"[bold]{spec.name}[/] ({spec.param_count() / 1e9:.2f} B parameters) on {lay.label}: "
                  f"{len(lay.stages)} stage(s), ZeRO {zero}, recompute {recompute}, {lay.micro_batches} micro-batches; "
                  f"seq {seq_len}, global batch {gb}")  # fmt: skip
        con.print(predict_fixes.mixed_table(out, title="Stages (pipeline order)", by_type=False))
        con.print(predict_fixes.mixed_table(out, title="By GPU type"))
    if over:
        lines = "; ".join(f"stage {i} on {s.gpu_type}: {predict_fixes.over_text(s.peak_bytes, marp.get_gpu(s.gpu_type))}"
                          for i, s in over)  # fmt: skip
        fail(f"{lines}.\nTo fix: move layers off that stage (--stage ...:LAYERS), raise its tp (:tpK) or width, "
             "lower its --local-micro-batch, or use --recompute full / --zero 1.", 3)


def _parse_stage(text: str, index: int) -> Any:
    """``4xA100-80GB:24[:tp2]`` or ``12xV100-16GB+4xT4:24:tp2`` -> marp.mixed.StageRequest."""
    from marp.mixed import StageRequest

    parts = text.split(":")
    example = "e.g. 4xA100-80GB:24, 12xV100-16GB+4xT4:24:tp2"
    if len(parts) not in (2, 3):
        fail(f"--stage: {text!r} (stage {index}) is not GPUS:LAYERS[:tpK] ({example}).", 2)
    groups = []
    for g in parts[0].split("+"):
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\S+)\s*", g)
        if not m or int(m.group(1)) < 1:
            fail(f"--stage: {g!r} in {text!r} (stage {index}) is not NxTYPE with N >= 1 ({example}).", 2)
        groups.append((m.group(2), int(m.group(1))))
    if not parts[1].strip().isdigit() or int(parts[1]) < 1:
        fail(f"--stage: LAYERS {parts[1]!r} in {text!r} (stage {index}) must be a whole number >= 1 ({example}).", 2)
    tp = 1
    if len(parts) == 3:
        m = re.fullmatch(r"tp(\d+)", parts[2].strip())
        if not m or int(m.group(1)) < 1:
            fail(f"--stage: {parts[2]!r} in {text!r} (stage {index}) must be tpK with K >= 1 ({example}).", 2)
        tp = int(m.group(1))
    return StageRequest(layers=int(parts[1]), groups=tuple(groups), tp=tp)


def _parse_local(items: list[str]) -> dict[str, int]:
    """``--local-micro-batch T4=2`` (repeated) -> {"T4": 2}."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            fail(f"--local-micro-batch: {item!r} is not TYPE=N with N >= 1 (e.g. T4=2).", 2)
        if name.strip() in out:
            fail(f"--local-micro-batch: {name.strip()} is given twice.", 2)
        out[name.strip()] = int(value)
    return out


def _single(
    model: str, seq_len: int, global_batch: int, micro_batch: int, precision: str, optimizer: str,
    optimizer_impl: str | None, train_steps: int, recompute: str, flash: bool, dropout: float | None,
    loss: str | None, dp: int, tp: int, pp: int, vpp: int, cp: int, zero: int, sp: bool, stage: str,
    gpu: str | None, cluster: Path | None, gpu_types: list[str] | None, max_gpus: int, no_recompute: bool,
    tuning: dict[str, Any], as_json: bool = False, inter_node_gbps: float | None = None,
) -> None:  # fmt: skip
    import marp
    from frenzy.cli import predict_fixes

    for value, flag in ((cluster, "--cluster"), (gpu_types, "--gpu-type"), (max_gpus, "--max-gpus")):
        if value:
            fail(f"{flag}: plans for many layouts; it contradicts the single-layout flags (--dp/--tp/--pp/--gpu...).",
                 2)  # fmt: skip
    if no_recompute and recompute != "none":
        fail(f"--no-recompute contradicts --recompute {recompute}.", 2)
    if gpu is None:
        fail("--gpu: required in single-layout mode (the GPU type decides whether the layout fits).", 2)
    if micro_batch <= 0:
        fail(f"--micro-batch: must be >= 1 in single-layout mode, got {micro_batch}.", 2)
    _choice(stage, "--stage", ("first", "last", "max"))
    if precision not in SINGLE_PRECISIONS:
        fail(f"--precision: must be one of {', '.join(k for k in SINGLE_PRECISIONS if k != 'pure-bf16')}, "
             f"got {precision!r}.", 2)  # fmt: skip
    for value, flag in ((dp, "--dp"), (tp, "--tp"), (pp, "--pp"), (vpp, "--vpp"), (cp, "--cp")):
        if value < 1:
            fail(f"{flag}: must be >= 1, got {value}.", 2)
    if zero not in (0, 1, 2, 3):
        fail(f"--zero: must be 0, 1, 2 or 3, got {zero}.", 2)
    gb = global_batch or dp * micro_batch
    if gb < 1 or gb % (dp * micro_batch):
        fail(f"--global-batch: {gb} is not a multiple of dp x micro batch = {dp * micro_batch}.", 2)
    try:
        spec = marp.resolve_model(model)
        gpu_type = marp.get_gpu(gpu)
        recipe = marp.TrainingRecipe(
            seq_len=seq_len, global_batch=gb, micro_batch=micro_batch,
            precision=SINGLE_PRECISIONS[precision],  # type: ignore[arg-type]
            optimizer=optimizer, optimizer_impl=optimizer_impl, loss=loss, dropout=dropout,  # type: ignore[arg-type]
            flash_attention=flash, train_steps=train_steps, **tuning,
        )  # fmt: skip
        layout = marp.Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero, micro_batch=micro_batch,
                             grad_accum=gb // (dp * micro_batch), recompute=recompute,  # type: ignore[arg-type]
                             sp=sp, cp=cp, vpp=vpp, ep=tuning["ep"], pp_layers=tuning["pp_layers"],
                             etp=tuning["etp"])  # fmt: skip
        mem = marp.predict_memory(spec, recipe, layout, gpu_type, stage=stage)
        step = marp.estimate_step_time(spec, recipe, layout, gpu_type, inter_node_gbps=inter_node_gbps,
                                       fp8=recipe.float8, compiled=recipe.compile)  # fmt: skip
    except marp.MarpError as exc:
        fail(_flag_error(exc), 2)
    prediction = prediction_dict(spec, recipe, layout, gpu_type, mem, step, stage)
    fixes: list[predict_fixes.Fix] = []
    if not prediction["fits"]:
        fixes = predict_fixes.single_fixes(spec, recipe, layout, gpu_type, stage, bool(global_batch),
                                           inter_node_gbps)  # fmt: skip
    # The prediction comes first, also when it does not fit, so the breakdown shows what to shrink.
    if as_json:
        echo_json({**prediction, "fixes": [f.to_dict() for f in fixes]})
    else:
        render.console().print(predict_fixes.single_table(prediction))
    if not prediction["fits"]:
        # The exit code is the README's 3; the error and its "To fix:" go to stderr (stdout stays JSON).
        fail(predict_fixes.single_fix_text(mem.device, gpu_type, fixes), 3)


def prediction_dict(
    spec: marp.ModelSpec, recipe: marp.TrainingRecipe, layout: marp.Layout, gpu: marp.GpuType,
    mem: marp.MemoryBreakdown, step_s: float, stage: str,
) -> dict[str, Any]:  # fmt: skip
    """The single-layout JSON object (a stable contract, see docs/marp.md)."""
    breakdown = {k: v for k, v in mem.to_dict().items() if k not in ("total", "peak_allocated", "reserved", "phase")}
    return {
        "fits": mem.device <= gpu.memory_bytes,
        "peak_allocated_bytes": mem.peak_allocated,
        "reserved_bytes": mem.reserved,
        "device_bytes": mem.device,
        "gpu_memory_bytes": gpu.memory_bytes,
        "headroom_bytes": gpu.memory_bytes - mem.device,
        "phase": mem.phase,
        "stage": stage,
        "breakdown": breakdown,
        "gpu": gpu.name,
        "model": spec.name,
        "parameters": spec.param_count(),
        "layout": layout.to_dict(),
        "recipe": recipe.to_dict(),
        "step_time_s": step_s,
        "tokens_per_s": recipe.tokens_per_step / step_s if step_s > 0 else 0.0,
    }


def _print_ranked(name: str, n_params: int, plans: list, rejected: list[str], a: PredictArgs, order: str,
                  dropped: list[str]) -> None:  # fmt: skip
    """The plan table (``order``: the goal's words), the best plan's memory, and why each GPU type that
    holds no plan and each plan the goal dropped is not there."""
    import time

    con = render.console()
    con.print(f"[bold]{name}[/]: {n_params / 1e9:.3f} B parameters; "
              f"seq {a.seq_len}, global batch {a.global_batch}, {a.precision}, {a.optimizer}")
    if plans:
        con.print(render.plan_table(plans, title=f"Ranked plans ({order}; {len(plans)} fit)", chosen=plans[0],
                                    limit=a.top, now=time.time()))  # fmt: skip
        con.print(render.memory_table(plans[0]))
    for line in rejected:
        con.print(f"[yellow]no fit[/] {line}")
    for line in dropped[:a.top]:
        con.print(f"[yellow]dropped[/] {line}")
    if len(dropped) > a.top:
        con.print(f"[yellow]dropped[/] ... and {len(dropped) - a.top} more plans (--top shows more)")


def _ranked_via_predictor(a: PredictArgs, recompute: bool, tuning: dict[str, Any], prices: dict[str, float]) -> None:
    """The job-spec path (same validation and JSON as the predictor service), the pools at ``prices``."""

    import marp
    from frenzy.cli import predict_fixes
    from frenzy.predictor.planning import predict as run_predict
    from frenzy.rpc.jobspec import JobSpecError, parse_entry
    from frenzy.v1 import predictor_pb2, types_pb2

    model, seq_len, global_batch, micro_batch, cluster = a.model, a.seq_len, a.global_batch, a.micro_batch, a.cluster
    gpu_types, max_gpus = a.gpu_types, a.max_gpus

    def request(ov: dict[str, Any]) -> predictor_pb2.PredictResponse:
        """The predictor's answer, with ranked_fixes' overrides (none: the user's job)."""
        entry = parse_entry({"model": model, "seq_len": ov.get("seq_len", seq_len), "global_batch": global_batch,
                             "micro_batch": ov.get("micro_batch", micro_batch), "precision": a.precision,
                             "optimizer": a.optimizer, "train_steps": a.train_steps,
                             "allow_recompute": ov.get("allow_recompute", recompute), "flash_attention": a.flash,
                             "command": ["-"], "max_gpus": ov.get("max_gpus", max_gpus),
                             "gpu_types": [] if ov.get("all_gpu_types") else gpu_types or [],
                             **{k: list(v) if isinstance(v, tuple) else v for k, v in tuning.items() if v is not None}})
        spec = entry.to_proto()
        pools = []
        if cluster is not None and not ov.get("all_gpu_types"):
            pools = [types_pb2.GpuPool(gpu_type=p.gpu_type, total_gpus=p.total_gpus, gpus_per_node=p.gpus_per_node,
                                       price_per_gpu_hour=prices.get(p.gpu_type, 0.0))
                     for p in (_pools(cluster, None) or [])]  # fmt: skip
        return run_predict(predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits,
                                                        pools=pools))

    try:
        resp = request({})
    except (JobSpecError, marp.MarpError, ValueError) as exc:
        fail(_flag_error(exc) if isinstance(exc, marp.MarpError) else str(exc), 2)
    if a.as_json:
        echo_json([{**render.to_dict(p), "gpus_by_type": {p.gpu_type: p.num_gpus}, "runtime_s": p.completion_s}
                   for p in resp.plans])  # fmt: skip
    else:
        _print_ranked(resp.model_name, resp.parameter_count, list(resp.plans), list(resp.rejected), a,
                      "fastest completion first", [])  # fmt: skip
    if not resp.plans:
        def attempt(ov: dict[str, Any]) -> str | None:
            try:
                plans = request(ov).plans
            except JobSpecError:
                return None
            if not plans:
                return None
            p, lay = plans[0], plans[0].layout
            return predict_fixes.plan_text(p.gpu_type, p.num_gpus, lay.tp, lay.pp, lay.dp, lay.zero_stage,
                                           lay.micro_batch, lay.recompute)  # fmt: skip

        found = predict_fixes.ranked_fixes(
            attempt, restricted_types=_restricting_flag(cluster, gpu_types), max_gpus=max_gpus,
            micro_batch=micro_batch, recompute_forbidden=not recompute, seq_len=seq_len)  # fmt: skip
        fail(_no_plan_text(list(resp.rejected), a.as_json) + predict_fixes.ranked_fix_text(found), 3)

__all__ = ["prediction_dict", "predict", "register"]
