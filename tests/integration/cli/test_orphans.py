"""A SIGKILLed `frenzy up` must not leave its services running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.processes import alive


@pytest.mark.slow
def test_services_die_with_a_killed_up(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {gpu: L4, count: 1, gpus_per_node: 1}\n")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "up", "--cluster", str(cluster), "--run-dir",
                             str(tmp_path / "run"), "--no-api", "--no-worker"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    out = ""
    while time.monotonic() < deadline and "Ctrl-C" not in out and proc.poll() is None:
        out += proc.stdout.readline()
    assert "Ctrl-C" in out, out
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                text=True).stdout.split()]
    assert len(children) >= 4, children  # redis, predictor, scheduler, agent
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(p) for p in children):
        time.sleep(0.2)
    assert not [p for p in children if alive(p)]
