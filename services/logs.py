"""How every Frenzy service writes its log: ``--log-format text`` (for people) or ``json``
(one object per line, for a log pipeline: Loki, Elasticsearch, ``jq``).

A JSON line carries ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message`` (the formatted text), then whichever of ``CONTEXT_FIELDS`` the call gave with
``extra={...}`` (or a ``LoggerAdapter``), e.g. ``log.info("job %s started", job_id,
extra={"job_id": job_id, "node": node})``, and ``exc_info`` as text when there is a traceback.
Anything that is not JSON (a path, an exception) is written as its ``str``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Context a log call may attach with extra=...: what an operator filters a cluster's logs by.
CONTEXT_FIELDS = ("job_id", "attempt", "node", "batch_id", "entry", "gpu_type", "outcome")
LOG_FORMAT_HELP = "text (for people) or json (one JSON object per line: time, level, logger, message, job_id, node)."


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value if isinstance(value, (str, int, float, bool)) else str(value)
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def check_format(fmt: str) -> str:
    """``fmt`` lower-cased, or ValueError naming the option and the choices."""
    value = fmt.strip().lower()
    if value not in LOG_FORMATS:
        raise ValueError(f"--log-format: {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    return value


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if check_format(fmt) == "json" else logging.Formatter(TEXT_FORMAT)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """The root logger: one stderr handler in ``fmt`` at ``level`` (replacing any handler set
    before, so a service's own log lines and its libraries' come out in one format)."""
    chosen = formatter(fmt)
    numeric = logging.getLevelName(level.strip().upper())
    if not isinstance(numeric, int):
        raise ValueError(f"--log-level: {level!r} is not one of DEBUG, INFO, WARNING, ERROR")
    handler = logging.StreamHandler()
    handler.setFormatter(chosen)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # JSON: a library's warnings.warn becomes a log record too (py.warnings), not a stray stderr line.
    logging.captureWarnings(chosen.__class__ is JsonFormatter)
