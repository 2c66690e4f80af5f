"""How every Frenzy service writes its log: ``--log-format text`` (for people) or ``json``
(one object per line, for a log pipeline: Loki, Elasticsearch, ``jq``).

A JSON line carries ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message`` (the formatted text), then whichever of ``CONTEXT_FIELDS`` the call gave with
``extra={...}`` (or a ``LoggerAdapter``), e.g. ``log.info("job %s started", job_id,
extra={"job_id": job_id, "node": node})``, and ``exc_info`` as text when there is a traceback.
Anything that is not JSON (a path, an exception) is written as its ``str``.

Two more sources fill ``job_id``, ``node`` and ``attempt`` where ``extra`` does not:
* the message's own words: the services' log calls say ``"job %s"``, ``"node %s"``, ``"attempt
  %d"`` (also ``"of job %s"``, ``"for %s"`` after "job"...: see ``_NAMED``), so the argument in
  that place is the field. A call that names a job or node this way needs no ``extra``; a
  message about a job worded otherwise must pass ``extra`` (tests/unit/observability checks
  every log call of the services for this);
* the process's own context (``set_context``): an agent is one node, so each of its lines
  carries ``node``, about a job or not (a GPU's health, Redis outages).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Context a log call may attach with extra=...: what an operator filters a cluster's logs by.
CONTEXT_FIELDS = ("job_id", "attempt", "node", "batch_id", "entry", "gpu_type", "outcome")
LOG_FORMAT_HELP = "text (for people) or json (one JSON object per line: time, level, logger, message, job_id, node)."

# A printf placeholder (what logging's %-formatting takes), and the word right before it (one
# space between) that says which field its argument is: "job %s", "on node %s", "attempt %d";
# "nodes %s" (a list) or "job=%s" name none.
_PLACEHOLDER = re.compile(r"%(?:\(\w+\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
_NAMED = {"job": "job_id", "node": "node", "attempt": "attempt"}
# Fields set once for the whole process (set_context): e.g. the agent's node.
_process_context: dict[str, str | int] = {}


def set_context(**fields: str | int | None) -> None:
    """Fields every JSON line of this process carries unless the call gives its own (``None``
    removes one): the agent sets its ``node``. Names must be in ``CONTEXT_FIELDS``."""
    for name, value in fields.items():
        if name not in CONTEXT_FIELDS:
            raise ValueError(f"log context: {name!r} is not one of {', '.join(CONTEXT_FIELDS)}")
        if value is None:
            _process_context.pop(name, None)
        else:
            _process_context[name] = value


def named_fields(record: logging.LogRecord) -> dict[str, Any]:
    """``job_id`` / ``node`` / ``attempt`` from the message's words: the argument of each
    placeholder right after "job ", "node " or "attempt " (the first one of each kind)."""
    if not isinstance(record.msg, str) or not isinstance(record.args, tuple) or not record.args:
        return {}
    out: dict[str, Any] = {}
    index = 0
    for match in _PLACEHOLDER.finditer(record.msg):
        if match.group(1) == "%":  # a literal percent sign takes no argument
            continue
        index += match.group(0).count("*")  # a * width or precision takes an argument first
        if index >= len(record.args):
            break
        before = record.msg[: match.start()]
        words = before.split() if before.endswith(" ") else []  # "job %s", not "job=%s" or "(%s"
        name = _NAMED.get(words[-1].lower()) if words else None
        if name is not None and name not in out:
            out[name] = record.args[index]
        index += 1
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        named = named_fields(record)
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is None:
                value = named.get(name)
            if value is None:
                value = _process_context.get(name)
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
