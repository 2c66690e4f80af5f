"""A hand-written stand-in shaped like pynvml (nvidia-ml-py): same function names, NVMLError with .value.

Only what the agent calls. Function names, constant names and error code values
are pynvml's (test_agent_gpus checks them against the installed module), and
return values have the attributes the real structs have (``.total``, ``.busId``,
``.gpu``, ``.pid``/``.usedGpuMemory``). Any call on a device can be made to fail
with any NVML error code through ``Device.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NvLink:
    remote_bus_id: str  # the peer's PCI bus id (a GPU's, or an NVSwitch's)
    active: bool = True
    remote_type: int = 0  # NVML_NVLINK_DEVICE_TYPE_GPU; 2 = SWITCH


@dataclass
class Proc:  # what nvmlDeviceGetComputeRunningProcesses returns per process
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's attribute name


@dataclass
class Device:
    name: str | bytes
    uuid: str | bytes
    total: int
    free: int
    lost: bool = False  # every call on it fails with GPU_IS_LOST
    bus_id: str | bytes = ""
    utilization: int = 0
    processes: list[Proc] = field(default_factory=list)
    nvlinks: list[NvLink] | None = None  # None: the GPU has no NVLink (NOT_SUPPORTED)
    errors: dict[str, int] = field(default_factory=dict)  # pynvml function name -> NVML error code


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int


@dataclass
class PciInfo:
    busId: str | bytes  # noqa: N815 - pynvml's attribute name
    busIdLegacy: str = ""  # noqa: N815


@dataclass
class Utilization:
    gpu: int
    memory: int


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeNvml:
    """Same names as pynvml; only what the agent calls. Codes match pynvml's values."""

    devices: list[Device] = field(default_factory=list)
    init_error: int | None = None
    count_error: int | None = None
    down_error: int | None = None  # every device call fails with this (NVML broke mid-run)
    topology: dict[tuple[int, int], int] = field(default_factory=dict)  # (i, j) -> NVML_TOPOLOGY_* level
    inits: int = 0
    shutdowns: int = 0

    NVMLError = NVMLError
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_IRQ_ISSUE = 11
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
    NVML_ERROR_UNKNOWN = 999
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_TOPOLOGY_INTERNAL = 0
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_HOSTBRIDGE = 30
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            raise NVMLError(self.count_error)
        return len(self.devices)

    def _call(self, dev: Device, fn: str) -> Device:
        if self.down_error is not None:
            raise NVMLError(self.down_error)
        if dev.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        if fn in dev.errors:
            raise NVMLError(dev.errors[fn])
        return dev

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        if index >= len(self.devices):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[index]
        if self.down_error is not None:
            raise NVMLError(self.down_error)
        if "nvmlDeviceGetHandleByIndex" in dev.errors:
            raise NVMLError(dev.errors["nvmlDeviceGetHandleByIndex"])
        return dev

    def nvmlDeviceGetName(self, handle: Device) -> str | bytes:
        return self._call(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: Device) -> str | bytes:
        return self._call(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Device) -> MemoryInfo:
        dev = self._call(handle, "nvmlDeviceGetMemoryInfo")
        return MemoryInfo(dev.total, dev.free, dev.total - dev.free)

    def nvmlDeviceGetPciInfo(self, handle: Device) -> PciInfo:
        return PciInfo(self._call(handle, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetUtilizationRates(self, handle: Device) -> Utilization:
        return Utilization(self._call(handle, "nvmlDeviceGetUtilizationRates").utilization, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Device) -> list[Proc]:
        return list(self._call(handle, "nvmlDeviceGetComputeRunningProcesses").processes)

    def _link(self, handle: Device, link: int, fn: str) -> NvLink:
        dev = self._call(handle, fn)
        if dev.nvlinks is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(dev.nvlinks):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return dev.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, handle: Device, link: int) -> int:
        return int(self._link(handle, link, "nvmlDeviceGetNvLinkState").active)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Device, link: int) -> PciInfo:
        return PciInfo(self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo").remote_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Device, link: int) -> int:
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Device, device2: Device) -> int:
        self._call(device1, "nvmlDeviceGetTopologyCommonAncestor")
        i, j = (next(k for k, d in enumerate(self.devices) if d is dev) for dev in (device1, device2))
        level = self.topology.get((i, j), self.topology.get((j, i)))
        if level is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return level
