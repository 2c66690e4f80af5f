"""Why a job's process ended, in words a user acts on: decided from its exit status and the tail
of its output, without I/O.

The agent reads the end of the job's log when the process exits (``tail_of``: a bounded read,
done by the daemon) and asks ``classify`` for the cause it reports with the EXITED event:

* ``"oom"``: the GPU ran out of memory. Recognised from the messages the frameworks print (below,
  each quoted from its source) or, on real GPUs, from a non-zero exit while the job's peak memory
  on a GPU was within ``NEAR_FULL_SHARE`` of the GPU's capacity (an allocator that died without a
  message: a CUDA kernel's own allocation, a C++ abort). The scheduler re-plans such a job with
  more memory per GPU (``frenzy.scheduler.oom_policy``).
* ``"signal 9 (SIGKILL)"``: killed by a signal (the shim re-raises its child's signal, so the exit
  status is negative); ``"exit code 137 (128 + SIGKILL: ...)"`` when a shell reports a child
  killed so.
* ``"launch failed: <why>"``: the command never ran. The agent's own checks say so before it
  starts anything (``launcher.start``: command not found, working directory missing; the scheduler
  builds this cause from the LAUNCH_FAILED event), and the shim says so when its exec fails after
  those checks passed (a script without a ``#!`` line, a binary of another architecture): its
  ``# frenzy shim: cannot start ...`` line with exit 127 is recognised here. Either way the cause
  keeps the reason, not "exit code 127".
* ``"exit code N"``: anything else that failed; ``""`` for a clean exit 0.

"node lost" is the scheduler's to say (an agent that is gone reports nothing): see
``frenzy.scheduler.agent_events``.

The out-of-memory messages, as the libraries print them (a line matches when it contains one):

* PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp): ``torch.OutOfMemoryError: CUDA
  out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB ...`` (2.1+;
  ``torch.cuda.OutOfMemoryError`` in 1.13-2.0; ``RuntimeError: CUDA out of memory.`` before), and
  ``HIP out of memory`` on ROCm builds;
* a CUDA runtime call outside the allocator (c10/cuda/CUDAException.h): ``RuntimeError: CUDA
  error: out of memory``;
* cuBLAS / cuDNN handle creation (ATen's CUDA context): ``CUBLAS_STATUS_ALLOC_FAILED``,
  ``CUDNN_STATUS_ALLOC_FAILED``;
* NCCL (its CUDACHECK macro, src/include/checks.h): ``NCCL WARN Cuda failure 'out of memory'``
  (``Cuda failure 2 'out of memory'`` in newer releases), and ``Failed to CUDA calloc`` from its
  allocation helpers; PyTorch then raises ``ncclUnhandledCudaError`` with ``Last error: Cuda
  failure 'out of memory'``;
* XLA (JAX, torch_xla): ``RESOURCE_EXHAUSTED: Out of memory while trying to allocate``.

Host memory (Python's ``MemoryError``, the kernel's OOM killer: SIGKILL) is not a GPU OOM: more
memory per GPU would not help, so it is reported as what it is.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

OOM = "oom"
LAUNCH_FAILED = "launch failed"
# The agent stopped the job itself: it lost Redis for nearly as long as the scheduler gives a silent
# node (frenzy.agent.fencing). A cause of the host, not of the job: the scheduler runs it again.
FENCED = "fenced"
# What the shim (shim.py) prints, then exits 127, when the command cannot be executed at all.
SHIM_CANNOT_START = "# frenzy shim: cannot start "
# A job that failed while one of its GPUs was this full is taken to have run out of memory: the
# caching allocator fails an allocation that does not fit in what is left, so a failing job at its
# peak sits just under the capacity (a few hundred MiB of a 40-80 GiB GPU: ~1 %); 5 % leaves room
# for what a heartbeat's sampling misses.
NEAR_FULL_SHARE = 0.95

_OOM_PATTERNS = (
    r"CUDA out of memory",
    r"HIP out of memory",
    r"OutOfMemoryError",
    r"CUDA error: out of memory",
    r"CUBLAS_STATUS_ALLOC_FAILED",
    r"CUDNN_STATUS_ALLOC_FAILED",
    r"Cuda failure (?:\d+ )?'out of memory'",
    r"Failed to CUDA calloc",
    r"RESOURCE_EXHAUSTED: Out of memory",
)
_OOM = re.compile("|".join(_OOM_PATTERNS))
# The lines the agent itself writes into a job's log (launcher.start's header, the exit trailer).
_AGENT_LINES = ("# frenzy agent", "# cwd=", "# argv: ", "# launch failed: ")
# At most this much of a line is searched: a job may print megabytes without a newline.
_LINE_CHARS = 4096


def oom_line(lines: Sequence[str]) -> str | None:
    """The last line of ``lines`` that says the GPU ran out of memory, or None."""
    for line in reversed(lines):
        if _OOM.search(line[:_LINE_CHARS]):
            return line
    return None


def shim_cannot_start(lines: Sequence[str]) -> str | None:
    """Why the shim could not execute the command (``"cannot start 'x': [Errno 8] Exec format
    error: ..."``), from its line in ``lines``; None when there is none."""
    for line in reversed(lines):
        if line.startswith(SHIM_CANNOT_START):
            return line[len("# frenzy shim: "):_LINE_CHARS].strip()
    return None


def signal_name(number: int) -> str:
    """``9`` -> ``"SIGKILL"``; a number Python does not name -> ``"SIG?"``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return "SIG?"


def classify(exit_code: int | None, tail: Sequence[str], *, cancelled: bool = False,
             peak_share: float | None = None, gpu_measured: bool = False) -> str:
    """The cause of an exit, as ``"oom"``, ``"signal N (NAME)"``, ``"exit code N"`` ... (module docstring).

    ``exit_code``: the process's status (negative: killed by that signal; None: unknown);
    ``tail``: the last lines of its output; ``cancelled``: the agent stopped it (a cancel);
    ``peak_share``: the job's highest memory on one of its GPUs as a share of that GPU's memory
    (None: not known); ``gpu_measured``: that peak was measured by NVML, not declared by the job
    (only a measurement says a GPU really was full)."""
    if exit_code == 0:
        return ""
    if cancelled:
        return "cancelled"
    if oom_line(tail) is not None:
        return OOM
    if gpu_measured and peak_share is not None and peak_share >= NEAR_FULL_SHARE:
        return OOM
    if exit_code == 127:
        never_ran = shim_cannot_start(tail)
        if never_ran is not None:
            return f"{LAUNCH_FAILED}: {never_ran}"
    if exit_code is None:
        return "exit code unknown"
    if exit_code < 0:
        return f"signal {-exit_code} ({signal_name(-exit_code)})"
    if 128 < exit_code < 128 + 65 and signal_name(exit_code - 128) != "SIG?":
        # What a shell reports for a child killed by a signal (POSIX: 128 + the signal number).
        return f"exit code {exit_code} (128 + {signal_name(exit_code - 128)}: a process it ran was killed)"
    return f"exit code {exit_code}"


def last_lines(text: str, lines: int, max_bytes: int) -> list[str]:
    """The last ``lines`` lines of ``text`` (without the agent's own ``# frenzy`` lines), each cut
    to a quarter of ``max_bytes`` (at most 1,024 characters: PyTorch's out-of-memory line is ~500)
    and together at most ``max_bytes`` bytes, the newest kept: what an event may carry."""
    if lines <= 0 or max_bytes <= 0:
        return []
    kept = [ln for ln in text.splitlines() if not ln.startswith(_AGENT_LINES)]
    out: list[str] = []
    size = 0
    each = max(16, min(1024, max_bytes // 4))
    for line in reversed(kept[-lines:]):
        line = line if len(line) <= each else line[:each - 1] + "…"
        cost = len(line.encode("utf-8", "replace")) + 1
        if size + cost > max_bytes:
            break
        out.append(line)
        size += cost
    return out[::-1]
