"""What one measured step is: ``MeasureConfig`` and the choices of each of its knobs.

Torch-free, so that the CLI can check its flags, ``compare`` can ask MARP about the step and
``oracle`` can list its cases without importing torch; ``step`` runs a config, ``precision``
and ``models`` build what it names.
"""

from __future__ import annotations

from dataclasses import dataclass

from marp import ModelSpec
from marp.choices import FSDP_RESHARDS, LORA_ADAPTER_DTYPES

# fsdp-bf16: FSDP2's MixedPrecisionPolicy (fp32 sharded parameters, bf16 all-gathered copies for
# compute, fp32 gradient reduce-scatter); multi-GPU oracle only, with dp x cp > 1.
POLICIES: tuple[str, ...] = ("fp32", "pure-bf16", "amp-bf16", "fsdp-bf16")
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


FINETUNES: tuple[str, ...] = ("full", "lora")
LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class ParallelConfig:
    """The multi-GPU layout one measured step runs under, on ``dp * tp * cp`` simulated ranks.

    dp x cp shard the model states (FSDP2 ``fully_shard`` over the flattened dp x cp mesh, as
    torchtitan's dp_shard_cp), tp is DTensor tensor parallelism (Megatron-style column / row
    splits, with sequence parallelism: the norms' activations split by sequence), cp splits the
    sequence (ring attention). ``finetune`` "lora" trains peft LoRA adapters of rank
    ``lora_rank`` on ``lora_targets`` with the base frozen, ``lora_dropout`` on their inputs.
    ``fsdp_reshard`` "keep-last" keeps the last block gathered after its forward (torchtitan),
    "all" reshards every block (torchtune's shard_model). ``lora_adapter_dtype`` "fp32" leaves
    peft's adapters in fp32 (get_peft_model's autocast_adapter_dtype=True, peft's default);
    "compute" keeps them in the model's parameter dtype (autocast_adapter_dtype=False, or a
    torchtune model built in bf16), as ``TrainingRecipe.lora_adapter_dtype``.
    """

    dp: int = 1
    tp: int = 1
    cp: int = 1
    finetune: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    lora_dropout: float = 0.0
    fsdp_reshard: str = "keep-last"
    lora_adapter_dtype: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "cp", "lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.finetune not in FINETUNES:
            raise ValueError(f"finetune must be one of {', '.join(FINETUNES)}, got {self.finetune!r}")
        if isinstance(self.lora_dropout, bool) or not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora dropout must be a probability in [0, 1), got {self.lora_dropout!r}")
        if self.fsdp_reshard not in FSDP_RESHARDS:
            raise ValueError(f"fsdp reshard must be one of {', '.join(FSDP_RESHARDS)}, got {self.fsdp_reshard!r}")
        if self.lora_adapter_dtype not in LORA_ADAPTER_DTYPES:
            raise ValueError(f"lora adapter dtype must be one of {', '.join(LORA_ADAPTER_DTYPES)}, "
                             f"got {self.lora_adapter_dtype!r}")
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if bad or not self.lora_targets:
            raise ValueError(f"lora targets must be among {', '.join(LORA_TARGETS)}, got {','.join(self.lora_targets)!r}")

    @property
    def sequence_parallel(self) -> bool:
        """Tensor parallelism runs with sequence parallelism, as torchtitan's plan always does (the
        norms' replicated parameters would otherwise be plain tensors beside DTensors, which
        foreach optimizers refuse)."""
        return self.tp > 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.cp

    @property
    def fsdp(self) -> bool:
        """Whether the model states are sharded (FSDP2 over dp x cp)."""
        return self.dp * self.cp > 1

    def rank_coords(self, rank: int) -> dict[str, int]:
        """(dp, cp, tp) coordinates of a global rank on the (dp, cp, tp) mesh, tp fastest."""
        return {"dp": rank // (self.cp * self.tp), "cp": rank // self.tp % self.cp, "tp": rank % self.tp}


def check_parallel(spec: ModelSpec, config: MeasureConfig, par: ParallelConfig) -> None:
    """Refuse (ValueError) what the multi-GPU oracle cannot build or MARP would not accept."""
    if spec.norm != "rmsnorm" or spec.arch != "decoder" or spec.experts:
        raise ValueError(f"{spec.name}: the multi-GPU oracle builds LLaMA-style dense decoders only "
                         "(RMSNorm, RoPE, separate q/k/v)")  # fmt: skip
    if spec.heads % par.tp or spec.kv_heads % par.tp:
        raise ValueError(f"tp {par.tp} must divide heads ({spec.heads}) and kv_heads ({spec.kv_heads})")
    if par.tp > 1 and spec.tied_embeddings:
        raise ValueError(f"{spec.name} ties its embeddings: the oracle's tensor parallelism needs an untied head")
    if par.tp > 1 and spec.vocab % par.tp:
        raise ValueError(f"tp {par.tp} must divide the vocabulary ({spec.vocab}) for the vocab-parallel embedding")
    if par.tp > 1 and config.seq_len % (par.tp * par.cp):
        raise ValueError(f"seq_len {config.seq_len} must be a multiple of tp x cp ({par.tp * par.cp}) for sequence parallelism")
    if par.cp > 1:
        if config.attention != "flash":
            raise ValueError("context parallelism needs flash attention (ring attention)")
        if config.seq_len % (2 * par.cp):
            raise ValueError(f"seq_len {config.seq_len} must be a multiple of 2 x cp ({2 * par.cp})")
        if config.gqa == "native" and spec.kv_heads != spec.heads:
            raise ValueError("context parallelism repeats K/V to every head (gqa repeat)")
    if config.precision == "amp-bf16":
        raise ValueError("the multi-GPU oracle does not emulate autocast: use fsdp-bf16 (FSDP2 mixed precision), "
                         "pure-bf16 or fp32")  # fmt: skip
    if config.precision == "fsdp-bf16" and not par.fsdp:
        raise ValueError("fsdp-bf16 is FSDP2's mixed precision: it needs dp x cp > 1")
    if par.finetune == "lora" and par.tp > 1:
        raise ValueError("LoRA with tp > 1 is not supported by the oracle (peft's adapters are not DTensor-parallel)")
    if config.grad_buffer != "transient" or config.optimizer_impl != "foreach" or config.dropout:
        raise ValueError("the multi-GPU oracle measures transient gradients, foreach optimizers and no dropout")


__all__ = [
    "ATTENTIONS", "CUDA_ROUND_BYTES", "FINETUNES", "GQA_MODES", "GRAD_BUFFERS", "LORA_TARGETS", "OPTIMIZERS",
    "OPTIMIZER_IMPLS", "POLICIES", "RECOMPUTES", "MeasureConfig", "ParallelConfig", "check_parallel",
]  # fmt: skip
