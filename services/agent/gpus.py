"""GPU discovery for the node agent: what GPUs this host has, and how much memory is free.

Two backends with one shape (``discover()`` once at start, ``refresh()`` before
every heartbeat): ``NvmlBackend`` reads the real devices through NVML
(nvidia-ml-py), ``FakeBackend`` serves a configured list so laptops and CI can
run a heterogeneous cluster without GPUs. Device names are mapped to MARP
catalog names here, because the scheduler only plans for catalog GPU types; a
device the catalog does not know is planned as the catalog GPU with the most
memory it can match (``type_from_memory``), so it is still schedulable by memory.

What NVML reports: name, UUID, PCI bus id, total/free memory (free memory is
live: processes the scheduler did not start count), utilization, the compute
processes, and the link between every pair of GPUs (NVLink count, else the
PCIe path: PIX/PXB/PHB/NODE/SYS as ``nvidia-smi topo -m`` prints them).
Failures never crash the agent: a GPU whose basic queries fail is reported
unhealthy with the reason; optional queries a GPU does not support are left
empty; NVML failing as a whole mid-run marks every GPU unhealthy until it
works again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
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
    health_reason: str = ""  # why not healthy (NVML error and remedy)
    pci_bus_id: str = ""  # normalised "dddddddd:bb:dd.f"; empty for fake GPUs
    utilization: int = -1  # percent of time a kernel ran (NVML), -1 unknown
    processes: tuple[tuple[int, int], ...] = ()  # (pid, used bytes or -1) of compute processes
    links: dict[int, str] = field(default_factory=dict, hash=False)  # peer index -> "NV4", "PIX", ...
    type_from_memory: bool = False  # gpu_type chosen by memory: the name is not in the catalog


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
    "NVML_ERROR_RESET_REQUIRED": ("the GPU needs a reset", "drain the node and reset the GPU (`nvidia-smi -r`)"),
    "NVML_ERROR_UNINITIALIZED": ("NVML is not initialised (it was shut down)", "restart the agent"),
    "NVML_ERROR_TIMEOUT": ("the GPU did not answer in time", "check `nvidia-smi` and `dmesg`"),
    "NVML_ERROR_IRQ_ISSUE": ("the driver saw an interrupt problem", "check `dmesg`; the host may need a reset"),
}

# Errors from an optional query (PCI id, utilization, processes, links) that say
# something is wrong with the GPU itself; anything else there (NOT_SUPPORTED,
# NO_PERMISSION, ...) just leaves the field empty.
_GPU_BROKEN = {"NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_IRQ_ISSUE",
               "NVML_ERROR_TIMEOUT"}
# Errors meaning NVML as a whole stopped working: initialise again next time.
_NVML_DOWN = {"NVML_ERROR_UNINITIALIZED", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
              "NVML_ERROR_LIBRARY_NOT_FOUND"}

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi topo names (values as in pynvml).
_TOPOLOGY = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVLINK_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


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


_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """``"00000000:3B:00.0"`` / ``"0000:3b:00.0"`` -> ``"00000000:3b:00.0"`` (so NVLink peers compare equal)."""
    text = _text(bus_id).strip().rstrip("\x00")
    m = _PCI.match(text)
    if not m:
        return text.lower()
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):08x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


class NvmlBackend:
    """Real GPUs through NVML. ``nvml`` defaults to the ``pynvml`` module (nvidia-ml-py).

    NVML stays initialised between ``discover()`` and ``close()`` so each
    heartbeat's ``refresh()`` is a few cheap calls.
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._started = False
        self._quiet: set[tuple[int, str]] = set()  # (gpu, query) already logged as unsupported

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

    def _reason(self, exc: BaseException) -> tuple[str, str]:
        """(NVML_ERROR_* name, "reason (NAME)") for an NVMLError."""
        code = _nvml_error_name(self._lib(), exc)
        reason = _NVML_REASONS.get(code, (str(exc) or "unknown error", ""))[0]
        return code, f"{reason} ({code})"

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
        gpus = [self._probe(i) for i in range(count)]
        return self._with_links(gpus)

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
            code, reason = self._reason(exc)
            log.warning("GPU %d is unusable: %s", index, reason)
            if code in _NVML_DOWN:
                self._started = False
            return GpuInfo(index, "", "", None, 0, 0, healthy=False, health_reason=reason)
        total = int(mem.total)
        gpu_type, by_memory = catalog_type_for(name, total), False
        if gpu_type is None:
            gpu_type = type_by_memory(total)
            by_memory = gpu_type is not None
            if by_memory:
                log.warning("GPU %d (%r, %.1f GiB) is not in the MARP catalog; planning it as a %s "
                            "(the catalog GPU with the most memory it matches)", index, name, total / 2**30,
                            gpu_type)
            else:
                log.warning("GPU %d (%r, %d bytes) is not in the MARP catalog and smaller than every catalog "
                            "GPU; it will not be scheduled", index, name, total)
        try:
            bus = self._optional(index, "PCI bus id", lambda: nvml.nvmlDeviceGetPciInfo(handle).busId)
        except _Broken as exc:
            log.warning("GPU %d is unusable: %s", index, exc.reason)
            if exc.code in _NVML_DOWN:
                self._started = False
            return GpuInfo(index, uuid, name, gpu_type, total, 0, healthy=False, health_reason=exc.reason,
                           type_from_memory=by_memory)
        info = GpuInfo(index, uuid, name, gpu_type, total, int(mem.free), healthy=True,
                       pci_bus_id=normalize_pci_bus_id(bus) if isinstance(bus, (str, bytes)) else "",
                       type_from_memory=by_memory)
        return self._live(info, handle)

    def _optional(self, index: int, what: str, call: Any) -> Any:
        """An optional query: its value, None when unsupported; raises _Broken when the GPU is in trouble."""
        nvml = self._nvml
        try:
            return call()
        except nvml.NVMLError as exc:
            code, reason = self._reason(exc)
            if code in _GPU_BROKEN or code in _NVML_DOWN:
                raise _Broken(reason, code) from exc
            if (index, what) not in self._quiet:
                self._quiet.add((index, what))
                log.info("GPU %d: NVML cannot tell its %s: %s", index, what, reason)
            return None
        except AttributeError:  # an older nvidia-ml-py without this function
            return None

    def _live(self, gpu: GpuInfo, handle: Any) -> GpuInfo:
        """``gpu`` with this moment's utilization and compute processes (unhealthy if those say so)."""
        nvml = self._nvml
        try:
            util = self._optional(gpu.index, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
            procs = self._optional(gpu.index, "processes",
                                   lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except _Broken as exc:
            if exc.code in _NVML_DOWN:
                self._started = False
            if gpu.healthy:
                log.warning("GPU %d became unusable: %s", gpu.index, exc.reason)
            return replace(gpu, memory_free=0, healthy=False, health_reason=exc.reason, utilization=-1,
                           processes=())
        return replace(
            gpu,
            utilization=int(util.gpu) if util is not None else -1,
            processes=tuple((int(p.pid), -1 if getattr(p, "usedGpuMemory", None) is None else int(p.usedGpuMemory))
                            for p in (procs or ())),
        )

    def _with_links(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        """Every healthy GPU pair's link: NV<n> for n active NVLinks (direct or through NVSwitches), else the
        PCIe path NVML reports. Left empty where NVML cannot tell."""
        nvml = self._nvml
        healthy = [g for g in gpus if g.healthy]
        if len(healthy) < 2:
            return gpus
        try:
            handles = {g.index: nvml.nvmlDeviceGetHandleByIndex(g.index) for g in healthy}
        except nvml.NVMLError as exc:
            log.info("NVML cannot tell the links between the GPUs: %s", self._reason(exc)[1])
            return gpus
        by_bus = {g.pci_bus_id: g.index for g in healthy if g.pci_bus_id}
        nvlinks: dict[int, dict[int, int]] = {g.index: {} for g in healthy}
        to_switch: dict[int, int] = {g.index: 0 for g in healthy}
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        for g in healthy:
            for link in range(max_links):
                try:
                    if int(nvml.nvmlDeviceGetNvLinkState(handles[g.index], link)) != 1:  # NVML_FEATURE_ENABLED
                        continue
                    try:
                        kind = int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handles[g.index], link))
                    except (nvml.NVMLError, AttributeError):
                        kind = 0  # NVML_NVLINK_DEVICE_TYPE_GPU: an older driver only links GPUs
                    if kind == _NVLINK_DEVICE_TYPE_SWITCH:
                        to_switch[g.index] += 1
                        continue
                    peer = by_bus.get(normalize_pci_bus_id(
                        nvml.nvmlDeviceGetNvLinkRemotePciInfo(handles[g.index], link).busId))
                except nvml.NVMLError:
                    break  # no such link (INVALID_ARGUMENT) or no NVLink at all (NOT_SUPPORTED)
                except AttributeError:
                    break
                if peer is not None and peer != g.index:
                    nvlinks[g.index][peer] = nvlinks[g.index].get(peer, 0) + 1
        out = []
        for g in gpus:
            if not g.healthy:
                out.append(g)
                continue
            links: dict[int, str] = {}
            for peer in healthy:
                if peer.index == g.index:
                    continue
                n = nvlinks[g.index].get(peer.index, 0)
                if not n and to_switch[g.index] and to_switch[peer.index]:
                    n = min(to_switch[g.index], to_switch[peer.index])
                if n:
                    links[peer.index] = f"NV{n}"
                    continue
                try:
                    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[g.index], handles[peer.index]))
                except (nvml.NVMLError, AttributeError):
                    continue
                if level in _TOPOLOGY:
                    links[peer.index] = _TOPOLOGY[level]
            out.append(replace(g, links=links))
        return out

    def refresh(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        try:
            self.start()
        except GpuDiscoveryError as exc:
            # NVML as a whole is down (driver unloaded, upgraded underneath us): nothing
            # is schedulable here until it comes back; each heartbeat tries again.
            reason = str(exc).split(". To fix:")[0]
            if any(g.healthy for g in gpus):
                log.error("%s; every GPU of this node is unhealthy until NVML works again", reason)
            return [replace(g, memory_free=0, healthy=False, health_reason=reason, utilization=-1, processes=())
                    for g in gpus]
        nvml = self._nvml
        out = []
        for gpu in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                code, reason = self._reason(exc)
                if code in _NVML_DOWN:
                    self._started = False
                if gpu.healthy:
                    log.warning("GPU %d became unusable: %s", gpu.index, reason)
                out.append(replace(gpu, memory_free=0, healthy=False, health_reason=reason, utilization=-1,
                                   processes=()))
                continue
            if not gpu.uuid:  # was lost at discovery and came back: learn who it is
                out.append(self._probe(gpu.index))
                continue
            if not gpu.healthy:
                log.info("GPU %d is usable again", gpu.index)
            out.append(self._live(replace(gpu, memory_free=int(mem.free), healthy=True, health_reason=""), handle))
        return out


class _Broken(Exception):
    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def catalog_type_for(nvml_name: str, memory_bytes: int | None) -> str | None:
    """MARP catalog name for an NVML device name (memory tells 40 GB from 80 GB parts)."""
    return marp.gpu_from_nvml_name(nvml_name, memory_bytes)


def type_by_memory(memory_bytes: int) -> str | None:
    """The catalog GPU to plan an unknown device as: the most memory it matches, the slowest on a tie.

    "Matches" allows 2 % slack: NVML totals of same-size parts differ by a few MiB.
    Planning with no more memory and no more speed than the device has keeps
    every plan the predictor ranks feasible on it. None when it is smaller than all.
    """
    fits = [g for g in marp.list_gpus() if g.memory_bytes <= memory_bytes * 1.02]
    if not fits:
        return None
    most = max(g.memory_bytes for g in fits)
    tied = [g for g in fits if g.memory_bytes >= most * 0.98]
    return min(tied, key=lambda g: (max(g.bf16_tflops, g.fp16_tflops), g.name)).name


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
    """A configured list of catalog GPUs, all healthy; free except for what the agent's running
    jobs are predicted to use (``show_usage``).

    UUIDs are ``GPU-fake-<node>-<i>`` so a restarted fake agent re-registers
    the same GPUs rather than new ones.
    """

    def __init__(self, spec: str | Iterable[tuple[str, int]], node: str) -> None:
        self.entries = parse_fake_spec(spec) if isinstance(spec, str) else [_checked(f"{t}:{c}", t, c)
                                                                             for t, c in spec]
        self.node = node
        self._usage: dict[int, int] = {}  # GPU index -> bytes the jobs running on it use

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

    def show_usage(self, used_bytes: dict[int, int]) -> None:
        """What the agent's running jobs use per GPU index (their predicted peak): ``refresh``
        reports it as used memory and 100 % utilization, as a real GPU would show them."""
        self._usage = dict(used_bytes)

    def refresh(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        out = []
        for g in gpus:
            used = min(g.memory_total, self._usage.get(g.index, 0))
            busy = g.index in self._usage
            # (idle fake GPUs keep reporting utilization as unknown, as at discovery)
            out.append(replace(g, memory_free=g.memory_total - used, utilization=100 if busy else -1))
        return out

    def close(self) -> None:
        pass


def node_health(gpus: list[GpuInfo]) -> str:
    """A node-level problem: every GPU unhealthy (NVML down, all lost); empty otherwise."""
    if not gpus or any(g.healthy for g in gpus):
        return ""
    return "; ".join(sorted({g.health_reason or "unhealthy" for g in gpus}))[:500]


def processes_json(gpu: GpuInfo) -> str:
    """The GPU's processes as the heartbeat sends them: [[pid, bytes used], ...] in JSON."""
    return json.dumps([[pid, used] for pid, used in gpu.processes])
