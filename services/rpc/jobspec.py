"""A job as people write it (CLI flags, a batch YAML entry, a REST body) -> the JobSpec proto.

One pydantic model validates every path, so `frenzy submit`, `frenzy batch`,
the REST gateway and the Celery worker reject the same bad input with the same
message ("global_batch: Input should be greater than 0"). Every field has an
upper bound, so no entry can overflow a proto integer, fill a gRPC message or
Redis (issue 14 items 8 and 10). An env that sets a variable Frenzy sets for every
job (``CUDA_VISIBLE_DEVICES``, ``FRENZY_*``, the rendezvous: ``frenzy.agent.jobenv.RESERVED``)
is refused here too, before anything is written, not on a node after GPUs were reserved.
Deeper checks (does the batch divide) are the predictor's, behind the gRPC API;
``unknown_model`` lets a client refuse a model name before packing and uploading its code.

A `model` that names a file is a client convenience: ``to_proto`` reads it
only where the caller allows (the CLI); the API server never opens a path.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from frenzy.agent import jobenv
from frenzy.rpc.convert import (
    CHOICE_DEFAULTS,
    DEFAULT_LORA_RANK,
    DEFAULT_LORA_TARGETS,
    FINETUNE_BY_NAME,
    OBJECTIVE_BY_NAME,
    OPTIMIZER_BY_NAME,
    PRECISION_BY_NAME,
)
from frenzy.v1 import types_pb2

# Limits: generous for any real training run, small enough that one job fits comfortably in a gRPC
# message (4 MiB) and a listing of many jobs still does.
MAX_NAME_CHARS = 256
MAX_COMMAND_ENV_BYTES = 64 * 1024  # the command's arguments plus the env's keys and values, UTF-8
MAX_MODEL_CONFIG_BYTES = 1024 * 1024  # an inline config.json (or the file the CLI reads)
MAX_JSON_DEPTH = 64  # nesting of an inline model config; real config.json files use 3 or 4
MAX_SEQ_LEN = 1 << 20  # 1 Mi tokens
MAX_BATCH = 1 << 24  # global and micro batch
MAX_MICRO_TOKENS = 1 << 24  # micro_batch x seq_len: keeps MARP's byte counts far inside int64
MAX_TRAIN_STEPS = 10**9
MAX_GPUS = 1 << 20
MAX_GPU_TYPES = 64
MAX_LORA_RANK = 1 << 16  # adapters far past any real rank (r <= 256 in the LoRA / QLoRA papers)
MAX_WEIGHT_DECAY = 1000.0  # marp.TrainingRecipe's bound
MAX_PIPELINE_STAGES = 1024  # marp.recipe.MAX_PIPELINE_STAGES: entries of pp_layers
MAX_STAGE_LAYERS = 1 << 16  # layers of one pipeline stage (real models: at most a few hundred in all)
MAX_SHORT_CHARS = 256  # idempotency key, catalog name, GPU type
MAX_WORKDIR_CHARS = 4096  # PATH_MAX
MAX_OOM_RETRIES = 10  # re-plans after out-of-memory exits; each one is a whole new attempt
# Scheduling priority: a small symmetric range, like nice(1)'s -20..19 but wide enough for a few
# named classes (say -50 batch, 0 normal, 50 urgent) with room between them.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
_INT_BOUNDS = {"seq_len": MAX_SEQ_LEN, "global_batch": MAX_BATCH, "micro_batch": MAX_BATCH,
               "train_steps": MAX_TRAIN_STEPS, "max_gpus": MAX_GPUS, "min_gpus": MAX_GPUS, "lora_rank": MAX_LORA_RANK, "ep": MAX_GPUS,
               "etp": MAX_GPUS, "priority": MAX_PRIORITY}
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
CATALOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,255}")


class JobSpecError(ValueError):
    """Bad job description; the message names the field."""


def _utf8(value: str) -> str:
    """JSON can carry lone surrogates ("\\ud800") and NUL bytes: neither survives a proto string or exec."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid UTF-8 text (lone surrogate)") from None
    if "\x00" in value:
        raise ValueError("contains a NUL character")
    return value


Text = Annotated[str, AfterValidator(_utf8)]


def json_depth(value: object) -> int:
    """Nesting depth of parsed JSON, without recursion (a hostile document can be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((c, depth + 1) for c in children)
    return deepest


def check_inline_config(text: str) -> None:
    """An inline model config: at most 1 MiB, one JSON object, nested at most MAX_JSON_DEPTH deep."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_MODEL_CONFIG_BYTES:
        raise ValueError(f"inline config is {size} bytes; the limit is {MAX_MODEL_CONFIG_BYTES} bytes (1 MiB)")
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"inline config is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal with too many digits
        raise ValueError(f"inline config is not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"inline config must be a JSON object, got {type(data).__name__}")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise ValueError(f"inline config is nested deeper than {MAX_JSON_DEPTH} levels")


def looks_like_path(ref: str) -> bool:
    """Not a catalog name and not inline JSON: what a server must refuse rather than open."""
    ref = ref.strip()
    return not ref.startswith("{") and (CATALOG_NAME.fullmatch(ref) is None or ref.lower().endswith(".json"))


class JobEntry(BaseModel):
    """One job: the model and recipe (never GPUs), plus the command to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text = Field(default="", max_length=MAX_NAME_CHARS)
    model: Text = Field(description="catalog name (frenzy models) or the config as a JSON object; the CLI "
                                    "also takes a path to a config.json, which it reads and sends inline")
    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN)
    global_batch: int = Field(gt=0, le=MAX_BATCH)
    micro_batch: int = Field(default=0, ge=0, le=MAX_BATCH, description="0: the planner chooses")
    precision: Literal["fp32", "fp16", "bf16", "amp-fp16", "amp-bf16", "master-fp16", "master-bf16", "pure-bf16",
                       "fsdp-bf16"] = "bf16"
    optimizer: Literal["adamw", "adam", "sgd", "sgd-momentum", "adam8bit"] = "adamw"
    train_steps: int = Field(default=1000, gt=0, le=MAX_TRAIN_STEPS)
    allow_recompute: bool = True
    flash_attention: bool = True
    finetune: Literal["full", "lora", "qlora"] = "full"
    lora_rank: int = Field(default=DEFAULT_LORA_RANK, gt=0, le=MAX_LORA_RANK,
                           description="rank of the LoRA / QLoRA adapters")
    weight_decay: float | None = Field(default=None, ge=0.0, lt=MAX_WEIGHT_DECAY, allow_inf_nan=False,
                                       description="unset: the optimizer's own default (AdamW 0.01, others 0)")
    ep: int = Field(default=1, gt=0, le=MAX_GPUS, description="expert-parallel degree (mixture-of-experts models)")
    pp_layers: list[Annotated[int, Field(ge=0, le=MAX_STAGE_LAYERS)]] = Field(
        default_factory=list, max_length=MAX_PIPELINE_STAGES,
        description="layers of each (virtual) pipeline stage, e.g. [2, 4, 4, 2] or \"2,4,4,2\"; empty: an even split")
    etp: int | None = Field(default=None, gt=0, le=MAX_GPUS,
                            description="expert-tensor-parallel degree (mixture-of-experts models); unset: tp")
    lora_targets: list[Literal["q", "k", "v", "o", "gate", "up", "down"]] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS), min_length=1, max_length=7,
        description="linears that carry LoRA / QLoRA adapters, e.g. [\"q\", \"v\"] or \"q,k,v,o,gate,up,down\"")
    compile: bool = Field(default=False, description="the model runs under torch.compile")
    float8: bool = Field(default=False, description="float8 linears (GPUs with fp8 tensor cores only)")
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, allow_inf_nan=False,
                                description="peft's lora_dropout on the LoRA / QLoRA adapters' inputs (0: none)")
    lora_adapter_dtype: Literal["fp32", "compute"] = Field(
        default="fp32", description="dtype of the LoRA / QLoRA adapters: fp32 (peft's default) or compute (the "
                                    "base's, torchtune); matters under pure-bf16")
    fsdp_reshard: Literal["keep-last", "all"] = Field(
        default="keep-last", description="FSDP2 blocks resharded after their forward: keep-last (torchtitan) or "
                                         "all (torchtune)")
    qlora_backend: Literal["bitsandbytes", "torchao"] = Field(
        default="bitsandbytes", description="QLoRA's NF4 base: bitsandbytes (peft; constants whole on every "
                                            "FSDP / ZeRO-3 rank) or torchao (torchtune; sharded)")
    main_grad_dtype: Literal["fp32", "half"] = Field(
        default="fp32", description="Megatron's main-grad buffer under precision fp16 / bf16 (master weights): "
                                    "fp32, or half (the parameters' dtype, Megatron --fp16's default)")
    command: list[Text] = Field(min_length=1)
    env: dict[Text, Text] = Field(default_factory=dict)
    workdir: Text = Field(default="", max_length=MAX_WORKDIR_CHARS)
    max_gpus: int = Field(default=0, ge=0, le=MAX_GPUS)
    min_gpus: int = Field(default=0, ge=0, le=MAX_GPUS, description="at least this many GPUs (0: no minimum)")
    gpu_types: list[Annotated[Text, Field(max_length=MAX_SHORT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_GPU_TYPES)
    idempotency_key: Text = Field(default="", max_length=MAX_SHORT_CHARS)
    max_oom_retries: int | None = Field(default=None, ge=0, le=MAX_OOM_RETRIES,
                                        description="re-plans after out-of-memory exits; unset: 2")
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY,
                          description="scheduling priority, -100..100 (0: normal; higher starts first). Raising it "
                                      "above the scheduler's --max-user-priority (default 0) needs an admin token")
    resumable: bool = Field(default=False, description="the command saves checkpoints and resumes from the latest "
                                                       "when started again: the scheduler may stop it once for much "
                                                       "shorter jobs and start it again later")
    objective: Literal["time", "cost", "gpu-hours"] = Field(
        default="time", description="what the plan minimises among those that fit: time (completion), cost "
                                    "(dollars: GPUs x price per GPU-hour x runtime) or gpu-hours (docs/cost.md)")
    deadline: float | str | None = Field(
        default=None, description="the job must finish within this long of its submission: a duration with a "
                                  "unit (12h, 90m, 1h30m, 2d) or a number of seconds; plans that cannot are dropped")
    budget: float | str | None = Field(
        default=None, description="dollars the job may cost at most (its plan's GPUs x price per GPU-hour x "
                                  "runtime), e.g. 250 or \"$250\"; plans that cost more are dropped")

    @field_validator("model", mode="before")
    @classmethod
    def _inline_object(cls, v: object) -> object:
        # REST and YAML may give the config as an object; it travels as JSON text.
        if isinstance(v, dict):
            try:
                if json_depth(v) > MAX_JSON_DEPTH:
                    raise ValueError(f"inline config is nested deeper than {MAX_JSON_DEPTH} levels")
                return json.dumps(v)
            except (TypeError, RecursionError):
                raise ValueError("inline config is not a JSON object") from None
        return v

    @field_validator("model")
    @classmethod
    def _model_size(cls, v: str) -> str:
        if v.strip().startswith("{"):
            check_inline_config(v.strip())
        elif not v.strip():
            raise ValueError("give a catalog name (see `frenzy models`) or the config as a JSON object")
        elif len(v) > MAX_WORKDIR_CHARS:
            raise ValueError(f"a name or path of {len(v)} characters; the limit is {MAX_WORKDIR_CHARS}")
        return v

    @field_validator("seq_len", "global_batch", "micro_batch", "train_steps", "max_gpus", "min_gpus", "lora_rank", "ep",
                     "etp", "priority", mode="before")
    @classmethod
    def _no_float_overflow(cls, v: object, info: ValidationInfo) -> object:
        # 1e23 arrives as a float; name the bound rather than pydantic's "unable to parse".
        if isinstance(v, float) and not abs(v) < 2**53:
            raise ValueError(f"out of range: at most {_INT_BOUNDS[info.field_name or '']}")
        return v

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_seconds(cls, v: object) -> float | None:
        from marp.errors import MarpError
        from marp.objectives import parse_duration

        try:
            return None if v is None else parse_duration(v)
        except MarpError as exc:
            raise ValueError(exc.problem) from None

    @field_validator("budget", mode="before")
    @classmethod
    def _budget_dollars(cls, v: object) -> float | None:
        from marp.errors import MarpError
        from marp.objectives import parse_budget

        try:
            return None if v is None else parse_budget(v)
        except MarpError as exc:
            raise ValueError(exc.problem) from None

    @field_validator("pp_layers", mode="before")
    @classmethod
    def _split_text(cls, v: object) -> object:
        # A YAML entry or a flag may write the split as "2,4,4,2".
        if isinstance(v, str):
            if len(v) > 8 * MAX_PIPELINE_STAGES:
                raise ValueError(f"more than {8 * MAX_PIPELINE_STAGES} characters")
            try:
                return [int(n) for n in v.split(",")] if v.strip() else []
            except ValueError:
                raise ValueError(f"{v[:64]!r} is not comma-separated layer counts (e.g. 2,4,4,2)") from None
        return v

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _targets_text(cls, v: object) -> object:
        if isinstance(v, str):
            return [t.strip() for t in v[:256].split(",")]
        return v

    @field_validator("lora_targets")
    @classmethod
    def _distinct_targets(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"each linear at most once, got {','.join(v)}")
        return v

    @field_validator("pp_layers")
    @classmethod
    def _split_has_layers(cls, v: list[int]) -> list[int]:
        if v and sum(v) < 1:
            raise ValueError("the split places no layer; give the layers of each pipeline stage, e.g. 2,4,4,2")
        return v

    @field_validator("micro_batch")
    @classmethod
    def _micro_tokens(cls, v: int, info: ValidationInfo) -> int:
        seq_len = info.data.get("seq_len") or 1
        if v * seq_len > MAX_MICRO_TOKENS:
            raise ValueError(f"micro_batch x seq_len is {v * seq_len} tokens; the limit is {MAX_MICRO_TOKENS}")
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, v: object) -> object:
        if isinstance(v, str):
            import shlex

            if len(v) > MAX_COMMAND_ENV_BYTES:  # before shlex, which is slow on megabytes
                raise ValueError(f"more than {MAX_COMMAND_ENV_BYTES} bytes")
            try:
                return shlex.split(v)
            except ValueError as exc:  # "No closing quotation"
                raise ValueError(f"cannot split into arguments: {exc}") from None
        return v

    @field_validator("command")
    @classmethod
    def _command_size(cls, v: list[str]) -> list[str]:
        _check_command_env_size(v, {})
        return v

    @field_validator("env")
    @classmethod
    def _env_keys_and_size(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key in v:
            if ENV_KEY.fullmatch(key) is None:
                raise ValueError(f"variable name {key[:64]!r} is not a shell name (letters, digits and _, "
                                 "not starting with a digit, at most 256)")
        check_reserved_env(v)
        _check_command_env_size(info.data.get("command") or [], v)
        return v

    def to_proto(self, read_model_files: bool = True) -> types_pb2.JobSpec:
        """The JobSpec. ``read_model_files``: a `model` naming a local config.json is read and sent inline
        (the CLI); without it (a server) anything that looks like a path is refused unopened, with the
        same answer whether or not the file exists."""
        model = types_pb2.ModelSpec()
        ref = self.model.strip()
        if ref.startswith("{"):
            model.config_json = ref
        elif not read_model_files and looks_like_path(ref):
            raise JobSpecError(
                "model: looks like a file path; the server never reads files. Give a catalog name "
                "(see `frenzy models`) or the config itself as a JSON object (the CLI reads a path for you)")
        elif read_model_files and os.path.isfile(ref):
            model.config_json = _read_config_file(ref)
            model.display_name = os.path.splitext(os.path.basename(ref))[0][:MAX_SHORT_CHARS]
        elif read_model_files and looks_like_path(ref):
            # Not a catalog name (it has a path's characters or ends in .json): a file that is not there.
            what = "is a directory" if os.path.isdir(ref) else "file not found"
            raise JobSpecError(f"model: {what}: {ref!r} (relative to {os.getcwd()}). To fix: give the path of an "
                               "existing config.json (Hugging Face style, e.g. examples/models/qwen2.5-0.5b-config.json), "
                               "a catalog name (see `frenzy models`) or the config as a JSON object")
        else:
            model.catalog_name = ref
        recipe = types_pb2.TrainingRecipe(
            seq_len=self.seq_len, global_batch=self.global_batch, micro_batch=self.micro_batch,
            precision=PRECISION_BY_NAME[self.precision], optimizer=OPTIMIZER_BY_NAME[self.optimizer],
            train_steps=self.train_steps, allow_recompute=self.allow_recompute, flash_attention=self.flash_attention,
            finetune=FINETUNE_BY_NAME[self.finetune], lora_rank=self.lora_rank, ep=self.ep,
            pp_layers=self.pp_layers, etp=self.etp or 0, lora_targets=self.lora_targets, compile=self.compile,
            float8=self.float8, lora_dropout=self.lora_dropout,
        )
        if self.weight_decay is not None:
            recipe.weight_decay = self.weight_decay
        for name, default in CHOICE_DEFAULTS.items():
            if getattr(self, name) != default:  # the default stays empty on the wire
                setattr(recipe, name, getattr(self, name))
        spec = types_pb2.JobSpec(
            name=self.name, model=model, recipe=recipe, command=self.command, env=self.env, workdir=self.workdir,
            limits=types_pb2.JobLimits(max_gpus=self.max_gpus, min_gpus=self.min_gpus,
                                       allowed_gpu_types=self.gpu_types),
            idempotency_key=self.idempotency_key,
            max_oom_retries=self.max_oom_retries,
            priority=self.priority,
            resumable=self.resumable,
        )
        if self.objective != "time" or self.deadline is not None or self.budget is not None:
            spec.goal.CopyFrom(types_pb2.JobGoal(objective=OBJECTIVE_BY_NAME[self.objective],
                                                 deadline_s=float(self.deadline or 0.0),
                                                 budget_usd=float(self.budget or 0.0)))
        return spec


def check_reserved_env(env: Iterable[str]) -> None:
    """Refuse a job env naming a variable Frenzy sets for every job (ValueError naming it and why).

    The agent sets them to the GPUs and rendezvous the scheduler gave the job; a job that set
    ``CUDA_VISIBLE_DEVICES`` itself would run on GPUs another job holds. One list, the agent's."""
    reserved = jobenv.reserved_in(dict.fromkeys(env, ""))
    if reserved:
        names = ", ".join(reserved[:5]) + (f" (+{len(reserved) - 5} more)" if len(reserved) > 5 else "")
        raise ValueError(
            f"{names}: set by Frenzy for every job (the GPUs and rendezvous the scheduler gave it); a job may not "
            f"set {'it' if len(reserved) == 1 else 'them'}. Reserved: {jobenv.reserved_names_text()}. To fix: drop "
            f"{'it' if len(reserved) == 1 else 'them'} from the env (the job reads the values Frenzy sets)")


def unknown_model(model: types_pb2.ModelSpec) -> str | None:
    """Why ``model`` names no model this client's MARP knows (``"unknown model 'x'. Did you mean ...? To
    fix: ..."``), or None. A client's check before it packs and uploads code: the catalog is MARP's,
    compiled in, and the config is parsed the way the predictor parses it. (A client older than the
    scheduler may not know a model added since; the same release on both sides agrees.)"""
    import marp
    from marp.model_catalog import find_model, suggest_models

    which = model.WhichOneof("source")
    if which == "catalog_name":
        if find_model(model.catalog_name) is not None:
            return None
        close = suggest_models(model.catalog_name, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return (f"unknown model {model.catalog_name!r}.{hint} To fix: give a catalog name (`frenzy models` lists "
                "them), the path of a config.json, or the config as inline JSON")
    if which == "config_json":
        try:
            marp.model_from_json(model.config_json, name=model.display_name or "custom")
        except marp.MarpError as exc:
            return str(exc)
    return None


def _check_command_env_size(command: list[str], env: dict[str, str]) -> None:
    size = sum(len(a.encode()) + 1 for a in command) + sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
    if size > MAX_COMMAND_ENV_BYTES:
        raise ValueError(f"command plus env: {size} bytes; the limit is {MAX_COMMAND_ENV_BYTES} bytes (64 KiB)")


def _read_config_file(path: str) -> str:
    """A local config.json, read on the client: at most MAX_MODEL_CONFIG_BYTES, checked like inline JSON."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_MODEL_CONFIG_BYTES + 1)
        text = raw.decode("utf-8")
        check_inline_config(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise JobSpecError(f"model: cannot read config file {path!r}: {exc}") from exc
    return text


def parse_entry(data: object) -> JobEntry:
    """Validate one job description; raises JobSpecError naming the field."""
    try:
        return JobEntry.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<job>"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = str(err.get("msg")).removeprefix("Value error, ")[:500]
        raise JobSpecError(f"{loc}: {msg}{more}") from exc
    except RecursionError:  # a document nested thousands deep
        raise JobSpecError(f"<job>: nested deeper than {MAX_JSON_DEPTH} levels") from None
