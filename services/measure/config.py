"""What one measured step is: ``MeasureConfig`` and the choices of each of its knobs.

Torch-free, so that the CLI can check its flags, ``compare`` can ask MARP about the step and
``oracle`` can list its cases without importing torch; ``step`` runs a config, ``precision``
and ``models`` build what it names.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES: tuple[str, ...] = ("fp32", "pure-bf16", "amp-bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adam", "sgd", "sgd-momentum")
# foreach: torch.optim's CUDA default; forloop: one parameter at a time (the CPU default, and
# transformers' own AdamW of the 2022 Trainer rows).
OPTIMIZER_IMPLS: tuple[str, ...] = ("foreach", "forloop")
ATTENTIONS: tuple[str, ...] = ("flash", "eager")
RECOMPUTES: tuple[str, ...] = ("none", "full")
GQA_MODES: tuple[str, ...] = ("repeat", "native")
# "transient": zero_grad() frees the gradients (set_to_none, PyTorch >= 2.0); "persistent": they are
# zeroed in place and stay allocated (PyTorch < 2.0's default, Megatron's contiguous buffer).
GRAD_BUFFERS: tuple[str, ...] = ("transient", "persistent")
# CUDACachingAllocator rounds every request up to kMinBlockSize = 512 bytes
# (c10/cuda/CUDACachingAllocator.cpp, round_size), and max_memory_allocated counts rounded sizes.
CUDA_ROUND_BYTES = 512


@dataclass(frozen=True)
class MeasureConfig:
    """One single-device training configuration (dp = tp = pp = 1, one micro-batch per step)."""

    seq_len: int
    micro_batch: int
    precision: str = "pure-bf16"
    optimizer: str = "adamw"
    attention: str = "flash"
    recompute: str = "none"
    gqa: str = "repeat"
    dropout: float = 0.0
    grad_buffer: str = "transient"
    optimizer_impl: str = "foreach"
    round_bytes: int = CUDA_ROUND_BYTES

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name, choices in (("precision", POLICIES), ("optimizer", OPTIMIZERS), ("attention", ATTENTIONS),
                              ("recompute", RECOMPUTES), ("gqa", GQA_MODES), ("grad_buffer", GRAD_BUFFERS),
                              ("optimizer_impl", OPTIMIZER_IMPLS)):  # fmt: skip
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a probability in [0, 1), got {self.dropout!r}")


__all__ = [
    "ATTENTIONS", "CUDA_ROUND_BYTES", "GQA_MODES", "GRAD_BUFFERS", "OPTIMIZERS", "OPTIMIZER_IMPLS", "POLICIES",
    "RECOMPUTES", "MeasureConfig",
]  # fmt: skip
