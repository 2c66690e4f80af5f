"""The agent's side of the spawner (``spawner.py``): start it, ask it for shims, watch them.

``Spawner.spawn`` returns a ``SpawnedShim``, which answers what the agent asked of the
``subprocess.Popen`` of an exec'd shim (``pid``, ``poll``, ``wait``, ``returncode``) although the
shim is the spawner's child, not the agent's: its end is seen through a pidfd (Linux 5.3+) and
its status read from the exit file the shim (or, if it was killed outright, the spawner) wrote.
Where the spawner cannot run (no pidfd, no SCM_RIGHTS, it died twice), ``Spawner.spawn`` raises
``SpawnerUnavailable`` and the launcher falls back to exec'ing the shim, which always works.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from frenzy.agent import safefile
from frenzy.agent.procs import process_running
from frenzy.agent.shim import CLEAN_MARK, PID_SUFFIX

log = logging.getLogger(__name__)

SPAWNER = Path(__file__).resolve().with_name("spawner.py")
_REPLY_TIMEOUT_S = 10.0
# After the shim is gone, how long its exit file may take to appear (the spawner writes it for a
# shim killed outright, once it has reaped it: normally within milliseconds).
_STATUS_GRACE_S = 5.0


class SpawnerUnavailable(RuntimeError):
    """The spawner cannot start this job and started nothing; the launcher exec's the shim instead."""


class SpawnerFailed(RuntimeError):
    """The spawner died while starting the job and left no sign that it had: the launch fails
    (retryable) rather than risk running the job twice."""


def pid_from(pid_path: Path) -> int | None:
    """The shim's pid from the file the spawner writes before answering, if that shim runs."""
    try:  # (beside the job's log: never followed if a link, never blocked on if a FIFO)
        pid_text, ticks_text = safefile.read_capped(pid_path, 64).decode("ascii").split()
        pid = int(pid_text)
        ticks = None if ticks_text == "None" else int(ticks_text)
    except (OSError, ValueError):
        return None
    return pid if process_running(pid, ticks) else None


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def read_status(exit_path: Path) -> tuple[int | None, bool]:
    """(exit code or None, whether the shim saw nothing of the job outlive it)."""
    try:
        lines = safefile.read_capped(exit_path, 64).decode("ascii").split()
        return int(lines[0]), CLEAN_MARK in lines[1:]
    except (OSError, ValueError, IndexError):  # (UnicodeDecodeError is a ValueError)
        return None, False


@dataclass
class SpawnedShim:
    """A job's shim that the spawner forked: what the agent needs of it, Popen-like."""

    pid: int
    exit_path: Path
    start_ticks: int | None = None  # /proc start time, as the spawner read it right after the fork
    returncode: int | None = None
    clean: bool = False  # the shim ended every process of the job itself
    _gone: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait_gone(self, timeout: float | None = None) -> bool:
        """Block until the shim process has ended (not reaped: its parent is the spawner)."""
        if self._gone.is_set():
            return True
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self._gone.set()
            return True
        try:
            ready = select.select([fd], [], [], timeout)[0]
        finally:
            os.close(fd)
        if ready:
            self._gone.set()
        return bool(ready)

    def poll(self) -> int | None:
        if self.returncode is None and self.wait_gone(0):
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The shim's exit code (as Popen gives it: -N for a signal), or None when none was recorded."""
        if self.returncode is not None:
            return self.returncode
        if not self.wait_gone(timeout):
            raise subprocess.TimeoutExpired(f"shim {self.pid}", timeout or 0.0)
        self._read(_STATUS_GRACE_S)
        return self.returncode

    def _read(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while True:
            code, clean = read_status(self.exit_path)
            if code is not None or time.monotonic() >= deadline:
                self.returncode, self.clean = code, clean
                return
            time.sleep(0.01)


class Spawner:
    """One spawner process per agent, started on first use and again if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: socket.socket | None = None

    def _start(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            for s in (mine, theirs):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SPAWNER), str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env={"PATH": os.defpath},
            )
        except OSError as exc:
            mine.close()
            raise SpawnerUnavailable(f"cannot start the spawner: {exc}") from exc
        finally:
            theirs.close()
        mine.settimeout(_REPLY_TIMEOUT_S)
        try:
            hello = mine.recv(64)
        except OSError:
            hello = b""
        if not hello.startswith(b'{"ready"'):
            mine.close()
            self._reap_proc()
            raise SpawnerUnavailable("the spawner did not start (its error is in the agent's output)")
        self._conn = mine
        return mine

    def spawn(self, argv: list[str], cwd: str | None, exit_path: Path, launch: bytes, log_fd: int) -> SpawnedShim:
        """Have the spawner fork the shim for ``argv``, its output on ``log_fd``. SpawnerUnavailable
        when it cannot (the launch has not happened: the caller may exec the shim instead)."""
        if not supported():
            raise SpawnerUnavailable("this system has no pidfd_open or SCM_RIGHTS")
        request = json.dumps({"exit_file": str(exit_path), "argv": argv, "cwd": cwd}).encode() + b"\n" + launch
        pid_path = Path(f"{exit_path}{PID_SUFFIX}")
        pid_path.unlink(missing_ok=True)  # an earlier run of the same attempt's is not ours
        with self._lock:
            for attempt in (1, 2):
                conn = self._conn if self._conn is not None else self._start()
                try:
                    socket.send_fds(conn, [request], [log_fd])
                except OSError as exc:
                    # A dead spawner: nothing was started, so a fresh one may be asked once.
                    log.warning("the spawner is gone (%s)%s", exc, "; starting a new one" if attempt == 1 else "")
                    self._close()
                    if attempt == 2:
                        raise SpawnerUnavailable(f"the spawner failed: {exc}") from exc
                    continue
                try:
                    reply = json.loads(conn.recv(65536) or b"null")
                except (OSError, ValueError) as exc:
                    reply = None
                    log.warning("no answer from the spawner: %s", exc)
                if not isinstance(reply, dict):
                    # It read the request and then failed: whether it forked is in the pid file
                    # it writes before answering. Never start the job a second time on a guess.
                    self._close()
                    pid = pid_from(pid_path)
                    if pid is not None:
                        return SpawnedShim(pid, exit_path)
                    raise SpawnerFailed("the spawner failed while starting the job; it may be retried")
                if "pid" not in reply:
                    raise SpawnerUnavailable(str(reply.get("error", "no pid in the spawner's reply")))
                ticks = reply.get("start_ticks")
                return SpawnedShim(int(reply["pid"]), exit_path, int(ticks) if isinstance(ticks, int) else None)
        raise AssertionError("unreachable")

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._reap_proc()

    def _reap_proc(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """End the spawner (its running shims carry on)."""
        with self._lock:
            self._close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


_default: Spawner | None = None
_default_lock = threading.Lock()


def default_spawner() -> Spawner:
    """The process's spawner (the agent has one; so does a test calling ``launcher.start``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Spawner()
        return _default
