"""Launch building blocks: environment, placeholder substitution, log file, start failures, ledger."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frenzy.agent import launcher
from frenzy.agent.ledger import Ledger, LedgerEntry
from frenzy.agent.run_as import JobUser
from frenzy.state.messages import LaunchMessage, LayoutEnv


def make_launch(**overrides) -> LaunchMessage:
    fields = dict(
        job_id="job-7", attempt=2, fence=41, node="n1", node_rank=1, nnodes=2, nproc_per_node=2,
        gpu_indices=[2, 3], gpu_uuids=["GPU-c", "GPU-d"], master_addr="10.0.0.1", master_port=29500,
        rdzv_id="job-7-2", command=["echo", "hi"],
        layout=LayoutEnv(gpu_type="A100-80GB", tp=2, pp=1, dp=2, zero_stage=1, micro_batch=4,
                         grad_accum=8, recompute="selective"),
    )
    fields.update(overrides)
    return LaunchMessage(**fields)


def test_env_has_every_frenzy_and_torchrun_variable() -> None:
    env = launcher.build_env(make_launch(), "n1", base={"PATH": "/bin", "HOME": "/root"})
    assert env == {
        "PATH": "/bin", "HOME": "/root", "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
        "NNODES": "2", "NODE_RANK": "1", "NPROC_PER_NODE": "2",
        "FRENZY_JOB_ID": "job-7", "FRENZY_ATTEMPT": "2", "FRENZY_NODE": "n1",
        "FRENZY_NNODES": "2", "FRENZY_NODE_RANK": "1", "FRENZY_NPROC_PER_NODE": "2",
        "FRENZY_RDZV_ID": "job-7-2", "FRENZY_GPU_TYPE": "A100-80GB", "FRENZY_GPU_UUIDS": "GPU-c,GPU-d",
        "FRENZY_TP": "2", "FRENZY_PP": "1", "FRENZY_DP": "2", "FRENZY_ZERO_STAGE": "1",
        "FRENZY_MICRO_BATCH": "4", "FRENZY_GRAD_ACCUM": "8", "FRENZY_RECOMPUTE": "selective",
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "10.0.0.1",
        "PET_MASTER_PORT": "29500", "PET_RDZV_ID": "job-7-2",
    }


def test_env_takes_only_the_allowlist_of_the_agent_environment_by_default(monkeypatch) -> None:
    monkeypatch.setenv("SITE_MARKER", "yes")
    monkeypatch.setenv("LC_TIME", "C")
    env = launcher.build_env(make_launch(), "n1")
    assert "SITE_MARKER" not in env and env["LC_TIME"] == "C" and env["PATH"] == os.environ["PATH"]
    assert launcher.build_env(make_launch(), "n1", pass_env=["SITE_*"])["SITE_MARKER"] == "yes"


def test_credentials_never_pass_even_when_a_pattern_matches_them() -> None:
    agent = {"PATH": "/bin", "REDIS_URL": "redis://:pw@h/0", "FRENZY_TOKEN": "t", "FRENZY_CREDENTIALS": "/c",
             "NCCL_SECRET": "s", "NCCL_DEBUG": "INFO", "HF_TOKEN": "h", "DB_PASSWORD": "p", "FRENZY_PREFIX": "x"}
    env = launcher.build_env(make_launch(), "n1", base=agent, pass_env=["NCCL_*", "HF_*", "DB_*"])
    assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/bin"
    for name in ("REDIS_URL", "FRENZY_TOKEN", "FRENZY_CREDENTIALS", "NCCL_SECRET", "HF_TOKEN", "DB_PASSWORD",
                 "FRENZY_PREFIX"):
        assert name not in env


def test_a_run_as_user_gets_its_own_login_variables() -> None:
    user = JobUser("train", 1234, 1234, (1234, 44), "/home/train", "/bin/bash")
    env = launcher.build_env(make_launch(), "n1", base={"HOME": "/root", "USER": "root", "PATH": "/bin"}, user=user)
    assert (env["HOME"], env["USER"], env["LOGNAME"], env["SHELL"]) == ("/home/train", "train", "train", "/bin/bash")


def test_message_env_is_added_but_cannot_override_the_reserved_gpus() -> None:
    msg = make_launch(env={"WANDB_PROJECT": "p", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONUNBUFFERED": "0"})
    env = launcher.build_env(msg, "n1", base={})
    assert env["WANDB_PROJECT"] == "p"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["PYTHONUNBUFFERED"] == "0"  # the job may opt out of unbuffered output


def test_every_placeholder_is_substituted() -> None:
    names = ["tp", "pp", "dp", "zero_stage", "micro_batch", "grad_accum", "nnodes", "node_rank",
             "nproc_per_node", "master_addr", "master_port", "rdzv_id", "job_id"]
    msg = make_launch(command=["run"] + [f"--{n}={{{n}}}" for n in names])
    assert launcher.build_argv(msg) == [
        "run", "--tp=2", "--pp=1", "--dp=2", "--zero_stage=1", "--micro_batch=4", "--grad_accum=8",
        "--nnodes=2", "--node_rank=1", "--nproc_per_node=2", "--master_addr=10.0.0.1",
        "--master_port=29500", "--rdzv_id=job-7-2", "--job_id=job-7",
    ]


def test_unknown_braces_are_left_alone() -> None:
    msg = make_launch(command=["run", "--rdzv-endpoint={master_addr}:{master_port}", "{unknown}",
                               '{"tp": {tp}}', "{ tp }", "{{tp}}", "${HOME}/x"])
    assert launcher.build_argv(msg) == [
        "run", "--rdzv-endpoint=10.0.0.1:29500", "{unknown}", '{"tp": 2}', "{ tp }", "{2}", "${HOME}/x",
    ]


def test_env_values_workdir_and_agent_env_take_placeholders_and_the_agent_env_yields(tmp_path: Path) -> None:
    msg = make_launch(env={"RUN_NAME": "{job_id}-a{attempt}", "NCCL_DEBUG": "WARN"},
                      workdir=str(tmp_path / "{job_id}"))
    env = launcher.build_env(msg, "n1", base={}, extra={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0"},
                             launch_id="p/n1/job-7/2")
    assert env["RUN_NAME"] == "job-7-a2"
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_SOCKET_IFNAME"] == "ib0"  # the job's own env wins
    assert env["FRENZY_LAUNCH_ID"] == "p/n1/job-7/2"
    assert launcher.workdir_for(msg) == str(tmp_path / "job-7")


# ---------------------------------------------------------------- torchrun

def test_torchrun_gets_the_static_rendezvous_of_the_launch() -> None:
    msg = make_launch(command=["torchrun", "train.py", "--micro-batch", "{micro_batch}", "--nnodes", "9"])
    assert launcher.build_argv(msg) == [
        "torchrun", "--nnodes=2", "--nproc-per-node=2", "--node-rank=1", "--master-addr=10.0.0.1",
        "--master-port=29500", "--rdzv-id=job-7-2", "train.py", "--micro-batch", "4", "--nnodes", "9",
    ]  # the script's own --nnodes is the script's business


@pytest.mark.parametrize("launcher_argv", [["/opt/venv/bin/torchrun"], ["python3", "-m", "torch.distributed.run"],
                                          [sys.executable, "-m", "torch.distributed.run"]])
def test_torchrun_is_recognised_by_path_and_as_a_module(launcher_argv: list[str]) -> None:
    argv = launcher.build_argv(make_launch(command=[*launcher_argv, "t.py"]))
    assert argv[:len(launcher_argv)] == launcher_argv and argv[-1] == "t.py"
    assert "--node-rank=1" in argv and "--master-port=29500" in argv


def test_options_the_user_gave_win_in_either_spelling() -> None:
    msg = make_launch(command=["torchrun", "--nproc_per_node", "1", "--master-port={master_port}",
                               "--max-restarts=3", "-m", "pkg.train", "--lr", "1"])
    assert launcher.build_argv(msg) == [
        "torchrun", "--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--rdzv-id=job-7-2",
        "--nproc_per_node", "1", "--master-port=29500", "--max-restarts=3", "-m", "pkg.train", "--lr", "1",
    ]


def test_a_c10d_rendezvous_gets_the_endpoint_instead_of_master_addr() -> None:
    argv = launcher.build_argv(make_launch(command=["torchrun", "--rdzv-backend", "c10d", "t.py"]))
    assert "--rdzv-endpoint=10.0.0.1:29500" in argv and "--rdzv-id=job-7-2" in argv
    assert not any(a.startswith("--master-") for a in argv)
    given = launcher.build_argv(make_launch(command=["torchrun", "--rdzv_endpoint=h:1", "t.py"]))
    assert not any(a.startswith(("--master-", "--rdzv-endpoint")) for a in given)


def test_standalone_and_other_commands_are_left_as_written() -> None:
    assert launcher.build_argv(make_launch(command=["torchrun", "--standalone", "t.py"])) == [
        "torchrun", "--standalone", "t.py"]
    assert launcher.build_argv(make_launch(command=["python", "torchrun.py"])) == ["python", "torchrun.py"]
    assert launcher.build_argv(make_launch(command=["bash", "-c", "torchrun t.py"])) == [
        "bash", "-c", "torchrun t.py"]


def test_every_attempt_on_every_node_gets_the_same_checkpoint_dir_and_none_without_a_root() -> None:
    dirs = {launcher.build_env(make_launch(attempt=a, node=n, node_rank=r), n, base={},
                               checkpoint_root="/shared/ckpt")["FRENZY_CHECKPOINT_DIR"]
            for a in (1, 2, 5) for n, r in (("n1", 0), ("n2", 1))}
    assert dirs == {"/shared/ckpt/job-7"}
    assert "FRENZY_CHECKPOINT_DIR" not in launcher.build_env(make_launch(), "n1", base={})
    # Not from the agent's environment, nor from the agent's --env: only the root decides.
    assert "FRENZY_CHECKPOINT_DIR" not in launcher.build_env(
        make_launch(), "n1", base={"FRENZY_CHECKPOINT_DIR": "/elsewhere"}, pass_env=["FRENZY_CHECKPOINT_DIR"])
    other = launcher.build_env(make_launch(job_id="job-8"), "n1", base={}, checkpoint_root="/shared/ckpt")
    assert other["FRENZY_CHECKPOINT_DIR"] == "/shared/ckpt/job-8"


def test_start_makes_the_checkpoint_dir_and_keeps_what_an_earlier_attempt_saved(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    script = ("import os; d = os.environ['FRENZY_CHECKPOINT_DIR']; print('saw', sorted(os.listdir(d))); "
              "open(os.path.join(d, 'step-' + os.environ['FRENZY_ATTEMPT']), 'w').close()")
    for attempt in (1, 2):
        msg = make_launch(attempt=attempt, command=[sys.executable, "-c", script])
        started = launcher.start(msg, "n1", tmp_path / "logs", checkpoint_root=str(root))
        assert started.proc.wait(timeout=10) == 0
    assert "saw ['step-1']" in started.log_path.read_text()  # attempt 2 found attempt 1's file
    assert sorted(os.listdir(root / "job-7")) == ["step-1", "step-2"]


def test_a_symlink_or_file_planted_as_a_jobs_checkpoint_dir_refuses_the_launch(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "job-7").symlink_to(tmp_path / "elsewhere")
    (root / "job-8").write_text("not a directory")
    for job_id in ("job-7", "job-8"):
        with pytest.raises(launcher.LaunchError, match="not a directory directly under"):
            launcher.start(make_launch(job_id=job_id), "n1", tmp_path / "logs", checkpoint_root=str(root))
    sneaky = LaunchMessage.model_construct(**{**make_launch().__dict__, "job_id": "../../x"})
    with pytest.raises(launcher.LaunchError):
        launcher.start(sneaky, "n1", tmp_path / "logs", checkpoint_root=str(root))
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_the_checkpoint_dir_belongs_to_the_run_as_user_and_is_kept(tmp_path: Path) -> None:
    user = JobUser("nobody", 65534, 65534, (65534,), "/nonexistent", "/usr/sbin/nologin")
    path = str(tmp_path / "ckpt" / "job-7")
    launcher.prepare_checkpoint_dir(str(tmp_path / "ckpt"), path, user)
    (Path(path) / "step-00000003").mkdir()
    launcher.prepare_checkpoint_dir(str(tmp_path / "ckpt"), path, user)  # the next attempt's launch
    info = os.stat(path)
    assert (info.st_uid, info.st_gid) == (65534, 65534) and os.listdir(path) == ["step-00000003"]
    assert os.stat(tmp_path / "ckpt").st_uid == 0  # the root stays the agent's


def test_log_path_layout(tmp_path: Path) -> None:
    assert launcher.log_path_for(tmp_path, make_launch(), "n1") == tmp_path / "job-7" / "attempt-2" / "n1.log"


def test_a_job_does_not_choose_its_log_dir_and_the_log_path_never_leaves_it(tmp_path: Path) -> None:
    chooser = make_launch(env={"FRENZY_LOG_DIR": str(tmp_path / "mine")})
    assert launcher.log_path_for(tmp_path, chooser, "n1") == tmp_path / "job-7" / "attempt-2" / "n1.log"
    # A message cannot carry such an id (messages.SafeName); model_construct skips that check.
    sneaky = LaunchMessage.model_construct(**{**make_launch().__dict__, "job_id": "../../x"})
    with pytest.raises(launcher.LaunchError, match="would leave the agent's log directory"):
        launcher.log_path_for(tmp_path / "logs", sneaky, "n1")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job-l").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(launcher.LaunchError):
        launcher.log_path_for(tmp_path / "logs", make_launch(job_id="job-l"), "n1")


def test_start_writes_a_header_then_the_output(tmp_path: Path) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import os; print('tp', os.environ['FRENZY_TP'], '{tp}')"])
    started = launcher.start(msg, "n1", tmp_path)
    assert started.proc.wait(timeout=10) == 0
    text = started.log_path.read_text()
    assert text.startswith("# frenzy agent n1: job job-7 attempt 2")
    assert "CUDA_VISIBLE_DEVICES=2,3" in text
    assert "tp 2 2\n" in text


def test_the_job_runs_under_its_shim_in_a_new_session_and_its_status_is_recorded(tmp_path: Path) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import os, sys; print('group', os.getpgid(0), os.getsid(0),"
                               " 'shim' in os.environ.get('FRENZY_SHIM', 'shim')); sys.exit(5)"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-7/2")
    assert started.proc.wait(timeout=10) == 5
    pid = started.proc.pid
    # The shim leads the job's session and group; its marker is not passed on to the command.
    assert f"group {pid} {pid} True\n" in started.log_path.read_text()
    assert launcher.read_exit_status(started.log_path) == 5


def test_a_signalled_job_is_reported_as_killed_by_that_signal(tmp_path: Path) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"])
    started = launcher.start(msg, "n1", tmp_path, launch_id="p/n1/job-7/2")
    deadline = time.monotonic() + 10
    while "up\n" not in started.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(started.proc.pid, signal.SIGTERM)
    assert started.proc.wait(timeout=10) == -signal.SIGTERM
    assert launcher.read_exit_status(started.log_path) == -signal.SIGTERM


def test_a_cancel_the_instant_the_job_starts_is_recorded_and_the_command_never_runs(tmp_path: Path) -> None:
    # The shim is signalled before its interpreter is up (no wait at all): the signal must stay
    # pending until the shim can record it, and the command must not start afterwards.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        marker = tmp_path / f"ran-{sig.name}"
        msg = make_launch(command=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
        # (the exec'd shim: its interpreter's start-up is the window this test is about)
        started = launcher.start(msg, "n1", tmp_path / sig.name, launch_id=f"p/n1/job-c/{sig.value}",
                                 spawner=False)
        os.killpg(started.proc.pid, sig)
        assert started.proc.wait(timeout=10) == -sig
        assert launcher.read_exit_status(started.log_path) == -sig
        assert not marker.exists()


def test_the_agent_thread_gets_its_signal_mask_back_after_a_launch(tmp_path: Path) -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    started = launcher.start(make_launch(command=[sys.executable, "-c", "pass"]), "n1", tmp_path, launch_id="p/n1/m/1")
    assert started.proc.wait(timeout=10) == 0
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    with pytest.raises(launcher.LaunchError):
        launcher.start(make_launch(command=["/nonexistent/binary"]), "n1", tmp_path, launch_id="p/n1/m/2")
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_processes_are_found_by_launch_id_even_outside_the_group(tmp_path: Path) -> None:
    # The command starts a grandchild in a session of its own, like torchrun's workers.
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
            " start_new_session=True); print('up', flush=True); time.sleep(30)")
    # (an exec'd shim, which carries the launch id in its environment as the command does)
    started = launcher.start(make_launch(command=[sys.executable, "-c", code]), "n1", tmp_path,
                             launch_id=f"t/{os.getpid()}/job-7/2", spawner=False)
    try:
        deadline = time.monotonic() + 10
        while len(launcher.find_processes(f"t/{os.getpid()}/job-7/2")) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        every = launcher.find_processes(f"t/{os.getpid()}/job-7/2")
        assert len(every) == 3 and started.proc.pid in every
        assert launcher.find_processes(f"t/{os.getpid()}/job-7/2", shim_only=True) == [started.proc.pid]
        assert launcher.find_processes(f"t/{os.getpid()}/job-7/9") == []
    finally:
        launcher.kill_launch(f"t/{os.getpid()}/job-7/2", signal.SIGKILL)
    started.proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while launcher.find_processes(f"t/{os.getpid()}/job-7/2") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert launcher.find_processes(f"t/{os.getpid()}/job-7/2") == []


def test_port_in_use_sees_a_listener(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert launcher.port_in_use(port)
    assert not launcher.port_in_use(port)


def test_command_not_found_is_a_launch_error(tmp_path: Path) -> None:
    msg = make_launch(command=["/nonexistent/frenzy-train", "--x"])
    with pytest.raises(launcher.LaunchError, match="command not found: '/nonexistent/frenzy-train'"):
        launcher.start(msg, "n1", tmp_path)
    assert "# launch failed: command not found" in launcher.log_path_for(tmp_path, msg, "n1").read_text()


def test_bad_workdir_is_a_launch_error(tmp_path: Path) -> None:
    msg = make_launch(command=[sys.executable, "-c", "pass"], workdir=str(tmp_path / "missing"))
    with pytest.raises(launcher.LaunchError, match="working directory .*missing' does not exist"):
        launcher.start(msg, "n1", tmp_path)


def test_process_running_tells_live_dead_and_reused_pids() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks = launcher.process_start_ticks(proc.pid)
        assert ticks is not None
        assert launcher.process_running(proc.pid, ticks)
        assert not launcher.process_running(proc.pid, ticks + 1)  # same pid, different process
    finally:
        proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    assert not launcher.process_running(proc.pid, ticks)  # a zombie is not running
    proc.wait()
    assert not launcher.process_running(proc.pid, ticks)


def test_ledger_round_trip_one_file_per_attempt(tmp_path: Path) -> None:
    path = tmp_path / "state" / "n1.json"
    ledger = Ledger(path)
    a = LedgerEntry("j1", 1, 123, 456, "/logs/j1.log", reported=False)
    b = LedgerEntry("j2", 3, 124, None, "/logs/j2.log", reported=True, fence=7, launch_id="p/n1/j2/3",
                    gpu_indices=(0, 3), peak_bytes_per_gpu=12 << 30)
    ledger.put(a)
    ledger.put(b)
    assert sorted(os.listdir(ledger.dir)) == ["j1.1.json", "j2.3.json"]
    ledger.put(LedgerEntry("j1", 1, 123, 456, "/logs/j1.log", reported=True))  # a change rewrites its own file
    assert Ledger(path).load()[0].reported is True
    ledger.remove("j1", 1)
    ledger.remove("j1", 1)  # removing twice is harmless
    assert Ledger(path).load() == [b]  # GPU indices come back as a tuple, as they were put
    assert os.listdir(ledger.dir) == ["j2.3.json"]  # nothing else left behind (no temp files)


def test_a_torn_ledger_entry_loses_only_that_job(tmp_path: Path) -> None:
    path = tmp_path / "state" / "n1.json"
    ledger = Ledger(path)
    b = LedgerEntry("j2", 3, 124, None, "/logs/j2.log", reported=True)
    ledger.put(LedgerEntry("j1", 1, 123, 456, "/logs/j1.log", reported=False))
    ledger.put(b)
    (ledger.dir / "j1.1.json").write_text("{not json")
    (ledger.dir / "j3.1.json").write_text("[1, 2]")
    assert Ledger(path).load() == [b]


def test_an_older_agents_single_file_still_loads_and_is_folded_in(tmp_path: Path) -> None:
    path = tmp_path / "state" / "n1.json"
    path.parent.mkdir()
    path.write_text("{not json")
    assert Ledger(path).load() == []  # a corrupt old file is ignored, not fatal
    # An older agent's file (fewer fields) and a newer one's (more) still load.
    path.write_text('{"jobs": [{"job_id": "j", "attempt": 1, "pid": 5, "start_ticks": null, "log_path": "l",'
                    ' "reported": true, "from_the_future": 1}]}')
    assert Ledger(path).load() == [LedgerEntry("j", 1, 5, None, "l", True)]
    assert not path.exists()  # folded into the directory...
    assert Ledger(path).load() == [LedgerEntry("j", 1, 5, None, "l", True)]  # ...and still there


def test_a_job_id_that_is_no_file_name_is_hashed(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "n1.json")
    odd = LedgerEntry("../../etc/x", 1, 5, None, "l", True)
    ledger.put(odd)
    (name,) = os.listdir(ledger.dir)
    assert "/" not in name and ".." not in name.split(".")[0]
    assert Ledger(tmp_path / "n1.json").load() == [odd]


def test_a_shims_child_between_fork_and_exec_is_not_a_second_shim() -> None:
    """A forked child carries its parent's environment until it execs: for that moment it looks
    like the shim too. Adoption after an agent crash must still find exactly one shim."""
    lid = f"t/{os.getpid()}/fork-window"
    env = {**os.environ, launcher.SHIM_MARKER: lid, launcher.LAUNCH_ID_VAR: lid}
    code = "import os, time\nos.fork()\ntime.sleep(30)\n"  # parent and child both stay, un-exec'd
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(launcher.find_processes(lid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(launcher.find_processes(lid)) == 2  # both carry the launch id
        assert launcher.find_processes(lid, shim_only=True) == [proc.pid]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ------------------------------------------------------------ the shim's handover (stdin)

def test_the_launch_handover_round_trips_any_environment_and_identity() -> None:
    from frenzy.agent.shim import encode_launch, read_launch

    env = {"A": "x=y", "MULTI": "line1\nline2", "EMPTY": "", "BYTES": "caf\udce9"}  # non-UTF-8 byte kept
    assert read_launch(encode_launch(env, None)) == (env, None, "")
    assert read_launch(encode_launch(env, (1001, 1002, [5, 6]))) == (env, (1001, 1002, [5, 6]), "")
    assert read_launch(encode_launch({}, (7, 8, []), "/sys/fs/cgroup/frenzy/n1/job-1.1")) == (
        {}, (7, 8, []), "/sys/fs/cgroup/frenzy/n1/job-1.1")


@pytest.mark.parametrize("env", [{"A=B": "1"}, {"A": "nul\0inside"}, {"": "empty name"}])
def test_an_environment_no_process_can_hold_is_refused_before_the_shim(env: dict[str, str]) -> None:
    from frenzy.agent.shim import encode_launch

    with pytest.raises(ValueError, match="cannot be passed"):
        encode_launch(env, None)


@pytest.mark.parametrize("data", [b"", b"{\"env\": {}}", b"frenzy-shim/2\0\0\0NOEQUALS\0", b"frenzy-shim/2\0\0\0A=1",
                                  b"frenzy-shim/1\0\0A=1\0"])
def test_a_garbled_handover_is_refused(data: bytes) -> None:
    from frenzy.agent.shim import read_launch

    with pytest.raises(ValueError):
        read_launch(data)


def test_a_garbled_handover_fails_the_job_with_127_and_says_why(tmp_path: Path) -> None:
    shim = launcher.SHIM
    exit_file = tmp_path / "x.exit"
    proc = subprocess.run([sys.executable, "-I", "-S", str(shim), str(exit_file), "--", "true"],
                          input=b"{\"env\": {}}", capture_output=True, timeout=30)
    assert proc.returncode == 127
    assert "bad launch on stdin" in proc.stderr.decode()
    assert exit_file.read_text() == "127\n"


def test_a_command_that_cannot_exec_is_reported_with_its_errno(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("no shebang here\n")
    script.chmod(0o755)
    msg = make_launch(command=[str(script)])
    # (the agent's own check passes: the file exists and is executable; the exec itself fails)
    started = launcher.start(msg, "n1", tmp_path / "logs")
    assert started.proc.wait(timeout=10) == 127
    text = started.log_path.read_text()
    assert f"# frenzy shim: cannot start {str(script)!r}: [Errno 8] Exec format error" in text
    assert launcher.read_exit_status(started.log_path) == 127
