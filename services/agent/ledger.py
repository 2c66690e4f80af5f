"""The agent's local record of the jobs it started, so a restarted agent can adopt them.

Jobs run in their own sessions and outlive the agent (unless --kill-on-exit).
A restarted agent reads this file to know which processes are still its
jobs: it then refuses to launch them twice when the scheduler's launch is
redelivered, can still cancel them, and reports their exit. One small JSON
file per job attempt in a directory per node, written atomically (temp file + rename) and
removed when the attempt's exit is reported: a change costs one small file, however many
jobs the node runs (a single file rewritten whole on each of a job's three changes was a
good part of the agent's time per job on a busy node). An older agent's single file is
still read, and folded into the directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass, fields
from pathlib import Path

from frenzy.agent import safefile

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
    node_dead_after_s: float = 0.0  # the launch's: a restarted agent keeps stopping it when cut off

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_indices", tuple(int(i) for i in self.gpu_indices))  # (JSON gives a list)


_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
# Bytes read of one entry (a few hundred in practice) and of an older agent's single file: what is
# larger is not a ledger, and read through safefile (no FIFO, no link), like every file the agent reads.
_ENTRY_MAX = 64 * 1024
_LEGACY_MAX = 64 * 1024 * 1024


def _entry_from(item: object) -> LedgerEntry:
    """An entry from its JSON object; fields a newer or older agent wrote are ignored / defaulted."""
    if not isinstance(item, dict):
        raise TypeError(f"a ledger entry is an object, not {type(item).__name__}")
    known = {f.name for f in fields(LedgerEntry)}
    return LedgerEntry(**{k: v for k, v in item.items() if k in known})


class Ledger:
    """The entries of one node, kept in ``<path stem>.jobs/`` beside ``path`` (the older single
    file, read for compatibility)."""

    def __init__(self, path: Path) -> None:
        self.path = path  # an older agent's single file
        self.dir = path.with_name(f"{path.stem}.jobs")
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], LedgerEntry] = {}
        self._dir_made = False

    def load(self) -> list[LedgerEntry]:
        with self._lock:
            self._entries = {}
            legacy = self._load_legacy()
            for entry in legacy:
                self._entries[(entry.job_id, entry.attempt)] = entry
            try:
                names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json") and not n.startswith("."))
            except FileNotFoundError:
                names = []
            for name in names:
                try:
                    entry = _entry_from(json.loads(safefile.read_capped(self.dir / name, _ENTRY_MAX)))
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, TypeError, AttributeError) as exc:
                    # A torn or hand-edited entry must not stop the agent: that one job is then
                    # unknown here, which the scheduler's timeouts cover; the others still load.
                    log.warning("ignoring unreadable agent ledger entry %s: %s", self.dir / name, exc)
                    continue
                self._entries[(entry.job_id, entry.attempt)] = entry
            if legacy:  # fold the old file into the directory, then drop it
                for entry in legacy:
                    self._write(entry)
                self.path.unlink(missing_ok=True)
            return list(self._entries.values())

    def _load_legacy(self) -> list[LedgerEntry]:
        try:
            raw = json.loads(safefile.read_capped(self.path, _LEGACY_MAX))
            return [_entry_from(item) for item in raw.get("jobs", [])]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable agent ledger %s: %s", self.path, exc)
            return []

    def put(self, entry: LedgerEntry) -> None:
        with self._lock:
            self._entries[(entry.job_id, entry.attempt)] = entry
            self._write(entry)

    def remove(self, job_id: str, attempt: int) -> None:
        with self._lock:
            if self._entries.pop((job_id, attempt), None) is not None:
                try:
                    os.unlink(self._file(job_id, attempt))
                except FileNotFoundError:
                    pass

    def _file(self, job_id: str, attempt: int) -> Path:
        # Job ids are the scheduler's ("job-<hex>"); anything else is hashed rather than trusted
        # as a file name.
        name = job_id if _SAFE_NAME.fullmatch(job_id) else hashlib.sha256(job_id.encode()).hexdigest()[:32]
        return self.dir / f"{name}.{int(attempt)}.json"

    def _write(self, entry: LedgerEntry) -> None:
        if not self._dir_made:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._dir_made = True
        target = self._file(entry.job_id, entry.attempt)
        data = json.dumps({f.name: getattr(entry, f.name) for f in fields(LedgerEntry)})
        try:
            safefile.write_atomic(target, data, mode=0o600)
        except FileNotFoundError:  # the directory went away under us (cleaned by hand): make it again
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            safefile.write_atomic(target, data, mode=0o600)
