"""GPU catalog look-ups and NVML name mapping."""

from __future__ import annotations

import pytest

from marp import UnknownGpuError, get_gpu, gpu_from_nvml_name, list_gpus
from marp.gpus import GiB

REQUIRED = ["V100-16GB", "V100-32GB", "T4", "A10", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB",
            "H100-80GB", "H100-96GB", "H200", "B200", "RTX-3090", "RTX-4090", "RTX-A6000", "MI300X"]  # fmt: skip


def test_catalog_has_required_types_with_sane_numbers() -> None:
    gpus = {g.name: g for g in list_gpus()}
    assert set(REQUIRED) <= set(gpus)
    for g in gpus.values():
        assert g.fp16_tflops > g.fp32_tflops > 0
        assert g.intra_node_link in ("nvlink", "pcie", "xgmi") and g.intra_node_gbps > 0
        assert g.nvml_names
    # NVML totals are a little under the marketing size.
    assert 79 * GiB < gpus["A100-80GB"].memory_bytes <= 80 * GiB
    assert 14.5 * GiB < gpus["T4"].memory_bytes <= 16 * GiB
    assert gpus["V100-16GB"].bf16_tflops == 0 and not gpus["T4"].supports("bf16")
    assert gpus["H100-80GB"].bf16_tflops > gpus["A100-80GB"].bf16_tflops


@pytest.mark.parametrize("alias", ["RTX-4090", "rtx4090", "rtx 4090", "RTX_4090", "NVIDIA GeForce RTX 4090"])
def test_get_gpu_aliases(alias: str) -> None:
    assert get_gpu(alias).name == "RTX-4090"


def test_get_gpu_case_insensitive() -> None:
    assert get_gpu("a100-80gb").name == "A100-80GB"
    assert get_gpu("h100").name == "H100-80GB"


def test_unknown_gpu_lists_valid_names() -> None:
    with pytest.raises(UnknownGpuError) as info:
        get_gpu("B300")
    assert info.value.field == "gpu_type"
    for name in REQUIRED:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("nvml", "memory", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
        ("Tesla V100-SXM2-16GB", None, "V100-16GB"),
        ("Tesla V100-SXM2-32GB", None, "V100-32GB"),
        ("Tesla V100S-PCIE-32GB", None, "V100-32GB"),
        ("NVIDIA H100 80GB HBM3", None, "H100-80GB"),
        ("NVIDIA H100 PCIe", None, "H100-80GB"),
        ("NVIDIA H200", None, "H200"),
        ("NVIDIA GeForce RTX 4090", None, "RTX-4090"),
        ("NVIDIA L4", None, "L4"),
        ("NVIDIA L40S", None, "L40S"),
        ("NVIDIA A10G", None, "A10G"),
        ("NVIDIA A10", None, "A10"),
        ("Tesla T4", None, "T4"),
        ("NVIDIA H100 NVL", None, "H100-96GB"),
        ("NVIDIA B200", None, "B200"),
        ("NVIDIA GeForce RTX 3090", None, "RTX-3090"),
        ("NVIDIA RTX A6000", None, "RTX-A6000"),
        ("AMD Instinct MI300X", None, "MI300X"),
        # Names not in the table: the family is recognised and memory picks the variant.
        ("NVIDIA A100-SXM4", 85_899_345_920, "A100-80GB"),
        ("NVIDIA A100-SXM4", 42_949_672_960, "A100-40GB"),
        ("Tesla V100-DGXS", 34_089_730_048, "V100-32GB"),
        ("Tesla V100-DGXS", 16_945_512_448, "V100-16GB"),
        ("NVIDIA A100-SXM4", None, None),  # ambiguous without memory: no guess
        ("NVIDIA L40", None, None),  # not L4, not L40S
        ("NVIDIA GeForce GTX 1080", 8 * GiB, None),
        ("", None, None),
    ],
)
def test_gpu_from_nvml_name(nvml: str, memory: int | None, expected: str | None) -> None:
    assert gpu_from_nvml_name(nvml, memory) == expected


def test_every_listed_nvml_name_maps_to_its_type() -> None:
    for gpu in list_gpus():
        for name in gpu.nvml_names:
            assert gpu_from_nvml_name(name, gpu.memory_bytes) == gpu.name


def test_new_types_capacity_and_formats() -> None:
    gpus = {g.name: g for g in list_gpus()}
    # Capacity: what NVML / ROCm report, a little under the marketing size.
    assert 178 * GiB < gpus["B200"].memory_bytes <= 180 * GiB
    assert 93 * GiB < gpus["H100-96GB"].memory_bytes <= 94 * GiB
    assert gpus["RTX-3090"].memory_bytes == 24 * GiB
    assert 47 * GiB < gpus["RTX-A6000"].memory_bytes <= 48 * GiB
    assert 191 * GiB < gpus["MI300X"].memory_bytes <= 192 * GiB
    # fp8 from Ada / Hopper / Blackwell / CDNA3 on; not on Ampere or Volta.
    for name in ("B200", "H100-80GB", "H100-96GB", "H200", "L40S", "L4", "RTX-4090", "MI300X"):
        assert gpus[name].supports_fp8, name
    for name in ("V100-16GB", "T4", "A100-80GB", "RTX-3090", "RTX-A6000"):
        assert not gpus[name].supports_fp8, name
    for name in ("B200", "H100-96GB", "RTX-3090", "RTX-A6000", "L40S", "MI300X"):
        assert gpus[name].supports("bf16") and gpus[name].supports("fp16"), name
    assert gpus["B200"].bf16_tflops > gpus["H100-80GB"].bf16_tflops > gpus["H100-96GB"].bf16_tflops
    assert gpus["RTX-A6000"].bf16_tflops > gpus["RTX-3090"].bf16_tflops  # GeForce: half-rate fp32 accumulate
    assert gpus["MI300X"].to_dict()["fp8_tflops"] == gpus["MI300X"].fp8_tflops


@pytest.mark.parametrize("gpu", ["V100-16GB", "V100-32GB", "T4"])
def test_gpu_without_bf16_refuses_it_by_name(gpu: str) -> None:
    from marp import (
        Layout,
        TrainingRecipe,
        UnsupportedPrecisionError,
        estimate_step_time,
        get_model,
        predict_memory,
    )

    model = get_model("gpt2")
    recipe = TrainingRecipe(seq_len=512, global_batch=4, micro_batch=4, precision="amp-bf16")
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch=4, grad_accum=1)
    for call in (lambda: predict_memory(model, recipe, layout, gpu),
                 lambda: estimate_step_time(model, recipe, layout, get_gpu(gpu))):  # fmt: skip
        with pytest.raises(UnsupportedPrecisionError) as info:
            call()
        assert info.value.field == "recipe.precision"
        assert gpu in str(info.value) and "amp-bf16" in str(info.value) and "bf16" in info.value.problem
    # fp16 on the same card is fine, with a positive speed.
    fp16 = TrainingRecipe(seq_len=512, global_batch=4, micro_batch=4, precision="amp-fp16")
    assert predict_memory(model, fp16, layout, gpu).total > 0
    assert estimate_step_time(model, fp16, layout, get_gpu(gpu)) > 0
