"""``--log-format json``'s job and node fields: where they come from (a call's ``extra``, the
message's own "job %s" / "node %s" / "attempt %d", the process's context) and that every log call
of the services that passes a job id or a node name puts it in its field. The last is read from
the source (each ``log.info(...)`` call under services/), so a new call that names a job as
"re-planning %s" without ``extra`` fails here; then the agent end to end (a real subprocess on a
real Redis): every line it writes carries its node, the lines that do not name it too."""

from __future__ import annotations

import ast
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frenzy import logs
from frenzy.state import node_keys
from frenzy.state.keys import Keys

SERVICES = Path(__file__).resolve().parents[3] / "services"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
LOGGERS = {"log", "logger", "_log", "LOG"}


def _json(msg: str, *args: object, **extra: object) -> dict[str, object]:
    record = logging.LogRecord("frenzy.x", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return json.loads(logs.JsonFormatter().format(record))


@pytest.fixture(autouse=True)
def no_process_context() -> Iterator[None]:
    """Each test starts without process context: an agent run in this process earlier (an
    in-process CLI test) leaves its node set, which these lines must not carry."""
    saved = {name: value for name, value in logs._process_context.items()}  # noqa: SLF001
    logs.set_context(**{name: None for name in logs.CONTEXT_FIELDS})
    yield
    logs.set_context(**{name: None for name in logs.CONTEXT_FIELDS})
    logs.set_context(**saved)


@pytest.fixture
def agent_context() -> Iterator[None]:
    logs.set_context(node="l4-7")
    yield
    logs.set_context(node=None)


def test_the_message_names_job_node_and_attempt() -> None:
    line = _json("refusing event %s from node %s for job %s attempt %d: %s", "1-0", "a100-1", "j-9", 3, "bad")
    assert (line["node"], line["job_id"], line["attempt"]) == ("a100-1", "j-9", 3)
    # Only the word right before the placeholder counts: not "nodes", not "job=", not a later word.
    line = _json("freed %d GPU(s) on nodes %s; job=%s, %s job", 2, ["a", "b"], "j-1", "x")
    assert not {"node", "job_id"} & set(line)
    # "%%" takes no argument and "%*d" takes two: the job is still the right argument.
    line = _json("100%% of %*d GPUs for Job %s", 3, 8, "j-2")
    assert line["job_id"] == "j-2"
    assert line["message"] == "100% of   8 GPUs for Job j-2"


def test_extra_wins_then_the_message_then_the_process(agent_context: None) -> None:
    line = _json("job %s attempt %d exited on node %s", "j-1", 2, "t4-0", node="a100-0")
    assert (line["job_id"], line["attempt"], line["node"]) == ("j-1", 2, "a100-0")  # extra over the words
    assert _json("job %s exited on node %s", "j-1", "t4-0")["node"] == "t4-0"  # words over the process
    assert _json("GPU %d became unusable: %s", 0, "Xid 79")["node"] == "l4-7"  # the agent's node
    with pytest.raises(ValueError, match="'user' is not one of"):
        logs.set_context(user="alice")


def _log_calls() -> Iterator[tuple[Path, ast.Call]]:
    for path in sorted(SERVICES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            funcs = [f.body, f.orelse] if isinstance(f, ast.IfExp) else [f]  # (log.warning if x else log.error)(...)
            if all(isinstance(g, ast.Attribute) and g.attr in LEVELS and isinstance(g.value, ast.Name)
                   and g.value.id in LOGGERS for g in funcs):  # fmt: skip
                yield path, node


def _field_of(arg: ast.expr) -> str | None:
    """``job_id`` for an argument that is a job id (``job.id``, ``msg.job_id``, ``job_id``), ``node``
    for a node name (``self.node``, ``event.node``, ``node``), else None."""
    text = ast.unparse(arg)
    last = text.rsplit(".", 1)[-1]
    if last == "job_id" or text in ("job.id", "job_id"):
        return "job_id"
    if last == "node":
        return "node"
    return None


def test_every_service_log_call_puts_its_job_and_node_in_their_fields() -> None:
    checked, gaps = 0, []
    for path, call in _log_calls():
        fmt = call.args[0]
        if not (isinstance(fmt, ast.Constant) and isinstance(fmt.value, str)):
            continue
        args = [ast.unparse(a) for a in call.args[1:]]
        extra = next((k.value for k in call.keywords if k.arg == "extra"), None)
        if isinstance(extra, ast.Dict):
            given = {k.value for k in extra.keys if isinstance(k, ast.Constant)}
        else:  # a helper's dict (the agent's self._context(job, attempt)) carries job_id and node
            given = {"job_id", "node", "attempt"} if extra is not None else set()
        record = logging.LogRecord("x", logging.INFO, "", 0, fmt.value, tuple(f"#{i}" for i in range(len(args))), None)
        named = {field: args[int(str(v)[1:])] for field, v in logs.named_fields(record).items()}
        # The agent's lines carry its node from the process context (set in its CLI, checked below).
        if SERVICES / "agent" in path.parents:
            given.add("node")
        for arg in call.args[1:]:
            field = _field_of(arg)
            if field is None:
                continue
            checked += 1
            if field not in given and named.get(field) != ast.unparse(arg):
                gaps.append(f"{path.relative_to(SERVICES.parent)}:{call.lineno}: {ast.unparse(arg)} is not in "
                            f"{field}: {fmt.value[:70]!r}")  # fmt: skip
    assert checked > 40  # the walk found the services' calls (about 60 pass a job or a node)
    assert not gaps, "say 'job %s' / 'node %s' or pass extra={...}:\n" + "\n".join(gaps)


@pytest.mark.timeout(60)
def test_agent_lines_all_carry_its_node(redis_url: str, redis_client: redis.Redis, keys: Keys,
                                       tmp_path: Path) -> None:  # fmt: skip
    node_keys.create(redis_client, keys, "ctx-0")
    proc = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "agent", "--node", "ctx-0", "--fake-gpus",
                             "L4:1", "--redis-url", redis_url, "--prefix", keys.prefix, "--log-format", "json",
                             "--log-dir", str(tmp_path)], stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(json.loads(line))
            if "registered node" in lines[-1]["message"]:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    lines += [json.loads(x) for x in proc.stderr.read().splitlines() if x.startswith("{")]
    assert any("registered node ctx-0" in x["message"] for x in lines), lines
    assert any("agent ctx-0 stopped" in x["message"] for x in lines), lines  # names it only as "agent %s"
    assert {x.get("node") for x in lines} == {"ctx-0"}, lines
