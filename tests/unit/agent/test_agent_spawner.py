"""The spawner (frenzy.agent.spawner): shims forked from one small process instead of an
interpreter per job. Real processes throughout: the spawner, its shims, their commands."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from unit.agent.test_agent_launcher import make_launch

from frenzy.agent import launcher, spawning
from frenzy.agent.spawning import Spawner

pytestmark = pytest.mark.skipif(not spawning.supported(), reason="the spawner needs Linux pidfds and SCM_RIGHTS")

DETACHED = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " start_new_session=True); print('spawned', flush=True); time.sleep({sleep})")


@pytest.fixture
def spawner() -> Iterator[Spawner]:
    s = Spawner()
    yield s
    s.close()


def _until(pred, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_spawned_job_runs_in_its_own_session_with_its_status_recorded(tmp_path: Path, spawner: Spawner) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import os, sys; print('ids', os.getpgid(0), os.getsid(0)); sys.exit(5)"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-7/2", spawner=spawner)
    assert isinstance(started.proc, spawning.SpawnedShim)
    assert started.proc.pid != spawner.pid
    assert started.proc.wait(timeout=10) == 5
    pid = started.proc.pid
    assert f"ids {pid} {pid}\n" in started.log_path.read_text()  # the shim leads the job's session and group
    assert launcher.read_exit_status(started.log_path) == 5
    assert started.proc.clean  # nothing of the job outlived it


def test_stragglers_in_other_sessions_are_ended_by_the_shim_itself(tmp_path: Path, spawner: Spawner) -> None:
    launch_id = f"t/{os.getpid()}/job-s/1"
    msg = make_launch(command=[sys.executable, "-c", DETACHED.format(sleep=0.2)])
    started = launcher.start(msg, "n1", tmp_path, launch_id=launch_id, spawner=spawner)
    assert started.proc.wait(timeout=20) == 0
    # No /proc search by anyone: the shim, a child subreaper, got the detached child and killed it.
    assert started.proc.clean
    assert "spawned" in started.log_path.read_text()
    assert launcher.find_processes(launch_id) == []


def test_the_pid_file_finds_a_running_shim_and_nothing_after_it(tmp_path: Path, spawner: Spawner) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import time; time.sleep(30)"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-7/2", spawner=spawner)
    try:
        assert launcher.spawned_pid(started.log_path) == started.proc.pid
    finally:
        os.killpg(started.proc.pid, signal.SIGTERM)
    assert started.proc.wait(timeout=10) == -signal.SIGTERM
    assert launcher.spawned_pid(started.log_path) is None  # gone: nothing to adopt


def test_a_shim_killed_outright_still_gets_a_status_from_the_spawner(tmp_path: Path, spawner: Spawner) -> None:
    msg = make_launch(command=[sys.executable, "-c", "print('up', flush=True); import time; time.sleep(30)"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-k/1", spawner=spawner)
    _until(lambda: "up" in started.log_path.read_text(), "the command's first output")
    os.killpg(started.proc.pid, signal.SIGKILL)  # shim and command, no chance to write anything
    assert started.proc.wait(timeout=10) == -signal.SIGKILL
    assert not started.proc.clean


def test_a_dead_spawner_is_replaced_and_its_running_job_still_records_its_end(tmp_path: Path, spawner: Spawner) -> None:
    first = launcher.start(make_launch(job_id="job-a", command=[sys.executable, "-c", "import time; time.sleep(1)"]),
                           "n1", tmp_path, launch_id="p/n1/job-a/2", spawner=spawner)
    old = spawner.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    # (dead, not merely signalled: a spawner that dies *while* starting a job makes that launch
    # fail as retryable instead, since it cannot be known whether it forked)
    _until(lambda: not launcher.process_running(old, None), "the spawner's death")
    second = launcher.start(make_launch(job_id="job-b", command=[sys.executable, "-c", "print('second')"]),
                            "n1", tmp_path, launch_id="p/n1/job-b/2", spawner=spawner)
    assert spawner.pid not in (None, old)
    assert second.proc.wait(timeout=10) == 0
    assert first.proc.wait(timeout=10) == 0  # the shim outlived its spawner and wrote its status


def test_where_the_spawner_cannot_run_the_shim_is_execd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawning, "SPAWNER", tmp_path / "missing-spawner.py")
    broken = Spawner()
    try:
        started = launcher.start(make_launch(command=[sys.executable, "-c", "print('ran')"]), "n1", tmp_path,
                                 launch_id="p/n1/job-7/2", spawner=broken)
    finally:
        broken.close()
    assert not isinstance(started.proc, spawning.SpawnedShim)  # a Popen of the exec'd shim
    assert started.proc.wait(timeout=10) == 0
    assert "ran\n" in started.log_path.read_text()


def test_the_command_gets_default_signal_dispositions_and_only_its_environment(tmp_path: Path,
                                                                            spawner: Spawner) -> None:
    # SIGPIPE (13) and SIGXFSZ (25), which Python ignores for itself, are back at the default for
    # the command, as subprocess would have them; the spawner's own environment does not leak in.
    msg = make_launch(command=["sh", "-c", "grep SigIgn /proc/self/status; env"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-7/2", spawner=spawner)
    assert started.proc.wait(timeout=10) == 0
    text = started.log_path.read_text()
    ignored = int(text.split("SigIgn:")[1].split()[0], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
    assert "FRENZY_LAUNCH_ID=p/n1/job-7/2" in text and "FRENZY_SHIM" not in text


def test_a_cancel_the_instant_the_job_is_spawned_ends_it_by_that_signal_before_its_work(
        tmp_path: Path, spawner: Spawner) -> None:
    # The spawner's shim is ready about a millisecond after start() returns, so the cancel may
    # reach the shim before the command starts (it never runs) or the command itself (it dies of
    # the signal). Both must read "killed by <sig>" and neither may let the command's work happen:
    # the command sleeps before its work, and sh takes the three signals' default actions.
    # (The exec'd shim's interpreter start-up window, where the command must never start, is
    # test_agent_launcher's test_a_cancel_the_instant_the_job_starts_....)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        marker = tmp_path / f"ran-{sig.name}"
        msg = make_launch(command=["/bin/sh", "-c", f"sleep 3; : > {str(marker)!r}"])
        started = launcher.start(msg, "n1", tmp_path / sig.name, launch_id=f"p/n1/job-c/{sig.value}", spawner=spawner)
        os.killpg(started.proc.pid, sig)  # the group exists as soon as start returns
        assert started.proc.wait(timeout=10) == -sig
        assert not marker.exists()


def test_the_spawner_reports_the_shims_start_time_as_proc_has_it(tmp_path: Path, spawner: Spawner) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import time; time.sleep(30)"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-7/2", spawner=spawner)
    try:
        assert started.proc.start_ticks is not None
        assert started.proc.start_ticks == launcher.process_start_ticks(started.proc.pid)
    finally:
        os.killpg(started.proc.pid, signal.SIGKILL)
    started.proc.wait(timeout=10)


def test_the_command_is_found_on_the_jobs_path_not_the_spawners(tmp_path: Path, spawner: Spawner) -> None:
    # A program only the job's PATH has (a venv's bin, say): the spawner itself runs with a bare
    # PATH, so looking it up there would fail the job with "command not found".
    bin_dir = tmp_path / "job-bin"
    bin_dir.mkdir()
    tool = bin_dir / "frenzy-test-tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    msg = make_launch(command=["frenzy-test-tool"], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    started = launcher.start(msg, "n1", tmp_path / "logs", launch_id="p/n1/job-7/2", spawner=spawner)
    assert started.proc.wait(timeout=10) == 0
    assert "tool ran\n" in started.log_path.read_text()
