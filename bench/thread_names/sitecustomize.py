"""bench/load.py puts this directory on the services' PYTHONPATH: each Python thread then gives
its OS thread its own name (``/proc/<pid>/task/<tid>/comm``: "grpc_3", "scheduler-loop",
"events", "_serve", ...), which Python 3.11 does not do, so the benchmark can tell the scheduler's
API threads from its placement loop's by their CPU time when both share one process. Nothing
else changes: the name is written once, from the thread itself, when it starts. (The agents'
spawner and shims run with ``-I -S``: they never load this.)"""

from __future__ import annotations

import threading

_start = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _os_name(name: str) -> str:
    """An unnamed thread's target: "Thread-3 (_serve)" -> "_serve"; else the name, as the OS keeps it (15 bytes)."""
    if name.startswith("Thread-") and name.endswith(")") and " (" in name:
        name = name[name.index(" (") + 2 : -1]
    return name[:15]


def _named_bootstrap_inner(self: threading.Thread) -> None:
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w", encoding="utf-8") as f:
            f.write(_os_name(self.name))
    except (OSError, ValueError):  # (no /proc, or a name the file will not take: left unnamed)
        pass
    _start(self)


threading.Thread._bootstrap_inner = _named_bootstrap_inner  # type: ignore[attr-defined]
