"""GPU discovery for the node agent: what GPUs this host has, and how much memory is free.

Two backends with one shape (``discover()`` once at start, ``refresh()`` before
every heartbeat): ``NvmlBackend`` reads the real devices through NVML
(nvidia-ml-py), ``FakeBackend`` serves a configured list so laptops and CI can
run a heterogeneous cluster without GPUs. Device names are mapped to MARP
catalog names here, because the scheduler only plans for catalog GPU types.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import marp

log = logging.getLogger(__name__)


class GpuDiscoveryError(RuntimeError):
    """GPU discovery could not run at all; the message says why and how to fix it."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the agent reports it to Redis."""

    index: int  # NVML index (PCI bus order); what CUDA_VISIBLE_DEVICES refers to
    uuid: str
    nvml_name: str
    gpu_type: str | None  # MARP catalog name, None when the device is not in the catalog
    memory_total: int  # bytes
    memory_free: int  # bytes
    healthy: bool


class GpuBackend(Protocol):
    def discover(self) -> list[GpuInfo]: ...

    def refresh(self, gpus: list[GpuInfo]) -> list[GpuInfo]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- NVML

_FIX_DRIVER = "install the NVIDIA driver (check with `nvidia-smi`)"
_FIX_FAKE = 'or run with --fake-gpus "A100-80GB:4" (or --fake-gpus-file) on a host without GPUs'

# Reason and remedy per NVML error code name; codes are looked up by name on
# the nvml module so an injected stand-in only has to define the names it uses.
_NVML_REASONS: dict[str, tuple[str, str]] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": ("the NVML library (libnvidia-ml.so) was not found", _FIX_DRIVER),
    "NVML_ERROR_DRIVER_NOT_LOADED": ("driver not loaded", _FIX_DRIVER),
    "NVML_ERROR_NO_PERMISSION": (
        "no permission to open the GPU devices",
        "run the agent as a user that can read /dev/nvidia*",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "the NVML library and the kernel driver versions differ",
        "reboot (or reload the nvidia kernel module) after a driver upgrade",
    ),
    "NVML_ERROR_FUNCTION_NOT_FOUND": ("the NVIDIA driver is too old for this NVML call", "upgrade the driver"),
    "NVML_ERROR_GPU_IS_LOST": ("a GPU fell off the bus", "check `nvidia-smi` and `dmesg`; the host may need a reset"),
}


def _nvml_error_name(nvml: Any, exc: BaseException) -> str:
    """The NVML_ERROR_* constant name for an NVMLError's code, or the code itself."""
    value = getattr(exc, "value", None)
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == value:
            return name
    return f"NVML error {value}"


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str today, older pynvml (and some builds) return bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Real GPUs through NVML. ``nvml`` defaults to the ``pynvml`` module (nvidia-ml-py).

    NVML stays initialised between ``discover()`` and ``close()`` so each
    heartbeat's ``refresh()`` is a few cheap calls.
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._started = False

    def _lib(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - dependency of the package
                raise GpuDiscoveryError(
                    f"NVML could not start: nvidia-ml-py is not installed ({exc}). "
                    f"To fix: pip install nvidia-ml-py, {_FIX_FAKE}."
                ) from exc
            self._nvml = pynvml
        return self._nvml

    def _explain(self, what: str, exc: BaseException) -> GpuDiscoveryError:
        nvml = self._lib()
        code = _nvml_error_name(nvml, exc)
        reason, fix = _NVML_REASONS.get(code, (str(exc) or "unknown error", _FIX_DRIVER))
        return GpuDiscoveryError(f"{what}: {reason} ({code}). To fix: {fix}, {_FIX_FAKE}.")

    def start(self) -> None:
        nvml = self._lib()
        if self._started:
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise self._explain("NVML could not start", exc) from exc
        self._started = True

    def close(self) -> None:
        if self._started:
            self._started = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:  # shutting down anyway; nothing to repair
                log.debug("nvmlShutdown failed: %s", exc)

    def discover(self) -> list[GpuInfo]:
        self.start()
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise self._explain("NVML could not count the GPUs", exc) from exc
        if count == 0:
            raise GpuDiscoveryError(f"NVML started but found no GPUs on this host. To fix: {_FIX_FAKE}.")
        return [self._probe(i) for i in range(count)]

    def _probe(self, index: int) -> GpuInfo:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as exc:
            # One broken GPU must not take the node down: report it unhealthy
            # (the scheduler never places on it) and keep the others.
            log.warning("GPU %d is unusable: %s (%s)", index, exc, _nvml_error_name(nvml, exc))
            return GpuInfo(index, "", "", None, 0, 0, healthy=False)
        gpu_type = catalog_type_for(name, int(mem.total))
        if gpu_type is None:
            log.warning("GPU %d (%r, %d bytes) is not in the MARP catalog; it will not be scheduled",
                        index, name, int(mem.total))
        return GpuInfo(index, uuid, name, gpu_type, int(mem.total), int(mem.free), healthy=True)

    def refresh(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        self.start()
        nvml = self._nvml
        out = []
        for gpu in gpus:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(gpu.index))
            except nvml.NVMLError as exc:
                if gpu.healthy:
                    log.warning("GPU %d became unusable: %s (%s)", gpu.index, exc, _nvml_error_name(nvml, exc))
                out.append(replace(gpu, memory_free=0, healthy=False))
                continue
            if not gpu.uuid:  # was lost at discovery and came back: learn who it is
                out.append(self._probe(gpu.index))
                continue
            out.append(replace(gpu, memory_free=int(mem.free), healthy=True))
        return out


def catalog_type_for(nvml_name: str, memory_bytes: int | None) -> str | None:
    """MARP catalog name for an NVML device name (memory tells 40 GB from 80 GB parts)."""
    return marp.gpu_from_nvml_name(nvml_name, memory_bytes)


# ---------------------------------------------------------------- fake

def _catalog_entry(gpu_type: str) -> Any:
    return marp.get_gpu(gpu_type)


def _catalog_memory_bytes(entry: Any) -> int:
    return int(entry.memory_bytes)


def _catalog_nvml_name(entry: Any, gpu_type: str) -> str:
    names = getattr(entry, "nvml_names", None) or ()
    return str(names[0]) if names else f"NVIDIA {gpu_type} (fake)"


def parse_fake_spec(spec: str) -> list[tuple[str, int]]:
    """``"A100-80GB:4,L4:2"`` -> ``[("A100-80GB", 4), ("L4", 2)]``; a bare type means one GPU."""
    out: list[tuple[str, int]] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        gpu_type, sep, count_text = entry.rpartition(":")
        if not sep:
            gpu_type, count_text = entry, "1"
        gpu_type = gpu_type.strip()
        try:
            count = int(count_text.strip())
        except ValueError:
            raise ValueError(
                f"fake GPU entry {entry!r}: count {count_text.strip()!r} is not a whole number "
                '(expected TYPE:COUNT, e.g. "A100-80GB:4")'
            ) from None
        out.append(_checked(entry, gpu_type, count))
    if not out:
        raise ValueError(f'fake GPU spec {spec!r} names no GPUs (expected e.g. "A100-80GB:4,L4:2")')
    return out


def _checked(entry: str, gpu_type: str, count: Any) -> tuple[str, int]:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"fake GPU entry {entry!r}: count must be a whole number >= 1, got {count!r}")
    try:
        _catalog_entry(gpu_type)
    except (KeyError, ValueError, LookupError) as exc:
        # MARP's own text already says "unknown GPU type ..., did you mean ..., valid: ...".
        problem = getattr(exc, "problem", None) or f"unknown GPU type {gpu_type!r} ({exc})"
        raise ValueError(f"fake GPU entry {entry!r}: {problem}") from None
    return gpu_type, count


def load_fake_file(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Read ``{gpus: [{type: A100-80GB, count: 4}, ...]}`` from a YAML or JSON file."""
    import yaml  # JSON is a subset of YAML, so one parser reads both

    text = Path(path).read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML/JSON: {exc}") from None
    items = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty list under 'gpus', e.g. gpus: [{{type: L4, count: 2}}]")
    out = []
    for i, item in enumerate(items):
        where = f"{path}: gpus[{i}]"
        if not isinstance(item, dict) or "type" not in item:
            raise ValueError(f"{where}: expected a mapping with 'type' and 'count', got {item!r}")
        out.append(_checked(where, str(item["type"]), item.get("count", 1)))
    return out


class FakeBackend:
    """A configured list of catalog GPUs, all healthy and entirely free.

    UUIDs are ``GPU-fake-<node>-<i>`` so a restarted fake agent re-registers
    the same GPUs rather than new ones.
    """

    def __init__(self, spec: str | Iterable[tuple[str, int]], node: str) -> None:
        self.entries = parse_fake_spec(spec) if isinstance(spec, str) else [_checked(f"{t}:{c}", t, c)
                                                                             for t, c in spec]
        self.node = node

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], node: str) -> FakeBackend:
        return cls(load_fake_file(path), node)

    def discover(self) -> list[GpuInfo]:
        gpus = []
        for gpu_type, count in self.entries:
            entry = _catalog_entry(gpu_type)
            total = _catalog_memory_bytes(entry)
            name = _catalog_nvml_name(entry, gpu_type)
            for _ in range(count):
                i = len(gpus)
                gpus.append(GpuInfo(i, f"GPU-fake-{self.node}-{i}", name, gpu_type, total, total, True))
        return gpus

    def refresh(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        return list(gpus)

    def close(self) -> None:
        pass
