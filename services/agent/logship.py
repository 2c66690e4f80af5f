"""Ship job logs from the node's log files into its own Redis log stream of each job.

The job writes straight into its log file (not through the agent), so the
training keeps running and logging whatever happens to the agent. One
``LogShipper`` thread tails every running job's file and appends what is new
to this node's stream of the job, ``node:{node}:logs:{job}``, through ``append_log.lua``,
which records the shipped byte offset per attempt beside it: a restarted agent resumes exactly
where the previous one stopped, and nothing is sent twice. The keys are the node's own: its
Redis user may write no other node's output (issue 34). ``frenzy logs JOB --follow`` reads the
streams of the job's nodes, merged in time order (via the scheduler), from any machine.

Pieces are whole lines where possible (a line longer than ``CHUNK_BYTES`` is
split). The watcher of a job calls ``finish()`` after the process ended and
before it reports the exit, so a finished job's stream holds all its output.

Caps (issue 34 item 6: a job printing 60 MB became 422 MB in Redis and 60 MB on disk):

* In Redis, a node's stream of a job holds at most ``FRENZY_LOG_MAX_BYTES`` (16 MiB by default;
  0: no cap, only ``maxlen`` entries) of entries, counted as stored; ``append_log.lua`` deletes
  the oldest entries past it, so the stream keeps the node's newest output (the cap is per node:
  a job on 4 nodes keeps up to 4 times it).
* On disk, a node's log file of one attempt keeps at most ``FRENZY_LOG_FILE_MAX_BYTES`` (256 MiB
  by default; 0: no cap) of blocks: output older than the newest that many bytes is skipped
  (never shipped) and its blocks freed with ``fallocate(PUNCH_HOLE)`` (the file keeps its size
  and offsets, so shipping resumes exactly after a restart; the freed part reads as zeros).
  The job writes straight into its file, so between two rounds (``poll_s``) a fast writer can
  pass the cap by what it writes meanwhile; a hard cap needs the shim to hand the job a pipe
  and copy it (docs/security.md).
* Text is stored as its UTF-8 with the C0 control characters other than tab, newline, carriage
  return and ESC, and DEL, shown as their Unicode control pictures (NUL is ``U+2400``): JSON
  would escape each as six bytes (``\u0000``), which made 60 MB of NULs 422 MB in Redis.

Readers are told the caps (StreamLogs' initial metadata, the REST answer) and see what was
dropped as each node's first offset (> 0) and the gaps between offsets.

The log file is opened without following a symbolic link, without blocking (a FIFO cannot hold
the shipper) and read only if it is a regular file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import BinaryIO

import redis

from frenzy.state import scripts
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk

log = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 1024  # most bytes in one stream entry
MiB = 1024 * 1024
REDIS_CAP_ENV = "FRENZY_LOG_MAX_BYTES"  # a job's output kept in its Redis stream
FILE_CAP_ENV = "FRENZY_LOG_FILE_MAX_BYTES"  # a node's log file of one attempt, on disk
DEFAULT_REDIS_CAP = 16 * MiB
DEFAULT_FILE_CAP = 256 * MiB
_BLOCK = 4096  # holes are punched in whole blocks

# C0 controls but tab, newline, carriage return and ESC, and DEL -> their control pictures
# (U+2400..U+241F, U+2421): three bytes each in the stored JSON instead of six.
_PICTURES = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D, 0x1B)} | {0x7F: 0x2421}


def log_text(data: bytes) -> str:
    """A piece of a log file as stored: UTF-8 (invalid bytes as U+FFFD), the rarer control
    characters as their control pictures (``_PICTURES``)."""
    return data.decode("utf-8", errors="replace").translate(_PICTURES)


def cap_from_env(name: str, default: int) -> int:
    """A byte cap from the environment (an integer, optionally with K, M or G; 0: no cap), else ``default``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    scale = {"K": 1024, "M": MiB, "G": 1024 * MiB}.get(raw[-1].upper(), 1)
    try:
        value = int(raw[:-1] if scale > 1 else raw) * scale
    except ValueError:
        log.warning("%s=%r is not a byte count; using %d", name, raw, default)
        return default
    return max(0, value)


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)


class NotARegularFile(OSError):
    """A job's log path that is not a regular file (a FIFO, a device, a directory): never read."""


def open_log(path: str, write: bool = False) -> BinaryIO | None:
    """``path`` opened without following a link or blocking (None when it does not exist);
    NotARegularFile unless it is a regular file."""
    try:
        fh = open(path, "r+b" if write else "rb", buffering=0, opener=_no_follow)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise NotARegularFile(f"{path}: not a regular file")
    return fh  # type: ignore[return-value]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_fallocate = getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    _fallocate.restype = ctypes.c_int
_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the blocks of ``[offset, offset + length)`` of the file, keeping its size; OSError if
    the file system cannot."""
    if _fallocate is None:
        raise OSError("fallocate is not available")
    if _fallocate(fd, _PUNCH, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@dataclass
class _Tail:
    job_id: str
    attempt: int
    path: str
    offset: int | None = None  # None: ask Redis what was already shipped
    lock: threading.Lock = field(default_factory=threading.Lock)
    punched: int = 0  # the file's blocks before this offset were freed (its cap)
    skipped: int = 0  # bytes of output dropped for the file cap, never shipped


class LogShipper:
    """Tails the log files of this node's jobs into their Redis log streams (one thread for all)."""

    def __init__(self, client: redis.Redis, keys: Keys, node: str, poll_s: float = 0.25,
                 maxlen: int = 10_000, retention_s: float = 7 * 24 * 3600, redis_cap: int | None = None,
                 file_cap: int | None = None) -> None:
        self.r = client
        self.k = keys
        self.node = node
        self.poll_s = poll_s
        self.maxlen = maxlen
        self.retention_ms = int(retention_s * 1000)
        # bytes of this node's stream of a job in Redis, of its log file on disk (0: no cap)
        self.redis_cap = cap_from_env(REDIS_CAP_ENV, DEFAULT_REDIS_CAP) if redis_cap is None else redis_cap
        cap = cap_from_env(FILE_CAP_ENV, DEFAULT_FILE_CAP) if file_cap is None else file_cap
        self.file_cap = cap if cap <= 0 else max(cap, 4 * CHUNK_BYTES)  # (room for whole pieces)
        self._can_punch = True
        self._append = scripts.register_loaded(client, "append_log")  # EVALSHA only (scripts.LoadedScript)
        self._tails: dict[tuple[str, int], _Tail] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()

    def _keys(self, job_id: str) -> list[str]:
        """append_log.lua's keys: this node's stream of the job and its offsets (the node's own)."""
        return [self.k.job_logs(job_id, self.node), self.k.job_log_offsets(job_id, self.node)]

    # ---- registry

    def watch(self, job_id: str, attempt: int, path: str, new_file: bool = False) -> None:
        """Tail ``path`` from where Redis says it stopped, or from 0 for a ``new_file`` this agent
        run created (nothing of it can have been shipped: one round trip less a job)."""
        with self._lock:
            self._tails.setdefault((job_id, attempt), _Tail(job_id, attempt, path, 0 if new_file else None))

    def finish(self, job_id: str, attempt: int) -> None:
        """Ship everything left in the file (the process has ended), then forget it. Redis errors propagate."""
        with self._lock:
            tail = self._tails.get((job_id, attempt))
        if tail is None:
            return
        self._pump(tail, final=True)
        with self._lock:
            self._tails.pop((job_id, attempt), None)

    def forget(self, job_id: str, attempt: int) -> None:
        with self._lock:
            self._tails.pop((job_id, attempt), None)

    # ---- the thread

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            self.pump_all()

    def pump_all(self) -> None:
        with self._lock:
            tails = list(self._tails.values())
        for tail in tails:
            try:
                self._pump(tail, final=False)
            except scripts.ScriptNotLoaded as exc:  # the file keeps everything: shipped once it is loaded
                if ("", -1) not in self._warned:
                    self._warned.add(("", -1))
                    log.warning("shipping logs: %s", exc)
                return
            except redis.RedisError as exc:
                # The file keeps everything: the next round (or the next agent run) catches up.
                log.debug("shipping the log of %s failed: %s", tail.job_id, exc, extra={"job_id": tail.job_id})
                return
            except Exception:  # a bad file must not stop the others from shipping
                key = (tail.job_id, tail.attempt)
                if key not in self._warned:
                    self._warned.add(key)
                    log.exception("shipping the log of job %s attempt %d failed", tail.job_id, tail.attempt)

    def _pump(self, tail: _Tail, final: bool) -> None:
        with tail.lock:
            fld = f"{self.node}/{tail.attempt}"
            if tail.offset is None:
                tail.offset = int(self.r.hget(self.k.job_log_offsets(tail.job_id, self.node), fld) or 0)
            fh = open_log(tail.path)
            if fh is None:
                return
            with fh:
                size = os.fstat(fh.fileno()).st_size
                cap = self.file_cap
                if cap > 0 and size - tail.offset > cap:
                    self._skip(fh, tail, fld, size - cap)
                try:
                    self._ship(fh, tail, fld, final)
                finally:
                    if cap > 0 and size > cap and self._can_punch:
                        self._free(fh, tail, min(tail.offset, size - cap))

    def _skip(self, fh: BinaryIO, tail: _Tail, fld: str, to: int) -> None:
        """Drop the output before ``to`` (past the file cap, never shipped): shipping goes on
        from the next line start after it when one is near. The stream gets a note in its place
        (a chunk covering the dropped bytes whose text says so), so every reader sees where and
        how much; without Redis the bytes are dropped all the same (the file's cap holds)."""
        assert tail.offset is not None
        fh.seek(to)
        head = fh.read(CHUNK_BYTES)
        cut = head.find(b"\n")
        if 0 <= cut < len(head) - 1:
            to += cut + 1
        if not tail.skipped:
            log.warning("job %s attempt %d: its output passed the log file cap (%s=%d bytes); the oldest is "
                        "dropped", tail.job_id, tail.attempt, FILE_CAP_ENV, self.file_cap,
                        extra={"job_id": tail.job_id})
        start = tail.offset
        tail.skipped += to - start
        note = LogChunk(node=self.node, attempt=tail.attempt, offset=start,
                        text=f"[frenzy: {to - start} bytes of output dropped here: the log file on {self.node} keeps "
                             f"the newest {self.file_cap} bytes of an attempt ({FILE_CAP_ENV})]\n")
        try:
            shipped = int(self._append(
                keys=self._keys(tail.job_id),
                args=[fld, start, to, self.maxlen, note.model_dump_json(), self.retention_ms, self.redis_cap,
                      self.file_cap]))
        except redis.RedisError:
            shipped = to
        tail.offset = max(to, shipped)

    def _free(self, fh: BinaryIO, tail: _Tail, upto: int) -> None:
        """Free the file's blocks before ``upto`` (shipped or dropped, and past the cap)."""
        upto -= upto % _BLOCK
        if upto <= tail.punched:
            return
        try:
            with open_log(tail.path, write=True) as wfh:  # type: ignore[union-attr]
                same = os.fstat(wfh.fileno())
                mine = os.fstat(fh.fileno())
                if (same.st_dev, same.st_ino) != (mine.st_dev, mine.st_ino):
                    return  # the path now names another file
                punch_hole(wfh.fileno(), tail.punched, upto - tail.punched)
            tail.punched = upto
        except (OSError, AttributeError) as exc:  # (AttributeError: the file went away: None)
            if getattr(exc, "errno", None) in (95, 22):  # EOPNOTSUPP, EINVAL: this file system cannot
                self._can_punch = False
                log.warning("cannot free the blocks of capped job logs on this file system (%s); the log "
                            "files are not capped on disk", exc)

    def _ship(self, fh: BinaryIO, tail: _Tail, fld: str, final: bool) -> None:
        assert tail.offset is not None
        while True:
            fh.seek(tail.offset)
            data = fh.read(CHUNK_BYTES)
            if not data:
                return
            if not final and len(data) < CHUNK_BYTES:
                cut = data.rfind(b"\n")
                if cut < 0:
                    return  # a partial line: wait for its end (or the job's)
                data = data[:cut + 1]
            start, end = tail.offset, tail.offset + len(data)
            chunk = LogChunk(node=self.node, attempt=tail.attempt, offset=start, text=log_text(data))
            shipped = int(self._append(
                keys=self._keys(tail.job_id),
                args=[fld, start, end, self.maxlen, chunk.model_dump_json(), self.retention_ms, self.redis_cap,
                      self.file_cap]))
            tail.offset = shipped  # > start always: the loop makes progress
            if shipped != end:
                log.debug("log of %s was already shipped up to %d; skipping ahead", tail.job_id, shipped,
                          extra={"job_id": tail.job_id})
