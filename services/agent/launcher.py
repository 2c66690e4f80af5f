"""Turn one LaunchMessage into a running process: environment, argv, log file, process group.

Pure helpers (``build_env``, ``build_argv``) plus ``start()``, which does the
Popen. Every job runs in its own session/process group so a cancel can signal
the whole tree (torchrun and its workers) at once, and so the job survives an
agent restart. Nothing here talks to Redis: the daemon reports what happened.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from frenzy.common.messages import LaunchMessage


class LaunchError(RuntimeError):
    """The process could not be started; the message is what the user should read."""


def placeholder_values(msg: LaunchMessage) -> dict[str, str]:
    """Values for the ``{name}`` placeholders a command may use."""
    lay = msg.layout
    return {
        "tp": str(lay.tp),
        "pp": str(lay.pp),
        "dp": str(lay.dp),
        "zero_stage": str(lay.zero_stage),
        "micro_batch": str(lay.micro_batch),
        "grad_accum": str(lay.grad_accum),
        "recompute": lay.recompute,
        "gpu_type": lay.gpu_type,
        "nnodes": str(msg.nnodes),
        "node_rank": str(msg.node_rank),
        "nproc_per_node": str(msg.nproc_per_node),
        "master_addr": msg.master_addr,
        "master_port": str(msg.master_port),
        "rdzv_id": msg.rdzv_id,
        "job_id": msg.job_id,
        "attempt": str(msg.attempt),
    }


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(arg: str, values: Mapping[str, str]) -> str:
    """Replace known ``{name}`` placeholders; anything else (JSON, ``{unknown}``) stays as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


def build_argv(msg: LaunchMessage) -> list[str]:
    values = placeholder_values(msg)
    return [substitute(a, values) for a in msg.command]


def build_env(msg: LaunchMessage, node: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment: the agent's, then the message's ``env``, then Frenzy's own variables.

    Frenzy's variables win over ``msg.env`` so a job can never be told to use
    GPUs other than the ones reserved for it.
    """
    env = dict(os.environ if base is None else base)
    env.update(msg.env)
    lay = msg.layout
    env.update({
        # NVML indices are PCI bus order; CUDA's default order is "fastest first".
        # Without this the same index can name a different GPU on mixed hosts.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in msg.gpu_indices),
        "MASTER_ADDR": msg.master_addr,
        "MASTER_PORT": str(msg.master_port),
        "NNODES": str(msg.nnodes),
        "NODE_RANK": str(msg.node_rank),
        "NPROC_PER_NODE": str(msg.nproc_per_node),
        "FRENZY_JOB_ID": msg.job_id,
        "FRENZY_ATTEMPT": str(msg.attempt),
        "FRENZY_NODE": node,
        "FRENZY_NNODES": str(msg.nnodes),
        "FRENZY_NODE_RANK": str(msg.node_rank),
        "FRENZY_NPROC_PER_NODE": str(msg.nproc_per_node),
        "FRENZY_RDZV_ID": msg.rdzv_id,
        "FRENZY_GPU_TYPE": lay.gpu_type,
        "FRENZY_GPU_UUIDS": ",".join(msg.gpu_uuids),
        "FRENZY_TP": str(lay.tp),
        "FRENZY_PP": str(lay.pp),
        "FRENZY_DP": str(lay.dp),
        "FRENZY_ZERO_STAGE": str(lay.zero_stage),
        "FRENZY_MICRO_BATCH": str(lay.micro_batch),
        "FRENZY_GRAD_ACCUM": str(lay.grad_accum),
        "FRENZY_RECOMPUTE": lay.recompute,
    })
    # Python jobs otherwise buffer stdout into the log file in 8 KiB blocks,
    # which makes a live log useless; a job may still opt out through msg.env.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def log_path_for(log_dir: Path, msg: LaunchMessage, node: str) -> Path:
    return log_dir / msg.job_id / f"attempt-{msg.attempt}" / f"{node}.log"


@dataclass
class Started:
    proc: subprocess.Popen
    log_path: Path
    argv: list[str]


def start(msg: LaunchMessage, node: str, log_dir: Path) -> Started:
    """Start this node's share of the job; raises LaunchError when it cannot start at all."""
    argv = build_argv(msg)
    env = build_env(msg, node)
    log_path = log_path_for(log_dir, msg, node)
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab", buffering=0)  # the child gets its own copy; ours is closed below
    except OSError as exc:
        raise LaunchError(f"cannot open log file {log_path}: {exc}") from exc
    try:
        header = (
            f"# frenzy agent {node}: job {msg.job_id} attempt {msg.attempt} at "
            f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
            f"# cwd={msg.workdir or os.getcwd()} CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}\n"
            f"# argv: {shlex.join(argv)}\n"
        )
        log.write(header.encode())
        try:
            proc = subprocess.Popen(
                argv, cwd=msg.workdir or None, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:  # command not found, not executable, bad workdir, ...
            text = _explain_start_failure(exc, argv, msg.workdir)
            log.write(f"# launch failed: {text}\n".encode())
            raise LaunchError(text) from exc
    finally:
        log.close()  # the child holds its own descriptor
    return Started(proc, log_path, argv)


def _explain_start_failure(exc: OSError, argv: list[str], workdir: str | None) -> str:
    if workdir and not os.path.isdir(workdir):
        return f"working directory {workdir!r} does not exist or is not a directory ({exc.strerror})"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {argv[0]!r} ({exc.strerror})"
    if isinstance(exc, PermissionError):
        return f"command not executable: {argv[0]!r} ({exc.strerror})"
    return f"cannot start {argv[0]!r}: {exc}"


# ---------------------------------------------------------------- process groups

def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a whole process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def group_exists(pgid: int) -> bool:
    return signal_group(pgid, 0)


def process_start_ticks(pid: int) -> int | None:
    """Kernel start time of ``pid`` (Linux /proc), to tell a process from a later one reusing its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])  # field 22 overall: starttime


def process_running(pid: int, start_ticks: int | None) -> bool:
    """Is ``pid`` still the same live (non-zombie) process we started?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to a signal probe
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    rest = stat[stat.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return False
    return start_ticks is None or int(rest[19]) == start_ticks
