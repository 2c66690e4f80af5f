"""issue 14 item 12: the CLI never prints a user's terminal escape sequences.

Before: `frenzy job` printed a job name's escape sequences raw, so anyone who could submit
a job could retitle, clear or fake the terminal of whoever looked at it (and rich markup
in a name was obeyed, a hyperlink included). `frenzy` is run as a user runs it, against
a real scheduler, predictor and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, types_pb2
from support.servers import Servers, running_servers
from support.state import add_node

EVIL_NAME = "evil\x1b]0;pwned\x07\x1b[2J\x9b31m\u202etxt.exe[link=http://evil.example]click[/link]\r\x08"
RAW = ("\x1b]", "\x1b[2J", "\x07", "\x9b", "\u202e", "\r", "\x08", "\x1b]8;")


def frenzy(*args: str, scheduler: str, color: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "FRENZY_SCHEDULER": scheduler}
    env.pop("NO_COLOR", None)
    if color:  # as on a terminal: rich writes its own styles, and must write nothing else
        env["FORCE_COLOR"] = "1"
    else:
        env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "frenzy.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "l4-0", "L4", 2, memory=23 * 1024**3)
    with running_servers(redis_url, prefix) as s:
        yield s


def test_job_name_escapes_are_shown_not_obeyed(servers: Servers) -> None:
    """issue 14 item 12: `frenzy job` and `frenzy jobs` show control characters as visible escapes;
    `--json` keeps the name exact."""
    spec = types_pb2.JobSpec(
        name=EVIL_NAME, model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
        recipe=types_pb2.TrainingRecipe(seq_len=128, global_batch=8), command=["true"])
    job_id = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
    for color in (False, True):
        for args in (("job", job_id), ("jobs",)):
            res = frenzy(*args, scheduler=servers.scheduler_addr, color=color)
            assert res.returncode in (0, 1), (args, res.stderr)
            out = res.stdout
            leaked = [r for r in RAW if r in out]
            assert not leaked, (args, color, leaked, out[:600])
            assert "\\x1b" in out, (args, out[:600])  # shown, so the reader sees something is odd
            if not color:
                assert "\x1b" not in out
    res = frenzy("job", job_id, "--json", scheduler=servers.scheduler_addr, color=False)
    assert json.loads(res.stdout)["spec"]["name"] == EVIL_NAME
