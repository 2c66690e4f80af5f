"""`frenzy up` as a new user meets it (issue 30): one stack per credentials file, a clear word
for a stale REDIS_URL, the dashboard's address and login from `frenzy dashboard`, and every
client and operator command finding the stack through the credentials file alone -- `frenzy
batch` included, which once enqueued into whatever Redis answered on 127.0.0.1:6379."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from frenzy.devstack.redis_server import free_port
from support.processes import interrupt_group

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

FRENZY = [sys.executable, "-m", "frenzy.cli.main"]
SCRUBBED = ("REDIS_URL", "REDIS_URL_FILE", "FRENZY_TOKEN", "FRENZY_TOKEN_FILE", "FRENZY_CREDENTIALS",
            "FRENZY_SCHEDULER", "FRENZY_API", "FRENZY_API_PORT", "FRENZY_PREFIX")


def _env(config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["XDG_CONFIG_HOME"] = str(config)
    env.update(extra)
    return env


def frenzy(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FRENZY, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("up")
    cluster = tmp / "cluster.yaml"
    cluster.write_text("nodes:\n  - {gpu: L4, count: 1, gpus_per_node: 2}\n")
    config = tmp / "config"
    api_port = free_port()
    env = _env(config, FRENZY_API_PORT=str(api_port))
    proc = subprocess.Popen([*FRENZY, "up", "--cluster", str(cluster), "--run-dir", str(tmp / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    out, deadline = "", time.monotonic() + 120
    assert proc.stdout is not None
    creds_file = config / "frenzy" / "credentials.json"
    state = {"env": _env(config), "config": config, "creds_file": creds_file, "api_port": api_port, "tmp": tmp,
             "cluster": cluster, "proc": proc}
    try:
        while time.monotonic() < deadline and "Ctrl-C" not in out and proc.poll() is None:
            out += proc.stdout.readline()
        assert "Ctrl-C" in out, out
        state["out"] = out
        state["creds"] = json.loads(creds_file.read_text())
        yield state
    finally:
        interrupt_group(proc)


def test_up_prints_the_dashboard_and_no_password(up: dict) -> None:
    assert f"http://127.0.0.1:{up['api_port']}/" in up["out"]
    password = up["creds"]["redis"].split("@")[0].rsplit(":", 1)[1]
    assert password and password not in up["out"], "the Redis password was printed"
    assert up["creds"]["api"] == f"http://127.0.0.1:{up['api_port']}"
    assert up["creds"]["batch_redis"] != up["creds"]["redis"]  # the worker's own user, not the admin's


def test_dashboard_says_where_and_how_to_log_in(up: dict) -> None:
    shown = frenzy(up["env"], "dashboard")
    assert shown.returncode == 0, shown.stderr
    assert f"http://127.0.0.1:{up['api_port']}/" in shown.stdout
    assert up["creds"]["token"] not in shown.stdout  # only --token prints the secret
    url = frenzy(up["env"], "dashboard", "--url").stdout.strip()
    token = frenzy(up["env"], "dashboard", "--token").stdout.strip()
    assert token == up["creds"]["token"]
    reply = httpx.get(f"{url}/api/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert reply.status_code == 200 and "jobs" in reply.json()
    assert httpx.get(f"{url}/api/jobs", timeout=30).status_code == 401


def test_operator_and_batch_commands_find_the_stack_in_the_credentials_file(up: dict, tmp_path: Path) -> None:
    made = frenzy(up["env"], "token", "create", "--user", "carol", "--role", "read", "--ttl", "1d")
    assert made.returncode == 0, made.stderr
    listed = frenzy(up["env"], "token", "list", "--json")
    assert listed.returncode == 0 and "carol" in listed.stdout, listed.stderr
    held = frenzy(up["env"], "queue", "status")
    assert held.returncode == 0, held.stderr
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: first-hour, model: gpt2-124m, seq_len: 256, global_batch: 4,"
                    f" command: ['{sys.executable}', '-c', 'print(1)']}}\n")
    sent = frenzy(up["env"], "batch", "submit", str(jobs), "--json")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "job-" in sent.stdout


def test_without_credentials_operator_and_batch_commands_refuse_rather_than_guess(tmp_path: Path) -> None:
    env = _env(tmp_path / "empty-config")
    for args in (("token", "list"), ("queue", "status"), ("batch", "list")):
        res = frenzy(env, *args)
        assert res.returncode == 1, (args, res.stdout, res.stderr)
        assert "To fix" in res.stderr and "REDIS_URL" in res.stderr, (args, res.stderr)
        assert "6379" not in res.stderr


def test_a_second_up_is_refused_while_the_first_answers(up: dict) -> None:
    second = frenzy(up["env"], "up", "--cluster", str(up["cluster"]), "--run-dir", str(up["tmp"] / "run2"),
                    timeout=60)
    assert second.returncode == 1
    assert "another stack is running" in second.stderr and "FRENZY_CREDENTIALS" in second.stderr
    assert json.loads(up["creds_file"].read_text())["token"] == up["creds"]["token"]  # left alone


def test_a_stale_redis_url_gets_a_hint_not_error_111(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        env = _env(tmp_path / "config", REDIS_URL=f"redis://frenzy:s3cret@127.0.0.1:{port}/0")
        res = frenzy(env, "up", "--run-dir", str(tmp_path / "run"), timeout=60)
    assert res.returncode == 1
    assert "unset REDIS_URL" in res.stderr and "s3cret" not in res.stderr, res.stderr


def test_an_api_port_in_use_is_refused_by_name(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = frenzy(_env(tmp_path / "config"), "up", "--api-port", str(port), "--run-dir", str(tmp_path / "run"),
                     timeout=60)
    assert res.returncode == 2
    assert f"--api-port {port}" in res.stderr


def test_stopping_up_removes_its_credentials_file(up: dict) -> None:
    # Last in this module: it stops the stack.
    proc = up["proc"]
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert not up["creds_file"].exists(), "a stopped stack's credentials were left to point at nothing"
