"""The sizes the memory terms are built from, one number (or one array over a grid) at a time.

Bytes per parameter by precision policy and optimizer, and their ZeRO sharding; parameters on the
first and last pipeline stage; the micro-batches of activations a pipeline rank holds at once;
the loss's bytes per logit; LoRA adapter parameters; and the memory outside the live tensors
(CUDA context, NCCL buffers, the caching allocator's fragmentation, Transformer Engine's
workspaces). ``marp.memory_terms`` combines them into the per-GPU terms; ``marp.perf`` and
``marp.plans`` use them too. Sources are cited on each function (see ``marp.memory``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marp.errors import InvalidRecipeError
from marp.gpus import GiB, GpuType, MiB
from marp.models import ModelSpec
from marp.recipe import RECOMPUTE, canonical_precision

# Device memory outside the caching allocator, per GPU. memory-notes D.6: the CUDA context
# costs 0.3-1.4 GiB as seen by nvidia-smi (1343 MiB measured before model load on the HF V100
# setup, measurements README "HF-" rows). 1 GiB elsewhere (context + cuBLAS/cuDNN kernels),
# and 512 MiB for NCCL communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers) when the
# job spans more than one GPU.
CONTEXT_BYTES_DEFAULT = 1 * GiB
CONTEXT_BYTES: dict[str, int] = {"V100-16GB": 1343 * MiB, "V100-32GB": 1343 * MiB}
NCCL_BYTES = 512 * MiB

# Caching-allocator fragmentation: the share of the dynamic bytes (everything allocated and
# freed within a step) that the allocator holds beyond the live tensors at the peak. PyTorch
# rounds blocks above 1 MiB up to 2 MiB and never splits cached blocks above 10 MiB for small
# requests (CUDACachingAllocator), so churned activation blocks fragment; memory-notes D.6
# reports reserved 2-10 % above allocated for torchtitan-like runs, more for eager ones.
FRAGMENTATION = 0.10

# Under sharded model states (ZeRO-3 / FSDP) with LoRA adapters and activation recomputation
# together, the caching allocator fragments far more. GMLake (Guo et al., "GMLake: Efficient and
# Transparent GPU Memory Defragmentation for Large-scale DNN Training with Virtual Memory
# Stitching", ASPLOS 2024; antgroup/glake GMLake/README.md, "Training Performence Evaluation")
# defines fragmentation as 1 - peak active / peak reserved and measures it for exactly these
# combinations: DeepSpeed ZeRO-3 with LoRA + recomputation on 4 A100-80GB (OPT-1.3B, Vicuna-13B,
# GPT-NeoX-20B), scaled to 16 GPUs, and on DeepSpeed, FSDP and Colossal-AI with LoRA +
# recomputation, where stitching takes fragmentation down by about 10 to 30 % (the paper's
# abstract: 15 % on average over eight LLMs, up to 33 %), leaving GMLake itself under 10 % (above
# 95 % efficiency for 13B-20B models). PyTorch's own fragmentation there is therefore at least the
# 15 % average reduction: MARP reserves peak allocated / (1 - 0.15) for such jobs, the published
# lower bound (no row of bench/ set it). Where the dynamic-bytes share above gives more, it stands.
SHARDED_LORA_RECOMPUTE_FRAGMENTATION = 0.15

# Transformer Engine allocates one cuBLAS workspace per GEMM stream through the caching
# allocator (transformer_engine/pytorch/cpp_extensions/gemm.py: get_cublas_workspace_size_bytes
# = 32 MiB on compute capability >= 9.0, else 4 MiB; 4 streams). Counted for master-* policies.
# HOPPER names the catalog's compute capability >= 9.0 parts (Hopper and Blackwell).
TE_STREAMS = 4
HOPPER = ("H100-80GB", "H100-96GB", "H200", "B200")

# QLoRA's NF4 base: 4 bits per parameter plus the double-quantised block constants, 0.127 bit per
# parameter (Dettmers et al. 2023, sec. 3): what a frozen quantised linear holds, and what FSDP
# shards and all-gathers (it gathers the quantised storage: bitsandbytes' Params4bit packed in
# bnb_4bit_quant_storage, torchao's NF4Tensor through its fsdp_pre_all_gather extension).
NF4_CONST_BYTES = 0.127 / 8
NF4_BYTES = 0.5 + NF4_CONST_BYTES

# DeepSpeed ZeRO-3's defaults (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig), which a job
# gets when its config leaves them out -- as accelerate's DeepSpeedPlugin does for a YAML config
# without a DeepSpeed JSON (it writes only stage, offload and gather-on-save): reduce_bucket_size
# 5e8 elements, with contiguous_gradients (default True) one buffer of that many elements in the
# model's dtype, allocated once the optimizer is set up (stage3.py, _setup_for_real_optimizer,
# "__ipg_bucket_flat_buffer"); stage3_prefetch_bucket_size 5e7 elements fetched ahead of use.
DS_REDUCE_BUCKET_ELEMENTS = 5e8
DS_PREFETCH_ELEMENTS = 5e7

RECOMPUTE_CODE: dict[str, int] = {name: i for i, name in enumerate(RECOMPUTE)}  # none 0, selective 1, ...


# ---- model states ------------------------------------------------------------------------------


def state_bytes_per_param(precision: str, optimizer: str) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer-state) bytes per trainable parameter, before sharding.

    memory-notes D.2 and the ZeRO paper (sec. 3.1): fp32: 4 + 4 + K; torch AMP keeps fp32
    parameters and gradients: 4 + 4 + K; Megatron/DeepSpeed ``master-*``: half parameters (2),
    an fp32 gradient buffer (4, Megatron's main_grad) and fp32 master weights inside the
    optimizer (4 + K); pure bf16: 2 + 2 + K with bf16 states; FSDP2 ``fsdp-bf16``: fp32
    sharded parameters and gradients (4 + 4 + K). K: Adam 2 states (momentum, variance), SGD
    with momentum 1, plain SGD 0, 8-bit Adam 2 x 1 B plus one fp32 absmax per 2048-element
    block and state (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", sec. 2).
    """
    policy = canonical_precision(precision)
    if policy not in ("fp32", "amp-fp16", "amp-bf16", "master-fp16", "master-bf16", "pure-bf16", "fsdp-bf16"):
        raise InvalidRecipeError("recipe.precision", f"unknown precision {precision!r}.")
    state = 2 if policy == "pure-bf16" else 4
    if optimizer in ("adam", "adamw"):
        k = 2.0 * state
    elif optimizer == "sgd-momentum":
        k = 1.0 * state
    elif optimizer == "sgd":
        k = 0.0
    elif optimizer == "adam8bit":
        k = 2.0 + 2.0 * 4 / 2048
    else:
        raise InvalidRecipeError("recipe.optimizer", f"unknown optimizer {optimizer!r}.")
    if policy.startswith("master-"):
        return (2.0, 4.0, 4.0 + k)
    if policy == "pure-bf16":
        return (2.0, 2.0, k)
    return (4.0, 4.0, k)


def model_state_bytes(
    n_params: int, precision: str, optimizer: str, zero_stage: int, dp: int
) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states) bytes of ``n_params`` on one rank of a dp group.

    ZeRO (Rajbhandari et al. 2020, Fig. 1): stage 1 shards the optimizer states (here including
    fp32 master weights), stage 2 also the gradients, stage 3 also the parameters. Shards round up.
    """
    p, g, o = state_bytes_per_param(precision, optimizer)
    p_div = dp if zero_stage >= 3 else 1
    g_div = dp if zero_stage >= 2 else 1
    o_div = dp if zero_stage >= 1 else 1
    return (int(np.ceil(n_params * p / p_div)), int(np.ceil(n_params * g / g_div)),
            int(np.ceil(n_params * o / o_div)))  # fmt: skip


# ---- pipeline stages, loss, adapters, runtime --------------------------------------------------


def ceil_div(a: NDArray[np.int64], b: NDArray[np.int64]) -> NDArray[np.int64]:
    return -(-a // b)


def runtime_reserve_bytes(gpu: GpuType | None, num_gpus: int) -> int:
    """CUDA context (+ library kernels) per GPU, plus NCCL buffers when the job has several GPUs."""
    context = CONTEXT_BYTES.get(gpu.name, CONTEXT_BYTES_DEFAULT) if gpu is not None else CONTEXT_BYTES_DEFAULT
    return context + (NCCL_BYTES if num_gpus > 1 else 0)


def stage_param_counts(
    model: ModelSpec, tp: ArrayLike, pp: ArrayLike, layers: ArrayLike | None = None
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Parameters on one TP rank of the first and of the last pipeline stage.

    Returns (first_stage, last_stage, one_layer, vocab_matrix), all per TP rank and counting
    every expert (expert parallelism divides them later). Megatron-LM: layers split evenly over
    stages (every stage gets the rounded-up share, the worst case); TP shards column/row-parallel
    weights and replicates norms and row-parallel biases (Shoeybi et al. 2019, sec. 3); the
    embedding and LM head are vocab-parallel, ceil(V / t) rows each; position embeddings are
    replicated. With pp = 1 both stages are the whole model; with pipelining a tied head keeps
    its own copy of the word embeddings on the last stage (Megatron's shared-embedding all-reduce).
    ``layers`` (an uneven split's fullest rank, ``marp.recipe.split_maxima``) replaces the even
    share where it is > 0.
    """
    tp_, pp_ = np.broadcast_arrays(np.asarray(tp, dtype=np.int64), np.asarray(pp, dtype=np.int64))
    sharded, replicated = model.layer_params_split()
    ex_sharded, ex_replicated = model.mlp_params_split(model.expert_ffn) if model.experts else (0, 0)
    layers = stage_layer_count(model.n_layers, pp_, layers)
    layer_local = (ceil_div(np.full_like(tp_, sharded + model.experts * ex_sharded), tp_)
                   + replicated + model.experts * ex_replicated)  # fmt: skip
    vocab_local = ceil_div(np.full_like(tp_, model.vocab), tp_) * model.hidden
    single = pp_ == 1
    h = model.hidden
    emb_extra = model.embedding_params() - model.vocab * h  # token types + embedding norm (encoders)
    embeddings = vocab_local + model.position_params() + emb_extra
    if model.head == "classifier":
        head_local = np.full_like(tp_, model.head_params())
    else:
        head_other = model.head_params() - (0 if model.tied_embeddings else model.vocab * h)
        # Untied heads hold their own vocab matrix; tied ones need a copy on the last stage.
        head_local = np.where(single & model.tied_embeddings, 0, vocab_local) + head_other
    head = head_local + model.final_norm_params()
    first = layers * layer_local + embeddings + np.where(single, head, 0)
    last = layers * layer_local + head + np.where(single, embeddings, 0)
    return first, last, layer_local, vocab_local


def stage_layer_count(n_layers: int, pp: NDArray[np.int64], split_max: ArrayLike | None = None) -> NDArray[np.int64]:
    """Layers charged to a pipeline rank: an even split's rounded-up share, or where ``split_max``
    (an uneven split's fullest rank) is > 0, that."""
    even = ceil_div(np.full_like(pp, n_layers), pp)
    if split_max is None:
        return even
    split = np.asarray(split_max, dtype=np.int64)
    return np.where(split > 0, split, even) if split.any() else even


def in_flight(
    n_layers: int, pp: NDArray[np.int64], vpp: NDArray[np.int64], m: NDArray[np.int64], rank: NDArray[np.int64],
    stage_layers: ArrayLike | None = None, chunk_layers: ArrayLike | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(layer x micro-batch units, micro-batches) of activations held at once by a pipeline rank.

    1F1B (Narayanan et al. 2021, sec. 2.2; PipeDream-Flush): rank r runs pp - r - 1 warm-up
    forwards, so it holds min(pp - r, m) micro-batches of its layers. Interleaved 1F1B with vpp
    chunks per rank (Megatron-LM core/pipeline_parallel/schedules.py, forward_backward_pipelining
    _with_interleaving): (pp - r - 1) x 2 + (vpp - 1) x pp warm-up chunk forwards plus the one in
    steady state, at most all m x vpp, each holding layers / (pp x vpp) layers. An uneven split
    (``stage_layers`` / ``chunk_layers`` > 0, ``marp.recipe.split_maxima``) charges every micro-
    batch the fullest rank's layers and every chunk pass the fullest virtual stage's.
    """
    layers_stage = stage_layer_count(n_layers, pp, stage_layers)
    per_chunk = layers_stage / vpp
    if chunk_layers is not None and np.any(chunk_layers):
        per_chunk = np.where(np.asarray(chunk_layers) > 0, chunk_layers, per_chunk)
    plain_mbs = np.minimum(pp - rank, m)
    chunks = np.minimum((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    inter = vpp > 1
    units = np.where(inter, chunks * per_chunk, plain_mbs * layers_stage)
    mbs = np.where(inter, np.minimum(np.ceil(chunks / vpp), m), plain_mbs)
    return units.astype(np.float64), mbs.astype(np.float64)


def loss_bytes_per_logit(loss: str, e: int, chunks: int, fused: bool = False) -> float:
    """Peak bytes per logit element of the loss (memory-notes D.5).

    torch: F.cross_entropy on the fp32-upcast logits. log_softmax saves its fp32 output (4); the
    caller frees the logits before backward (torchtitan / torchtune ``del pred``); at the start of
    the backward nll_loss's gradient (4) and log_softmax's gradient (4) coexist with the saved
    output: 12. fused: Megatron's vocab-parallel CE upcasts once and works in place on the fp32
    copy (4), the gradient is cast back to the logits dtype (e): 4 + e. megatron-fused: Megatron's
    --cross-entropy-loss-fusion under its jit fuser materialises one more logits-sized fp32 buffer
    (megatron/core/fusions/fused_cross_entropy.py, "a full logits-sized transient allocation"):
    4 + 4 + e. fused-copy: the same CE as Megatron had it before the max subtraction became in
    place -- ``vocab_parallel_logits = vocab_parallel_logits - logits_max.unsqueeze(dim=-1)``
    (NVIDIA/Megatron-LM megatron/core/tensor_parallel/cross_entropy.py at 8e6e7cd; the in-place
    change was still being proposed in Megatron-LM PRs #569, 2023-11, and #863, 2024-06) -- whose
    *forward* holds the caller's half logits (``output.float()`` in the GPT model's loss), the fp32
    copy and the shifted fp32 copy: e + 8 (``loss_forward_bytes_per_logit``); its backward is
    fused's, 4 + e. chunked (torchtune CEWithChunkedOutputLoss): the low-precision logits (e) and every
    chunk's log-softmax (4) are kept, one chunk is upcast at a time: e + 4 + 4 / chunks, or
    4 + 8 / chunks in the backward. inplace (llm.c's fused classifier): the low-precision logits
    are overwritten by their gradient, no fp32 copy: e. A compiled chunked loss (kernels "fused":
    torch.compile recomputes the pointwise log-softmax from the saved logits) keeps the logits
    (e) and one chunk's fp32 softmax and gradient: e + 8 / chunks. loss-parallel (torch's
    ``loss_parallel()`` on vocab-sharded DTensor logits, torch/distributed/tensor/parallel/loss.py,
    the torch loss under TP): its ``_log_softmax`` keeps the shifted logits beside ``exp`` in the
    forward and builds the gradient on its own fp32 buffers in the backward -- 16 per local logit at
    the backward's start (12 + 4; the forward, with the bf16 logits, e + 12 against the plain loss's
    e + 8). Measured on fake tensors at tp 2 and 4 (bf16, 16 Ki tokens x 8 Ki vocabulary), with
    DTensor's global-shape shape propagation kept out of the count: it runs on its own fake tensors.
    """
    if loss == "loss-parallel":
        return 16.0
    if loss == "chunked" and fused:
        return e + 8.0 / chunks
    if loss == "inplace":
        return float(e)
    if loss == "torch":
        return 12.0
    if loss in ("fused", "fused-copy"):
        return 4.0 + e
    if loss == "megatron-fused":
        return 8.0 + e
    return max(e + 4.0 + 4.0 / chunks, 4.0 + 8.0 / chunks)


def loss_forward_bytes_per_logit(loss: str, e: int, chunks: int, fused: bool = False) -> float:
    """Peak bytes per logit element in the loss's forward, where it differs from the backward's
    start (``loss_bytes_per_logit``): fused-copy's out-of-place max subtraction, e + 8."""
    if loss == "fused-copy":
        return e + 8.0
    return loss_bytes_per_logit(loss, e, chunks, fused)


def lora_params(model: ModelSpec, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters per layer: r x (d_in + d_out) per targeted matrix (Hu et al. 2021, sec. 4).

    In a mixture-of-experts layer every expert's gate / up / down projection is its own linear and
    gets its own adapter (peft wraps each matching module), so MLP targets count experts times.
    """
    h, f = model.hidden, model.expert_ffn if model.experts else model.ffn
    # (MLA: the projections' full widths, as if each were one matrix -- an approximation of peft's
    # adapters on the latent down / up projections.)
    dims = {"q": (h, model.q_width), "k": (h, model.k_width), "v": (h, model.v_width), "o": (model.o_width, h),
            "up": (h, f), "down": (f, h),
            "gate": (h, f) if model.mlp == "swiglu" else (0, 0)}  # fmt: skip
    copies = {t: (max(model.experts, 1) if t in ("gate", "up", "down") else 1) for t in targets}
    return sum(copies[t] * rank * (dims[t][0] + dims[t][1]) for t in targets)
