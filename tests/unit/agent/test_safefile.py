"""frenzy.agent.safefile: the agent's opens of paths a job may control (issue 34, item 3).

Real files, FIFOs, links and devices in a temporary directory: a FIFO never blocks, a link is never
followed (neither the file nor its directory), only regular files are read, and reads are capped."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from frenzy.agent import safefile


def test_a_fifo_is_refused_at_once_for_reading_and_for_appending(tmp_path: Path) -> None:
    fifo = tmp_path / "peak_bytes"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(safefile.NotRegular):
        safefile.read_capped(fifo, 64)
    with pytest.raises(OSError):  # ENXIO: no reader; never a block
        safefile.append(fifo, b"x")
    assert time.monotonic() - t0 < 1.0


def test_links_are_not_followed_neither_the_file_nor_its_directory(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("42\n")
    (tmp_path / "link").symlink_to(secret)
    with pytest.raises(OSError):
        safefile.read_capped(tmp_path / "link", 64)
    real = tmp_path / "real"
    real.mkdir()
    (real / "peak_bytes").write_text("7\n")
    (tmp_path / "run").symlink_to(real)
    with pytest.raises(OSError):  # the directory on the way is a link
        safefile.read_capped(tmp_path / "run" / "peak_bytes", 64)
    assert safefile.read_capped(real / "peak_bytes", 64) == b"7\n"


def test_devices_and_directories_are_not_read(tmp_path: Path) -> None:
    with pytest.raises(safefile.NotRegular):
        safefile.read_capped("/dev/zero", 64, through_dir=False)
    with pytest.raises(OSError):
        safefile.read_capped(tmp_path, 64)


def test_reads_are_capped_head_or_tail(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.write(b"head\n")
        fh.truncate(1 << 36)  # 64 GiB, sparse
        fh.seek((1 << 36) - 5)
        fh.write(b"tail\n")
    assert safefile.read_capped(big, 5) == b"head\n"
    assert safefile.read_capped(big, 5, tail=True) == b"tail\n"


def test_write_atomic_replaces_a_planted_link_or_fifo_without_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "exit").symlink_to(victim)
    safefile.write_atomic(tmp_path / "exit", "0\n")
    assert victim.read_text() == "keep\n"
    assert not (tmp_path / "exit").is_symlink() and (tmp_path / "exit").read_text() == "0\n"
    os.mkfifo(tmp_path / "pid")
    safefile.write_atomic(tmp_path / "pid", "1 2\n")
    assert (tmp_path / "pid").read_text() == "1 2\n"


def test_bounded_gives_up_on_a_call_that_does_not_return() -> None:
    release = threading.Event()
    t0 = time.monotonic()
    assert safefile.bounded(lambda: release.wait(30), 0.2, default="gave up") == "gave up"
    assert time.monotonic() - t0 < 2
    release.set()
    assert safefile.bounded(lambda: 5, 1.0) == 5
    assert safefile.bounded(lambda: open("/nonexistent/x"), 1.0, default=0) == 0
