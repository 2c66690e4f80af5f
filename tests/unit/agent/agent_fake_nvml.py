"""A hand-written stand-in shaped like pynvml (nvidia-ml-py): same function names, NVMLError with .value.

Only what the agent calls. Error code values match pynvml's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Device:
    name: str | bytes
    uuid: str | bytes
    total: int
    free: int
    lost: bool = False  # every call on it fails with GPU_IS_LOST


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int


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
    inits: int = 0
    shutdowns: int = 0

    NVMLError = NVMLError
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
    NVML_ERROR_UNKNOWN = 999

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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        return self.devices[index]

    def _alive(self, dev: Device) -> Device:
        if dev.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return dev

    def nvmlDeviceGetName(self, handle: Device) -> str | bytes:
        return self._alive(handle).name

    def nvmlDeviceGetUUID(self, handle: Device) -> str | bytes:
        return self._alive(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Device) -> MemoryInfo:
        dev = self._alive(handle)
        return MemoryInfo(dev.total, dev.free, dev.total - dev.free)
