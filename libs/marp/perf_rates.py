"""Rates the step-time model prices a step with: achievable throughput, bandwidths, fixed costs.

Pure data plus two small lookups; ``marp.perf`` turns a layout's FLOPs and bytes into seconds
with them. Every constant carries its source. Constants marked FITTED were set by hand against
the published runs in ``bench/data/speed/throughput.csv`` (``bench/marp_accuracy.py`` prints
the fit) and each stays inside the range its cited source gives; docs/marp.md lists them.

Datasheet peaks live in ``marp.gpus``; here are the *achievable* fractions of them.
"""

from __future__ import annotations

from marp.gpus import GpuType

# ---- achievable matmul throughput (fraction of the dense datasheet peak) ------------------------
# Large bf16/fp16 GEMMs as cuBLAS runs them inside training (power- and clock-limited):
# A100: 250-290 of 312 TFLOP/s in NVIDIA's published GEMM sweeps and the 75-80 % HFU that
#   llm-foundry measures for 13B-30B models (scripts/train/benchmarking/README.md) -> 0.80 (FITTED);
# H100 SXM: 600-760 of 989.5 TFLOP/s (the H100 runs bf16 GEMMs at ~0.65-0.75 of peak under the
#   700 W limit; llm-foundry's H100 MFU tops out at ~46 %, Llama 3's 405B run at 43 %) -> 0.62 (FITTED);
# V100: 100-110 of 125 TFLOP/s fp16 in cuBLAS sweeps today, but Megatron-LM 2019 sustains 39
#   TFLOP/s (30 % of peak) on one GPU end to end with the 2019 stack -> 0.42 (FITTED).
# Other generations borrow the nearest measured one (Ada / Ampere PCIe parts: the A100 value
# times the PCIe efficiency of ``PCIE_MATMUL``; Blackwell and MI300X: the H100 value).
MATMUL_EFF: dict[str, float] = {
    "V100-16GB": 0.42, "V100-32GB": 0.42, "A100-40GB": 0.80, "A100-80GB": 0.80,
    "H100-80GB": 0.62, "H100-96GB": 0.62, "H200": 0.66, "B200": 0.62, "MI300X": 0.45,
}  # fmt: skip
# H200: same compute die as H100 with 1.4x the memory bandwidth and a higher power ceiling; NVIDIA
# quotes 1.1-1.2x H100 training speed for the same job (H200 product brief, "up to 1.6x" is inference)
# -> 0.66. MI300X: ~45 % of its 1307 TFLOP/s bf16 peak in public GEMM sweeps (SemiAnalysis, Dec 2024).
# GEMM width at which a layer's matmuls run at half the large-GEMM rate's headroom: the rate is
# MATMUL_EFF / (1 + GEMM_HALF_WIDTH / hidden); 7-8 % slower at h = 4096, 30 % at h = 768, matching
# the A100 MFU drop from 7B to 125M models in llm-foundry's tables (FITTED).
GEMM_HALF_WIDTH = 256.0
# Rows (tokens per micro-batch and GPU) at which the GEMM rate halves: a 128 x 128 output tile per
# SM needs 100+ tiles to fill an A100 / H100 wave, i.e. about 1-2 K rows at h = 768-4096
# (NVIDIA Matrix Multiplication Background User's Guide, "wave quantization") (FITTED 128).
GEMM_HALF_ROWS = 128.0
PCIE_MATMUL = 0.60  # PCIe / workstation parts (A10, L4, L40S, RTX): clock-limited at 150-350 W TDP

# float8 matmuls (Transformer Engine): the fp8 dense peak is 2x bf16, but scaling casts and amax
# bookkeeping eat part of it. NVIDIA's NeMo tables show 1.3-1.5x bf16 end to end on H100 and
# llm-foundry's H100 FP8 table 1.25-1.3x -> fp8 GEMMs at 0.50 of the fp8 peak (FITTED), i.e. 1.6x
# the bf16 GEMM rate, with the cast traffic charged as elementwise bytes (FP8_CAST_BYTES).
FP8_MATMUL_EFF = 0.50

# ---- attention (FlashAttention / cuDNN fused attention), fraction of the dense peak ---------------
# FlashAttention-2 (Dao 2023, Fig. 6): forward + backward 50-60 % of the A100's peak at head dim
# 128; on H100 FA2 reaches ~35 % and FA3 / cuDNN 60-75 % (Shah et al. 2024, FlashAttention-3, sec. 4).
# The causal kernels skip the masked half; we count causal FLOPs (half of 4 s^2 h per layer forward,
# backward 2.5x the forward: its five matmuls against the forward's two).
# FITTED inside those ranges: FlashAttention-2 (and the Triton flash kernel llm-foundry used) on
# A100 0.40, on H100 0.30 (FA2 does not use Hopper's wgmma / TMA); cuDNN fused attention, which
# Transformer Engine runs on Hopper, 0.50 (FA3-class kernels).
ATTN_EFF: dict[str, float] = {"A100": 0.40, "H100": 0.30, "V100": 0.30, "other": 0.30}
ATTN_EFF_CUDNN_HOPPER = 0.50
# Eager attention (no flash): score matmuls at the GEMM rate, plus the s^2 softmax traffic.

# ---- memory-bound (elementwise) work ----------------------------------------------------------------
# Bytes each token moves per layer through HBM outside the matmuls, in units of hidden x element
# bytes (norms, residual adds, bias / dropout, rotary, casts; forward + backward). Korthikanti et
# al. 2022 (sec. 4.1) count 34 s b h bytes of saved activations per layer; every saved tensor is
# written once and read about twice more (backward and its producer), so ~ 60-100 h-sized passes.
# Unfused (eager PyTorch): 80 (FITTED); fused kernels (Megatron/TE, torch.compile): 40 (FITTED).
ELEM_PASSES_EAGER = 80.0
ELEM_PASSES_FUSED = 40.0
# The MLP activation passes over the ffn-wide tensor: GELU forward reads 1 and writes 1, backward
# reads 2 and writes 1 (5); SwiGLU forward reads 2 writes 1, backward reads 3 writes 2 (8).
ACT_PASSES = {"gelu": 5.0, "swiglu": 8.0}
# Eager attention over materialised scores, passes over the b x heads x s^2 tensor: forward write
# (QK^T), softmax read + write, read by P.V (4); backward about 1.75x that (7). The score matmuls
# have an inner dimension of only the head size (64-128), below the ridge point of every GPU, so
# their traffic, not their FLOPs, sets their time. Dropout on the probabilities (Megatron's 0.1):
# mask write and apply forward, mask read and apply backward (4 more).
EAGER_SCORE_PASSES = 11.0
DROPOUT_SCORE_PASSES = 4.0
# Hidden dropout at two sites per layer (attention and MLP outputs), mask plus apply, both ways.
DROPOUT_PASSES = 10.0
# Cross-entropy over fp32 logits: write logits, read for log-softmax, write / read the gradient.
LOSS_BYTES_PER_LOGIT = 16.0
FP8_CAST_BYTES = 6.0  # extra h-sized passes per layer for the float8 casts of inputs and grads
MEM_BW_EFF = 0.80  # achievable fraction of the HBM datasheet bandwidth (STREAM-like kernels)

# ---- fixed costs ----------------------------------------------------------------------------------
# Kernel launches: an eager PyTorch op costs ~5-10 us of CPU dispatch (PyTorch "Accelerating PyTorch
# with CUDA Graphs" blog, 2021; He 2022, "Making Deep Learning Go Brrrr From First Principles":
# ~3.6 us for a bare op, more once autograd records it); a transformer layer runs ~40 kernels forward
# and ~80 backward. When the GPU work of a layer is shorter than its launches, the CPU is the
# bottleneck, and more GPUs do not shorten it. 8 us: no run of the validation set is launch-bound
# (5 and 10 us give the same table), so the value rests on those sources alone.
LAUNCH_S = 8e-6
KERNELS_PER_LAYER = 120.0
KERNELS_PER_LAYER_FUSED = 60.0  # Megatron/TE fused modules, or torch.compile
# Per optimizer step: zero_grad, the loss .item() sync, data loading hand-off, logging (~5 ms in
# torchtitan / llm-foundry traces of small models), independent of the model.
STEP_FIXED_S = 5e-3
# Optimizer (Adam) state traffic per local parameter per step: read param, grad, m, v (+ fp32
# master) and write them back: 28 bytes (fp32 params) to 36 (bf16 params + fp32 master).
OPT_BYTES_PER_PARAM = 32.0
# DDP's gradient bucket (torch.nn.parallel.DistributedDataParallel bucket_cap_mb default 25 MB;
# Li et al. 2020 sec. 4.1 measure 10-25 MB buckets as the sweet spot); the last one is exposed.
DDP_BUCKET_BYTES = 25e6
# Pipeline point-to-point latency per send (NCCL send/recv, ~20-30 us over IB / NVLink).
P2P_LATENCY_S = 25e-6

# ---- communication ------------------------------------------------------------------------------
# NCCL bus bandwidth as a fraction of the link's per-direction rate: nccl-tests all-reduce reaches
# ~75-80 % of NVLink (A100: ~230 of 300 GB/s; H100: ~360 of 450 GB/s) and ~90 % of an InfiniBand NIC.
INTRA_BW_EFF = 0.80
INTER_BW_EFF = 0.90
ALPHA_INTRA_S = 5e-6  # NCCL per-step latency inside a node (NVLink / PCIe)
ALPHA_INTER_S = 15e-6  # ... and across nodes (InfiniBand / RoCE)
# Overlap: the share of the compute a collective can hide behind. FSDP prefetches the next layer's
# all-gather and reduce-scatters during backward (Zhao et al. 2023, PyTorch FSDP, sec. 3.3);
# Megatron / DDP overlap the gradient reduce with the last micro-batch's backward (--overlap-grad-
# reduce; Li et al. 2020, PyTorch DDP, sec. 3.2.3) and the distributed optimizer's parameter
# all-gather with the next forward. Not 1.0: compute kernels slow down while NCCL shares the SMs
# and memory (Zhao et al. 2023 report 5-10 % interference) (FITTED 0.85).
OVERLAP = 0.85
# While a collective runs beside compute, NCCL's kernels occupy SMs (one CTA per channel, 16-32
# channels: 12-24 % of an H100's 132 SMs) and memory bandwidth, so hidden communication still
# costs a share of its own time (FITTED 0.2).
INTERFERENCE = 0.2
# Transformer Engine's userbuffer TP communication overlap (Megatron-Core --tp-comm-overlap, on in
# NVIDIA's Hopper performance recipes) hides about half of the TP all-gather / reduce-scatter time
# behind the GEMMs it feeds (FITTED 0.5).
TP_OVERLAP_TE = 0.5
# Tensor parallel collectives sit on the critical path (each layer waits for them); Transformer
# Engine's userbuffer overlap hides part of them on Hopper. Charged in full (conservative).

# Inter-node bandwidth per GPU (GB/s) by generation, when the cluster file does not give one:
# DGX H100 / H200 / B200 reference architectures: 8 x 400 Gb/s ConnectX-7 per 8 GPUs = 50 GB/s;
# DGX A100: 8 x 200 Gb/s HDR = 25 GB/s; DGX-2 (V100): 8 x 100 Gb/s per 16 GPUs = 6.25 GB/s; AMD
# MI300X platforms: 400 Gb/s per GPU (50); PCIe cards in clouds (AWS g5/g6.48xlarge: 100 Gb/s per
# 8-GPU node): 1.5625 GB/s.
INTER_NODE_GBPS_BY_GPU: dict[str, float] = {
    "H100-80GB": 50.0, "H100-96GB": 50.0, "H200": 50.0, "B200": 50.0, "MI300X": 50.0,
    "A100-40GB": 25.0, "A100-80GB": 25.0, "V100-16GB": 6.25, "V100-32GB": 6.25,
}  # fmt: skip
INTER_NODE_GBPS_PCIE = 1.5625


def default_inter_node_gbps(gpu: GpuType) -> float:
    """GB/s per GPU between nodes for a cluster of ``gpu`` (its generation's reference design)."""
    return INTER_NODE_GBPS_BY_GPU.get(gpu.name, INTER_NODE_GBPS_PCIE)


def matmul_eff(gpu: GpuType) -> float:
    """Achievable fraction of the dense bf16/fp16 peak for large training GEMMs."""
    eff = MATMUL_EFF.get(gpu.name)
    if eff is not None:
        return eff
    return PCIE_MATMUL if gpu.intra_node_link == "pcie" else MATMUL_EFF["A100-80GB"]


def attn_eff(gpu: GpuType, fused: bool = False) -> float:
    """Achievable fraction of the dense peak for fused (flash) attention, forward + backward;
    ``fused``: Megatron / Transformer Engine kernels (cuDNN attention on Hopper-class parts)."""
    hopper = gpu.name.startswith(("H100", "H200", "B200"))
    if fused and hopper:
        return ATTN_EFF_CUDNN_HOPPER
    for key in ("A100", "H100", "V100"):
        if key in gpu.name:
            return ATTN_EFF[key]
    return ATTN_EFF["H100"] if hopper else ATTN_EFF["other"]


__all__ = [
    "ACT_PASSES", "ALPHA_INTER_S", "ALPHA_INTRA_S", "DDP_BUCKET_BYTES", "DROPOUT_PASSES", "DROPOUT_SCORE_PASSES", "EAGER_SCORE_PASSES", "ELEM_PASSES_EAGER", "ELEM_PASSES_FUSED", "FP8_CAST_BYTES",
    "FP8_MATMUL_EFF", "GEMM_HALF_ROWS", "GEMM_HALF_WIDTH", "INTERFERENCE", "INTER_BW_EFF", "INTER_NODE_GBPS_BY_GPU", "INTER_NODE_GBPS_PCIE", "INTRA_BW_EFF",
    "KERNELS_PER_LAYER", "KERNELS_PER_LAYER_FUSED", "LAUNCH_S", "LOSS_BYTES_PER_LOGIT", "MEM_BW_EFF",
    "OPT_BYTES_PER_PARAM", "OVERLAP", "P2P_LATENCY_S", "STEP_FIXED_S", "TP_OVERLAP_TE", "attn_eff", "default_inter_node_gbps",
    "matmul_eff",
]  # fmt: skip
