"""Batch submissions: the YAML file format and the per-entry outcomes in Redis.

A batch file lists jobs the way `frenzy submit` takes them (see
``frenzy.rpc.jobspec.JobEntry``)::

    defaults:              # optional: merged under every entry
      command: python -c "print('hello')"
    jobs:
      - {name: gpt2-small, model: gpt2-124m, seq_len: 1024, global_batch: 32}
      - {name: qwen-tiny, model: qwen2.5-0.5b, seq_len: 2048, global_batch: 16, micro_batch: 2}
      - {name: sweep-low, model: gpt2-124m, seq_len: 1024, global_batch: 32, priority: -10}

``priority`` (-100..100, higher starts first) is checked against the worker's own token: a
value above the scheduler's ``--max-user-priority`` fails that entry (``error``,
"PERMISSION_DENIED: spec.priority: ...") unless the worker runs with an admin token. A top-level list of entries is accepted too. The file is checked for shape
only (YAML syntax, a list of mappings); each entry is validated by the worker,
so one bad entry fails alone and the others go on.

The file is read with bounds (issue 14 item 11): at most ``MAX_BATCH_FILE_BYTES``,
nested at most ``MAX_YAML_DEPTH`` deep, and at most ``MAX_YAML_NODES`` nodes once
every alias is expanded, so a "billion laughs" document fails at once with a
clear error instead of taking gigabytes when its aliases are written out as JSON.

Outcomes live in one hash per batch (``Keys.batch``): field = entry index,
value = JSON ``{"status", "job_id", "error", "name", "at", "attempts"}``.
``queued`` and ``retrying`` are in flight; ``submitted`` and ``duplicate``
succeeded; ``invalid``, ``rejected`` and ``error`` failed.

Batch records expire (issue 14 item 8): each hash lives ``batch_ttl_s()`` (7 days
by default, ``FRENZY_BATCH_TTL_S``) from its last write, and the batches index
drops ids older than that whenever a batch is written, so no batch — a rejected
one included — stays in Redis forever. The jobs a batch made are the scheduler's
and stay.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
import yaml

from frenzy.rpc.jobspec import MAX_MODEL_CONFIG_BYTES, check_inline_config
from frenzy.state import scripts
from frenzy.state.keys import Keys

QUEUED = "queued"  # enqueued, no worker has finished it yet
RETRYING = "retrying"  # the scheduler was unreachable; Celery retries with backoff
SUBMITTED = "submitted"  # the scheduler accepted the job (also after a redelivered task)
DUPLICATE = "duplicate"  # the entry's own idempotency_key named an existing job
INVALID = "invalid"  # bad entry (the message names the field); never retried
REJECTED = "rejected"  # valid, but no GPU type in the cluster can hold it; never retried
ERROR = "error"  # gave up: scheduler unreachable after every retry, or an unexpected failure

SUCCESS = frozenset({SUBMITTED, DUPLICATE})
FAILED = frozenset({INVALID, REJECTED, ERROR})
FINAL = SUCCESS | FAILED


MAX_BATCH_FILE_BYTES = 8 * 1024 * 1024
MAX_YAML_NODES = 1_000_000  # after expanding aliases; a 10,000-job batch uses about 200,000
MAX_YAML_DEPTH = 64
DEFAULT_BATCH_TTL_S = 7 * 24 * 3600


def batch_ttl_s() -> int:
    """How long a batch's records live after their last write (``FRENZY_BATCH_TTL_S``, else 7 days)."""
    raw = os.environ.get("FRENZY_BATCH_TTL_S")
    try:
        ttl = int(float(raw)) if raw else DEFAULT_BATCH_TTL_S
    except ValueError:
        raise ValueError(f"FRENZY_BATCH_TTL_S: expected seconds, got {raw!r}") from None
    if ttl < 1:
        raise ValueError(f"FRENZY_BATCH_TTL_S: must be >= 1 second (got {raw!r})")
    return ttl


class BatchFileError(ValueError):
    """The batch file cannot be used at all (nothing is enqueued)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts what the document expands to as it is composed.

    An alias is the same node object as its anchor, so each node's expanded size is known
    once its children are: the count is linear in the file, not in the expansion."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            if id(node) not in self._expanded:  # the anchor is still open: the node contains itself
                raise BatchFileError(f"recursive alias *{event.anchor} at line {event.start_mark.line + 1}")
            return node
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise BatchFileError(f"nested deeper than {MAX_YAML_DEPTH} levels at line {mark.line + 1}")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        size = 1 + sum(self._expanded[id(c)] for c in children)
        if size > MAX_YAML_NODES:
            raise BatchFileError(f"expands to more than {MAX_YAML_NODES} values (anchors and aliases "
                                 f"repeated, line {node.start_mark.line + 1}); write the jobs out or use `defaults:`")
        self._expanded[id(node)] = size
        return node


@dataclass(frozen=True)
class Outcome:
    index: int
    status: str
    job_id: str = ""
    error: str = ""
    name: str = ""
    at: float = 0.0
    attempts: int = 0

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def ok(self) -> bool:
        return self.status in SUCCESS

    def to_json(self) -> str:
        data = asdict(self)
        del data["index"]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, index: int, text: str) -> Outcome:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return cls(index=index, status=ERROR, error=f"unreadable outcome record: {text[:80]!r}")
        if not isinstance(data, dict):
            return cls(index=index, status=ERROR, error=f"unreadable outcome record: {text[:80]!r}")
        return cls(
            index=index, status=str(data.get("status", ERROR)), job_id=str(data.get("job_id") or ""),
            error=str(data.get("error") or ""), name=str(data.get("name") or ""),
            at=float(data.get("at") or 0.0), attempts=int(data.get("attempts") or 0),
        )


def new_batch_id() -> str:
    """Sortable and readable: 20250101-120000-3fa9c1."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def entry_name(entry: object) -> str:
    if isinstance(entry, dict) and entry.get("name") is not None:
        return str(entry["name"])
    return ""


# ---- the batch file ---------------------------------------------------------------------------


def _inline_model_file(entry: dict[str, Any], base: Path) -> dict[str, Any]:
    """A `model:` that names a config.json next to the batch file travels inline, so a worker
    on another machine (or in a container) does not need the file."""
    ref = entry.get("model")
    if not isinstance(ref, str) or not ref.strip() or ref.strip().startswith("{"):
        return entry
    for candidate in (base / ref, Path(ref)):
        if candidate.is_file():
            try:
                with open(candidate, "rb") as fh:
                    text = fh.read(MAX_MODEL_CONFIG_BYTES + 1).decode("utf-8")
                check_inline_config(text)
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise BatchFileError(f"model: cannot read config file {str(candidate)!r}: {exc}") from exc
            return {**entry, "model": text}
    return entry


def parse_batch(data: object, base: Path | None = None) -> list[dict[str, Any]]:
    """The entries of a loaded batch document; raises BatchFileError for a wrong shape."""
    defaults: dict[str, Any] = {}
    if isinstance(data, dict):
        unknown = sorted(str(k) for k in data if k not in ("jobs", "defaults"))
        if unknown:
            raise BatchFileError(f"unknown top-level key(s): {', '.join(unknown)}. Expected `jobs:` "
                                 "(a list of job entries) and optionally `defaults:`")
        if "jobs" not in data:
            raise BatchFileError("no `jobs:` list. Expected `jobs: [ {name, model, seq_len, global_batch, "
                                 "command}, ... ]`")
        raw_defaults = data.get("defaults") or {}
        if not isinstance(raw_defaults, dict):
            raise BatchFileError(f"defaults: expected a mapping, got {type(raw_defaults).__name__}")
        defaults = {str(k): v for k, v in raw_defaults.items()}
        data = data["jobs"]
    if not isinstance(data, list):
        raise BatchFileError(f"expected a list of job entries (or `jobs:` holding one), got {type(data).__name__}")
    if not data:
        raise BatchFileError("the batch has no jobs")
    entries: list[dict[str, Any]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise BatchFileError(f"jobs[{i}]: expected a mapping (name: ..., model: ...), got "
                                 f"{type(item).__name__} {str(item)[:60]!r}")
        entry = {**defaults, **{str(k): v for k, v in item.items()}}
        if base is not None:
            entry = _inline_model_file(entry, base)
        # JSON is the only thing that crosses the queue: YAML dates and the like become strings.
        try:
            entries.append(json.loads(json.dumps(entry, default=str)))
        except (TypeError, ValueError, RecursionError) as exc:  # a date or bytes as a mapping key
            raise BatchFileError(f"jobs[{i}]: cannot be written as JSON ({str(exc)[:120]})") from None
    return entries


def load_yaml(text: str) -> object:
    """One YAML document with the bounds above; raises BatchFileError (syntax errors name the line)."""
    if len(text) > MAX_BATCH_FILE_BYTES:
        raise BatchFileError(f"{len(text)} characters; the limit is {MAX_BATCH_FILE_BYTES} bytes (8 MiB)")
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # the reader refuses unprintable characters here
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise BatchFileError(f"YAML syntax error{where}: {problem}") from exc
    except RecursionError:  # bounded by MAX_YAML_DEPTH; kept as a backstop
        raise BatchFileError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    except BatchFileError:
        raise
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # PyYAML's constructors fail this way on explicit tags with bad values (`!!timestamp x`,
        # `!!int 1_x`): still the file's fault, not a crash.
        raise BatchFileError(f"a tagged value YAML cannot build ({type(exc).__name__}: {str(exc)[:120]})") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_batch_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read and shape-check a batch YAML file; raises BatchFileError saying what is wrong and where."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_BATCH_FILE_BYTES + 1)
        if len(raw) > MAX_BATCH_FILE_BYTES:
            raise BatchFileError(f"{p}: larger than {MAX_BATCH_FILE_BYTES} bytes (8 MiB); split the batch")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BatchFileError(f"cannot read {str(p)!r}: {exc}") from exc
    try:
        data = load_yaml(text)
        return parse_batch(data, p.resolve().parent)
    except BatchFileError as exc:
        raise BatchFileError(f"{p}: {exc}") from exc


# ---- outcomes in Redis ------------------------------------------------------------------------


def init_batch(client: redis.Redis, keys: Keys, batch_id: str, entries: list[dict[str, Any]],
               ttl_s: int | None = None) -> None:
    """Mark every entry queued and index the batch, in one transaction, before anything is enqueued;
    the records expire ``ttl_s`` (default ``batch_ttl_s()``) after their last write."""
    now = time.time()
    ttl = ttl_s or batch_ttl_s()
    mapping = {str(i): Outcome(index=i, status=QUEUED, name=entry_name(e), at=now).to_json()
               for i, e in enumerate(entries)}
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.batch(batch_id), mapping=mapping)
    pipe.expire(keys.batch(batch_id), ttl)
    pipe.zadd(keys.batches(), {batch_id: now}, nx=True)
    pipe.zremrangebyscore(keys.batches(), "-inf", f"({now - ttl!r}")
    pipe.execute()


def record_outcome(client: redis.Redis, keys: Keys, batch_id: str, outcome: Outcome,
                   ttl_s: int | None = None) -> bool:
    """Write one entry's outcome; a success already recorded is never replaced by a failure.
    The batch's records then live ``ttl_s`` (default ``batch_ttl_s()``) more. -> False when the
    earlier success was kept."""
    script = scripts.register(client, "record_batch_outcome")
    written = script(keys=[keys.batch(batch_id), keys.batches()],
                     args=[str(outcome.index), outcome.to_json(), "1" if outcome.ok else "0",
                           repr(time.time()), batch_id, str(ttl_s or batch_ttl_s())])
    return bool(int(written))


def get_outcome(client: redis.Redis, keys: Keys, batch_id: str, index: int) -> Outcome | None:
    raw = client.hget(keys.batch(batch_id), str(index))
    return None if raw is None else Outcome.from_json(index, _text(raw))


def read_batch(client: redis.Redis, keys: Keys, batch_id: str) -> list[Outcome]:
    """Every entry of a batch, by index; [] for an unknown batch."""
    raw = client.hgetall(keys.batch(batch_id))
    out = []
    for field, value in raw.items():
        try:
            index = int(_text(field))
        except ValueError:
            continue
        out.append(Outcome.from_json(index, _text(value)))
    return sorted(out, key=lambda o: o.index)


def list_batches(client: redis.Redis, keys: Keys, limit: int = 20) -> list[tuple[str, float]]:
    """Most recent batches first: (batch id, created at)."""
    rows = client.zrevrange(keys.batches(), 0, max(limit, 1) - 1, withscores=True)
    return [(_text(b), float(s)) for b, s in rows]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
