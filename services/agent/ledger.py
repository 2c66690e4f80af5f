"""The agent's local record of the jobs it started, so a restarted agent can adopt them.

Jobs run in their own sessions and outlive the agent (unless --kill-on-exit).
A restarted agent reads this file to know which processes are still its
jobs: it then refuses to launch them twice when the scheduler's launch is
redelivered, can still cancel them, and reports their exit. One small JSON
file per node, rewritten atomically (temp file + rename) on every change.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerEntry:
    job_id: str
    attempt: int
    pid: int  # also the process group id (the job is a session leader)
    start_ticks: int | None  # /proc start time, guards against pid reuse
    log_path: str
    reported: bool  # has the RUNNING event been sent?
    fence: int | None = None  # the reservation it runs under (sent with every event)
    launch_id: str = ""  # FRENZY_LAUNCH_ID of its processes (finds them in /proc)
    node_rank: int = 0
    # This node's GPUs it runs on and MARP's predicted memory per GPU: what fake GPUs show as
    # used, also after a restarted agent adopted the job.
    gpu_indices: tuple[int, ...] = ()
    peak_bytes_per_gpu: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_indices", tuple(int(i) for i in self.gpu_indices))  # (JSON gives a list)


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], LedgerEntry] = {}

    def load(self) -> list[LedgerEntry]:
        with self._lock:
            self._entries = {}
            try:
                raw = json.loads(self.path.read_text())
                known = {f.name for f in fields(LedgerEntry)}
                for item in raw.get("jobs", []):
                    # Fields a newer or older agent wrote are ignored / defaulted.
                    e = LedgerEntry(**{k: v for k, v in item.items() if k in known})
                    self._entries[(e.job_id, e.attempt)] = e
            except FileNotFoundError:
                pass
            except (ValueError, TypeError, AttributeError) as exc:
                # A torn or hand-edited file must not stop the agent; the jobs in
                # it are then unknown, which the scheduler's timeouts cover.
                log.warning("ignoring unreadable agent ledger %s: %s", self.path, exc)
            return list(self._entries.values())

    def put(self, entry: LedgerEntry) -> None:
        with self._lock:
            self._entries[(entry.job_id, entry.attempt)] = entry
            self._save()

    def remove(self, job_id: str, attempt: int) -> None:
        with self._lock:
            if self._entries.pop((job_id, attempt), None) is not None:
                self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"jobs": [asdict(e) for e in self._entries.values()]}, indent=1))
        os.replace(tmp, self.path)
