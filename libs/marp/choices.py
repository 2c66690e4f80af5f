"""The values a training recipe's options take: precision policies, optimizers, recomputation,
fine-tuning and framework choices. Plain tuples, no numpy, so a command line can list them in its
help without importing MARP's model (``marp.recipe`` re-exports every one)."""

from __future__ import annotations

# Precision policies (docs/marp.md, "Precision policies"). "fp16" / "bf16" are the historical
# names of the Megatron/DeepSpeed mixed-precision policies and stay their aliases.
PRECISIONS: tuple[str, ...] = (
    "fp32", "fp16", "bf16", "amp-fp16", "amp-bf16", "master-fp16", "master-bf16", "pure-bf16", "fsdp-bf16",
)  # fmt: skip
PRECISION_ALIASES: dict[str, str] = {"fp16": "master-fp16", "bf16": "master-bf16"}
OPTIMIZERS: tuple[str, ...] = ("adamw", "adam", "sgd", "sgd-momentum", "adam8bit")
OPTIMIZER_IMPLS: tuple[str, ...] = ("foreach", "fused", "forloop")
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full", "op-sac")
LOSSES: tuple[str, ...] = ("torch", "fused", "chunked", "megatron-fused", "inplace", "fused-copy")
KERNELS: tuple[str, ...] = ("eager", "fused")
FINETUNES: tuple[str, ...] = ("full", "lora", "qlora")
GRAD_BUFFERS: tuple[str, ...] = ("persistent", "transient")
LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
# The dtype LoRA / QLoRA adapters are kept in: "fp32", peft's default (get_peft_model's
# autocast_adapter_dtype=True upcasts bf16 / fp16 adapters, peft tuners_utils.cast_adapter_dtype),
# or "compute", the base's dtype (autocast_adapter_dtype=False, or torchtune's bf16 adapters).
LORA_ADAPTER_DTYPES: tuple[str, ...] = ("fp32", "compute")
# Which FSDP2 blocks reshard after their forward: every one but the last (torchtitan's apply_fsdp:
# the last block is needed first by the backward) or all of them (torchtune's shard_model,
# reshard_after_forward=True for every layer and the root).
FSDP_RESHARDS: tuple[str, ...] = ("keep-last", "all")
# Where QLoRA's NF4 base comes from: bitsandbytes (peft / HF: Params4bit keeps its block constants in
# a quant_state dict that FSDP and DeepSpeed neither shard nor sync, only parameters and buffers --
# AnswerDotAI/fsdp_qlora PR 4; bnb's fix_4bit_weight_quant_state_from_module keeps a whole copy on
# the module), or torchao (torchtune: NF4Tensor shards its constants with the data through
# fsdp_pre_all_gather).
QLORA_BACKENDS: tuple[str, ...] = ("bitsandbytes", "torchao")
# The dtype of a master-* policy's main-grad buffer: "fp32" (Megatron forces it under --bf16 and
# takes it with --accumulate-allreduce-grads-in-fp32 / grad_reduce_in_fp32; DeepSpeed's fp32
# gradient partitions) or "half", the parameters' dtype: Megatron's --fp16 default (megatron
# arguments.py validate_args sets accumulate_allreduce_grads_in_fp32 only for --bf16; the grad
# buffer's dtype is `torch.float if accumulate_allreduce_grads_in_fp32 else param.dtype`,
# NVIDIA/Megatron-LM megatron/model/distributed.py at a8ca4d5, mcore DDP's grad_reduce_in_fp32 alike).
MAIN_GRAD_DTYPES: tuple[str, ...] = ("fp32", "half")
# Who shards a master-* policy's states at ZeRO stage 3: "megatron-fsdp", Megatron-Core's FSDP
# (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params: bf16 parameters, fp32
# main grads and master weights sharded per unit, a unit unsharded only in its forward and backward,
# its full gradients reduce-scattered at its post-backward -- FSDP2's flow; Megatron-LM
# megatron/core/distributed/fsdp/src/docs/mfsdp_design.md, "Flow"), or "deepspeed", DeepSpeed's
# ZeRO-3 with its contiguous reduce bucket and per-submodule fetching (deepspeed/runtime/zero/
# stage3.py). Issue 36: charging every master-* ZeRO-3 job DeepSpeed's 5e8-element bucket made a
# Megatron-FSDP run at TP 2 on 8 H100 about 70 % over.
ZERO3_BACKENDS: tuple[str, ...] = ("megatron-fsdp", "deepspeed")
