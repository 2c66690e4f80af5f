"""A cgroup (v2) per job: one kill for everything it started, and memory and process limits.

A job's processes are found today through its process group, its shim's subreaping and the
launch id in their environment -- each of which a hostile job can leave (a process that double
forks, clears its environment and outlives an exec'd shim). A cgroup it cannot leave: the job's
command joins ``ROOT/NODE/JOB.ATTEMPT`` before it execs (the shim's child, while still root), so
everything it ever starts is there, ``cgroup.kill`` ends all of it at once, and ``pids.max`` /
``memory.max`` bound what it may take (``memory.oom.group``: an out-of-memory kill takes the whole
job, not one rank). The shim itself stays outside: it records the exit, whatever the job did.

Where: ``--cgroup-root`` (default ``auto``: ``frenzy`` at the top of the cgroup2 mount, as Docker's
cgroupfs driver makes ``docker``; under systemd give the agent ``Delegate=yes`` and a root inside its
own unit instead). ``off`` turns it off. What this host allows is checked once at start and said in
one log line: no cgroup2 mount or no write access (jobs run without cgroups, as before), or cgroups
without the memory or pids controller (a hybrid host keeps them on cgroup v1: the kill still works,
the limits are not set). docs/operators.md says what an operator enables.

GPUs: on cgroup v2, access to ``/dev/nvidiaN`` is decided by a BPF device program attached to the
cgroup (what systemd's ``DeviceAllow=`` and container runtimes install); Frenzy does not attach one
yet, so a job can still open a GPU it was not given (CUDA_VISIBLE_DEVICES is advice). See
docs/security.md.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

WANTED = ("memory", "pids")
DEFAULT_PIDS_MAX = 16384


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where the cgroup2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a
    hybrid host); None when it is not."""
    try:
        with open(mountinfo) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split()[4]
    return None


def parse_bytes(text: str) -> int | None:
    """``8G``, ``512M``, ``1048576`` -> bytes; ``none``/``max``/"" -> None (no limit)."""
    text = text.strip()
    if text.lower() in ("", "none", "max"):
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    scale = units.get(text[-1].lower(), 1)
    number = text[:-1] if text[-1].lower() in units else text
    value = int(float(number) * scale)
    if value <= 0:
        raise ValueError(f"{text!r}: a memory limit must be above 0")
    return value


@dataclass
class JobCgroups:
    """This node's jobs' cgroups, or nothing (``enabled`` False) where the host does not allow them."""

    root: str = ""  # ROOT/NODE, where the jobs' cgroups are made ("" when disabled)
    controllers: tuple[str, ...] = ()  # of WANTED, those the jobs' cgroups have
    memory_max: int | None = None
    pids_max: int | None = DEFAULT_PIDS_MAX
    why_not: str = ""  # why cgroups (or a controller) are off here, for the start log line

    @property
    def enabled(self) -> bool:
        return bool(self.root)

    @classmethod
    def setup(cls, setting: str, node: str, memory_max: int | None = None,
              pids_max: int | None = DEFAULT_PIDS_MAX) -> JobCgroups:
        """Check and prepare ``--cgroup-root`` (``auto``, ``off`` or a path in the cgroup2 mount) for
        ``node``; never raises for what the host lacks: the result says it (``why_not``)."""
        off = cls(memory_max=memory_max, pids_max=pids_max)
        if setting == "off":
            off.why_not = "--cgroup-root off"
            return off
        if os.geteuid() != 0:
            # (a delegated subtree would do without root; an agent that is not root runs jobs as itself)
            off.why_not = "the agent is not root"
            return off
        mount = cgroup2_mount()
        if mount is None:
            off.why_not = "no cgroup2 hierarchy is mounted on this host"
            return off
        base = os.path.join(mount, "frenzy") if setting == "auto" else os.path.realpath(setting)
        if not (base + "/").startswith(mount.rstrip("/") + "/"):
            off.why_not = f"--cgroup-root {setting} is not inside the cgroup2 mount {mount}"
            return off
        root = os.path.join(base, node)
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            off.why_not = f"cannot make {root}: {exc.strerror or exc}"
            return off
        # Controllers flow down: each level from the mount to ROOT/NODE passes them to its children.
        have = set(_read(os.path.join(mount, "cgroup.controllers")).split())
        chain = [mount]
        rel = os.path.relpath(root, mount)
        for part in rel.split(os.sep):
            chain.append(os.path.join(chain[-1], part))
        controllers = [c for c in WANTED if c in have]
        for level in chain:
            available = set(_read(os.path.join(level, "cgroup.controllers")).split())
            controllers = [c for c in controllers if c in available]
            if not controllers:
                break
            try:
                _write(os.path.join(level, "cgroup.subtree_control"), " ".join(f"+{c}" for c in controllers))
            except OSError as exc:
                # EBUSY: the level holds processes (v2's no-internal-process rule): not ours to move.
                log.debug("cannot enable %s in %s: %s", controllers, level, exc)
                controllers = [c for c in controllers
                               if c in _read(os.path.join(level, "cgroup.subtree_control")).split()]
        missing = [c for c in WANTED if c not in controllers]
        why = ""
        if missing:
            why = (f"no {' and '.join(missing)} controller in {mount} (on a hybrid host they are bound to "
                   "cgroup v1): jobs get their own cgroup and its kill, not the "
                   f"{' and '.join(c + ' limit' for c in missing)}")
        if not os.path.exists(os.path.join(root, "cgroup.kill")):
            why = (why + "; " if why else "") + "no cgroup.kill (Linux < 5.14): jobs are ended process by process"
        return cls(root=root, controllers=tuple(controllers), memory_max=memory_max, pids_max=pids_max, why_not=why)

    def describe(self) -> str:
        if not self.enabled:
            return f"jobs run without a cgroup of their own ({self.why_not})"
        limits = []
        if "memory" in self.controllers:
            limits.append(f"memory.max {self.memory_max if self.memory_max is not None else 'max'}")
        if "pids" in self.controllers:
            limits.append(f"pids.max {self.pids_max if self.pids_max is not None else 'max'}")
        text = f"a cgroup per job under {self.root}" + (f" ({', '.join(limits)})" if limits else "")
        return text + (f"; {self.why_not}" if self.why_not else "")

    def path_for(self, job_id: str, attempt: int) -> str:
        return os.path.join(self.root, f"{job_id}.{int(attempt)}") if self.enabled else ""

    def create(self, job_id: str, attempt: int) -> str:
        """The job attempt's cgroup, made (or emptied, if a crashed start left it) with its limits; ""
        when cgroups are off. OSError when it cannot be made."""
        if not self.enabled:
            return ""
        path = self.path_for(job_id, attempt)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            kill(path)  # a start of this attempt that never ran: nothing of it may stay
        if "memory" in self.controllers:
            _write(os.path.join(path, "memory.max"), str(self.memory_max) if self.memory_max else "max")
            try:
                _write(os.path.join(path, "memory.oom.group"), "1")
            except OSError:
                pass  # (Linux < 4.19)
        if "pids" in self.controllers:
            _write(os.path.join(path, "pids.max"), str(self.pids_max) if self.pids_max else "max")
        return path


def members(path: str) -> list[int]:
    return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]


def kill(path: str) -> bool:
    """SIGKILL everything in the cgroup ``path`` (``cgroup.kill``; else each member); False when it is gone."""
    if not path or not os.path.isdir(path):
        return False
    try:
        _write(os.path.join(path, "cgroup.kill"), "1")
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EINVAL):
            log.debug("cgroup.kill in %s: %s", path, exc)
    for pid in members(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True


def remove(path: str, timeout_s: float = 5.0) -> bool:
    """Kill what is left in ``path`` and remove it; False when it still holds processes after ``timeout_s``."""
    if not path or not os.path.isdir(path):
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        kill(path)
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: processes still dying
            if time.monotonic() >= deadline:
                log.warning("the cgroup %s still holds processes %s after %.0f s", path, members(path), timeout_s)
                return False
            time.sleep(0.05)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
