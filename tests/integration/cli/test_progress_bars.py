"""Progress bars of `frenzy simulate` and `frenzy measure`, as a user sees them: the real CLI in a
subprocess whose stderr is a pseudo-terminal. The bars appear there; stdout (``--json``) is the same
as without them; ``--no-progress`` or a piped stderr draws nothing."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
SIMULATE = ["simulate", "--cluster", str(REPO / "examples/clusters/paper-64.yaml"), "--synthetic", "12",
            "--policies", "frenzy,opportunistic", "--seeds", "2", "--json"]  # fmt: skip
# Wall-clock numbers: the only part of the JSON that differs between two identical runs.
WALL_CLOCK = ("decision_ms_mean", "decision_ms_p99")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor moves, so the tests read the text
# Each run takes about a second alone; on a loaded machine (make test: four workers on two cores,
# stacks and torch beside them) many times that. A run's deadline, and the simulate test's budget
# for its three runs, stay under the test's own timeout so that a slow run fails as itself.
RUN_TIMEOUT_S = 150.0


def _frenzy(args: list[str], terminal: bool, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (or a pipe); (exit code, stdout, stderr without
    its escape sequences).

    Both ends are drained together (select) under one deadline: a child that outlives it is killed
    and the test fails saying so, well inside the test's own timeout, whose thread method would
    otherwise end the whole xdist worker ("worker crashed") while a blocking read waited on a slow
    or stuck child; and a large stdout cannot fill its pipe while the pty is being read."""
    return _run([sys.executable, "-m", "frenzy.cli.main", *args], terminal, timeout, f"frenzy {' '.join(args)}")


def _run(cmd: list[str], terminal: bool, timeout: float, what: str) -> tuple[int, str, str]:
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("FORCE_COLOR", None)
    if not terminal:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{what} (stderr a pipe) ran past {timeout:.0f} s: {exc.stderr!r}")
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    assert proc.stdout is not None
    out, err = bytearray(), bytearray()
    into = {proc.stdout.fileno(): out, leader: err}
    deadline = time.monotonic() + timeout
    try:
        while into:  # until stdout's EOF and the pty's EIO (the child's side closed)
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                pytest.fail(f"{what} (stderr a terminal) ran past {timeout:.0f} s; its stderr so "
                            f"far: {ANSI.sub('', err.decode(errors='replace'))[-2000:]!r}")  # fmt: skip
            ready, _, _ = select.select(list(into), [], [], min(left, 1.0))
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: no follower left open
                    chunk = b""
                if chunk:
                    into[fd] += chunk
                else:
                    del into[fd]
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(leader)
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, out.decode(), ANSI.sub("", err.decode(errors="replace"))


def _without_wall_clock(data: dict[str, Any]) -> dict[str, Any]:
    for run in [data["policies"], data["spread"], *data["per_seed"]]:
        for metrics in run.values():
            for key in WALL_CLOCK:
                metrics.pop(key)
    return data


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)  # three runs, each under its deadline
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
    code, out, err = _frenzy(args, terminal=True, timeout=240)
    assert code == 0, err[-2000:]
    for label in (
        "custom (dp 1 x tp 1 x cp 2): rank 0 (dp 0, cp 0, tp 0)",
        "rank 1 (dp 0, cp 1, tp 0)",
        "1/2 ranks",
    ):
        assert label in err, err[-2000:]
    assert [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1]


def test_the_terminal_runner_fails_a_slow_child_cleanly_and_drains_a_large_stdout() -> None:
    """The helper's own guarantees: past its deadline the child is killed and the test fails as
    itself (not the xdist worker); a stdout larger than a pipe's buffer, written while stderr is
    a terminal, does not block the child (the old helper read stdout only after the pty closed)."""
    slow = [sys.executable, "-c", "import sys, time; print('started', file=sys.stderr, flush=True); time.sleep(60)"]
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ran past 2 s; its stderr so far: 'started"):
        _run(slow, True, 2.0, "a sleeper")
    assert time.monotonic() - started < 30
    big = [sys.executable, "-c", "import sys; sys.stdout.write('x' * 1_000_000); sys.stdout.flush(); "
                                 "print('bar', file=sys.stderr)"]  # fmt: skip
    code, out, err = _run(big, True, 60.0, "a talker")
    assert (code, len(out), err.strip()) == (0, 1_000_000, "bar")
