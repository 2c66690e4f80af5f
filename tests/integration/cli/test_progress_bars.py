"""Progress bars of `frenzy simulate` and `frenzy measure`, as a user sees them: the real CLI in a
subprocess whose stderr is a pseudo-terminal. The bars appear there; stdout (``--json``) is the same
as without them; ``--no-progress`` or a piped stderr draws nothing."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
SIMULATE = ["simulate", "--cluster", str(REPO / "examples/clusters/paper-64.yaml"), "--synthetic", "12",
            "--policies", "frenzy,opportunistic", "--seeds", "2", "--json"]  # fmt: skip
# Wall-clock numbers: the only part of the JSON that differs between two identical runs.
WALL_CLOCK = ("decision_ms_mean", "decision_ms_p99")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor moves, so the tests read the text


def _frenzy(args: list[str], terminal: bool, timeout: float = 240) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (or a pipe); (exit code, stdout, stderr without
    its escape sequences)."""
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("FORCE_COLOR", None)
    cmd = [sys.executable, "-m", "frenzy.cli.main", *args]
    if not terminal:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    err = b""
    while True:  # drain the terminal until the child closes it, or the pty buffer would block it
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child's side is closed
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout=timeout)
    return proc.returncode, out.decode(), ANSI.sub("", err.decode(errors="replace"))


def _without_wall_clock(data: dict[str, Any]) -> dict[str, Any]:
    for run in [data["policies"], data["spread"], *data["per_seed"]]:
        for metrics in run.values():
            for key in WALL_CLOCK:
                metrics.pop(key)
    return data


@pytest.mark.slow
def test_simulate_bars_on_a_terminal_json_unchanged() -> None:
    code, out, err = _frenzy(SIMULATE, terminal=True)
    assert code == 0, err
    # One bar per policy with its seed, jobs finished of 12 and the simulated time.
    for label in ("frenzy seed 0 (1/2)", "opportunistic seed 1 (2/2)", "12/12", "jobs, simulated"):
        assert label in err, err[-2000:]
    code, plain, quiet = _frenzy([*SIMULATE, "--no-progress"], terminal=True)
    assert code == 0 and quiet == ""
    assert _without_wall_clock(json.loads(out)) == _without_wall_clock(json.loads(plain))
    code, piped, nothing = _frenzy(SIMULATE, terminal=False)
    assert code == 0 and nothing == ""
    assert _without_wall_clock(json.loads(piped)) == _without_wall_clock(json.loads(plain))


@pytest.mark.slow
@pytest.mark.timeout(300)  # two rank subprocesses, each importing torch
def test_measure_bar_per_rank_on_a_terminal() -> None:
    pytest.importorskip("torch")
    spec = json.dumps({"arch": "decoder", "head": "lm", "n_layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2,
                       "ffn": 344, "mlp": "swiglu", "vocab": 1024, "tied_embeddings": False, "pos_emb": "rope",
                       "max_positions": 4096, "norm": "rmsnorm", "bias": False})  # fmt: skip
    args = ["measure", "--model", spec, "--seq-len", "128", "--micro-batch", "1", "--precision", "fsdp-bf16",
            "--optimizer", "adamw", "--cp", "2", "--json"]  # fmt: skip
    code, out, err = _frenzy(args, terminal=True)
    assert code == 0, err[-2000:]
    for label in (
        "custom (dp 1 x tp 1 x cp 2): rank 0 (dp 0, cp 0, tp 0)",
        "rank 1 (dp 0, cp 1, tp 0)",
        "1/2 ranks",
    ):
        assert label in err, err[-2000:]
    assert [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1]
