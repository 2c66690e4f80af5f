"""What the user asks for (``TrainingRecipe``) and how one job is laid out (``Layout``).

The recipe never names GPUs: it is the batch, sequence length, precision,
optimizer and the freedoms the planner may use (recomputation, ZeRO stages,
a GPU cap). A layout is one concrete way to run it: tensor (tp), pipeline (pp)
and data (dp) parallel degrees, ZeRO stage, micro-batch, gradient accumulation
and activation recomputation. Both are validated on construction, so an invalid
one cannot exist (as torchtitan's ParallelDims does for its degrees).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp._check import check_bool, check_choice, check_int, check_number
from marp.choices import (  # the choices live there (no numpy, for --help); re-exported here
    FINETUNES,
    FSDP_RESHARDS,
    GRAD_BUFFERS,
    KERNELS,
    LORA_ADAPTER_DTYPES,
    LORA_TARGETS,
    LOSSES,
    MAIN_GRAD_DTYPES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISION_ALIASES,
    PRECISIONS,
    QLORA_BACKENDS,
    RECOMPUTE,
    ZERO3_BACKENDS,
)
from marp.errors import InvalidLayoutError, InvalidRecipeError, MarpError

Precision = Literal[
    "fp32", "fp16", "bf16", "amp-fp16", "amp-bf16", "master-fp16", "master-bf16", "pure-bf16", "fsdp-bf16",
]
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adam8bit"]
OptimizerImpl = Literal["foreach", "fused", "forloop"]
Recompute = Literal["none", "selective", "full", "op-sac"]
Loss = Literal["torch", "fused", "chunked", "megatron-fused", "inplace", "fused-copy"]
Kernels = Literal["eager", "fused"]
Finetune = Literal["full", "lora", "qlora"]
GradBuffer = Literal["persistent", "transient"]

ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
MAX_PIPELINE_STAGES = 1024  # virtual stages of a split; far past any real pp x vpp
# The optimizers' own defaults (torch.optim.AdamW 1e-2; Adam and SGD 0; bitsandbytes Adam8bit 0):
# what a training script that does not set weight decay runs with.
DEFAULT_WEIGHT_DECAY: dict[str, float] = {"adamw": 0.01}


def check_pp_layers(split: Any, field: str, err: type[MarpError]) -> tuple[int, ...]:
    """A pipeline split as a tuple: layers per (virtual) stage, each >= 0, at least one layer in all.

    A stage may hold no transformer layer (only the embedding or the head, as Megatron's
    --decoder-first-pipeline-num-layers 0 allows); whether the split covers the model's layers
    and matches pp x vpp is checked against the model and the layout.
    """
    if isinstance(split, list):
        split = tuple(split)
    if (not isinstance(split, tuple) or not split or len(split) > MAX_PIPELINE_STAGES
            or any(isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0 for n in split)
            or sum(split) < 1):  # fmt: skip
        raise err(field, f"must be 1 to {MAX_PIPELINE_STAGES} non-negative layer counts with at least one "
                         f"layer in all, got {split!r}.", "give the layers of each pipeline stage, e.g. 2,4,4,2.")
    return tuple(int(n) for n in split)


def split_maxima(split: tuple[int, ...], pp: int) -> tuple[int, int]:
    """(the most layers one pipeline rank holds, the most one virtual stage holds) of a split over
    ``pp`` ranks: rank r runs virtual stages r, r + pp, r + 2 pp, ... (Megatron's interleaved
    schedule gives model chunk c of rank r the virtual stage c x pp + r)."""
    return max(sum(split[r::pp]) for r in range(pp)), max(split)


def balanced_split(n_layers: int, stages: int, input_weight: int = 1, output_weight: int = 1) -> tuple[int, ...]:
    """The layers of each of ``stages`` (virtual) pipeline stages when they do not divide the model:
    torchtitan's default split (pytorch/torchtitan torchtitan/distributed/pipeline_parallel.py,
    ``generate_llm_fqn_per_model_part``, input_weight = output_weight = 1), which counts the token
    embedding and the final norm + head as one layer each, gives every stage (n_layers + 2) // stages
    of those units, the first (n_layers + 2) % stages stages one more, and takes the embedding's unit
    from the first stage and the head's from the last. Megatron-LM's
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split gives the same
    split where stages divides n_layers + 2 (its only case): 126 layers over 8 x 2 virtual stages are
    7, 8 x 14, 7 (Llama 3.1 405B's, 16 layers on ranks 1-6, 15 on ranks 0 and 7).

    Raises ValueError where a stage would get no unit or the embedding / head more than a stage's
    share (torchtitan refuses those too)."""
    effective = n_layers + input_weight + output_weight
    per, extra = divmod(effective, stages)
    if stages < 2 or per < max(1, input_weight, output_weight):
        raise ValueError(f"{n_layers} layers and the embedding and head do not fill {stages} pipeline stages.")
    split = [per + (1 if i < extra else 0) for i in range(stages)]
    split[0] -= input_weight
    split[-1] -= output_weight
    return tuple(split)


def canonical_precision(precision: str) -> str:
    """The policy a precision name stands for (``bf16`` -> ``master-bf16``)."""
    return PRECISION_ALIASES.get(precision, precision)


def compute_dtype(precision: str) -> str:
    """The matmul dtype of a policy: "fp32", "fp16" or "bf16" (for GPU throughput and support)."""
    policy = canonical_precision(precision)
    if policy == "fp32":
        return "fp32"
    return "fp16" if policy.endswith("fp16") else "bf16"


@dataclass(frozen=True)
class TrainingRecipe:
    """A training job as the user describes it.

    ``precision`` is a precision policy (docs/marp.md): ``fp32``; ``amp-fp16`` / ``amp-bf16``
    (torch autocast: fp32 parameters and gradients, half-precision matmuls); ``master-fp16`` /
    ``master-bf16`` (half-precision parameters, fp32 gradient buffer and fp32 master weights in
    the optimizer, Megatron / DeepSpeed style; ``fp16`` / ``bf16`` are their aliases);
    ``pure-bf16`` (everything in bf16); ``fsdp-bf16`` (FSDP2: fp32 sharded parameters, bf16
    compute). ``optimizer`` "sgd" is plain SGD, "sgd-momentum" keeps one momentum buffer,
    "adam8bit" is block-wise 8-bit Adam (Dettmers et al. 2022). ``micro_batch`` None lets the
    planner choose among the powers of two (up to 16) that divide ``global_batch``.

    The remaining fields refine the memory model; None means "the policy's usual choice":
    ``optimizer_impl`` (foreach on CUDA for torch.optim, fused for Megatron-style ``master-*``),
    ``kv_repeat`` (grouped-query K and V repeated to every query head before attention, as
    torchtitan's and torchtune's Llama and HF's eager attention do with ``repeat_kv``; False for
    kernels that take grouped K/V natively, FlashAttention-2 and SDPA ``enable_gqa``; default:
    repeated with eager kernels, native with fused ones),
    ``loss`` (Megatron's in-place vocab-parallel CE for ``master-*``, else PyTorch CE on fp32
    logits), ``grad_buffer`` (``persistent``: gradients live between steps, as Megatron's
    contiguous buffer or ``zero_grad(set_to_none=False)``; ``transient``: PyTorch >= 2.0
    ``zero_grad()`` frees them), ``dropout`` (the model config's). ``finetune`` LoRA / QLoRA
    trains rank-``lora_rank`` adapters on ``lora_targets``. ``offload_optimizer`` keeps the
    optimizer states (and fp32 master weights) in CPU memory (ZeRO-Offload). ``weight_decay``
    None is the optimizer's own default (AdamW 0.01, the others 0); it decides whether torch's
    SGD allocates a gradient-sized temporary in its step (``marp.memory_terms``). ``ep`` is the
    expert-parallel degree the job runs with (a mixture-of-experts model): the planner keeps it
    fixed and considers only layouts whose dp it divides. ``pp_layers`` fixes the pipeline split
    the job's script uses: the layers of each (virtual) pipeline stage, in order (Megatron's
    --decoder-first/last-pipeline-num-layers, torchtitan's per-stage module lists); the planner
    considers only the pp x vpp factorisations of its length. ``etp`` is the expert-tensor-parallel
    degree (None: each layout's tp, Megatron's default for --expert-tensor-parallel-size).
    ``compile``: the model runs under torch.compile, whose min-cut partitioner recomputes
    pointwise ops in the backward instead of saving their outputs (modelled as fused kernels,
    docs/marp.md "torch.compile"). ``float8``: float8 linears (torchao Float8Linear, or
    Transformer Engine fp8 under ``master-*``); needs a GPU with fp8 tensor cores.
    ``lora_dropout``: peft's dropout on each adapter's input (LoraConfig.lora_dropout); above 0
    every adapted linear keeps its own dropped-out copy of its input and the mask.
    ``lora_adapter_dtype``: "fp32" (peft's default) or "compute". It matters under ``pure-bf16``
    only, where nothing else casts the adapters (FSDP's mixed precision, DeepSpeed's bf16 module
    and autocast do): fp32 adapters keep fp32 parameters, gradients and optimizer states, and each
    adapted linear casts its bf16 input to fp32 (peft Linear.forward, ``_cast_input_dtype``), a
    copy lora_A keeps for its weight gradient. ``fsdp_reshard``: "keep-last" (torchtitan) keeps the
    last FSDP2 block gathered after its forward, "all" (torchtune) reshards every block.
    ``qlora_backend``: "bitsandbytes" (peft's QLoRA; the NF4 block constants stay whole on every
    rank under FSDP / ZeRO-3) or "torchao" (torchtune; sharded with the data).
    ``main_grad_dtype`` (``master-*`` only): "fp32", the main-grad buffer in fp32 (4 B per
    parameter), or "half", in the parameters' dtype (2 B: Megatron --fp16 without
    --accumulate-allreduce-grads-in-fp32), whose optimizer step then makes an fp32 copy of the
    gradients (Float16OptimizerWithFloat16Params: ``main_param.grad = main_grad.float()``).
    ``zero3_backend`` (``master-*`` at ZeRO stage 3 only): "megatron-fsdp" (Megatron-Core's FSDP,
    default) or "deepspeed" (DeepSpeed ZeRO-3 at its defaults: the 5e8-element reduce bucket).
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
    # At least this many GPUs (None: any): a job written for a fixed world size says so.
    min_gpus: int | None = None
    optimizer_impl: OptimizerImpl | None = None
    loss: Loss | None = None
    loss_chunks: int = 8
    dropout: float | None = None
    grad_buffer: GradBuffer | None = None
    kernels: Kernels | None = None
    finetune: Finetune = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    offload_optimizer: bool = False
    kv_repeat: bool | None = None
    weight_decay: float | None = None
    ep: int = 1
    pp_layers: tuple[int, ...] | None = None
    etp: int | None = None
    compile: bool = False
    float8: bool = False
    lora_dropout: float = 0.0
    lora_adapter_dtype: str = "fp32"
    fsdp_reshard: str = "keep-last"
    qlora_backend: str = "bitsandbytes"
    main_grad_dtype: str = "fp32"
    zero3_backend: str = "megatron-fsdp"

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
        if self.min_gpus is not None:
            check_int(self.min_gpus, "recipe.min_gpus", err)
            if self.max_gpus is not None and self.min_gpus > self.max_gpus:
                raise err("recipe.min_gpus", f"min_gpus {self.min_gpus} is above max_gpus {self.max_gpus}.",
                          "set min_gpus <= max_gpus.")
        if self.optimizer_impl is not None:
            check_choice(self.optimizer_impl, "recipe.optimizer_impl", err, OPTIMIZER_IMPLS)
        if self.loss is not None:
            check_choice(self.loss, "recipe.loss", err, LOSSES)
        check_int(self.loss_chunks, "recipe.loss_chunks", err)
        if self.dropout is not None:
            check_number(self.dropout, "recipe.dropout", err, 0.0, 1.0)
        if self.grad_buffer is not None:
            check_choice(self.grad_buffer, "recipe.grad_buffer", err, GRAD_BUFFERS)
        if self.kernels is not None:
            check_choice(self.kernels, "recipe.kernels", err, KERNELS)
        check_choice(self.finetune, "recipe.finetune", err, FINETUNES)
        check_int(self.lora_rank, "recipe.lora_rank", err)
        targets = self.lora_targets
        if isinstance(targets, list):
            object.__setattr__(self, "lora_targets", tuple(targets))
            targets = self.lora_targets
        if (not isinstance(targets, tuple) or not targets or len(set(targets)) != len(targets)
                or any(t not in LORA_TARGETS for t in targets)):  # fmt: skip
            raise err("recipe.lora_targets",
                      f"must be distinct names from {', '.join(LORA_TARGETS)}, got {targets!r}.")  # fmt: skip
        check_bool(self.offload_optimizer, "recipe.offload_optimizer", err)
        if self.kv_repeat is not None:
            check_bool(self.kv_repeat, "recipe.kv_repeat", err)
        if self.weight_decay is not None:
            check_number(self.weight_decay, "recipe.weight_decay", err, 0.0, 1e3)
        check_int(self.ep, "recipe.ep", err, fix="use 1, or an expert-parallel degree that divides the experts.")
        if self.pp_layers is not None:
            object.__setattr__(self, "pp_layers", check_pp_layers(self.pp_layers, "recipe.pp_layers", err))
        check_bool(self.compile, "recipe.compile", err)
        check_bool(self.float8, "recipe.float8", err)
        check_number(self.lora_dropout, "recipe.lora_dropout", err, 0.0, 1.0)
        check_choice(self.lora_adapter_dtype, "recipe.lora_adapter_dtype", err, LORA_ADAPTER_DTYPES)
        check_choice(self.fsdp_reshard, "recipe.fsdp_reshard", err, FSDP_RESHARDS)
        check_choice(self.qlora_backend, "recipe.qlora_backend", err, QLORA_BACKENDS)
        check_choice(self.main_grad_dtype, "recipe.main_grad_dtype", err, MAIN_GRAD_DTYPES)
        check_choice(self.zero3_backend, "recipe.zero3_backend", err, ZERO3_BACKENDS)
        if self.main_grad_dtype == "half" and not self.megatron_style:
            raise err("recipe.main_grad_dtype",
                      f"a half-precision main-grad buffer is Megatron's (master-*); {self.policy} keeps "
                      "its gradients in the parameters' .grad.",
                      "use precision master-fp16 or master-bf16, or main_grad_dtype fp32.")  # fmt: skip
        if self.etp is not None:
            check_int(self.etp, "recipe.etp", err, fix="use an expert-tensor-parallel degree >= 1, or leave it unset (tp).")
        if self.policy == "fsdp-bf16" and self.finetune == "qlora":
            raise err("recipe.finetune", "qlora keeps a 4-bit frozen base; it cannot use the fsdp-bf16 policy.",
                      "use precision pure-bf16 or amp-bf16 with qlora.")  # fmt: skip

    # ---- resolved choices (the policy defaults, docs/marp.md) ------------------------------------

    @property
    def policy(self) -> str:
        return canonical_precision(self.precision)

    @property
    def megatron_style(self) -> bool:
        """``master-*`` policies model Megatron-LM / DeepSpeed (contiguous fp32 grad buffer, fused
        optimizer, vocab-parallel CE, Transformer Engine kernels)."""
        return self.policy.startswith("master-")

    @property
    def resolved_optimizer_impl(self) -> str:
        if self.optimizer_impl is not None:
            return self.optimizer_impl
        # Megatron uses apex/TE FusedAdam; torch.optim picks foreach on CUDA (PyTorch docs,
        # torch.optim "Algorithms": foreach is the default when all tensors are on CUDA).
        return "fused" if self.megatron_style or self.optimizer == "adam8bit" else "foreach"

    @property
    def resolved_loss(self) -> str:
        if self.loss is not None:
            return self.loss
        return "fused" if self.megatron_style else "torch"

    @property
    def resolved_grad_buffer(self) -> str:
        if self.grad_buffer is not None:
            return self.grad_buffer
        return "persistent" if self.megatron_style else "transient"

    @property
    def fused_kernels(self) -> bool:
        return self.kernels == "fused" if self.kernels is not None else self.megatron_style

    @property
    def fp32_adapters(self) -> bool:
        """LoRA / QLoRA adapters computed in fp32 beside a bf16 base: peft's fp32 default under
        pure bf16, where no mixed-precision wrapper or autocast casts them to the compute dtype."""
        return self.finetune != "full" and self.lora_adapter_dtype == "fp32" and self.policy == "pure-bf16"

    @property
    def pointwise_fused(self) -> bool:
        """Pointwise ops fused (and recomputed in the backward rather than saved): Megatron / TE
        kernels, or torch.compile's generated ones."""
        return self.fused_kernels or self.compile

    @property
    def resolved_kv_repeat(self) -> bool:
        return self.kv_repeat if self.kv_repeat is not None else not self.fused_kernels

    @property
    def resolved_weight_decay(self) -> float:
        if self.weight_decay is not None:
            return float(self.weight_decay)
        return DEFAULT_WEIGHT_DECAY.get(self.optimizer, 0.0)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len, "global_batch": self.global_batch, "micro_batch": self.micro_batch,
            "precision": self.precision, "optimizer": self.optimizer,
            "allow_recompute": self.allow_recompute, "flash_attention": self.flash_attention,
            "zero_stages": list(self.zero_stages), "train_steps": self.train_steps,
            "max_gpus": self.max_gpus, "optimizer_impl": self.resolved_optimizer_impl,
            "loss": self.resolved_loss, "loss_chunks": self.loss_chunks, "dropout": self.dropout,
            "grad_buffer": self.resolved_grad_buffer, "kernels": "fused" if self.fused_kernels else "eager",
            "finetune": self.finetune,
            "lora_rank": self.lora_rank, "lora_targets": list(self.lora_targets),
            "offload_optimizer": self.offload_optimizer, "kv_repeat": self.resolved_kv_repeat,
            "weight_decay": self.resolved_weight_decay, "ep": self.ep,
            "pp_layers": None if self.pp_layers is None else list(self.pp_layers), "etp": self.etp,
            "compile": self.compile, "float8": self.float8, "lora_dropout": self.lora_dropout,
            "lora_adapter_dtype": self.lora_adapter_dtype, "fsdp_reshard": self.fsdp_reshard,
            "qlora_backend": self.qlora_backend, "main_grad_dtype": self.main_grad_dtype,
            "zero3_backend": self.zero3_backend,
        }  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """One parallel layout of a job on ``tp * pp * dp * cp`` GPUs.

    ``zero_stage`` shards model states over the data-parallel group (Rajbhandari et al. 2020):
    1 optimizer states (Megatron's distributed optimizer), 2 also gradients, 3 also parameters
    (FSDP FULL_SHARD). The group includes the context-parallel ranks, which hold the same
    parameters: states shard over dp x cp (torchtitan's dp_shard x cp FSDP mesh, Megatron's
    data-parallel group with context parallel). ``shard_degree`` (default: dp) shards over a
    smaller group (x cp) -- FSDP HYBRID_SHARD, or Megatron's
    ``--num-distributed-optimizer-instances`` -- and must divide dp.
    ``recompute``: "selective" recomputes the attention core (Korthikanti et al. 2022, sec. 5),
    "op-sac" saves every other matmul output and the attention output (torchtitan's op-level
    selective activation checkpointing), "full" checkpoints every layer (Chen et al. 2016).
    ``sp`` is Megatron sequence parallelism, ``cp`` context parallelism (sequence split over cp
    ranks), ``vpp`` the interleaved-1F1B model chunks per pipeline rank, ``ep`` the expert-parallel
    degree of a mixture-of-experts model (ep divides dp). ``pp_layers`` (None: an even split, every
    stage charged the rounded-up share) gives the layers of each of the pp x vpp (virtual) stages,
    uneven splits included; the memory model charges every rank the fullest rank's layers, and one
    chunk's pass the fullest virtual stage's (an upper bound for the other ranks). ``etp`` (None:
    tp) shards the experts' weights over an expert-tensor-parallel group of its own (Megatron's
    --expert-tensor-parallel-size): the experts' grid is pp x etp x ep x edp over the same GPUs, so
    etp x ep must divide tp x dp x cp, and expert states shard over edp = tp x dp x cp / (etp x ep).
    """

    tp: int
    pp: int
    dp: int
    zero_stage: int
    micro_batch: int
    grad_accum: int
    recompute: Recompute = "none"
    sp: bool = False
    cp: int = 1
    vpp: int = 1
    ep: int = 1
    shard_degree: int | None = None
    pp_layers: tuple[int, ...] | None = None
    etp: int | None = None

    def __post_init__(self) -> None:
        err = InvalidLayoutError
        for attr in ("tp", "pp", "dp", "micro_batch", "grad_accum", "cp", "vpp", "ep"):
            check_int(getattr(self, attr), f"layout.{attr}", err)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise err("layout.zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage!r}.")
        check_choice(self.recompute, "layout.recompute", err, RECOMPUTE)
        check_bool(self.sp, "layout.sp", err)
        if self.vpp > 1 and self.pp == 1:
            raise err("layout.vpp", f"vpp {self.vpp} needs pipeline parallelism (pp > 1).",
                      "use vpp 1 or pp > 1.")  # fmt: skip
        if self.dp % self.ep:
            raise err("layout.ep", f"ep {self.ep} must divide dp {self.dp} (experts shard within the DP group).")
        if self.shard_degree is not None:
            check_int(self.shard_degree, "layout.shard_degree", err)
            if self.dp % self.shard_degree:
                raise err("layout.shard_degree", f"shard degree {self.shard_degree} must divide dp {self.dp}.")
        if self.etp is not None:
            check_int(self.etp, "layout.etp", err)
        if (self.tp * self.dp * self.cp) % (self.expert_tp * self.ep):
            raise err("layout.etp", f"etp {self.expert_tp} x ep {self.ep} must divide tp x dp x cp = "
                      f"{self.tp * self.dp * self.cp} (the experts' grid runs on the same GPUs).")
        if self.pp_layers is not None:
            object.__setattr__(self, "pp_layers", check_pp_layers(self.pp_layers, "layout.pp_layers", err))
            if len(self.pp_layers) != self.pp * self.vpp:
                raise err("layout.pp_layers", f"{len(self.pp_layers)} stages given, but pp {self.pp} x vpp {self.vpp} "
                          f"= {self.pp * self.vpp} (virtual) stages.", "give one layer count per (virtual) stage.")

    @classmethod
    def of_valid(cls, **given: Any) -> Layout:
        """A layout whose fields already passed these rules -- a row of a ``LayoutGrid``, which
        refuses by the same ones -- built without checking each field again: the planner reads
        ~180 such rows per ranking, and checking them again was ~15 % of bench/marp_speed.py."""
        lay = object.__new__(cls)
        for f in fields(cls):
            object.__setattr__(lay, f.name, given.pop(f.name) if f.name in given else f.default)
        if given:
            raise TypeError(f"Layout has no field(s) {', '.join(sorted(given))}")
        return lay

    @property
    def shard(self) -> int:
        return self.dp if self.shard_degree is None else self.shard_degree

    @property
    def expert_tp(self) -> int:
        """The expert-tensor-parallel degree: etp, or tp when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def samples_per_step(self) -> int:
        """Sequences per optimizer step = dp x micro_batch x grad_accum."""
        return self.dp * self.micro_batch * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "zero_stage": self.zero_stage,
            "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "recompute": self.recompute, "num_gpus": self.num_gpus, "sp": self.sp, "cp": self.cp,
            "vpp": self.vpp, "ep": self.ep, "shard_degree": self.shard,
            "pp_layers": None if self.pp_layers is None else list(self.pp_layers), "etp": self.expert_tp,
        }  # fmt: skip


@dataclass(frozen=True)
class LayoutGrid:
    """Many layouts at once: ``Layout``'s fields as int64 arrays, one element per layout.

    The vectorised form of ``Layout`` that the memory model evaluates in one numpy pass. The
    fields broadcast against each other on construction; ``recompute`` holds indices into
    RECOMPUTE, ``sp`` 0 / 1 and ``shard`` the sharding group (``Layout.shard``). The rules are
    Layout's: a vectorised screen finds the first layout that breaks one, and building that
    Layout raises the error a single layout would. Relations with the model and the recipe
    (heads, layers, global batch) are the caller's (``marp.memory.validate_layout``).
    A pipeline split travels as its maxima (``split_maxima``): ``stage_layers``, the most layers a
    pipeline rank holds, and ``chunk_layers``, the most a virtual stage holds; 0 means an even
    split. ``layout_at`` gives such an element's layout without the split (its maxima only).
    """

    tp: NDArray[np.int64]
    pp: NDArray[np.int64]
    dp: NDArray[np.int64]
    zero_stage: NDArray[np.int64]
    micro_batch: NDArray[np.int64]
    grad_accum: NDArray[np.int64]
    recompute: NDArray[np.int64]
    sp: NDArray[np.int64]
    cp: NDArray[np.int64]
    vpp: NDArray[np.int64]
    ep: NDArray[np.int64]
    shard: NDArray[np.int64]
    etp: NDArray[np.int64]
    stage_layers: NDArray[np.int64]
    chunk_layers: NDArray[np.int64]

    def __post_init__(self) -> None:
        shapes = {getattr(self, f.name).shape for f in fields(self)}
        if len(shapes) != 1:
            raise InvalidLayoutError("layout", f"the grid's fields must share one shape, got {sorted(shapes)}.",
                                     "build it with LayoutGrid.broadcast.")  # fmt: skip
        bad = self._broken()
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            self.layout_at(index)  # raises Layout's error for it
            raise InvalidLayoutError("layout", f"layout {index} of the grid is invalid.")

    def _broken(self) -> NDArray[np.bool_]:
        """Where a Layout built from the element would refuse it (its __post_init__ rules)."""
        bad = (self.zero_stage < 0) | (self.zero_stage > 3) | (self.recompute < 0)
        bad |= (self.recompute >= len(RECOMPUTE)) | (self.sp < 0) | (self.sp > 1) | (self.shard < 1)
        for positive in (self.tp, self.pp, self.dp, self.micro_batch, self.grad_accum, self.cp, self.vpp, self.ep):
            bad |= positive < 1
        bad |= (self.vpp > 1) & (self.pp == 1)
        bad |= (self.dp % np.maximum(self.ep, 1) != 0) | (self.dp % np.maximum(self.shard, 1) != 0)
        # (Guarded: the planner's grids rarely carry a split or an expert grid, and int64 modulo is slow.)
        if self.stage_layers.any():
            bad |= (self.stage_layers < 0) | (self.chunk_layers < 0) | (self.chunk_layers > self.stage_layers)
        if (self.etp != self.tp).any() or (self.ep != 1).any():
            bad |= (self.etp < 1) | ((self.tp * self.dp * self.cp) % np.maximum(self.etp * self.ep, 1) != 0)
        return bad

    @classmethod
    def broadcast(
        cls, tp: ArrayLike, pp: ArrayLike, dp: ArrayLike, zero_stage: ArrayLike, micro_batch: ArrayLike,
        grad_accum: ArrayLike, recompute: ArrayLike, sp: ArrayLike = False, cp: ArrayLike = 1,
        vpp: ArrayLike = 1, ep: ArrayLike = 1, shard: ArrayLike | None = None, etp: ArrayLike | None = None,
        stage_layers: ArrayLike = 0, chunk_layers: ArrayLike = 0,
    ) -> LayoutGrid:
        """A grid from anything numpy broadcasts; ``shard`` None shards over all of dp, ``etp`` None is tp."""
        given = (tp, pp, dp, zero_stage, micro_batch, grad_accum, recompute, np.asarray(sp, dtype=np.int64),
                 cp, vpp, ep, dp if shard is None else shard, tp if etp is None else etp, stage_layers,
                 chunk_layers)  # fmt: skip
        return cls(*np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in given)))

    @classmethod
    def of(cls, layout: Layout) -> LayoutGrid:
        """A one-element grid of ``layout``."""
        stage, chunk = (0, 0) if layout.pp_layers is None else split_maxima(layout.pp_layers, layout.pp)
        return cls.broadcast(
            [layout.tp], [layout.pp], [layout.dp], [layout.zero_stage], [layout.micro_batch],
            [layout.grad_accum], [RECOMPUTE.index(layout.recompute)], sp=[layout.sp], cp=[layout.cp],
            vpp=[layout.vpp], ep=[layout.ep], shard=[layout.shard], etp=[layout.expert_tp], stage_layers=[stage],
            chunk_layers=[chunk],
        )  # fmt: skip

    def layout_at(self, index: int) -> Layout:
        """The Layout of one element (validated: raises InvalidLayoutError when it is not one)."""
        at = {f.name: int(np.ravel(getattr(self, f.name))[index]) for f in fields(self)}
        code, sp, shard = at.pop("recompute"), at.pop("sp"), at.pop("shard")
        at.pop("stage_layers"), at.pop("chunk_layers")
        if at["etp"] == at["tp"]:
            at["etp"] = None  # the default: experts shard like the dense weights
        recompute = RECOMPUTE[code] if 0 <= code < len(RECOMPUTE) else str(code)
        return Layout(**at, recompute=recompute, sp=bool(sp) if sp in (0, 1) else sp,  # type: ignore[arg-type]
                      shard_degree=shard)  # fmt: skip

    @property
    def num_gpus(self) -> NDArray[np.int64]:
        return self.tp * self.pp * self.dp * self.cp


__all__ = [
    "DEFAULT_WEIGHT_DECAY", "FINETUNES", "GRAD_BUFFERS", "KERNELS", "LORA_TARGETS", "LOSSES", "MAIN_GRAD_DTYPES", "OPTIMIZERS", "OPTIMIZER_IMPLS", "PRECISIONS",
    "PRECISION_ALIASES", "RECOMPUTE", "ZERO3_BACKENDS", "ZERO_STAGES", "Layout", "LayoutGrid", "TrainingRecipe",
    "balanced_split", "canonical_precision",
    "check_pp_layers", "compute_dtype", "split_maxima",
]  # fmt: skip
