"""GPU discovery: the NVML backend against a hand-written stand-in shaped like pynvml, and the fake backend."""

from __future__ import annotations

import json

import marp
import pytest
from frenzy.agent.gpus import (
    FakeBackend,
    GpuDiscoveryError,
    GpuInfo,
    NvmlBackend,
    load_fake_file,
    parse_fake_spec,
)
from unit.agent.agent_fake_nvml import Device, FakeNvml

GiB = 2**30


def two_a100s() -> FakeNvml:
    return FakeNvml(devices=[
        Device("NVIDIA A100-SXM4-80GB", "GPU-aaaa", 80 * GiB, 79 * GiB),
        Device(b"NVIDIA A100-SXM4-80GB", b"GPU-bbbb", 80 * GiB, 10 * GiB),  # older pynvml: bytes
    ])


# ---------------------------------------------------------------- NVML discovery

def test_nvml_discovers_every_gpu_with_catalog_names() -> None:
    nvml = two_a100s()
    gpus = NvmlBackend(nvml).discover()
    assert gpus == [
        GpuInfo(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", "A100-80GB", 80 * GiB, 79 * GiB, True),
        GpuInfo(1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", "A100-80GB", 80 * GiB, 10 * GiB, True),
    ]
    assert nvml.inits == 1


def test_nvml_names_map_through_marp_with_memory() -> None:
    nvml = FakeNvml(devices=[Device("NVIDIA L4", "GPU-l4", 23 * GiB, 22 * GiB),
                             Device("NVIDIA A100-SXM4-40GB", "GPU-40", 40 * GiB, 40 * GiB)])
    gpus = NvmlBackend(nvml).discover()
    for g in gpus:
        assert g.gpu_type == marp.gpu_from_nvml_name(g.nvml_name, g.memory_total)
    assert [g.gpu_type for g in gpus] == ["L4", "A100-40GB"]


def test_nvml_unknown_device_is_reported_with_no_type() -> None:
    nvml = FakeNvml(devices=[Device("Matrox Millennium G200", "GPU-old", 8 * 2**20, 8 * 2**20)])
    (gpu,) = NvmlBackend(nvml).discover()
    assert gpu.gpu_type is None and gpu.healthy and gpu.nvml_name == "Matrox Millennium G200"


def test_nvml_refresh_reads_live_free_memory() -> None:
    nvml = two_a100s()
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.devices[0].free = 5 * GiB
    fresh = backend.refresh(gpus)
    assert [g.memory_free for g in fresh] == [5 * GiB, 10 * GiB]
    assert [g.uuid for g in fresh] == ["GPU-aaaa", "GPU-bbbb"]  # identity unchanged
    assert nvml.inits == 1  # NVML stays open between discover and refresh


def test_nvml_lost_gpu_at_discovery_is_unhealthy_and_the_rest_work() -> None:
    nvml = two_a100s()
    nvml.devices[0].lost = True
    gpus = NvmlBackend(nvml).discover()
    assert gpus[0] == GpuInfo(0, "", "", None, 0, 0, healthy=False)
    assert gpus[1].healthy and gpus[1].uuid == "GPU-bbbb"


def test_nvml_gpu_lost_later_turns_unhealthy_then_recovers() -> None:
    nvml = two_a100s()
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.devices[1].lost = True
    gpus = backend.refresh(gpus)
    assert gpus[1].healthy is False and gpus[1].memory_free == 0
    assert gpus[1].uuid == "GPU-bbbb" and gpus[0].healthy
    nvml.devices[1].lost = False
    gpus = backend.refresh(gpus)
    assert gpus[1].healthy and gpus[1].memory_free == 10 * GiB


def test_nvml_gpu_lost_at_discovery_is_learned_when_it_comes_back() -> None:
    nvml = two_a100s()
    nvml.devices[0].lost = True
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.devices[0].lost = False
    gpus = backend.refresh(gpus)
    assert gpus[0].uuid == "GPU-aaaa" and gpus[0].gpu_type == "A100-80GB" and gpus[0].healthy


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (9, "driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED)"),
        (12, "libnvidia-ml.so) was not found (NVML_ERROR_LIBRARY_NOT_FOUND)"),
        (4, "no permission to open the GPU devices (NVML_ERROR_NO_PERMISSION)"),
        (18, "versions differ (NVML_ERROR_LIB_RM_VERSION_MISMATCH)"),
        (999, "(NVML_ERROR_UNKNOWN)"),
        (4242, "(NVML error 4242)"),
    ],
)
def test_nvml_init_failure_explains_and_suggests_fake_gpus(code: int, expected: str) -> None:
    with pytest.raises(GpuDiscoveryError) as err:
        NvmlBackend(FakeNvml(init_error=code)).discover()
    text = str(err.value)
    assert text.startswith("NVML could not start: ")
    assert expected in text
    assert "To fix:" in text and "--fake-gpus" in text


def test_nvml_driver_not_loaded_message_is_exact() -> None:
    with pytest.raises(GpuDiscoveryError, match=r"^NVML could not start: driver not loaded "
                       r"\(NVML_ERROR_DRIVER_NOT_LOADED\)\. To fix: install the NVIDIA driver"):
        NvmlBackend(FakeNvml(init_error=9)).discover()


def test_nvml_count_failure_and_no_gpus_are_errors() -> None:
    with pytest.raises(GpuDiscoveryError, match="could not count the GPUs.*NVML_ERROR_GPU_IS_LOST"):
        NvmlBackend(FakeNvml(count_error=15)).discover()
    with pytest.raises(GpuDiscoveryError, match="found no GPUs"):
        NvmlBackend(FakeNvml()).discover()


def test_nvml_close_shuts_down_once() -> None:
    nvml = two_a100s()
    backend = NvmlBackend(nvml)
    backend.discover()
    backend.close()
    backend.close()
    assert nvml.shutdowns == 1


# ---------------------------------------------------------------- fake backend

def test_fake_spec_parses_types_and_counts() -> None:
    assert parse_fake_spec("A100-80GB:4,L4:2") == [("A100-80GB", 4), ("L4", 2)]
    assert parse_fake_spec(" L4 : 1 , A100-80GB ") == [("L4", 1), ("A100-80GB", 1)]


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("A100-80GB:4,Z9000:2", r"'Z9000:2'.*unknown GPU type 'Z9000'"),
        ("A100-80GB:four", r"'A100-80GB:four'.*count 'four' is not a whole number"),
        ("L4:0", r"'L4:0'.*count must be a whole number >= 1, got 0"),
        ("L4:-1", r"'L4:-1'.*>= 1"),
        (" , ", r"names no GPUs"),
    ],
)
def test_fake_spec_errors_name_the_bad_entry(spec: str, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        parse_fake_spec(spec)


def test_fake_backend_uses_catalog_memory_and_stable_uuids() -> None:
    gpus = FakeBackend("A100-80GB:2,L4:1", node="n1").discover()
    a100 = marp.get_gpu("A100-80GB")
    l4 = marp.get_gpu("L4")
    assert [g.index for g in gpus] == [0, 1, 2]
    assert [g.gpu_type for g in gpus] == ["A100-80GB", "A100-80GB", "L4"]
    assert [g.uuid for g in gpus] == ["GPU-fake-n1-0", "GPU-fake-n1-1", "GPU-fake-n1-2"]
    assert gpus[0].memory_total == a100.memory_bytes and gpus[2].memory_total == l4.memory_bytes
    assert all(g.memory_free == g.memory_total and g.healthy for g in gpus)
    assert FakeBackend("A100-80GB:2,L4:1", node="n1").discover() == gpus  # deterministic
    assert FakeBackend("L4:1", node="n2").refresh(gpus) == gpus


def test_fake_backend_from_yaml_and_json_files(tmp_path) -> None:
    y = tmp_path / "gpus.yaml"
    y.write_text("gpus:\n  - {type: A100-80GB, count: 4}\n  - type: L4\n    count: 2\n")
    j = tmp_path / "gpus.json"
    j.write_text(json.dumps({"gpus": [{"type": "L4", "count": 1}]}))
    assert load_fake_file(y) == [("A100-80GB", 4), ("L4", 2)]
    assert [g.gpu_type for g in FakeBackend.from_file(j, "n").discover()] == ["L4"]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("gpus: []", "non-empty list under 'gpus'"),
        ("nodes: 3", "non-empty list under 'gpus'"),
        ("gpus: [{type: Z9000, count: 1}]", r"gpus\[0\].*unknown GPU type 'Z9000'"),
        ("gpus: [{type: L4, count: 1}, {type: L4, count: two}]", r"gpus\[1\].*count must be"),
        ("gpus: [L4]", r"gpus\[0\]: expected a mapping"),
        ("gpus: [", "not valid YAML/JSON"),
    ],
)
def test_fake_file_errors_name_the_bad_entry(tmp_path, text: str, pattern: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=pattern):
        load_fake_file(path)


def test_real_pynvml_either_discovers_or_explains() -> None:
    # No stand-in: on a GPU host this discovers; anywhere else it must fail with advice, not a traceback.
    backend = NvmlBackend()
    try:
        gpus = backend.discover()
    except GpuDiscoveryError as exc:
        assert "To fix:" in str(exc) and "--fake-gpus" in str(exc)
    else:
        assert gpus and all(g.uuid for g in gpus if g.healthy)
    finally:
        backend.close()
