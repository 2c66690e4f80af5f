"""One job attempt as this agent sees it (``JobProcess``: its pid, log, fence, GPUs, what has been
reported) and the lines the agent adds to a job's log file. Kept apart from the daemon's loop,
which starts, watches, adopts and stops these."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from frenzy.agent import launcher, safefile
from frenzy.agent.ledger import LedgerEntry

log = logging.getLogger("frenzy.agent.daemon")  # the daemon's logger: these lines are its own


@dataclass
class JobProcess:
    """One job attempt this agent started (or adopted from a previous agent run)."""

    job_id: str
    attempt: int
    pid: int  # also the process group id: the job is a session leader
    log_path: str
    start_ticks: int | None
    fence: int | None = None
    launch_id: str = ""  # FRENZY_LAUNCH_ID of its processes
    node_rank: int = 0
    proc: object | None = None  # subprocess.Popen for our own children; None when adopted
    reported: bool = False  # RUNNING event sent
    cancelled: bool = False  # a CancelMessage asked it to stop
    killed_on_exit: bool = False  # --kill-on-exit stopped it
    gpu_indices: tuple[int, ...] = ()  # this node's GPUs it runs on (from the ledger for an adopted job)
    peak_bytes_per_gpu: int = 0  # MARP's prediction, shown as used memory on fake GPUs
    # The most memory it held on one of its GPUs in any NVML sample, and that GPU's size (real GPUs).
    peak_seen: int = 0
    peak_gpu_total: int = 0
    watching: bool = False
    new_log: bool = False  # its log file was created by this start: shipped from 0 without asking Redis
    exited: threading.Event = field(default_factory=threading.Event)
    # The scheduler's --node-dead-after-s from the launch (0: not said): the agent stops the job
    # itself when cut off from Redis for nearly that long (``Agent._fence_if_cut_off``).
    node_dead_after_s: float = 0.0
    fenced: bool = False  # stopped because this node lost Redis (the job runs elsewhere by now)

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.attempt)

    def ledger_entry(self) -> LedgerEntry:
        return LedgerEntry(self.job_id, self.attempt, self.pid, self.start_ticks, self.log_path, self.reported,
                           fence=self.fence, launch_id=self.launch_id, node_rank=self.node_rank,
                           gpu_indices=self.gpu_indices, peak_bytes_per_gpu=self.peak_bytes_per_gpu,
                           node_dead_after_s=self.node_dead_after_s)



def ended(job: JobProcess) -> bool:
    """Whether the job's leader has exited (a zombie not yet reaped counts), without reaping it."""
    try:
        return os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # not our child (adopted after a restart): is it still there?
        return not launcher.process_running(job.pid, job.start_ticks)


def append_line(log_path: os.PathLike[str] | str, line: str) -> None:
    try:
        launcher.make_job_dirs(Path(log_path).parent)
        try:
            safefile.append(log_path, (line + "\n").encode())
        except FileNotFoundError:
            fd = safefile.open_in(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "ab") as fh:
                fh.write((line + "\n").encode())
    except OSError as exc:  # the log is a convenience; the event is what counts
        log.debug("could not append to %s: %s", log_path, exc)


def append_trailer(log_path: str, code: int | None, cancelled: bool) -> None:
    # Never through a link or into a FIFO a job put in its log's place (safefile.append).
    try:
        safefile.append(log_path, f"# frenzy agent: exited with code {code}{' (cancelled)' if cancelled else ''} at "
                                  f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
    except OSError as exc:  # the log is a convenience; the event is what counts
        log.debug("could not append to %s: %s", log_path, exc)
