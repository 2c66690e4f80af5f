"""A job as people write it (CLI flags, a batch YAML entry) -> the JobSpec proto.

One pydantic model validates both paths, so `frenzy submit`, `frenzy batch`
and the Celery worker reject the same bad input with the same message
("global_batch: Input should be greater than 0"). Deeper checks (is the model
known, does the batch divide) are the predictor's, behind the gRPC API.
"""

from __future__ import annotations

import json
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from frenzy.rpc.convert import OPTIMIZER_BY_NAME, PRECISION_BY_NAME
from frenzy.v1 import types_pb2


class JobSpecError(ValueError):
    """Bad job description; the message names the field."""


class JobEntry(BaseModel):
    """One job: the model and recipe (never GPUs), plus the command to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    model: str = Field(description="catalog name (frenzy models), path to a config.json, or inline JSON")
    seq_len: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    micro_batch: int = Field(default=0, ge=0, description="0: the planner chooses")
    precision: Literal["fp32", "fp16", "bf16", "amp-fp16", "amp-bf16", "master-fp16", "master-bf16", "pure-bf16",
                       "fsdp-bf16"] = "bf16"
    optimizer: Literal["adamw", "adam", "sgd", "sgd-momentum", "adam8bit"] = "adamw"
    train_steps: int = Field(default=1000, gt=0)
    allow_recompute: bool = True
    flash_attention: bool = True
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = ""
    max_gpus: int = Field(default=0, ge=0)
    gpu_types: list[str] = Field(default_factory=list)
    idempotency_key: str = ""

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, v: object) -> object:
        if isinstance(v, str):
            import shlex

            return shlex.split(v)
        return v

    def to_proto(self) -> types_pb2.JobSpec:
        model = types_pb2.ModelSpec()
        ref = self.model.strip()
        if ref.startswith("{"):
            model.config_json = ref
        elif os.path.isfile(ref):
            try:
                with open(ref, encoding="utf-8") as fh:
                    text = fh.read()
                json.loads(text)
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise JobSpecError(f"model: cannot read config file {ref!r}: {exc}") from exc
            model.config_json = text
            model.display_name = os.path.splitext(os.path.basename(ref))[0]
        else:
            model.catalog_name = ref
        recipe = types_pb2.TrainingRecipe(
            seq_len=self.seq_len, global_batch=self.global_batch, micro_batch=self.micro_batch,
            precision=PRECISION_BY_NAME[self.precision], optimizer=OPTIMIZER_BY_NAME[self.optimizer],
            train_steps=self.train_steps, allow_recompute=self.allow_recompute, flash_attention=self.flash_attention,
        )
        return types_pb2.JobSpec(
            name=self.name, model=model, recipe=recipe, command=self.command, env=self.env, workdir=self.workdir,
            limits=types_pb2.JobLimits(max_gpus=self.max_gpus, allowed_gpu_types=self.gpu_types),
            idempotency_key=self.idempotency_key,
        )


def parse_entry(data: object) -> JobEntry:
    """Validate one job description; raises JobSpecError naming the field."""
    try:
        return JobEntry.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<job>"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise JobSpecError(f"{loc}: {err.get('msg')}{more}") from exc
