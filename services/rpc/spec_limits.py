"""The bounds of ``frenzy.rpc.jobspec.JobEntry``, checked on the proto a server receives.

JobEntry bounds every field for the CLI, REST and the batch worker, but a gRPC
client sends a JobSpec (or a PredictRequest) straight, so the scheduler and the
predictor check the same bounds here (issue 14 items 8 and 10): a 3.9 MB name or
a seq_len of 2^62 is INVALID_ARGUMENT naming the field, never an overflow deep in
MARP or a listing too big for one message; an env setting a variable Frenzy sets
(``CUDA_VISIBLE_DEVICES``) is refused before the job is stored. Errors are ValueError('field: why').
"""

from __future__ import annotations

from frenzy.code.limits import SHA256_RE
from frenzy.rpc.jobspec import (
    ENV_KEY,
    MAX_BATCH,
    MAX_COMMAND_ENV_BYTES,
    MAX_GPU_TYPES,
    MAX_GPUS,
    MAX_MICRO_TOKENS,
    MAX_NAME_CHARS,
    MAX_OOM_RETRIES,
    MAX_PIPELINE_STAGES,
    MAX_PRIORITY,
    MAX_SEQ_LEN,
    MAX_SHORT_CHARS,
    MAX_STAGE_LAYERS,
    MAX_TRAIN_STEPS,
    MAX_WORKDIR_CHARS,
    MIN_PRIORITY,
    check_inline_config,
    check_reserved_env,
)
from frenzy.v1 import types_pb2
from marp.objectives import MAX_BUDGET_USD, MAX_DEADLINE_S

MAX_ZERO_STAGES = 8  # the planner knows stages 0-3; a few repeats are harmless
MAX_POOLS = 256
MAX_POOL_GPUS = 1 << 20
MAX_IDEMPOTENCY_KEY_CHARS = 200
MAX_PRICE = 1e6  # dollars per GPU-hour (has.cluster_spec's bound)


def check_recipe(recipe: types_pb2.TrainingRecipe, prefix: str = "recipe") -> None:
    """Integer fields inside the bounds MARP computes safely with (int64 byte counts)."""
    for field, bound in (("seq_len", MAX_SEQ_LEN), ("global_batch", MAX_BATCH), ("micro_batch", MAX_BATCH),
                         ("train_steps", MAX_TRAIN_STEPS)):
        value = getattr(recipe, field)
        if not 0 <= value <= bound:
            raise ValueError(f"{prefix}.{field}: out of range (got {value}; must be 0 to {bound})")
    if recipe.micro_batch * max(recipe.seq_len, 1) > MAX_MICRO_TOKENS:
        raise ValueError(f"{prefix}.micro_batch: micro_batch x seq_len is {recipe.micro_batch * recipe.seq_len} "
                         f"tokens; the limit is {MAX_MICRO_TOKENS}")
    if len(recipe.zero_stages) > MAX_ZERO_STAGES or any(not 0 <= z <= 3 for z in recipe.zero_stages):
        raise ValueError(f"{prefix}.zero_stages: at most {MAX_ZERO_STAGES} stages, each 0 to 3")
    if len(recipe.pp_layers) > MAX_PIPELINE_STAGES or any(not 0 <= n <= MAX_STAGE_LAYERS for n in recipe.pp_layers):
        raise ValueError(f"{prefix}.pp_layers: at most {MAX_PIPELINE_STAGES} stages, each 0 to {MAX_STAGE_LAYERS} "
                         "layers")
    if not 0 <= recipe.etp <= MAX_GPUS:
        raise ValueError(f"{prefix}.etp: out of range (got {recipe.etp}; must be 0 to {MAX_GPUS})")
    if len(recipe.lora_targets) > 7 or any(len(t) > 8 for t in recipe.lora_targets):
        raise ValueError(f"{prefix}.lora_targets: at most 7 of q, k, v, o, gate, up, down")


def check_model(model: types_pb2.ModelSpec, prefix: str = "model") -> None:
    if len(model.catalog_name) > MAX_SHORT_CHARS:
        raise ValueError(f"{prefix}.catalog_name: {len(model.catalog_name)} characters; the limit is {MAX_SHORT_CHARS}")
    if len(model.display_name) > MAX_SHORT_CHARS:
        raise ValueError(f"{prefix}.display_name: {len(model.display_name)} characters; the limit is {MAX_SHORT_CHARS}")
    if model.WhichOneof("source") == "config_json":
        try:
            check_inline_config(model.config_json)
        except ValueError as exc:
            raise ValueError(f"{prefix}.config_json: {exc}") from None


def check_limits(limits: types_pb2.JobLimits, prefix: str = "limits") -> None:
    if not 0 <= limits.max_gpus <= MAX_GPUS:
        raise ValueError(f"{prefix}.max_gpus: out of range (got {limits.max_gpus}; must be 0 to {MAX_GPUS})")
    if not 0 <= limits.min_gpus <= MAX_GPUS:
        raise ValueError(f"{prefix}.min_gpus: out of range (got {limits.min_gpus}; must be 0 to {MAX_GPUS})")
    if limits.min_gpus and limits.max_gpus and limits.min_gpus > limits.max_gpus:
        raise ValueError(f"{prefix}.min_gpus: {limits.min_gpus} is above max_gpus {limits.max_gpus}. "
                         "To fix: set min_gpus <= max_gpus")
    if len(limits.allowed_gpu_types) > MAX_GPU_TYPES:
        raise ValueError(f"{prefix}.allowed_gpu_types: {len(limits.allowed_gpu_types)} types; the limit is "
                         f"{MAX_GPU_TYPES}")
    if any(len(t) > MAX_SHORT_CHARS for t in limits.allowed_gpu_types):
        raise ValueError(f"{prefix}.allowed_gpu_types: a type longer than {MAX_SHORT_CHARS} characters")


def check_pools(pools: list[types_pb2.GpuPool]) -> None:
    if len(pools) > MAX_POOLS:
        raise ValueError(f"pools: {len(pools)} pools; the limit is {MAX_POOLS}")
    for i, pool in enumerate(pools):
        if len(pool.gpu_type) > MAX_SHORT_CHARS:
            raise ValueError(f"pools[{i}].gpu_type: longer than {MAX_SHORT_CHARS} characters")
        if not 0 <= pool.gpus_per_node <= pool.total_gpus <= MAX_POOL_GPUS:
            raise ValueError(f"pools[{i}]: need 0 <= gpus_per_node <= total_gpus <= {MAX_POOL_GPUS} "
                             f"(got {pool.gpus_per_node} per node, {pool.total_gpus} in all)")
        if not 0 <= pool.price_per_gpu_hour <= MAX_PRICE:  # also refuses NaN
            raise ValueError(f"pools[{i}].price_per_gpu_hour: must be 0..{MAX_PRICE:.0e} dollars "
                             f"(got {pool.price_per_gpu_hour})")


def check_goal(goal: types_pb2.JobGoal, where: str = "goal") -> None:
    """A job's objective and limits: a known objective, a deadline of 0 (none) to ten years, a budget
    of 0 (none) to 1e12 dollars."""
    if goal.objective not in types_pb2.Objective.values():
        raise ValueError(f"{where}.objective: unknown value {goal.objective}")
    if not 0 <= goal.deadline_s <= MAX_DEADLINE_S:
        raise ValueError(f"{where}.deadline_s: must be 0 (none) to {MAX_DEADLINE_S:.0f} seconds "
                         f"(got {goal.deadline_s})")
    if not 0 <= goal.budget_usd <= MAX_BUDGET_USD:
        raise ValueError(f"{where}.budget_usd: must be 0 (none) to {MAX_BUDGET_USD:.0e} dollars "
                         f"(got {goal.budget_usd})")


def check_spec(spec: types_pb2.JobSpec) -> None:
    """Every bound JobEntry has, on the JobSpec proto (field paths start with ``spec.``)."""
    if len(spec.name) > MAX_NAME_CHARS:
        raise ValueError(f"spec.name: {len(spec.name)} characters; the limit is {MAX_NAME_CHARS}")
    check_model(spec.model, "spec.model")
    check_recipe(spec.recipe, "spec.recipe")
    check_limits(spec.limits, "spec.limits")
    if spec.HasField("max_oom_retries") and not 0 <= spec.max_oom_retries <= MAX_OOM_RETRIES:
        raise ValueError(f"spec.max_oom_retries: {spec.max_oom_retries}; must be 0..{MAX_OOM_RETRIES}")
    check_goal(spec.goal, "spec.goal")
    if not MIN_PRIORITY <= spec.priority <= MAX_PRIORITY:
        raise ValueError(f"spec.priority: {spec.priority}; must be {MIN_PRIORITY}..{MAX_PRIORITY} (0: normal)")
    size = sum(len(a.encode()) + 1 for a in spec.command) + sum(
        len(k.encode()) + len(v.encode()) + 2 for k, v in spec.env.items())
    if size > MAX_COMMAND_ENV_BYTES:
        raise ValueError(f"spec.command: command plus env is {size} bytes; the limit is {MAX_COMMAND_ENV_BYTES} "
                         "bytes (64 KiB)")
    for key in spec.env:
        if ENV_KEY.fullmatch(key) is None:
            raise ValueError(f"spec.env: variable name {key[:64]!r} is not a shell name (letters, digits and _, "
                             "not starting with a digit, at most 256)")
    try:  # a gRPC client's env: refused here, not on a node after GPUs were reserved for it
        check_reserved_env(spec.env)
    except ValueError as exc:
        raise ValueError(f"spec.env: {exc}") from None
    if len(spec.workdir) > MAX_WORKDIR_CHARS:
        raise ValueError(f"spec.workdir: {len(spec.workdir)} characters; the limit is {MAX_WORKDIR_CHARS}")
    if len(spec.idempotency_key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise ValueError(f"spec.idempotency_key: longer than {MAX_IDEMPOTENCY_KEY_CHARS} characters")
    if spec.code_sha256 and SHA256_RE.fullmatch(spec.code_sha256) is None:
        raise ValueError("spec.code_sha256: not a sha256 (64 lowercase hex digits). To fix: let `frenzy submit` "
                         "or the SDK pack and upload the code")
    if spec.code_sha256 and spec.workdir:
        raise ValueError("spec.workdir: a job runs either in its packed code (code_sha256) or in a directory "
                         "on the nodes (workdir), not both. To fix: drop --workdir, or submit with --no-code")
