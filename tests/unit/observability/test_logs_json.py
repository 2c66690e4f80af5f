"""``--log-format json``: one JSON object per line with time, level, logger, message and the
job/node fields a call attaches with ``extra=``; the text format unchanged; bad choices refused
with the option named. Also the CLI end to end: `frenzy predictor --log-format json` writes JSON
lines on stderr (a real subprocess)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from frenzy import logs
from frenzy.devstack.redis_server import free_port


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    logger = logging.getLogger("frenzy.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_is_one_object_with_the_fixed_fields(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.warning("job %s attempt %d started on\nnode %s", "job-1", 2, "a100-0")
    [line] = stream.getvalue().splitlines()  # a newline in the message stays inside the string
    obj = json.loads(line)
    # The fixed four, and the fields the message's own words name ("job %s", "attempt %d", "node %s").
    assert set(obj) == {"time", "level", "logger", "message", "job_id", "attempt", "node"}
    assert (obj["job_id"], obj["attempt"], obj["node"]) == ("job-1", 2, "a100-0")
    logger.info("scheduler %s ready", "s-1")
    assert set(json.loads(stream.getvalue().splitlines()[1])) == {"time", "level", "logger", "message"}
    assert obj["level"] == "WARNING" and obj["logger"] == "frenzy.test.logs"
    assert obj["message"] == "job job-1 attempt 2 started on\nnode a100-0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", obj["time"]), obj["time"]


def test_context_fields_come_from_extra(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("started", extra={"job_id": "job-7", "node": "l4-0", "attempt": 1, "unrelated": "x"})
    logging.LoggerAdapter(logger, {"job_id": "job-8", "node": "t4-1"}).info("via an adapter")
    logger.info("no context", extra={"job_id": None})
    first, second, third = lines(stream)
    assert (first["job_id"], first["node"], first["attempt"]) == ("job-7", "l4-0", 1)
    assert "unrelated" not in first  # only the known context fields, never whatever a call passes
    assert (second["job_id"], second["node"]) == ("job-8", "t4-1")
    assert "job_id" not in third


def test_tracebacks_and_odd_values_stay_json(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed", extra={"node": object()})
    [obj] = lines(stream)
    assert obj["message"] == "failed" and obj["level"] == "ERROR"
    assert "RuntimeError: boom" in obj["exc_info"] and "Traceback" in obj["exc_info"]
    assert obj["node"].startswith("<object object")


def test_text_stays_text_and_bad_choices_are_named() -> None:
    record = logging.LogRecord("frenzy.x", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    assert logs.formatter("text").format(record).endswith("INFO frenzy.x: hello there")
    assert logs.formatter("JSON").format(record).startswith("{")
    with pytest.raises(ValueError, match="--log-format: 'yaml' is not one of text, json"):
        logs.check_format("yaml")
    with pytest.raises(ValueError, match="--log-level: 'LOUD'"):
        logs.configure("LOUD", "text")


def test_predictor_writes_json_lines() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "predictor", "--address", f"127.0.0.1:{port}",
                             "--log-format", "json"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FRENZY_PREDICTOR_TOKEN": "frzp_" + "t" * 40})
    try:
        first = proc.stderr.readline()  # the "listening" line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    obj = json.loads(first)
    assert obj["logger"] == "frenzy.predictor" and obj["level"] == "INFO"
    assert f"port {port}" in obj["message"]


def test_bad_log_format_is_refused_naming_the_option() -> None:
    done = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "predictor", "--address", "127.0.0.1:0",
                           "--log-format", "xml"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--log-format: 'xml' is not one of text, json" in done.stderr
