"""Whether a process still runs, and stopping one as a terminal would, for tests that start, kill
or freeze processes."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie answers kill(0) but does not: its state in /proc says so)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def interrupt_group(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Ctrl-C to ``proc``'s process group (started with ``start_new_session``), as a user's terminal
    sends it; SIGKILL to the group if it has not exited within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
