"""GPU catalog: memory, peak throughput and intra-node links of common training GPUs.

The planner needs, per GPU type, how many bytes a process can use and how fast
the card computes and communicates. ``memory_bytes`` is the total that NVML
reports (``nvmlDeviceGetMemoryInfo().total``, what ``nvidia-smi`` prints as
"MiB" total) -- slightly less than the marketing size, and still including the
CUDA context, which the memory model reserves separately. Throughputs are the
*dense* (no 2:4 sparsity) tensor-core peaks from the vendor datasheets cited
next to each entry (datasheets that quote "with sparsity" figures are halved);
0.0 means the format is not supported (no bf16 before Ampere, no fp8 before
Ada / Hopper), and ``check_precision`` refuses such a pairing by name rather
than let a planner give it zero speed. ``intra_node_gbps`` is the per-direction
GPU-to-GPU bandwidth inside one node (``xgmi``: AMD Infinity Fabric).

``gpu_from_nvml_name`` maps what an agent discovers through NVML onto a catalog
name, using the reported memory to split variants (A100 40 vs 80 GB, V100 16 vs 32 GB).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from marp._check import check_choice, check_int, check_number
from marp.errors import UnknownGpuError, UnsupportedPrecisionError
from marp.prices import list_price
from marp.recipe import compute_dtype

MiB = 1024**2
GiB = 1024**3

Link = Literal["nvlink", "pcie", "xgmi"]
LINKS: tuple[str, ...] = ("nvlink", "pcie", "xgmi")


@dataclass(frozen=True)
class GpuType:
    """One GPU model. ``memory_bytes`` is NVML's total (ROCm's for AMD); TFLOPS are dense peaks,
    0.0 where the format is not supported (``fp8_tflops``: float8 e4m3 / e5m2 matmuls)."""

    name: str
    memory_bytes: int
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    mem_bw_gbps: float
    intra_node_link: Link
    intra_node_gbps: float
    nvml_names: tuple[str, ...]
    fp8_tflops: float = 0.0
    # On-demand list price, US dollars per GPU-hour (marp.prices: source and date; docs/cost.md). A
    # cluster file's price_per_gpu_hour overrides it (marp.objectives.price_table).
    price_per_gpu_hour: float = 0.0

    def __post_init__(self) -> None:
        err = UnknownGpuError
        if not isinstance(self.name, str) or not self.name:
            raise err("gpu_type", f"name must be a non-empty string, got {self.name!r}.")
        check_int(self.memory_bytes, "gpu_type.memory_bytes", err)
        check_number(self.bf16_tflops, "gpu_type.bf16_tflops", err, 0.0, 1e6)
        check_number(self.fp8_tflops, "gpu_type.fp8_tflops", err, 0.0, 1e6)
        check_number(self.price_per_gpu_hour, "gpu_type.price_per_gpu_hour", err, 0.0, 1e6)
        for attr in ("fp16_tflops", "fp32_tflops", "mem_bw_gbps", "intra_node_gbps"):
            check_number(getattr(self, attr), f"gpu_type.{attr}", err, 1e-9, 1e6)
        check_choice(self.intra_node_link, "gpu_type.intra_node_link", err, LINKS)
        if not isinstance(self.nvml_names, tuple) or not all(isinstance(n, str) for n in self.nvml_names):
            raise err("gpu_type.nvml_names", "must be a tuple of strings.")

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for a precision policy's matmul dtype (mixed policies multiply in bf16/fp16)."""
        dtype = compute_dtype(precision)
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[dtype]

    def supports(self, precision: str) -> bool:
        return self.peak_tflops(precision) > 0.0

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_tflops > 0.0

    def check_precision(self, precision: str) -> None:
        """Refuse a precision policy whose matmul dtype this GPU cannot run (V100 and bf16)."""
        if self.supports(precision):
            return
        dtype = compute_dtype(precision)
        raise UnsupportedPrecisionError(
            "recipe.precision",
            f"{self.name} cannot run {precision}: it has no {dtype} tensor-core support "
            "(bf16 needs Ampere or newer).",
            f"use an fp16 or fp32 precision policy (amp-fp16, master-fp16, fp32) on {self.name}, "
            "or a GPU with bf16.",
        )

    def check_fp8(self) -> None:
        """Refuse float8 linears on a GPU without fp8 tensor cores (before Hopper / Ada / MI300)."""
        if self.supports_fp8:
            return
        raise UnsupportedPrecisionError(
            "recipe.float8",
            f"{self.name} cannot run float8 linears: it has no fp8 tensor-core support "
            "(fp8 needs Hopper, Ada Lovelace, Blackwell or MI300).",
            f"drop --float8 on {self.name}, or use a GPU with fp8 (H100, H200, B200, L40S, L4, MI300X).",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "memory_bytes": self.memory_bytes, "bf16_tflops": self.bf16_tflops,
            "fp16_tflops": self.fp16_tflops, "fp32_tflops": self.fp32_tflops,
            "mem_bw_gbps": self.mem_bw_gbps, "intra_node_link": self.intra_node_link,
            "intra_node_gbps": self.intra_node_gbps, "nvml_names": list(self.nvml_names),
            "fp8_tflops": self.fp8_tflops, "price_per_gpu_hour": self.price_per_gpu_hour,
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
    # fp8 tensor 242.5 TFLOPS dense (485 sparse), same datasheet.
    GpuType("L4", 23034 * MiB, 121.0, 121.0, 30.3, 300.0, "pcie", 32.0, ("NVIDIA L4",), fp8_tflops=242.5),
    # NVIDIA L40S datasheet: bf16/fp16 tensor 362.05 TFLOPS dense (733 sparse), fp32 91.6,
    # GDDR6 864 GB/s, PCIe Gen4 x16 64 GB/s bidirectional. NVML total 46068 MiB.
    # fp8 tensor 733 TFLOPS dense (1,466 sparse), same datasheet
    # (https://www.nvidia.com/en-us/data-center/l40s/).
    GpuType("L40S", 46068 * MiB, 362.05, 362.05, 91.6, 864.0, "pcie", 32.0, ("NVIDIA L40S",), fp8_tflops=733.0),
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
    # fp8 3,958 TFLOPS with sparsity = 1979 dense.
    GpuType("H100-80GB", 81559 * MiB, 989.5, 989.5, 67.0, 3350.0, "nvlink", 450.0,
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100"), fp8_tflops=1979.0),
    # NVIDIA H100 datasheet, H100 NVL column (https://resources.nvidia.com/en-us-tensor-core/
    # nvidia-tensor-core-gpu-datasheet): 94 GB HBM3 (96 GB on the package), 3.9 TB/s; bf16/fp16
    # tensor 1,671 TFLOPS with sparsity = 835.5 dense, fp8 3,341 = 1670.5 dense, fp32 60. Its
    # NVLink bridge (600 GB/s) joins pairs of cards only, so a node's collectives run over PCIe
    # Gen5 (128 GB/s bidirectional). NVML total 95830 MiB (nvidia-smi on H100 NVL hosts).
    GpuType("H100-96GB", 95830 * MiB, 835.5, 835.5, 60.0, 3900.0, "pcie", 64.0,
            ("NVIDIA H100 NVL",), fp8_tflops=1670.5),
    # NVIDIA H200 datasheet (SXM): H100 compute (989.5 dense bf16/fp16, 67 fp32), 141 GB HBM3e
    # at 4.8 TB/s, NVLink 900 GB/s total. NVML total 143771 MiB.
    GpuType("H200", 143771 * MiB, 989.5, 989.5, 67.0, 4800.0, "nvlink", 450.0,
            ("NVIDIA H200", "NVIDIA H200 NVL"), fp8_tflops=1979.0),
    # NVIDIA HGX platform specifications, HGX B200 (https://www.nvidia.com/en-us/data-center/hgx/),
    # per GPU of the 8: bf16/fp16 tensor 36 PFLOPS with sparsity / 8 / 2 = 2250 TFLOPS dense,
    # fp8 72 PFLOPS / 8 / 2 = 4500 dense, fp32 600 TFLOPS / 8 = 75, HBM3e 64 TB/s / 8 = 8 TB/s,
    # NVLink 5 1.8 TB/s per GPU (900 per direction); DGX B200 datasheet: 1,440 GB for 8 GPUs.
    # NVML total 183359 MiB (nvidia-smi on B200 hosts).
    GpuType("B200", 183359 * MiB, 2250.0, 2250.0, 75.0, 8000.0, "nvlink", 900.0,
            ("NVIDIA B200",), fp8_tflops=4500.0),
    # NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): bf16/fp16 tensor with fp32
    # accumulate 165.2 TFLOPS dense (training accumulates in fp32), fp32 82.6, GDDR6X
    # 1008 GB/s, no NVLink: PCIe Gen4 x16. NVML total 24564 MiB.
    # Same whitepaper: fp8 tensor with fp32 accumulate 330.3 TFLOPS dense.
    GpuType("RTX-4090", 24564 * MiB, 165.2, 165.2, 82.6, 1008.0, "pcie", 32.0,
            ("NVIDIA GeForce RTX 4090",), fp8_tflops=330.3),
    # NVIDIA Ampere GA102 GPU architecture whitepaper (https://www.nvidia.com/content/PDF/
    # nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf), RTX 3090: bf16/fp16 tensor with
    # fp32 accumulate 71 TFLOPS dense (142 sparse), fp32 35.6, GDDR6X 936 GB/s; its NVLink
    # bridge joins pairs only: PCIe Gen4 x16. No fp8. NVML total 24576 MiB (nvidia-smi).
    GpuType("RTX-3090", 24576 * MiB, 71.0, 71.0, 35.6, 936.0, "pcie", 32.0, ("NVIDIA GeForce RTX 3090",)),
    # NVIDIA RTX A6000 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/design-
    # visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-
    # 1454980-r9-web%20(1).pdf): tensor 309.7 TFLOPS with sparsity = 154.8 dense (bf16/fp16, fp32
    # accumulate at full rate on the professional part, GA102 whitepaper), fp32 38.7, 48 GB GDDR6
    # at 768 GB/s, NVLink bridge for pairs only: PCIe Gen4 x16. No fp8. NVML total 49140 MiB.
    GpuType("RTX-A6000", 49140 * MiB, 154.8, 154.8, 38.7, 768.0, "pcie", 32.0, ("NVIDIA RTX A6000",)),
    # AMD Instinct MI300X data sheet (https://www.amd.com/content/dam/amd/en/documents/
    # instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf): bf16/fp16 matrix
    # 1,307.4 TFLOPS dense (2,614.9 with sparsity), fp8 2,614.9 dense, fp32 163.4, 192 GB HBM3 at
    # 5.3 TB/s; Infinity Fabric 128 GB/s per link, 7 links to the other 7 GPUs of a platform
    # (896 GB/s, 448 per direction). Total 205822885888 B = 196288 MiB (rocm-smi "VRAM Total").
    GpuType("MI300X", 196288 * MiB, 1307.4, 1307.4, 163.4, 5300.0, "xgmi", 448.0,
            ("AMD Instinct MI300X", "AMD Instinct MI300X VF"), fp8_tflops=2614.9),
)  # fmt: skip
# Every type's list price (marp.prices keeps them with their source and date).
_GPUS = tuple(replace(g, price_per_gpu_hour=list_price(g.name)) for g in _GPUS)


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
    ("h100nvl", ("H100-96GB",)),
    ("h100", ("H100-80GB",)),
    ("b200", ("B200",)),
    ("mi300x", ("MI300X",)),
    ("a6000", ("RTX-A6000",)),
    ("3090", ("RTX-3090",)),
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
