"""How much GPU memory a job holds now, from one NVML reading: pure, no I/O.

The agent samples this at every heartbeat and keeps the highest value per job attempt: the peak
reported with the exit and compared with MARP's prediction (``frenzy accuracy``). NVML lists each
compute process on a GPU with its used memory (nvmlDeviceGetComputeRunningProcesses); the job's
share of a GPU is what its own processes use there. Where NVML names no process of the job (a
container's pid namespace hides the host pids; an old driver leaves ``usedGpuMemory`` unset) the
GPU's whole used memory counts: the job holds its GPUs alone (the scheduler reserved them), so
that is the job's memory plus at most the driver's own reserve. A sample every few seconds misses
a short spike: the peak is a lower bound, and a job may also declare its own
(``launcher.PEAK_FILE``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from frenzy.agent.gpus import GpuInfo


def job_gpu_bytes(gpus: Sequence[GpuInfo], indices: Collection[int], pids: Collection[int]) -> tuple[int, int]:
    """(the most memory the job holds on one of its GPUs ``indices``, that GPU's total memory), from
    one reading of ``gpus``; ``pids``: the job's processes. (0, 0) when none of its GPUs is readable."""
    best, total = 0, 0
    for gpu in gpus:
        if gpu.index not in indices or not gpu.healthy or gpu.memory_total <= 0:
            continue
        mine = [used for pid, used in gpu.processes if pid in pids and used >= 0]
        held = sum(mine) if mine else gpu.memory_total - gpu.memory_free
        if held > best:
            best, total = held, gpu.memory_total
    return best, total
