"""A process as Linux's /proc tells it: its start time and whether it still runs.

Shared by the launcher (adopted jobs, stragglers) and the spawner's client (a shim found by
its pid file): a pid alone may have been reused, a pid with its start time may not.
"""

from __future__ import annotations

import os
from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """Kernel start time of ``pid`` (Linux /proc), to tell a process from a later one reusing its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])  # field 22 overall: starttime


def process_running(pid: int, start_ticks: int | None) -> bool:
    """Is ``pid`` still the same live (non-zombie) process we started?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to a signal probe
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    rest = stat[stat.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return False
    return start_ticks is None or int(rest[19]) == start_ticks
