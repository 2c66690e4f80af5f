"""A job's output as Redis holds it: one stream per node, read merged in time order (issue 34).

Each node's agent ships its output of a job to ``node:{node}:logs:{job}`` (``append_log.lua``),
keys its Redis user alone may write (``frenzy.state.acl``): no node can append to, trim or move
the offsets of another node's output. A reader (StreamLogs, so ``frenzy logs``, ``frenzy job``,
``frenzy submit --wait``, REST and the SDK) merges the streams of the nodes the job was placed
on, in any attempt (``placed_nodes``: the job record knows them), by entry id. Redis makes each
id from its own clock when the entry is appended (``<ms>-<seq>``), so the merge gives the order
in which the output reached Redis, as the one stream of every node gave before.

Only placed nodes are read: a node may write its own stream of any job id, and would otherwise
speak in the log of a job it never ran. An entry of node n's stream that names another node is
skipped (n may speak for itself only).

A follower keeps a cursor per stream (the last id it read of each; ``LogReader.cursors``) and
picks up the streams of nodes the job is placed on later (``LogReader.refresh``, after a
requeue). One XREAD reads every stream at once; when one stream gave all it was allowed
(``count``), entries of the others newer than its last are left for the next read, so the
merged order holds across reads.

The one stream of every node that jobs had before issue 34 (``logs:{job}``, no longer written)
is read too while it lasts (it expires 7 days after its last output): it merges like a node's
stream, its chunks keep the node they name.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import redis

from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import BadMessage, LogChunk, decode_log_chunk, is_safe_name
from frenzy.state.records import JobRecord

log = logging.getLogger(__name__)

READ_ENTRIES = 500  # entries one read takes, all streams together (each chunk up to 16 KiB)
BACK_PAGE = 200  # entries a backward read (the tail) takes a round, all streams together


@dataclass(frozen=True)
class LogSource:
    """One stream of a job's output: a node's (``node``) or the legacy one of every node (``node`` "")."""

    key: str
    offsets: str
    node: str


def placed_nodes(job: JobRecord) -> list[str]:
    """Every node ``job`` was placed on, in any attempt, as the scheduler recorded it: each
    reservation's history entry (``RESERVED``: "<gpus> x <type> on a, b", as ``StateStore``'s
    placement writes it), the current placement, the nodes of the attempt the last requeue ended,
    and the nodes that reported a start (``log:{node}``, kept across attempts) or an exit."""
    seen: dict[str, None] = {}

    def add(name: object) -> None:
        if isinstance(name, str) and is_safe_name(name):
            seen.setdefault(name)

    for entry in job.history:
        if entry.get("state") == JobState.RESERVED.value:
            _, on, names = str(entry.get("reason", "")).rpartition(" on ")
            if on:
                for name in names.split(","):
                    add(name.strip())
    for name, _ in job.placement:
        add(name)
    for name in (*job.previous_nodes, *job.log_paths, *job.exit_codes):
        add(name)
    for rec in job.attempts:
        add(rec.get("node"))
        add(rec.get("peak_node"))
    return list(seen)


def sources(keys: Keys, job: JobRecord, node: str = "") -> list[LogSource]:
    """The streams of ``job``'s output (only ``node``'s, when given), the legacy one last."""
    nodes = [n for n in placed_nodes(job) if not node or n == node]
    return [*(LogSource(keys.job_logs(job.id, n), keys.job_log_offsets(job.id, n), n) for n in nodes),
            LogSource(keys.legacy_job_logs(job.id), keys.legacy_job_log_offsets(job.id), "")]


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


def _int(text: str | None) -> int:
    try:
        return max(0, int(float(text or 0)))
    except ValueError:
        return 0


def _backward(r: redis.Redis, src: LogSource, top: str, page: int) -> Iterator[tuple[LogSource, str, dict]]:
    """``src``'s entries from ``top`` (inclusive) back to its oldest, newest first, ``page`` a read."""
    end = top
    while True:
        batch = r.xrevrange(src.key, max=end, count=page)
        for entry_id, fields in batch:
            yield src, entry_id, fields
        if len(batch) < page:
            return
        end = "(" + batch[-1][0]


class LogReader:
    """One reader of one job's output (a StreamLogs call): ``node`` and ``attempt`` filter it
    ("" and 0: all); ``cursors`` holds the last entry read of each stream."""

    def __init__(self, r: redis.Redis, keys: Keys, job: JobRecord, node: str = "", attempt: int = 0) -> None:
        self.r, self.keys, self.job_id = r, keys, job.id
        self.node, self.attempt = node, attempt
        self.sources: list[LogSource] = []
        self.cursors: dict[str, str] = {}
        self.refresh(job)

    def refresh(self, job: JobRecord) -> None:
        """Add the streams of nodes ``job`` was placed on since (read from their start)."""
        known = {s.key for s in self.sources}
        added = [src for src in sources(self.keys, job, self.node) if src.key not in known]
        for src in added:
            self.sources.append(src)
            self.cursors[src.key] = "0"
        if added:
            self._streams_only()

    def _streams_only(self) -> None:
        """Leave out a key that is not a stream: a node may make its own key a hash, and one
        WRONGTYPE would fail the read of every node's output."""
        pipe = self.r.pipeline(transaction=False)
        for src in self.sources:
            pipe.type(src.key)
        kinds = pipe.execute()
        for src, kind in zip(list(self.sources), kinds, strict=True):
            if (kind.decode() if isinstance(kind, bytes) else kind) not in ("stream", "none"):
                log.warning("job %s: %s is a %s, not a log stream: left out", self.job_id, src.key, kind)
                self.sources.remove(src)
                self.cursors.pop(src.key, None)

    def _retrying(self, call):  # noqa: ANN001, ANN202
        """``call()``, once more after leaving out keys that are not streams (WRONGTYPE)."""
        try:
            return call()
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            self._streams_only()
            return call()

    def caps(self) -> tuple[int, int]:
        """(a node's stream cap, a node's log file cap) the agents shipped under, in bytes (0: none
        or not known yet): the highest any stream of the job recorded (append_log.lua)."""
        pipe = self.r.pipeline(transaction=False)
        for src in self.sources:
            pipe.hmget(src.offsets, ":cap", ":disk_cap")
        got = [g for g in pipe.execute(raise_on_error=False) if isinstance(g, list)]  # (not a hash: no caps)
        return max((_int(c) for c, _ in got), default=0), max((_int(f) for _, f in got), default=0)

    def _chunk(self, src: LogSource, entry_id: str, fields: dict) -> LogChunk | None:
        """The entry's chunk if it is one this reader wants; a bad one is logged and skipped."""
        try:
            chunk = decode_log_chunk(fields)
            if src.node and chunk.node != src.node:
                raise BadMessage(f"node: {chunk.node!r} in the stream of node {src.node!r}")
        except BadMessage as exc:
            log.warning("job %s: skipping bad log entry %s: %s", self.job_id, entry_id, exc)
            return None
        if (self.node and chunk.node != self.node) or (self.attempt and chunk.attempt != self.attempt):
            return None
        return chunk

    def _chunks(self, entries: Iterable[tuple[LogSource, str, dict]]) -> Iterator[LogChunk]:
        for src, entry_id, fields in entries:
            chunk = self._chunk(src, entry_id, fields)
            if chunk is not None:
                yield chunk

    def tail(self, lines: int) -> list[LogChunk]:
        """The chunks holding the last ``lines`` lines, oldest first (the first one cut to its last
        lines); the cursors move to each stream's newest entry, so ``read`` goes on after them."""
        return self._retrying(lambda: self._tail(lines))

    def _tail(self, lines: int) -> list[LogChunk]:
        pipe = self.r.pipeline(transaction=False)
        for src in self.sources:
            pipe.xrevrange(src.key, count=1)
        for src, newest in zip(self.sources, pipe.execute(), strict=True):
            self.cursors[src.key] = newest[0][0] if newest else "0"
        tops = [src for src in self.sources if self.cursors[src.key] != "0"]
        page = max(10, BACK_PAGE // max(1, len(tops)))
        position = {src.key: i for i, src in enumerate(self.sources)}  # (ties: as ``read`` orders them)
        merged = heapq.merge(*(_backward(self.r, src, self.cursors[src.key], page) for src in tops),
                             key=lambda e: (entry_order(e[1]), position[e[0].key]), reverse=True)
        picked: list[LogChunk] = []
        count = 0
        for chunk in self._chunks(merged):
            picked.append(chunk)
            count += chunk.text.count("\n") + (0 if chunk.text.endswith("\n") else 1)
            if count >= lines:
                break
        picked.reverse()
        extra = count - lines
        if picked and extra > 0:
            head = picked[0]
            kept = "\n".join(head.text.split("\n")[extra:])
            picked[0] = head.model_copy(update={"text": kept,
                                                "offset": head.offset + len(head.text.encode()) - len(kept.encode())})
        return picked

    def read(self, count: int = READ_ENTRIES, block_ms: int | None = None) -> tuple[int, list[LogChunk]]:
        """The entries after the cursors, merged by id: (how many were read, the chunks wanted of
        them). ``block_ms``: wait up to that long for a first entry. Each stream gives at most
        ``count`` / streams entries; when one gave all it could, the others' entries newer than
        its last wait for the next read (the cursors stop at the last entry returned)."""
        per_stream = max(10, count // max(1, len(self.sources)))
        if not self.sources:  # (every key left out: wait as a blocking read would)
            if block_ms:
                time.sleep(block_ms / 1000)
            return 0, []
        reply = self._retrying(lambda: self.r.xread({s.key: self.cursors[s.key] for s in self.sources},
                                                     count=per_stream, block=block_ms))
        if isinstance(reply, dict):  # (RESP3)
            reply = list(reply.items())
        position = {src.key: (i, src) for i, src in enumerate(self.sources)}
        limits = [entry_order(entries[-1][0]) for _key, entries in reply or () if len(entries) >= per_stream]
        limit = min(limits) if limits else None
        merged = sorted(
            ((entry_order(entry_id), position[key][0], position[key][1], entry_id, fields)
             for key, entries in reply or () for entry_id, fields in entries
             if limit is None or entry_order(entry_id) <= limit),
            key=lambda e: (e[0], e[1]))
        for _order, _i, src, entry_id, _fields in merged:
            self.cursors[src.key] = entry_id
        return len(merged), list(self._chunks((src, entry_id, fields) for _o, _i, src, entry_id, fields in merged))
