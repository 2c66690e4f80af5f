"""A launch that fails before the command runs keeps its reason, end to end (issue 20): real
scheduler, predictor and agent (separate processes, a fake L4). `frenzy submit --wait` of a command
the node does not have, or with a working directory it does not have, ends FAILED saying so --
"could not start the job: command not found: 'x'" -- not "failed with exit code 127"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e.test_agents_e2e import Stack, make_stack  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ONE_L4 = {"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 1, "name_prefix": "l4"}]}


def _submit_wait(s: Stack, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "submit", "--scheduler", s.stack.scheduler_addr,
                          "--model", "gpt2-124m", "--seq-len", "512", "--global-batch", "8", "--wait", *args],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FRENZY_CREDENTIALS": str(s.stack.credentials_file), "COLUMNS": "300"})
    assert out.returncode == 1, (out.stdout, out.stderr)
    return " ".join(out.stdout.split())  # (rich wraps long lines)


def test_a_command_or_workdir_the_node_lacks_fails_with_the_agents_reason(
        make_stack: Callable[..., Stack], tmp_path: Path) -> None:  # noqa: F811
    s = make_stack(ONE_L4)
    text = _submit_wait(s, "--no-code", "--", "frenzy-no-such-command", "--help")
    # The reason once, on the last state line: not again as "failed:" and "cause:" under it (issue 30).
    assert "FAILED node l4-0 (node rank 0) could not start the job: command not found: 'frenzy-no-such-command'" \
        in text
    assert text.count("could not start the job") == 1 and "cause:" not in text and "failed: node" not in text, text
    assert "exit code 127" not in text
    job_id = re.search(r"submitted (job-[0-9a-f]+)", text).group(1)  # type: ignore[union-attr]
    shown = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "job", job_id, "--scheduler",
                            s.stack.scheduler_addr], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "FRENZY_CREDENTIALS": str(s.stack.credentials_file), "COLUMNS": "300"})
    shown_text = " ".join(shown.stdout.split())
    assert "failed: node l4-0 (torchrun node rank 0) could not start the job" in shown_text, shown.stdout
    assert "cause: launch failed: command not found: 'frenzy-no-such-command'" in shown_text
    assert "exited with code 127" not in shown_text

    missing = tmp_path / "not-here"
    text = _submit_wait(s, "--workdir", str(missing), "--", sys.executable, "-c", "print(1)")
    assert f"could not start the job: working directory '{missing}' does not exist" in text
    assert "exit code 127" not in text
