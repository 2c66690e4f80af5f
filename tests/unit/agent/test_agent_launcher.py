"""Launch building blocks: environment, placeholder substitution, log file, start failures, ledger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from frenzy.agent import launcher
from frenzy.agent.ledger import Ledger, LedgerEntry
from frenzy.common.messages import LaunchMessage, LayoutEnv


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
    }


def test_env_inherits_the_agent_environment_by_default(monkeypatch) -> None:
    monkeypatch.setenv("FRENZY_TEST_MARKER", "yes")
    assert launcher.build_env(make_launch(), "n1")["FRENZY_TEST_MARKER"] == "yes"


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
    msg = make_launch(command=["torchrun", "--rdzv-endpoint={master_addr}:{master_port}", "{unknown}",
                               '{"tp": {tp}}', "{ tp }", "{{tp}}", "${HOME}/x"])
    assert launcher.build_argv(msg) == [
        "torchrun", "--rdzv-endpoint=10.0.0.1:29500", "{unknown}", '{"tp": 2}', "{ tp }", "{2}", "${HOME}/x",
    ]


def test_log_path_layout(tmp_path: Path) -> None:
    assert launcher.log_path_for(tmp_path, make_launch(), "n1") == tmp_path / "job-7" / "attempt-2" / "n1.log"


def test_start_writes_a_header_then_the_output(tmp_path: Path) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import os; print('tp', os.environ['FRENZY_TP'], '{tp}')"])
    started = launcher.start(msg, "n1", tmp_path)
    assert started.proc.wait(timeout=10) == 0
    text = started.log_path.read_text()
    assert text.startswith("# frenzy agent n1: job job-7 attempt 2")
    assert "CUDA_VISIBLE_DEVICES=2,3" in text
    assert "tp 2 2\n" in text


def test_started_process_leads_its_own_process_group(tmp_path: Path) -> None:
    msg = make_launch(command=[sys.executable, "-c", "import os; print(os.getpgid(0) == os.getpid())"])
    started = launcher.start(msg, "n1", tmp_path)
    started.proc.wait(timeout=10)
    assert "True" in started.log_path.read_text()


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


def test_ledger_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "n1.json"
    ledger = Ledger(path)
    a = LedgerEntry("j1", 1, 123, 456, "/logs/j1.log", reported=False)
    b = LedgerEntry("j2", 3, 124, None, "/logs/j2.log", reported=True)
    ledger.put(a)
    ledger.put(b)
    ledger.remove("j1", 1)
    ledger.remove("j1", 1)  # removing twice is harmless
    assert Ledger(path).load() == [b]
    path.write_text("{not json")
    assert Ledger(path).load() == []
