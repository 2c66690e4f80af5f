"""issue 14 item 11: `frenzy batch submit` reads YAML with bounded size, depth and aliases.

Before: a "billion laughs" batch file (nine anchors, each nine aliases of the one before)
made `frenzy batch submit` use 2.6 GB and hang; a file of any size was read whole."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frenzy.worker.batch import MAX_BATCH_FILE_BYTES, BatchFileError, load_batch_file


def billion_laughs() -> str:
    """Ten anchors under `defaults:` (merged into every entry), each nine aliases of the one before:
    a 1 KB file that stands for 9**9 strings once written out as JSON for the queue."""
    text = 'defaults:\n  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(1, 10):
        text += f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n"
    return text + "jobs:\n  - {name: laugh, model: gpt2-124m, seq_len: 8, global_batch: 8, command: [*l9]}\n"


def submit(path: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "frenzy.cli.main", "batch", "submit", str(path), "--no-wait",
                           "--redis-url", redis_url], env=env, capture_output=True, text=True, timeout=30)


def test_billion_laughs_fails_fast_with_a_clear_error(tmp_path: Path, redis_url: str) -> None:
    """issue 14 item 11: the whole CLI, as a user runs it."""
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    t0 = time.monotonic()
    res = submit(path, redis_url)
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-500:])
    assert "expands to more than" in res.stderr and "Nothing was enqueued" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 20


def test_oversized_file_is_refused_unread(tmp_path: Path, redis_url: str) -> None:
    """issue 14 item 11: a cap on file bytes (8 MiB), with an error that says so."""
    path = tmp_path / "big.yaml"
    entry = "  - {name: j, model: gpt2-124m, seq_len: 8, global_batch: 8, command: true}\n"
    with open(path, "w") as fh:
        fh.write("jobs:\n")
        fh.write(entry * (MAX_BATCH_FILE_BYTES // len(entry) + 10))
    res = submit(path, redis_url)
    assert res.returncode == 2 and "8 MiB" in res.stderr, res.stderr[-500:]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaults: {a: &a [*a]}\njobs: [{name: x}]\n", "recursive alias"),
        ("jobs: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper"),
        ("jobs: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "nested deeper"),
        ("jobs:\n  - &e {name: a, model: m, seq_len: 1, global_batch: 1, command: x}\n" + "  - *e\n" * 20_000,
         None),  # many aliases of a small entry: fine, it expands to what it says
    ],
    ids=["recursive", "deep-lists", "deep-maps", "many-aliases"],
)
def test_recursive_and_deep_documents(tmp_path: Path, text: str, message: str | None) -> None:
    """issue 14 item 11: self-referencing anchors and deep nesting fail with a clear error, not a
    RecursionError or a hang."""
    path = tmp_path / "b.yaml"
    path.write_text(text)
    if message is None:
        assert len(load_batch_file(path)) == 20_001
        return
    with pytest.raises(BatchFileError, match=message):
        load_batch_file(path)
