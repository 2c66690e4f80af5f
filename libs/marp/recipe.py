"""What the user asks for (``TrainingRecipe``) and how one job is laid out (``Layout``).

The recipe never names GPUs: it is the batch, sequence length, precision,
optimizer and the freedoms the planner may use (recomputation, ZeRO stages,
a GPU cap). A layout is one concrete way to run it: tensor (tp), pipeline (pp)
and data (dp) parallel degrees, ZeRO stage, micro-batch, gradient accumulation
and activation recomputation. Both are validated on construction, so an invalid
one cannot exist (as torchtitan's ParallelDims does for its degrees).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from marp._check import check_bool, check_choice, check_int
from marp.errors import InvalidLayoutError, InvalidRecipeError

Precision = Literal["fp32", "fp16", "bf16"]
Optimizer = Literal["adamw", "adam", "sgd"]
Recompute = Literal["none", "full"]

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adam", "sgd")
RECOMPUTE: tuple[str, ...] = ("none", "full")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


@dataclass(frozen=True)
class TrainingRecipe:
    """A training job as the user describes it.

    ``precision`` fp16 / bf16 means mixed precision with fp32 master weights (Micikevicius
    et al. 2018; Megatron / DeepSpeed style: half-precision working weights and grads).
    ``optimizer`` "sgd" is SGD with momentum. ``micro_batch`` None lets the planner choose
    among the powers of two (up to 16) that divide ``global_batch``.
    """

    seq_len: int
    global_batch: int
    micro_batch: int | None = None
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    allow_recompute: bool = True
    flash_attention: bool = True
    zero_stages: tuple[int, ...] = ZERO_STAGES
    train_steps: int = 1000
    max_gpus: int | None = None

    def __post_init__(self) -> None:
        err = InvalidRecipeError
        check_int(self.seq_len, "recipe.seq_len", err, fix="use a positive sequence length in tokens.")
        check_int(self.global_batch, "recipe.global_batch", err,
                  fix="use a positive number of sequences per optimizer step.")  # fmt: skip
        if self.micro_batch is not None:
            check_int(self.micro_batch, "recipe.micro_batch", err)
            if self.global_batch % self.micro_batch:
                raise err(
                    "recipe.micro_batch",
                    f"global batch {self.global_batch} is not divisible by micro batch {self.micro_batch}.",
                    "choose a micro batch that divides the global batch, or leave it unset.",
                )
        check_choice(self.precision, "recipe.precision", err, PRECISIONS)
        check_choice(self.optimizer, "recipe.optimizer", err, OPTIMIZERS)
        check_bool(self.allow_recompute, "recipe.allow_recompute", err)
        check_bool(self.flash_attention, "recipe.flash_attention", err)
        stages = self.zero_stages
        if isinstance(stages, list):  # JSON gives lists; keep the dataclass hashable
            object.__setattr__(self, "zero_stages", tuple(stages))
            stages = self.zero_stages
        if (
            not isinstance(stages, tuple)
            or not stages
            or any(isinstance(s, bool) or s not in ZERO_STAGES for s in stages)
            or len(set(stages)) != len(stages)
        ):
            raise err(
                "recipe.zero_stages",
                f"must be a non-empty tuple of distinct stages from 0-3, got {stages!r}.",
            )
        check_int(self.train_steps, "recipe.train_steps", err)
        if self.max_gpus is not None:
            check_int(self.max_gpus, "recipe.max_gpus", err)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len, "global_batch": self.global_batch, "micro_batch": self.micro_batch,
            "precision": self.precision, "optimizer": self.optimizer,
            "allow_recompute": self.allow_recompute, "flash_attention": self.flash_attention,
            "zero_stages": list(self.zero_stages), "train_steps": self.train_steps,
            "max_gpus": self.max_gpus,
        }  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """One parallel layout of a job on ``tp * pp * dp`` GPUs.

    ``zero_stage`` shards model states over the dp group (Rajbhandari et al. 2020):
    1 optimizer states, 2 also gradients, 3 also parameters (FSDP FULL_SHARD).
    ``recompute`` "full" checkpoints every transformer layer (Chen et al. 2016).
    """

    tp: int
    pp: int
    dp: int
    zero_stage: int
    micro_batch: int
    grad_accum: int
    recompute: Recompute = "none"

    def __post_init__(self) -> None:
        err = InvalidLayoutError
        for attr in ("tp", "pp", "dp", "micro_batch", "grad_accum"):
            check_int(getattr(self, attr), f"layout.{attr}", err)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise err("layout.zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage!r}.")
        check_choice(self.recompute, "layout.recompute", err, RECOMPUTE)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def samples_per_step(self) -> int:
        """Sequences per optimizer step = dp x micro_batch x grad_accum."""
        return self.dp * self.micro_batch * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "zero_stage": self.zero_stage,
            "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "recompute": self.recompute, "num_gpus": self.num_gpus,
        }  # fmt: skip


__all__ = ["OPTIMIZERS", "PRECISIONS", "RECOMPUTE", "ZERO_STAGES", "Layout", "TrainingRecipe"]
