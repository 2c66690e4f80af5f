"""Listings that always fit in one gRPC message (issue 14 item 8).

A listing is a table, not a copy of every record: ``job_summary`` keeps what
`frenzy jobs`, /api/jobs and the dashboard show and trims what can be large (an
inline model config, the command and env, the candidate plans, a long history).
``fit`` then stops adding rows at ``MAX_LISTING_BYTES``, far under gRPC's 4 MiB
message limit, so one huge record — even one written before the field limits
existed — can never break a listing for everyone. `frenzy job ID` (GetJob) still
returns the whole record.

A jobs listing can be narrowed by user, name and submission time (``ListJobsRequest``); the
scheduler applies them before ``limit`` counts. ``since_time`` reads the one ``since`` dialect the
CLI (``--since``), the REST gateway (``?since=``) and the SDK (``since=``) share.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Iterable
from typing import TypeVar

from google.protobuf.message import Message

from frenzy.v1 import types_pb2

MAX_LIST_JOBS = 1000  # rows in one ListJobs answer, whatever the request's limit
MAX_LISTING_BYTES = 3 * 1024 * 1024  # the answer's size; gRPC refuses messages over 4 MiB
MAX_SUMMARY_TEXT = 256  # characters of a name, reason or label shown in a table
MAX_SUMMARY_COMMAND_BYTES = 1024
MAX_SUMMARY_HISTORY = 32  # the latest transitions
MAX_SUMMARY_PLANS = 8  # the best candidates
MAX_GPU_PROCESSES = 64  # processes listed per GPU in ListNodes
MAX_GPU_LINKS = 64

M = TypeVar("M", bound=Message)


def clip(text: str, limit: int = MAX_SUMMARY_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def job_summary(job: types_pb2.Job) -> types_pb2.Job:
    """A copy of ``job`` small enough for a table row (a few KiB at most)."""
    out = types_pb2.Job()
    out.CopyFrom(job)
    spec = out.spec
    spec.name = clip(spec.name)
    spec.model.display_name = clip(spec.model.display_name)
    if spec.model.WhichOneof("source") == "config_json":
        spec.model.config_json = ""  # the config can be 1 MiB; model_name names it
    elif len(spec.model.catalog_name) > MAX_SUMMARY_TEXT:
        spec.model.catalog_name = clip(spec.model.catalog_name)
    kept, size = [], 0
    for arg in spec.command:
        size += len(arg.encode()) + 1
        if size > MAX_SUMMARY_COMMAND_BYTES:
            kept.append("…")
            break
        kept.append(arg)
    del spec.command[:]
    spec.command.extend(kept)
    spec.env.clear()  # values can hold anything up to 64 KiB
    spec.workdir = clip(spec.workdir, 1024)
    spec.idempotency_key = clip(spec.idempotency_key)
    out.model_name = clip(out.model_name)
    out.pending_reason = clip(out.pending_reason, 1024)
    out.user = clip(out.user)
    del out.candidate_plans[MAX_SUMMARY_PLANS:]
    if len(out.history) > MAX_SUMMARY_HISTORY:
        latest = list(out.history[-MAX_SUMMARY_HISTORY:])
        del out.history[:]
        out.history.extend(latest)
    for h in out.history:
        h.reason = clip(h.reason, 1024)
    if len(out.attempts) > MAX_SUMMARY_HISTORY:  # (a job re-planned that often: its latest)
        latest_attempts = list(out.attempts[-MAX_SUMMARY_HISTORY:])
        del out.attempts[:]
        out.attempts.extend(latest_attempts)
    for a in out.attempts:
        del a.tail[:]  # up to 4 KiB each: GetJob has them
        a.outcome = clip(a.outcome, 1024)
    return out


_SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
SINCE_HELP = ("a duration back from now (30m, 2h, 7d, 1h30m; units s m h d w) or an ISO date or time "
              "(2026-11-28, 2026-11-28T14:03; local time unless it names a zone)")


def since_time(value: str | float | dt.datetime | dt.timedelta | None, now: float | None = None) -> float:
    """``value`` as the unix time a ``since`` filter starts at (0.0: no bound).

    A string is a duration back from ``now`` (``2h``) or an ISO date or date and time (naive: local
    time, as the tables print it); a number is already a unix time; a ``timedelta`` counts back
    from ``now``. ValueError (without the field's name: each caller names its own flag) when it is
    neither."""
    now = time.time() if now is None else now
    if value is None or value == "":
        return 0.0
    if isinstance(value, dt.timedelta):
        return max(0.0, now - value.total_seconds())
    if isinstance(value, dt.datetime):
        return max(0.0, value.timestamp())  # naive: local time
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r} is not a time; expected unix seconds >= 0")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a time; expected {SINCE_HELP}")
    text = value.strip()
    if _DURATION.fullmatch(text.lower()):
        return max(0.0, now - sum(float(n) * _SINCE_UNITS[u] for n, u in _DURATION_PART.findall(text.lower())))
    try:
        # 3.11's fromisoformat takes a date, a date and time ("T" or a space) and a zone ("Z", "+02:00").
        return max(0.0, dt.datetime.fromisoformat(text).timestamp())
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"{value!r} is neither a duration nor a date; expected {SINCE_HELP}") from None


def fit(rows: Iterable[M], budget: int = MAX_LISTING_BYTES) -> list[M]:
    """The leading ``rows`` whose encoded size stays within ``budget`` bytes."""
    kept: list[M] = []
    used = 0
    for row in rows:
        used += row.ByteSize() + 8  # field tag and length prefix
        if used > budget:
            break
        kept.append(row)
    return kept
