"""GPU catalog: memory, peak throughput and intra-node links of common training GPUs.

The planner needs, per GPU type, how many bytes a process can use and how fast
the card computes and communicates. ``memory_bytes`` is the total that NVML
reports (``nvmlDeviceGetMemoryInfo().total``, what ``nvidia-smi`` prints as
"MiB" total) -- slightly less than the marketing size, and still including the
CUDA context, which the memory model reserves separately. Throughputs are the
*dense* (no 2:4 sparsity) tensor-core peaks from the vendor datasheets cited
next to each entry; 0.0 means the format is not supported (no bf16 before Ampere).
``intra_node_gbps`` is the per-direction GPU-to-GPU bandwidth inside one node.

``gpu_from_nvml_name`` maps what an agent discovers through NVML onto a catalog
name, using the reported memory to split variants (A100 40 vs 80 GB, V100 16 vs 32 GB).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Literal

from marp._check import check_choice, check_int, check_number
from marp.errors import UnknownGpuError
from marp.recipe import compute_dtype

MiB = 1024**2
GiB = 1024**3

Link = Literal["nvlink", "pcie"]


@dataclass(frozen=True)
class GpuType:
    """One GPU model. ``memory_bytes`` is NVML's total; TFLOPS are dense peaks."""

    name: str
    memory_bytes: int
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    mem_bw_gbps: float
    intra_node_link: Link
    intra_node_gbps: float
    nvml_names: tuple[str, ...]

    def __post_init__(self) -> None:
        err = UnknownGpuError
        if not isinstance(self.name, str) or not self.name:
            raise err("gpu_type", f"name must be a non-empty string, got {self.name!r}.")
        check_int(self.memory_bytes, "gpu_type.memory_bytes", err)
        check_number(self.bf16_tflops, "gpu_type.bf16_tflops", err, 0.0, 1e6)
        for attr in ("fp16_tflops", "fp32_tflops", "mem_bw_gbps", "intra_node_gbps"):
            check_number(getattr(self, attr), f"gpu_type.{attr}", err, 1e-9, 1e6)
        check_choice(self.intra_node_link, "gpu_type.intra_node_link", err, ("nvlink", "pcie"))
        if not isinstance(self.nvml_names, tuple) or not all(isinstance(n, str) for n in self.nvml_names):
            raise err("gpu_type.nvml_names", "must be a tuple of strings.")

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for a precision policy's matmul dtype (mixed policies multiply in bf16/fp16)."""
        dtype = compute_dtype(precision)
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[dtype]

    def supports(self, precision: str) -> bool:
        return self.peak_tflops(precision) > 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "memory_bytes": self.memory_bytes, "bf16_tflops": self.bf16_tflops,
            "fp16_tflops": self.fp16_tflops, "fp32_tflops": self.fp32_tflops,
            "mem_bw_gbps": self.mem_bw_gbps, "intra_node_link": self.intra_node_link,
            "intra_node_gbps": self.intra_node_gbps, "nvml_names": list(self.nvml_names),
        }  # fmt: skip


_GPUS: tuple[GpuType, ...] = (
    # NVIDIA Tesla V100 datasheet (2020): SXM2 125 TFLOPS fp16 tensor, 15.7 fp32, HBM2 900 GB/s,
    # NVLink 300 GB/s total (150 per direction); no bf16. NVML total 16160 MiB.
    GpuType("V100-16GB", 16160 * MiB, 0.0, 125.0, 15.7, 900.0, "nvlink", 150.0,
            ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB", "Tesla V100-SXM2-16GB-LS",
             "Tesla V100-FHHL-16GB")),
    # Same datasheet, 32 GB HBM2. NVML total 32510 MiB.
    GpuType("V100-32GB", 32510 * MiB, 0.0, 125.0, 15.7, 900.0, "nvlink", 150.0,
            ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB",
             "Tesla V100-SXM3-32GB", "Tesla V100-DGXS-32GB")),
    # NVIDIA T4 datasheet: 65 TFLOPS fp16 mixed precision, 8.1 fp32, GDDR6 320 GB/s,
    # PCIe Gen3 x16 (32 GB/s bidirectional); no bf16. NVML total 15360 MiB.
    GpuType("T4", 15360 * MiB, 0.0, 65.0, 8.1, 320.0, "pcie", 16.0, ("Tesla T4", "NVIDIA T4")),
    # NVIDIA A10 datasheet: bf16/fp16 tensor 125 TFLOPS dense (250 sparse), fp32 31.2,
    # GDDR6 600 GB/s, PCIe Gen4 64 GB/s bidirectional. NVML total 23028 MiB.
    GpuType("A10", 23028 * MiB, 125.0, 125.0, 31.2, 600.0, "pcie", 32.0, ("NVIDIA A10",)),
    # A10G (AWS G5; no public NVIDIA datasheet): AWS / NVIDIA list 70 TFLOPS bf16/fp16 tensor
    # dense, 35 TFLOPS fp32, the A10's 24 GB GDDR6 at 600 GB/s, PCIe Gen4. NVML total 23028 MiB.
    GpuType("A10G", 23028 * MiB, 70.0, 70.0, 35.0, 600.0, "pcie", 32.0, ("NVIDIA A10G",)),
    # NVIDIA L4 datasheet: bf16/fp16 tensor 121 TFLOPS dense (242 sparse), fp32 30.3,
    # GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s bidirectional. NVML total 23034 MiB.
    GpuType("L4", 23034 * MiB, 121.0, 121.0, 30.3, 300.0, "pcie", 32.0, ("NVIDIA L4",)),
    # NVIDIA L40S datasheet: bf16/fp16 tensor 362.05 TFLOPS dense (733 sparse), fp32 91.6,
    # GDDR6 864 GB/s, PCIe Gen4 x16 64 GB/s bidirectional. NVML total 46068 MiB.
    GpuType("L40S", 46068 * MiB, 362.05, 362.05, 91.6, 864.0, "pcie", 32.0, ("NVIDIA L40S",)),
    # NVIDIA A100 datasheet (2021): bf16/fp16 tensor 312 TFLOPS dense, fp32 19.5, HBM2 1555 GB/s
    # (40 GB), NVLink 3 600 GB/s total (300 per direction). NVML total 40960 MiB.
    GpuType("A100-40GB", 40960 * MiB, 312.0, 312.0, 19.5, 1555.0, "nvlink", 300.0,
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB")),
    # Same datasheet, 80 GB HBM2e at 2039 GB/s (SXM). NVML total 81920 MiB.
    GpuType("A100-80GB", 81920 * MiB, 312.0, 312.0, 19.5, 2039.0, "nvlink", 300.0,
            ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM-80GB",
             "A100-SXM4-80GB", "A100-SXM-80GB")),
    # NVIDIA H100 datasheet (SXM5): bf16/fp16 tensor 1979 TFLOPS with sparsity = 989.5 dense,
    # fp32 67, HBM3 3.35 TB/s, NVLink 4 900 GB/s total (450 per direction). NVML total 81559 MiB.
    GpuType("H100-80GB", 81559 * MiB, 989.5, 989.5, 67.0, 3350.0, "nvlink", 450.0,
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100")),
    # NVIDIA H200 datasheet (SXM): H100 compute (989.5 dense bf16/fp16, 67 fp32), 141 GB HBM3e
    # at 4.8 TB/s, NVLink 900 GB/s total. NVML total 143771 MiB.
    GpuType("H200", 143771 * MiB, 989.5, 989.5, 67.0, 4800.0, "nvlink", 450.0,
            ("NVIDIA H200", "NVIDIA H200 NVL")),
    # NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): bf16/fp16 tensor with fp32
    # accumulate 165.2 TFLOPS dense (training accumulates in fp32), fp32 82.6, GDDR6X
    # 1008 GB/s, no NVLink: PCIe Gen4 x16. NVML total 24564 MiB.
    GpuType("RTX-4090", 24564 * MiB, 165.2, 165.2, 82.6, 1008.0, "pcie", 32.0,
            ("NVIDIA GeForce RTX 4090",)),
)  # fmt: skip


def _norm(text: str) -> str:
    """Lower case, alphanumerics only: "RTX 4090", "rtx-4090" and "RTX4090" all become "rtx4090"."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


_BY_NORM: dict[str, GpuType] = {_norm(g.name): g for g in _GPUS}
_BY_NVML: dict[str, GpuType] = {_norm(n): g for g in _GPUS for n in g.nvml_names}
_BY_NAME: dict[str, GpuType] = {g.name: g for g in _GPUS}

# Fallback for NVML names not listed above: a family token -> the catalog variants it may be.
# Longer / more specific tokens first (a100 before a10, a10g before a10, l40s before l4).
_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("h200", ("H200",)),
    ("h100", ("H100-80GB",)),
    ("a100", ("A100-40GB", "A100-80GB")),
    ("a10g", ("A10G",)),
    ("a10", ("A10",)),
    ("l40s", ("L40S",)),
    ("v100", ("V100-16GB", "V100-32GB")),
    ("4090", ("RTX-4090",)),
    ("t4", ("T4",)),
    ("l4", ("L4",)),
)


def list_gpus() -> list[GpuType]:
    """Every catalog GPU type, smallest memory first within a generation (catalog order)."""
    return list(_GPUS)


def gpu_names() -> list[str]:
    return [g.name for g in _GPUS]


def gpu_from_nvml_name(nvml_name: str, memory_bytes: int | None = None) -> str | None:
    """The catalog name for an NVML device name, or None when it is not a catalog GPU.

    Known NVML names map directly. Otherwise the family is recognised from the name
    ("A100", "V100", ...) and the variant from a "NNGB" token in the name or, failing
    that, from ``memory_bytes`` (the variant whose NVML total is nearest). An ambiguous
    name without memory gives None rather than a guess.
    """
    if not isinstance(nvml_name, str) or not nvml_name.strip():
        return None
    norm = _norm(nvml_name)
    exact = _BY_NVML.get(norm) or _BY_NORM.get(norm)
    if exact is not None:
        return exact.name
    core = re.sub(r"^(nvidia|tesla|geforce|quadro|rtx)+", "", norm)
    for token, variants in _FAMILIES:
        # Short tokens ("t4", "l4", "a10") must be the whole model name, not a substring of
        # e.g. "l40" or "a1000"; longer ones may carry suffixes ("a100sxm480gb").
        if len(token) <= 3 and not re.fullmatch(token + r"(pcie|sxm\w*|\d+gb)?", core):
            continue
        if token not in core:
            continue
        if len(variants) == 1:
            return variants[0]
        size = re.search(r"(?<![a-z0-9])(\d+)\s*gb", nvml_name.lower())
        if size is not None:
            target = int(size.group(1)) * 10**9
        elif memory_bytes is not None and not isinstance(memory_bytes, bool) and memory_bytes > 0:
            target = memory_bytes
        else:
            return None
        return min(variants, key=lambda v: abs(_BY_NAME[v].memory_bytes - target))
    return None


def find_gpu(name: str) -> GpuType | None:
    """The catalog GPU called ``name`` (case/space/hyphen-insensitive, NVML names accepted)."""
    if not isinstance(name, str):
        return None
    gpu = _BY_NORM.get(_norm(name))
    if gpu is not None:
        return gpu
    mapped = gpu_from_nvml_name(name)
    return _BY_NAME.get(mapped) if mapped else None


def get_gpu(name: str) -> GpuType:
    """The catalog GPU type called ``name``; UnknownGpuError listing the valid names otherwise."""
    gpu = find_gpu(name)
    if gpu is not None:
        return gpu
    names = gpu_names()
    close = difflib.get_close_matches(str(name).upper(), names, n=3, cutoff=0.4)
    hint = f"Did you mean {', '.join(close)}? " if close else ""
    raise UnknownGpuError(
        "gpu_type",
        f"unknown GPU type {name!r}. {hint}Valid: {', '.join(names)}.",
        "use one of the catalog names (list_gpus()).",
    )


__all__ = ["GiB", "GpuType", "MiB", "find_gpu", "get_gpu", "gpu_from_nvml_name", "gpu_names", "list_gpus"]
