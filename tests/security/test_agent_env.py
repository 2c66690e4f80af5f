"""issue 14 item 4: a job's environment holds no Redis address and no credential of the agent.

Before: every job inherited the agent's whole environment, ``REDIS_URL`` (with the
Redis password) included, so any job could forge launches and events on every node.
These tests start a real agent process with credentials in its environment and run a
real job that prints its own environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import typer
from integration.agent.agent_cluster import Cluster
from typer.testing import CliRunner

from frenzy.agent import cli
from frenzy.state.keys import Keys
from frenzy.state.messages import EventKind
from support.waiting import wait_for

NODE = "sec-env"
PRINT_ENV = [sys.executable, "-c", "import json, os; print('ENV=' + json.dumps(dict(os.environ)), flush=True)"]


@pytest.fixture
def agent_process(redis_url: str, redis_client: redis.Redis, keys: Keys, tmp_path: Path) -> Iterator[Cluster]:
    """A real ``frenzy agent`` process whose environment carries the Redis URL and Frenzy credentials."""
    env = {**os.environ, "REDIS_URL": redis_url, "FRENZY_PREFIX": keys.prefix, "FRENZY_TOKEN": "tok-agent-0123",
           "FRENZY_CREDENTIALS": str(tmp_path / "creds"), "S3_SECRET_ACCESS_KEY": "s3-secret",
           "DB_PASSWORD": "db-pw", "NCCL_DEBUG": "INFO", "NCCL_AUTH_TOKEN": "nccl-tok", "SITE_ONLY": "agent-only"}
    cluster = Cluster(redis_url, redis_client, keys, tmp_path)
    cluster.node_key(NODE)  # the operator's `frenzy node key create`: an agent does not start without one
    proc = subprocess.Popen(
        [sys.executable, "-m", "frenzy.agent", "--node", NODE, "--fake-gpus", "L4:1", "--log-dir",
         str(cluster.log_dir), "--heartbeat-s", "0.2", "--ttl-s", "2", "--pass-env", "NCCL_*",
         "--log-level", "WARNING"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: redis_client.exists(keys.node_alive(NODE)) or proc.poll() is not None, 30,
                 "agent registered")
        assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
        yield cluster
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _launch(cluster: Cluster, job_id: str, command: list[str], **fields) -> None:
    cluster.launch(job_id, command, indices=[0], at=NODE, gpu_uuids=[""], **fields)


def _job_env(cluster: Cluster, job_id: str) -> dict[str, str]:
    exited = cluster.wait_event(job_id, EventKind.EXITED, timeout=30)
    assert exited.exit_code == 0 and exited.log_path
    line = next(ln for ln in Path(exited.log_path).read_text().splitlines() if ln.startswith("ENV="))
    return json.loads(line[len("ENV="):])


def test_a_job_sees_no_redis_address_and_no_credential(agent_process: Cluster, redis_url: str) -> None:
    """Item 4: the job's environment is an allowlist: PATH, HOME, the locale, --pass-env, the job's own env and
    Frenzy's variables; never REDIS_URL, FRENZY_TOKEN, FRENZY_CREDENTIALS or a *SECRET*/*PASSWORD*/*TOKEN*."""
    _launch(agent_process, "job-envsec01", PRINT_ENV, env={"WANDB_PROJECT": "p"})
    env = _job_env(agent_process, "job-envsec01")
    for name in ("REDIS_URL", "FRENZY_TOKEN", "FRENZY_CREDENTIALS", "FRENZY_PREFIX", "S3_SECRET_ACCESS_KEY",
                 "DB_PASSWORD", "NCCL_AUTH_TOKEN", "SITE_ONLY"):
        assert name not in env, name
    password = urlsplit(redis_url).password
    text = json.dumps(env)
    assert "redis://" not in text and (not password or password not in text)
    assert "tok-agent-0123" not in text and "s3-secret" not in text and "db-pw" not in text
    # What a job needs is still there.
    assert env["PATH"] == os.environ["PATH"] and env["NCCL_DEBUG"] == "INFO" and env["WANDB_PROJECT"] == "p"
    assert env["FRENZY_JOB_ID"] == "job-envsec01" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["PET_NNODES"] == "1" and env["MASTER_ADDR"] == "127.0.0.1"


def test_a_job_env_that_sets_a_reserved_variable_is_refused(agent_process: Cluster) -> None:
    """Item 4 (reserved variables): a job that sets what Frenzy sets for it (its GPUs, its rendezvous, FRENZY_*)
    is refused by the launch check, with a message naming the variable; it never runs."""
    for job_id, name in (("job-envsec02", "CUDA_VISIBLE_DEVICES"), ("job-envsec03", "FRENZY_NODE"),
                         ("job-envsec04", "MASTER_PORT"), ("job-envsec05", "PET_NNODES")):
        _launch(agent_process, job_id, PRINT_ENV, env={name: "0,1,2,3"})
        failed = agent_process.wait_event(job_id, EventKind.LAUNCH_FAILED, timeout=30)
        assert f"the job's env sets {name}, which Frenzy sets for every job itself" in failed.message
        assert not failed.retryable
        assert [e.kind for e in agent_process.events(job_id)] == [EventKind.LAUNCH_FAILED]


@pytest.mark.parametrize("name", ["REDIS_URL", "FRENZY_TOKEN", "FRENZY_CREDENTIALS", "DB_PASSWORD",
                                  "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "FRENZY_*", "REDIS_*", "*"])
def test_pass_env_naming_a_credential_stops_the_agent_at_start(name: str) -> None:
    """Item 4: ``--pass-env`` cannot hand a credential to jobs; the agent refuses to start and says why."""
    app = typer.Typer()
    app.command()(cli.agent_command)
    result = CliRunner().invoke(app, ["--node", "n1", "--fake-gpus", "L4:1", "--pass-env", name,
                                      "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 2
    assert f"--pass-env {name!r}" in result.output or f"--pass-env {name}" in result.output
