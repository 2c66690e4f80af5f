"""issue 14 item 6: a launch cannot make the agent write outside its log root or run a job anywhere.

Before: a ``job_id`` of ``../../../../x`` made the agent write logs outside its log root;
a job's ``env.FRENZY_LOG_DIR`` picked where the agent writes; ``workdir: /etc`` was
accepted. These tests run the real Agent on the test Redis and send it launches as
the scheduler (or an attacker with stream access) would."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from integration.agent import conftest as agent_fixtures
from integration.agent.agent_cluster import Cluster, wait_for
from typer.testing import CliRunner

from frenzy.agent import cli
from frenzy.state.messages import EventKind, encode

cluster = agent_fixtures.cluster  # the agent integration tests' fixture: agents on the test Redis

PWD = [sys.executable, "-c", "import os; print('cwd', os.getcwd(), flush=True)"]


def test_a_job_id_that_climbs_out_of_the_log_root_writes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    """Item 6: ``job_id`` "../../../../x" (and any id that is not one safe path component) is refused when the
    launch is read; no file appears outside the log root and nothing runs."""
    cluster.log_dir = tmp_path / "a" / "b" / "c" / "logs"
    cluster.start()
    template = cluster.launch("job-template", PWD, reserve=False)  # a real launch, then forged copies of it
    cluster.wait_event("job-template", EventKind.LAUNCH_FAILED)  # no reservation: stale
    for bad in ("../../../../x", "..", "a/b", "/abs", ".hidden", "x" * 129, "job\n1"):
        fields = encode(template)
        fields["data"] = fields["data"].replace('"job_id":"job-template"', f'"job_id":{_json(bad)}')
        cluster.send(fields)
    wait_for(lambda: cluster.pending() == 0, what="forged launches read and acknowledged")
    cluster.launch("job-after", PWD, fence=2)  # the agent carries on
    assert cluster.wait_event("job-after", EventKind.EXITED).exit_code == 0
    assert not (tmp_path / "x").exists() and not (tmp_path / "a" / "x").exists()
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and cluster.log_dir not in p.parents]
    assert outside == []
    assert {e.job_id for e in cluster.events()} == {"job-template", "job-after"}


def test_a_job_cannot_choose_where_the_agent_writes_its_log(cluster: Cluster, tmp_path: Path) -> None:
    """Item 6: ``env.FRENZY_LOG_DIR`` no longer moves the agent's writes; FRENZY_* is reserved, so the launch is
    refused naming the variable, and nothing is written where it pointed."""
    cluster.start()
    cluster.launch("job-logdir", PWD, env={"FRENZY_LOG_DIR": str(tmp_path / "chosen")})
    failed = cluster.wait_event("job-logdir", EventKind.LAUNCH_FAILED)
    assert "FRENZY_LOG_DIR" in failed.message
    assert not (tmp_path / "chosen").exists()


@pytest.mark.parametrize("workdir", ["/etc", "/", "/root/..", "{tmp}/link-to-etc"])
def test_a_workdir_outside_the_allowed_roots_is_refused(cluster: Cluster, tmp_path: Path, workdir: str) -> None:
    """Item 6: ``workdir: /etc`` (or a symlink or ``..`` that resolves outside) is refused by the launch check,
    with a message naming --workdir-root; the job never runs."""
    (tmp_path / "link-to-etc").symlink_to("/etc")
    cluster.start()
    cluster.launch("job-wd", PWD, workdir=workdir.format(tmp=tmp_path))
    failed = cluster.wait_event("job-wd", EventKind.LAUNCH_FAILED)
    assert "is outside the directories jobs may run in" in failed.message and "--workdir-root" in failed.message
    assert [e.kind for e in cluster.events("job-wd")] == [EventKind.LAUNCH_FAILED]


def test_workdir_roots_are_the_operators_choice(cluster: Cluster, tmp_path: Path) -> None:
    """Item 6: with ``--workdir-root`` only those directories (and below) are allowed, the defaults no longer."""
    allowed = tmp_path / "jobs"
    (allowed / "run1").mkdir(parents=True)
    cluster.start(workdir_roots=[allowed])
    cluster.launch("job-in", PWD, workdir=str(allowed / "run1"))
    exited = cluster.wait_event("job-in", EventKind.EXITED)
    assert exited.exit_code == 0 and f"cwd {allowed / 'run1'}\n" in Path(exited.log_path or "").read_text()
    cluster.launch("job-out", PWD, workdir=str(tmp_path), fence=2)
    assert "--workdir-root" in cluster.wait_event("job-out", EventKind.LAUNCH_FAILED).message


def test_an_unsafe_node_name_stops_the_agent_at_start() -> None:
    """Item 6: the node name is part of every log path: one that is not a safe path component is refused."""
    app = typer.Typer()
    app.command()(cli.agent_command)
    result = CliRunner().invoke(app, ["--node", "../up", "--fake-gpus", "L4:1", "--redis-url",
                                      "redis://127.0.0.1:1/0"])
    assert result.exit_code == 2 and "node name '../up'" in result.output and "--node" in result.output


def _json(text: str) -> str:
    return json.dumps(text)
