"""GPU discovery: the NVML backend against a hand-written stand-in shaped like pynvml, and the fake backend."""

from __future__ import annotations

import json

import pytest
from unit.agent.agent_fake_nvml import Device, FakeNvml, NvLink, Proc

import marp
from frenzy.agent.gpus import (
    FakeBackend,
    GpuDiscoveryError,
    GpuInfo,
    NvmlBackend,
    load_fake_file,
    parse_fake_spec,
    type_by_memory,
)

GiB = 2**30


def two_a100s() -> FakeNvml:
    return FakeNvml(devices=[
        Device("NVIDIA A100-SXM4-80GB", "GPU-aaaa", 80 * GiB, 79 * GiB, bus_id="00000000:07:00.0"),
        Device(b"NVIDIA A100-SXM4-80GB", b"GPU-bbbb", 80 * GiB, 10 * GiB,  # older pynvml: bytes
               bus_id=b"0000:0F:00.0", utilization=87, processes=[Proc(4242, 70 * GiB)]),
    ], topology={(0, 1): 40})


# ---------------------------------------------------------------- the stand-in is shaped like pynvml

def test_the_stand_in_uses_pynvml_names_and_codes() -> None:
    import pynvml

    fake = FakeNvml()
    names = [n for n in dir(fake) if n.startswith(("nvml", "NVML_"))]
    assert len(names) > 30
    for name in names:
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(fake, name), name
    for field in ("total", "free", "used"):
        assert hasattr(pynvml.c_nvmlMemory_t(), field)
    assert hasattr(pynvml.nvmlPciInfo_t(), "busId") and hasattr(pynvml.c_nvmlUtilization_t(), "gpu")
    assert {f[0] for f in pynvml.c_nvmlProcessInfo_v3_t._fields_} >= {"pid", "usedGpuMemory"}
    assert issubclass(pynvml.NVMLError, Exception) and pynvml.NVMLError(15).value == 15


# ---------------------------------------------------------------- NVML discovery

def test_nvml_discovers_every_gpu_with_catalog_names() -> None:
    nvml = two_a100s()
    gpus = NvmlBackend(nvml).discover()
    assert gpus == [
        GpuInfo(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", "A100-80GB", 80 * GiB, 79 * GiB, True,
                pci_bus_id="00000000:07:00.0", utilization=0, links={1: "NODE"}),
        GpuInfo(1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", "A100-80GB", 80 * GiB, 10 * GiB, True,
                pci_bus_id="00000000:0f:00.0", utilization=87, processes=((4242, 70 * GiB),), links={0: "NODE"}),
    ]
    assert nvml.inits == 1


def test_nvml_names_map_through_marp_with_memory() -> None:
    nvml = FakeNvml(devices=[Device("NVIDIA L4", "GPU-l4", 23 * GiB, 22 * GiB),
                             Device("NVIDIA A100-SXM4-40GB", "GPU-40", 40 * GiB, 40 * GiB)])
    gpus = NvmlBackend(nvml).discover()
    for g in gpus:
        assert g.gpu_type == marp.gpu_from_nvml_name(g.nvml_name, g.memory_total)
    assert [g.gpu_type for g in gpus] == ["L4", "A100-40GB"]
    assert not any(g.type_from_memory for g in gpus)


def test_an_unknown_name_is_planned_by_its_memory() -> None:
    nvml = FakeNvml(devices=[Device("NVIDIA RTX 6000 Ada Generation", "GPU-ada", 48 * GiB - 2**20, 47 * GiB),
                             Device("NVIDIA B300 (someday)", "GPU-b3", 180 * GiB, 180 * GiB)])
    ada, b300 = NvmlBackend(nvml).discover()
    assert ada.healthy and ada.type_from_memory and ada.nvml_name == "NVIDIA RTX 6000 Ada Generation"
    assert ada.gpu_type == "RTX-A6000"  # the catalog GPU with the most memory it can match (48 GiB)
    assert marp.get_gpu(ada.gpu_type).memory_bytes <= ada.memory_total
    assert b300.gpu_type == "B200" and b300.type_from_memory
    assert type_by_memory(80 * GiB) == "A100-80GB"  # A100 and H100 both 80 GB: the slower one


def test_nvml_unknown_device_smaller_than_the_catalog_is_reported_with_no_type() -> None:
    nvml = FakeNvml(devices=[Device("Matrox Millennium G200", "GPU-old", 8 * 2**20, 8 * 2**20)])
    (gpu,) = NvmlBackend(nvml).discover()
    assert gpu.gpu_type is None and gpu.healthy and gpu.nvml_name == "Matrox Millennium G200"
    assert gpu.memory_total == 8 * 2**20 and not gpu.type_from_memory


def test_nvml_refresh_reads_live_free_memory_utilization_and_foreign_processes() -> None:
    nvml = two_a100s()
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.devices[0].free = 5 * GiB  # a process the scheduler did not start
    nvml.devices[0].processes = [Proc(777, 75 * GiB), Proc(778, None)]
    nvml.devices[0].utilization = 99
    fresh = backend.refresh(gpus)
    assert [g.memory_free for g in fresh] == [5 * GiB, 10 * GiB]
    assert fresh[0].processes == ((777, 75 * GiB), (778, -1)) and fresh[0].utilization == 99
    assert [g.uuid for g in fresh] == ["GPU-aaaa", "GPU-bbbb"]  # identity unchanged
    assert [g.links for g in fresh] == [{1: "NODE"}, {0: "NODE"}]  # topology is kept
    assert nvml.inits == 1  # NVML stays open between discover and refresh


def _bus(i: int) -> str:
    return f"00000000:{0x10 + i:02X}:00.0"


def test_nvlink_pairs_are_counted_and_the_rest_is_the_pcie_path() -> None:
    devs = [Device("NVIDIA A100-SXM4-80GB", f"GPU-{i}", 80 * GiB, 80 * GiB, bus_id=_bus(i)) for i in range(4)]
    devs[0].nvlinks = [NvLink(_bus(1))] * 4 + [NvLink(_bus(2), active=False)]
    devs[1].nvlinks = [NvLink(_bus(0))] * 4
    devs[2].nvlinks = [NvLink(_bus(3).lower().replace("00000000", "0000"))] * 2  # another spelling of the id
    devs[3].nvlinks = [NvLink(_bus(2))] * 2
    topology = {(i, j): 50 if (i < 2) != (j < 2) else 10 for i in range(4) for j in range(4) if i != j}
    gpus = NvmlBackend(FakeNvml(devices=devs, topology=topology)).discover()
    assert [g.links for g in gpus] == [
        {1: "NV4", 2: "SYS", 3: "SYS"},
        {0: "NV4", 2: "SYS", 3: "SYS"},
        {0: "SYS", 1: "SYS", 3: "NV2"},
        {0: "SYS", 1: "SYS", 2: "NV2"},
    ]


def test_gpus_on_nvswitches_are_linked_through_them() -> None:
    switch = "00000000:C0:00.0"
    devs = [Device("NVIDIA H100 80GB HBM3", f"GPU-{i}", 80 * GiB, 80 * GiB, bus_id=_bus(i),
                   nvlinks=[NvLink(switch, remote_type=2)] * 18) for i in range(2)]
    devs.append(Device("NVIDIA H100 80GB HBM3", "GPU-2", 80 * GiB, 80 * GiB, bus_id=_bus(2)))  # no NVLink
    gpus = NvmlBackend(FakeNvml(devices=devs, topology={(0, 2): 30, (1, 2): 30})).discover()
    assert [g.links for g in gpus] == [{1: "NV18", 2: "PHB"}, {0: "NV18", 2: "PHB"}, {0: "PHB", 1: "PHB"}]


def test_without_topology_information_links_stay_empty() -> None:
    gpus = NvmlBackend(FakeNvml(devices=[Device("NVIDIA L4", f"GPU-{i}", 23 * GiB, 23 * GiB) for i in range(2)])
                       ).discover()
    assert [g.links for g in gpus] == [{}, {}] and all(g.healthy for g in gpus)


# ---------------------------------------------------------------- NVML failure paths

def test_nvml_lost_gpu_at_discovery_is_unhealthy_and_the_rest_work() -> None:
    nvml = two_a100s()
    nvml.devices[0].lost = True
    gpus = NvmlBackend(nvml).discover()
    assert gpus[0] == GpuInfo(0, "", "", None, 0, 0, healthy=False,
                              health_reason="a GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)")
    assert gpus[1].healthy and gpus[1].uuid == "GPU-bbbb" and gpus[1].links == {}


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
                                  "nvmlDeviceGetMemoryInfo"])
@pytest.mark.parametrize(("code", "reason"), [
    (15, "a GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)"),
    (16, "the GPU needs a reset (NVML_ERROR_RESET_REQUIRED)"),
    (10, "the GPU did not answer in time (NVML_ERROR_TIMEOUT)"),
    (4, "no permission to open the GPU devices (NVML_ERROR_NO_PERMISSION)"),
    (999, "(NVML_ERROR_UNKNOWN)"),
])
def test_a_failing_basic_query_makes_that_gpu_unhealthy_with_the_reason(call: str, code: int, reason: str) -> None:
    nvml = two_a100s()
    nvml.devices[1].errors[call] = code
    gpus = NvmlBackend(nvml).discover()
    assert gpus[0].healthy and gpus[0].gpu_type == "A100-80GB"
    assert not gpus[1].healthy and gpus[1].memory_free == 0 and reason in gpus[1].health_reason


@pytest.mark.parametrize("call", ["nvmlDeviceGetPciInfo", "nvmlDeviceGetUtilizationRates",
                                  "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetTopologyCommonAncestor",
                                  "nvmlDeviceGetNvLinkState"])
@pytest.mark.parametrize("code", [3, 4, 13, 2])  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, INVALID_ARG
def test_an_unsupported_optional_query_only_leaves_its_field_empty(call: str, code: int) -> None:
    nvml = two_a100s()
    for dev in nvml.devices:
        dev.errors[call] = code
        dev.nvlinks = [NvLink(_bus(9))]
    gpus = NvmlBackend(nvml).refresh(NvmlBackend(nvml).discover())
    assert all(g.healthy and g.health_reason == "" and g.uuid for g in gpus)
    if call == "nvmlDeviceGetPciInfo":
        assert [g.pci_bus_id for g in gpus] == ["", ""]
    if call == "nvmlDeviceGetUtilizationRates":
        assert [g.utilization for g in gpus] == [-1, -1]
    if call == "nvmlDeviceGetComputeRunningProcesses":
        assert [g.processes for g in gpus] == [(), ()]
    if call == "nvmlDeviceGetTopologyCommonAncestor":
        assert [g.links for g in gpus] == [{}, {}]


@pytest.mark.parametrize("call", ["nvmlDeviceGetPciInfo", "nvmlDeviceGetUtilizationRates",
                                  "nvmlDeviceGetComputeRunningProcesses"])
@pytest.mark.parametrize("code", [15, 16, 11, 10])  # GPU_IS_LOST, RESET_REQUIRED, IRQ_ISSUE, TIMEOUT
def test_an_optional_query_saying_the_gpu_is_broken_makes_it_unhealthy(call: str, code: int) -> None:
    nvml = two_a100s()
    nvml.devices[0].errors[call] = code
    gpus = NvmlBackend(nvml).discover()
    assert not gpus[0].healthy and "NVML_ERROR_" in gpus[0].health_reason and gpus[1].healthy


def test_nvml_gpu_lost_later_turns_unhealthy_then_recovers() -> None:
    nvml = two_a100s()
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.devices[1].lost = True
    gpus = backend.refresh(gpus)
    assert gpus[1].healthy is False and gpus[1].memory_free == 0
    assert gpus[1].health_reason == "a GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)"
    assert gpus[1].uuid == "GPU-bbbb" and gpus[0].healthy
    nvml.devices[1].lost = False
    gpus = backend.refresh(gpus)
    assert gpus[1].healthy and gpus[1].memory_free == 10 * GiB and gpus[1].health_reason == ""


def test_nvml_gpu_lost_at_discovery_is_learned_when_it_comes_back() -> None:
    nvml = two_a100s()
    nvml.devices[0].lost = True
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.devices[0].lost = False
    gpus = backend.refresh(gpus)
    assert gpus[0].uuid == "GPU-aaaa" and gpus[0].gpu_type == "A100-80GB" and gpus[0].healthy


@pytest.mark.parametrize("code", [9, 1, 18])  # DRIVER_NOT_LOADED, UNINITIALIZED, LIB_RM_VERSION_MISMATCH
def test_nvml_failing_as_a_whole_mid_run_marks_every_gpu_and_initialises_again(code: int) -> None:
    nvml = two_a100s()
    backend = NvmlBackend(nvml)
    gpus = backend.discover()
    nvml.down_error = code
    gpus = backend.refresh(gpus)
    assert not any(g.healthy for g in gpus) and all("NVML_ERROR_" in g.health_reason for g in gpus)
    nvml.init_error = code  # the driver is still gone when the next heartbeat re-initialises
    gpus = backend.refresh(gpus)
    assert not any(g.healthy for g in gpus)
    assert all(g.health_reason.startswith("NVML could not start") for g in gpus)
    nvml.down_error = nvml.init_error = None  # driver back
    gpus = backend.refresh(gpus)
    assert all(g.healthy for g in gpus) and nvml.inits == 2
    assert [g.memory_free for g in gpus] == [79 * GiB, 10 * GiB]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (9, "driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED)"),
        (12, "libnvidia-ml.so) was not found (NVML_ERROR_LIBRARY_NOT_FOUND)"),
        (4, "no permission to open the GPU devices (NVML_ERROR_NO_PERMISSION)"),
        (18, "versions differ (NVML_ERROR_LIB_RM_VERSION_MISMATCH)"),
        (13, "driver is too old for this NVML call (NVML_ERROR_FUNCTION_NOT_FOUND)"),
        (15, "a GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)"),
        (16, "the GPU needs a reset (NVML_ERROR_RESET_REQUIRED)"),
        (1, "NVML is not initialised (it was shut down) (NVML_ERROR_UNINITIALIZED)"),
        (10, "did not answer in time (NVML_ERROR_TIMEOUT)"),
        (11, "interrupt problem (NVML_ERROR_IRQ_ISSUE)"),
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


def test_fake_gpus_show_what_the_running_jobs_are_predicted_to_use() -> None:
    backend = FakeBackend("A100-80GB:2,L4:1", node="n1")
    gpus = backend.discover()
    assert backend.refresh(gpus) == gpus  # nothing runs: as discovered
    backend.show_usage({0: 30 * 1024**3, 2: 10**15})  # more than the GPU has: capped
    now = backend.refresh(gpus)
    assert now[0].memory_free == gpus[0].memory_total - 30 * 1024**3 and now[0].utilization == 100
    assert now[1] == gpus[1]
    assert now[2].memory_free == 0 and now[2].utilization == 100
    backend.show_usage({})  # the jobs ended
    assert backend.refresh(now) == gpus
