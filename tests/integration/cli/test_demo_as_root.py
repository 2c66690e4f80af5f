"""`frenzy demo` -- the README's main command -- passes wherever it is run from, root included.

Run as root, `frenzy up`/`demo` start jobs under an unprivileged account (issue 34); the suite's
other demo runs live under pytest's 0700 temp directory, where the stack keeps its own user, so a
stack whose account cannot even start the stack's Python (a venv on an interpreter under /root)
went unseen until `make demo` failed every job with "Permission denied". Here the run directory is
one every account can enter, as `make demo`'s ./var is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_demo_passes_with_a_run_directory_every_account_can_enter() -> None:
    base = Path(tempfile.mkdtemp(prefix="frenzy-demo-"))  # in /tmp (1777): enterable by every account
    try:
        os.chmod(base, 0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FRENZY_CREDENTIALS", "FRENZY_TOKEN")}
        env["XDG_CONFIG_HOME"] = str(base / "config")
        done = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "demo", "--run-dir", str(base / "run")],
                              capture_output=True, text=True, timeout=240, env=env, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "demo passed" in done.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)
