"""Ship job logs from the node's log files into each job's Redis log stream.

The job writes straight into its log file (not through the agent), so the
training keeps running and logging whatever happens to the agent. One
``LogShipper`` thread tails every running job's file and appends what is new
to ``logs:{job}`` through ``append_log.lua``, which records the shipped byte
offset per node and attempt: a restarted agent resumes exactly where the
previous one stopped, and nothing is sent twice. ``frenzy logs JOB --follow``
reads that stream (via the scheduler) from any machine.

Pieces are whole lines where possible (a line longer than ``CHUNK_BYTES`` is
split). The watcher of a job calls ``finish()`` after the process ended and
before it reports the exit, so a finished job's stream holds all its output.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import redis

from frenzy.state import scripts
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk

log = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 1024  # most bytes in one stream entry


@dataclass
class _Tail:
    job_id: str
    attempt: int
    path: str
    offset: int | None = None  # None: ask Redis what was already shipped
    lock: threading.Lock = field(default_factory=threading.Lock)


class LogShipper:
    """Tails the log files of this node's jobs into their Redis log streams (one thread for all)."""

    def __init__(self, client: redis.Redis, keys: Keys, node: str, poll_s: float = 0.25,
                 maxlen: int = 10_000, retention_s: float = 7 * 24 * 3600) -> None:
        self.r = client
        self.k = keys
        self.node = node
        self.poll_s = poll_s
        self.maxlen = maxlen
        self.retention_ms = int(retention_s * 1000)
        self._append = scripts.register(client, "append_log")
        self._tails: dict[tuple[str, int], _Tail] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()

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
                tail.offset = int(self.r.hget(self.k.job_log_offsets(tail.job_id), fld) or 0)
            try:
                fh = open(tail.path, "rb")
            except FileNotFoundError:
                return
            with fh:
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
                    chunk = LogChunk(node=self.node, attempt=tail.attempt, offset=start,
                                     text=data.decode("utf-8", errors="replace"))
                    shipped = int(self._append(
                        keys=[self.k.job_logs(tail.job_id), self.k.job_log_offsets(tail.job_id)],
                        args=[fld, start, end, self.maxlen, chunk.model_dump_json(), self.retention_ms]))
                    tail.offset = shipped  # > start always: the loop makes progress
                    if shipped != end:
                        log.debug("log of %s was already shipped up to %d; skipping ahead", tail.job_id, shipped,
                                  extra={"job_id": tail.job_id})
