"""bench/load.py puts this directory on the services' PYTHONPATH: each Python thread then gives
its OS thread its own name (``/proc/<pid>/task/<tid>/comm``: "grpc_3", "scheduler-loop",
"events", "_serve", ...), which Python 3.11 does not do, so the benchmark can tell the scheduler's
API threads from its placement loop's by their CPU time when both share one process. Nothing
else changes: the name is written once, from the thread itself, when it starts."""

from __future__ import annotations

import re
import threading

_DEFAULT = re.compile(r"Thread-\d+ \((.+)\)$")  # an unnamed thread: "Thread-3 (_serve)" -> "_serve"
_start = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named_bootstrap_inner(self: threading.Thread) -> None:
    m = _DEFAULT.match(self.name)
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w", encoding="utf-8") as f:
            f.write((m.group(1) if m else self.name)[:15])
    except OSError:
        pass
    _start(self)


threading.Thread._bootstrap_inner = _named_bootstrap_inner  # type: ignore[attr-defined]
