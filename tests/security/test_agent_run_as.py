"""issue 14 ("Jobs run clean"): ``frenzy agent --run-as USER`` runs jobs as that user.

Before: every job ran as the agent's user (root on a GPU host started by systemd) and
there was no option to change it. The job here runs as the stock ``nobody`` account
(no user is created); the exit status is still recorded by the shim, which stays the
agent's."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from integration.agent import conftest as agent_fixtures
from integration.agent.agent_cluster import Cluster

from frenzy.agent.run_as import resolve
from frenzy.state.messages import EventKind

cluster = agent_fixtures.cluster  # the agent integration tests' fixture: agents on the test Redis

try:
    NOBODY = pwd.getpwnam("nobody")
except KeyError:  # pragma: no cover - every Linux has it
    NOBODY = None

needs_root = pytest.mark.skipif(os.geteuid() != 0 or NOBODY is None, reason="switching users needs root and 'nobody'")
WHO = ["/bin/sh", "-c", 'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) home=$HOME user=$USER"']


@needs_root
def test_jobs_run_as_the_run_as_user_with_its_groups_and_home(cluster: Cluster) -> None:
    """Run-as: uid, gid, supplementary groups (setgroups before setgid/setuid) and HOME/USER of the user."""
    assert NOBODY is not None
    cluster.start(run_as="nobody")
    cluster.launch("job-runas1", WHO)
    exited = cluster.wait_event("job-runas1", EventKind.EXITED)
    assert exited.exit_code == 0  # recorded by the shim, which stayed root
    groups = " ".join(str(g) for g in sorted(set(os.getgrouplist("nobody", NOBODY.pw_gid))))
    text = Path(exited.log_path or "").read_text()
    assert (f"uid={NOBODY.pw_uid} gid={NOBODY.pw_gid} groups={groups} home={NOBODY.pw_dir} user=nobody\n"
            in text), text
    assert " user=nobody\n" in text.splitlines(keepends=True)[1]  # the log header says who it ran as


@needs_root
def test_a_run_as_job_cannot_signal_the_shim_or_write_the_log_directory(cluster: Cluster) -> None:
    """Run-as: the job is an ordinary user: the root-owned shim (its parent) and the log directory are out of
    its reach, so it cannot fake its exit status or plant files for the agent."""
    code = ('import os; p = os.getppid()\n'
            'try:\n    os.kill(p, 9); print("killed shim")\nexcept PermissionError: print("shim safe")\n'
            'try:\n    open(os.environ["LOGF"] + ".planted", "w"); print("planted")\n'
            'except PermissionError: print("log dir safe")\n')
    cluster.start(run_as="nobody")
    log_file = cluster.log_dir.resolve() / "job-runas2" / "attempt-1" / "n1.log"
    cluster.launch("job-runas2", ["/usr/bin/python3", "-c", code], env={"LOGF": str(log_file)})
    exited = cluster.wait_event("job-runas2", EventKind.EXITED)
    text = Path(exited.log_path or "").read_text()
    assert exited.exit_code == 0, text
    assert "shim safe\n" in text and "log dir safe\n" in text


def test_run_as_another_user_without_root_is_refused_at_start() -> None:
    """Run-as: an agent that is not root cannot switch users; it refuses to start, saying so (checked in a child
    that drops to 'nobody' first); naming its own user is fine; an unknown user is refused."""
    with pytest.raises(ValueError, match="no such user"):
        resolve("frenzy-no-such-user-here")
    if os.geteuid() != 0 or NOBODY is None:
        with pytest.raises(ValueError, match="not root"):
            resolve("root")
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, then ask
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            try:
                resolve("root")
                answer = "accepted"
            except ValueError as exc:
                answer = str(exc)
            same = resolve("nobody").switches()
            os.write(write, f"{answer}|{same}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        answer, same = fh.read().split("|")
    os.waitpid(pid, 0)
    assert "the agent runs as uid" in answer and "not root" in answer and "--run-as root" in answer
    assert same == "False"
