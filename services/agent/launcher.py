"""Turn one LaunchMessage into a running process: environment, argv, log file, process group.

Pure helpers (``build_env``, ``build_argv``, ``inject_torchrun``) plus
``start()``, which does the Popen. Every job runs under the shim
(``shim.py``) in its own session/process group, so a cancel can signal the
whole tree at once, the job survives an agent restart, and its exit status
is written to a file any later agent run can read. Processes that leave the
group (torchrun starts each worker in a session of its own) are still found
through the launch id every descendant inherits in its environment
(``FRENZY_LAUNCH_ID``). Nothing here talks to Redis: the daemon reports what
happened.

The job's environment is built, never copied from the agent's: an allowlist of
the agent's variables (``jobenv``), the operator's ``--env``, the job's own
env, then Frenzy's variables. Its log path is the agent's LOG_DIR/JOB/attempt-N/
NODE.log and must stay under LOG_DIR whatever the job id says.

The torchrun contract: when the command is ``torchrun ...`` (or ``python -m
torch.distributed.run ...``) the agent inserts the rendezvous options the
user did not give himself, right after the launcher: ``--nnodes``,
``--nproc-per-node``, ``--node-rank``, ``--rdzv-id`` and either
``--master-addr``/``--master-port`` (static rendezvous, node ranks as planned)
or, if the user chose ``--rdzv-backend``/``--rdzv-endpoint``, the endpoint
``MASTER_ADDR:MASTER_PORT``. Options the user wrote (e.g. ``--nproc-per-node 1``
or ``--master-port {master_port}``) win. The same values are exported as
``PET_*`` variables, which torchrun reads as defaults, so a torchrun started by
the user's own script (``bash train.sh``) joins the same rendezvous.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from frenzy.agent import jobenv, safefile
from frenzy.agent.launch_check import under
from frenzy.agent.procs import process_running as process_running
from frenzy.agent.procs import process_start_ticks as process_start_ticks
from frenzy.agent.run_as import JobUser
from frenzy.agent.shim import GUARDED, PID_SUFFIX, SHIM_MARKER, encode_launch
from frenzy.agent.spawning import (
    SpawnedShim,
    Spawner,
    SpawnerFailed,
    SpawnerUnavailable,
    default_spawner,
    pid_from,
    read_status,
)
from frenzy.state.messages import LaunchMessage

SHIM = Path(__file__).resolve().with_name("shim.py")
_log = logging.getLogger(__name__)
_warned_fallback = False  # said once per process, not per job
LAUNCH_ID_VAR = "FRENZY_LAUNCH_ID"


# A spawn that fails with one of these says the host is short of something, not that the job is wrong.
_HOST_ERRNOS = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC})


class LaunchError(RuntimeError):
    """The process could not be started; the message is what the user should read.

    ``retryable``: the host's fault, not the job's (the spawner failed, no cgroup, the log directory
    cannot be written): another node may start it, so the scheduler requeues rather than fails it."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


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
        # {stage_layers} {local_micro_batch}: a mixed plan's, where the node's ranks agree (else
        # left as written; docs/mixed-plans.md); a single-type plan's micro-batch is every rank's
        **(jobenv.contract_placeholders(lay.contract) if lay.contract
           else {"local_micro_batch": str(lay.micro_batch)}),
    }


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(arg: str, values: Mapping[str, str]) -> str:
    """Replace known ``{name}`` placeholders; anything else (JSON, ``{unknown}``) stays as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


def build_argv(msg: LaunchMessage) -> list[str]:
    """The argv to run: placeholders substituted, then torchrun's rendezvous options added."""
    values = placeholder_values(msg)
    return inject_torchrun([substitute(a, values) for a in msg.command], msg)


# ---------------------------------------------------------------- torchrun

# torchrun options that take no value (everything else starting with "-" takes one,
# as "--opt=value" or "--opt value"); from torch/distributed/run.py.
_TORCHRUN_FLAGS = {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                   "--virtual-local-rank", "--virtual_local_rank"}


def torchrun_start(argv: list[str]) -> int | None:
    """Index of torchrun's first own option in ``argv``, or None when the command is not torchrun."""
    if not argv:
        return None
    if os.path.basename(argv[0]) == "torchrun":
        return 1
    if (os.path.basename(argv[0]).startswith("python") and len(argv) >= 3 and argv[1] == "-m"
            and argv[2] == "torch.distributed.run"):
        return 3
    return None


def torchrun_options(argv: list[str], start: int) -> dict[str, str | None]:
    """torchrun's own options in ``argv`` (up to the training script), names with dashes: value or None."""
    out: dict[str, str | None] = {}
    i = start
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "--":
            break  # the training script (or program): its arguments are not torchrun's
        name, eq, value = arg.partition("=")
        key = "--" + name.lstrip("-").replace("_", "-") if name.startswith("--") else name
        if eq:
            out[key] = value
        elif name in _TORCHRUN_FLAGS:
            out[key] = None
        else:
            out[key] = argv[i + 1] if i + 1 < len(argv) else None
            i += 1
        i += 1
    return out


def inject_torchrun(argv: list[str], msg: LaunchMessage) -> list[str]:
    """``argv`` with the rendezvous options of this launch added, when it is a torchrun command.

    Only options the user did not give are added (his win); ``--standalone``
    means the user wants a single-node run and gets nothing added.
    """
    start = torchrun_start(argv)
    if start is None:
        return list(argv)
    given = torchrun_options(argv, start)
    if "--standalone" in given:
        return list(argv)
    add: list[str] = []

    def opt(name: str, value: object) -> None:
        if name not in given:
            add.append(f"{name}={value}")

    opt("--nnodes", msg.nnodes)
    opt("--nproc-per-node", msg.nproc_per_node)
    opt("--node-rank", msg.node_rank)
    if "--rdzv-endpoint" in given or given.get("--rdzv-backend", "static") != "static":
        opt("--rdzv-endpoint", f"{msg.master_addr}:{msg.master_port}")
    else:
        opt("--master-addr", msg.master_addr)
        opt("--master-port", msg.master_port)
    opt("--rdzv-id", msg.rdzv_id)
    return [*argv[:start], *add, *argv[start:]]


def build_env(msg: LaunchMessage, node: str, base: Mapping[str, str] | None = None,
              extra: Mapping[str, str] | None = None, launch_id: str = "", pass_env: Iterable[str] = (),
              user: JobUser | None = None, run_dir: str = "", checkpoint_root: str = "") -> dict[str, str]:
    """The job's environment: the allowed part of the agent's (``base``, default ``os.environ``; see
    ``jobenv.inherited``), the job user's login variables (``--run-as``), the agent's ``--env``, the
    message's ``env``, then Frenzy's. ``run_dir``: the attempt's own directory on this node
    (``FRENZY_RUN_DIR``, see ``run_dir_for``). ``checkpoint_root``: the agent's ``--checkpoint-root``;
    the job gets ``FRENZY_CHECKPOINT_DIR=ROOT/<job id>``, the same for every attempt (none without it).

    Frenzy's variables win over ``msg.env`` so a job can never be told to use
    GPUs other than the ones reserved for it (the launch check refuses a job
    that tries). Placeholders (``{job_id}``) in the message's values are substituted.
    """
    env = jobenv.inherited(os.environ if base is None else base, pass_env)
    if user is not None:
        env.update(user.login_env())
    env.update(extra or {})
    values = placeholder_values(msg)
    env.update({k: substitute(v, values) for k, v in msg.env.items()})
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
        # torchrun reads PET_<OPTION> as the option's default: a torchrun the
        # job's own script starts joins the same rendezvous (explicit options win).
        "PET_NNODES": str(msg.nnodes),
        "PET_NPROC_PER_NODE": str(msg.nproc_per_node),
        "PET_NODE_RANK": str(msg.node_rank),
        "PET_MASTER_ADDR": msg.master_addr,
        "PET_MASTER_PORT": str(msg.master_port),
        "PET_RDZV_ID": msg.rdzv_id,
        **jobenv.contract_env(lay.contract),  # a mixed plan's FRENZY_STAGE .. FRENZY_LOSS_SCALE
    })
    if run_dir:
        env["FRENZY_RUN_DIR"] = run_dir
        if "TMPDIR" not in msg.env:  # a private tmp (the job's own choice, in its env, wins)
            env["TMPDIR"] = os.path.join(run_dir, TMP_DIR)
    if checkpoint_root:
        env[jobenv.CHECKPOINT_DIR_VAR] = jobenv.checkpoint_dir(checkpoint_root, msg.job_id)
    else:
        env.pop(jobenv.CHECKPOINT_DIR_VAR, None)  # from the job's own env: it is Frenzy's to set
    if launch_id:
        # Inherited by every descendant, even ones in other sessions (torchrun's
        # workers): how the agent finds all of a job's processes.
        env[LAUNCH_ID_VAR] = launch_id
    else:
        env.pop(LAUNCH_ID_VAR, None)
    # Python jobs otherwise buffer stdout into the log file in 8 KiB blocks,
    # which makes a live log useless; a job may still opt out through msg.env.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def workdir_for(msg: LaunchMessage) -> str | None:
    """The job's working directory as written (placeholders substituted); None: the agent's own."""
    return substitute(msg.workdir, placeholder_values(msg)) if msg.workdir else None


def resolved_workdir(msg: LaunchMessage) -> str | None:
    """The job's working directory with every symlink and ``..`` resolved (what the launch check judges)."""
    workdir = workdir_for(msg)
    return os.path.realpath(workdir) if workdir else None


def log_path_for(log_dir: Path, msg: LaunchMessage, node: str) -> Path:
    """``LOG_DIR/JOB/attempt-N/NODE.log``; raises LaunchError if it would resolve outside LOG_DIR.

    Launch messages only carry safe job ids (``messages.SafeName``); this is
    the second lock on the same door.
    """
    path = log_dir / msg.job_id / f"attempt-{msg.attempt}" / f"{node}.log"
    root = os.path.realpath(log_dir)
    if not under(os.path.realpath(path), root):
        raise LaunchError(f"the log path of job {msg.job_id!r} would leave the agent's log directory {root}")
    return path


def prepare_checkpoint_dir(root: str, path: str, user: JobUser | None = None) -> None:
    """Make the job's checkpoint directory ``path`` (``ROOT/<job id>``) if it is not there yet, owned
    by the job's user; raises LaunchError when it cannot, or when what is there is not a plain
    directory right under ROOT.

    Kept when it exists: what an earlier attempt saved there is what the next one resumes from.
    Every node of a job makes the same directory on a shared filesystem, hence ``exist_ok``. A job
    may write under ROOT, so an entry there may be a symlink it planted for a job that has not
    started yet: it is refused (never followed, never chowned), and the path must resolve to a
    directory directly under ROOT's real path.
    """
    try:
        if not os.path.isdir(root):
            Path(root).mkdir(parents=True, exist_ok=True)
            os.chmod(root, JOB_DIR_MODE)  # made here: jobs may enter it, not list it
        try:
            os.mkdir(path, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
        info = os.lstat(path)
    except OSError as exc:
        raise LaunchError(f"cannot make the checkpoint directory {path} (--checkpoint-root {root}): "
                          f"{exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode) or os.path.dirname(os.path.realpath(path)) != os.path.realpath(root):
        raise LaunchError(f"the checkpoint directory {path} is not a directory directly under the agent's "
                          f"--checkpoint-root {root} (a symlink or a file is there); remove it")
    owner = user if user is not None and user.switches() else None
    if owner is not None and info.st_uid not in (owner.uid, os.geteuid()):
        # Someone else's directory where this job's should be: made ahead of the job by another
        # account (in a checkpoint root jobs may write in) to feed it a checkpoint. Never handed over.
        raise LaunchError(f"the checkpoint directory {path} belongs to uid {info.st_uid}, not to the job's user "
                          f"{owner.name} (uid {owner.uid}); remove it")
    try:
        fd = safefile.open_dir(path)
        try:
            if owner is not None and info.st_uid != owner.uid:
                os.fchown(fd, owner.uid, owner.gid)  # the job saves there as its own user
            os.fchmod(fd, PRIVATE_DIR_MODE)  # its user's alone
        finally:
            os.close(fd)
    except OSError as exc:
        who = f"uid {owner.uid}" if owner is not None else "the agent"
        raise LaunchError(f"cannot give the checkpoint directory {path} to {who}: {exc.strerror or exc}") from None


# LOG_DIR/JOB and LOG_DIR/JOB/attempt-N: the agent's (root's), traversable by the job's user (to reach
# its run directory) but not listable, so no job learns which other jobs ran here.
JOB_DIR_MODE = 0o711
PRIVATE_DIR_MODE = 0o700
LOG_FILE_MODE = 0o600
TMP_DIR = "tmp"  # in the run directory: the job's TMPDIR, its own


def make_job_dirs(attempt_dir: Path) -> None:
    """Make ``LOG_DIR/JOB/attempt-N`` (and ``LOG_DIR/JOB``) ``JOB_DIR_MODE`` where missing. OSError
    when one is there but is not a plain directory (a link planted for a job not started yet)."""
    for folder in (attempt_dir.parent, attempt_dir):
        try:
            os.mkdir(folder, JOB_DIR_MODE)
            os.chmod(folder, JOB_DIR_MODE, follow_symlinks=False)  # whatever the umask took away
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a plain directory (a link or a file)", str(folder)) from None
        except FileNotFoundError:  # the log directory itself is missing (removed by hand): make it
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(folder, JOB_DIR_MODE)
            os.chmod(folder, JOB_DIR_MODE, follow_symlinks=False)


def make_private_dir(path: Path, owner: JobUser | None) -> None:
    """``path`` as a directory of ``owner``'s (the agent's own when None) that only it may enter (0700).
    What a previous start left there is kept if it is a plain directory; anything else (a link, a
    FIFO, a file) is removed first, never followed."""
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            os.mkdir(path, PRIVATE_DIR_MODE)
    fd = safefile.open_dir(path)
    try:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)


def open_log(log_path: Path, owner: JobUser | None):  # -> a raw binary file, append mode
    """The job's log, opened for appending (created 0600, ``owner``'s): never through a link, never a
    FIFO or a device someone put in its place (safefile)."""
    fd = safefile.open_in(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, LOG_FILE_MODE)
    try:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, LOG_FILE_MODE)
        return os.fdopen(fd, "ab", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def run_dir_for(log_path: str | os.PathLike[str]) -> Path:
    """The attempt's own directory on this node, next to its log (``FRENZY_RUN_DIR``): where the job
    tells the agent what only it knows, e.g. its peak GPU memory (``PEAK_FILE``)."""
    return Path(log_path).with_suffix(".run")


# A job may write its peak memory per GPU (bytes, a whole number: e.g. torch.cuda.max_memory_reserved()
# plus its CUDA context) to $FRENZY_RUN_DIR/peak_bytes; the agent reports it with the exit. On fake
# GPUs it is the only observation there is; on real ones the larger of it and what NVML saw counts.
PEAK_FILE = "peak_bytes"
_PEAK_FILE_MAX = 64  # bytes read: a number, not a document


def read_declared_peak(log_path: str | os.PathLike[str]) -> int:
    """The peak bytes per GPU the job wrote to ``PEAK_FILE`` in its run directory (0: none or unreadable)."""
    # The job owns its run directory: the file may be a FIFO, a link or a device it planted, so it is
    # opened without blocking or following anything, and only a regular file is read (safefile).
    try:
        text = safefile.read_capped(run_dir_for(log_path) / PEAK_FILE, _PEAK_FILE_MAX).decode("ascii", "replace")
        value = int(float(text.partition("\n")[0].strip()))  # "8.5e9" is accepted as well as "8500000000"
    except (OSError, ValueError, OverflowError):
        return 0
    return value if 0 < value < 2**62 else 0


def read_log_end(log_path: str | os.PathLike[str], max_bytes: int = 64 * 1024) -> str:
    """The last ``max_bytes`` of a job's log as text ("" when unreadable): enough to find the error
    above torchrun's summary of a failed worker."""
    try:  # (a job that runs as the agent's user could have put a FIFO or a link there: safefile)
        fd = safefile.open_in(log_path)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - max_bytes), os.SEEK_SET)
        data = os.read(fd, max_bytes)
    except OSError:
        return ""
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    return text if size <= max_bytes else text.partition("\n")[2]  # the first line read is cut: dropped


def exit_path_for(log_path: str | os.PathLike[str]) -> Path:
    """Where the shim records the job's exit status: next to its log."""
    return Path(log_path).with_suffix(".exit")


def read_exit_status(log_path: str | os.PathLike[str]) -> int | None:
    """The exit status the shim recorded for the job logging to ``log_path``, or None."""
    return read_status(exit_path_for(log_path))[0]


def spawned_pid(log_path: str | os.PathLike[str]) -> int | None:
    """The running shim the spawner forked for the job logging to ``log_path`` (its pid file), if any."""
    return pid_from(Path(f"{exit_path_for(log_path)}{PID_SUFFIX}"))


@dataclass
class ShimStarted:
    """A job's shim once ``start`` has it running (not the scheduler's ``agent_events.Started``, the
    outcome of a node's "started" event)."""

    # The shim, leader of the job's session and process group: forked by the spawner (the
    # usual way) or exec'd by us (where the spawner cannot run).
    proc: SpawnedShim | subprocess.Popen
    log_path: Path
    argv: list[str]
    # Bytes the log held before this start wrote to it: 0 means a new file, so nothing of it was
    # ever shipped and the log shipper need not ask Redis where it stopped.
    log_start: int = -1


def start(msg: LaunchMessage, node: str, log_dir: Path, launch_id: str = "",
          extra_env: Mapping[str, str] | None = None, pass_env: Iterable[str] = (),
          user: JobUser | None = None, checkpoint_root: str = "",
          spawner: Spawner | None | bool = None, cgroup: str = "") -> ShimStarted:
    """Start this node's share of the job; raises LaunchError when it cannot start at all.

    ``spawner``: which spawner forks the shim (None: this process's; False: none, exec the shim
    as a new interpreter, which is also the fallback when the spawner cannot run).
    ``user``: run the command as this user (``--run-as``); None: as the agent's.
    ``checkpoint_root``: the agent's ``--checkpoint-root`` ("" for none); the job's directory under it
    is made here (``prepare_checkpoint_dir``).
    ``cgroup``: the job's own cgroup (``cgroups.JobCgroups.create``), which its command joins before
    exec ("": none).
    """
    argv = build_argv(msg)
    workdir = resolved_workdir(msg)
    log_path = log_path_for(log_dir, msg, node)
    run_dir = run_dir_for(log_path)
    try:
        env = build_env(msg, node, extra=extra_env, launch_id=launch_id, pass_env=pass_env, user=user,
                        run_dir=str(run_dir), checkpoint_root=checkpoint_root)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if checkpoint_root:
        prepare_checkpoint_dir(checkpoint_root, env[jobenv.CHECKPOINT_DIR_VAR], user)
    owner = user if user is not None and user.switches() else None
    try:
        make_job_dirs(log_path.parent)
        # The job's own places, its user's alone (0700): the run directory and, in it, a private tmp.
        make_private_dir(run_dir, owner)
        make_private_dir(run_dir / TMP_DIR, owner)
        (run_dir / PEAK_FILE).unlink(missing_ok=True)  # an earlier run of the same attempt's is not ours
        log = open_log(log_path, owner)  # the child gets its own copy; ours is closed below
        log_start = log.tell()  # append mode: the end, before our header
    except OSError as exc:
        raise LaunchError(f"cannot open log file {log_path}: {exc}", retryable=True) from exc
    try:
        header = (
            f"# frenzy agent {node}: job {msg.job_id} attempt {msg.attempt} at "
            f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
            f"# cwd={workdir or os.getcwd()} CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"
            f"{f' user={user.name}' if user is not None and user.switches() else ''}\n"
            f"# argv: {shlex.join(argv)}\n"
        )
        log.write(header.encode())
        problem = _why_not_startable(argv, workdir, env)
        if problem:
            log.write(f"# launch failed: {problem}\n".encode())
            raise LaunchError(problem)
        exit_path = exit_path_for(log_path)
        exit_path.unlink(missing_ok=True)  # a status left by an earlier run of the same attempt is not ours
        # The shim's own process gets only its markers (how a restarted agent finds it); the
        # command's environment and user go over stdin, so nothing the job sets runs in the shim.
        shim_env = {SHIM_MARKER: launch_id or "1"}
        if launch_id:
            shim_env[LAUNCH_ID_VAR] = launch_id
        identity = user.as_shim_arg() if user is not None and user.switches() else None
        try:
            handover = encode_launch(env, identity, cgroup)
        except ValueError as exc:
            log.write(f"# launch failed: {exc}\n".encode())
            raise LaunchError(str(exc)) from None
        if spawner is not False:
            forker = default_spawner() if spawner is None or spawner is True else spawner
            try:
                shim = forker.spawn(argv, workdir, exit_path, handover, log.fileno())
            except SpawnerFailed as exc:
                log.write(f"# launch failed: {exc}\n".encode())
                raise LaunchError(str(exc), retryable=True) from exc
            except SpawnerUnavailable as exc:
                global _warned_fallback
                if not _warned_fallback:
                    _warned_fallback = True
                    _log.warning("starting jobs' shims as new interpreters (slower): %s", exc)
            else:
                return ShimStarted(shim, log_path, argv, log_start)
        # The child inherits this thread's signal mask across exec: the shim starts with a
        # cancel's signals blocked and takes them once it can record them (shim.py).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, GUARDED)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SHIM), str(exit_path), "--", *argv],
                cwd=workdir, env=shim_env, stdin=subprocess.PIPE,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:  # the workdir vanished meanwhile, out of processes, ...
            text = f"cannot start {argv[0]!r}: {exc}"
            log.write(f"# launch failed: {text}\n".encode())
            # Out of processes, memory or descriptors is the host's state; a missing directory is the job's.
            raise LaunchError(text, retryable=exc.errno in _HOST_ERRNOS) from exc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    finally:
        log.close()  # the child holds its own descriptor
    try:
        with proc.stdin:  # type: ignore[union-attr]
            proc.stdin.write(handover)  # type: ignore[union-attr]
    except BrokenPipeError:
        pass  # the shim died before reading (killed at once): its exit is reported like any other
    return ShimStarted(proc, log_path, argv, log_start)


def _why_not_startable(argv: list[str], workdir: str | None, env: Mapping[str, str]) -> str | None:
    """Why ``argv`` cannot start (checked here, so the error is the agent's clear text, not the shim's)."""
    if workdir and not os.path.isdir(workdir):
        return f"working directory {workdir!r} does not exist or is not a directory"
    exe = argv[0]
    if os.sep in exe:
        path = exe if os.path.isabs(exe) else os.path.join(workdir or os.getcwd(), exe)
        if not os.path.exists(path):
            return f"command not found: {exe!r} (No such file or directory)"
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return f"command not executable: {exe!r} (Permission denied)"
        return None
    if shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        return f"command not found: {exe!r} (not on the job's PATH: {env.get('PATH', os.defpath)})"
    return None


def port_in_use(port: int) -> bool:
    """Is ``port`` already bound on this host (by something that is not in TIME_WAIT)?"""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like torch's TCPStore
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
        finally:
            sock.close()
    return False


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


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in b"\0" + fh.read()
    except OSError:  # gone, or another user's process
        return False


# How long a search of /proc may take. Reading a process's environ takes its memory map's lock,
# which a job can hold for as long as it likes (a page fault on a FUSE file it serves itself): a
# search stuck there is left behind and the caller goes on without it (the job's cgroup, its
# process group and its shim's subreaping still end it).
PROC_SCAN_TIMEOUT_S = 5.0


def find_processes(launch_id: str, shim_only: bool = False,
                   timeout_s: float | None = PROC_SCAN_TIMEOUT_S) -> list[int]:
    """Live processes of this host that belong to ``launch_id`` (Linux /proc), lowest pid first;
    [] when the search did not end within ``timeout_s`` (None: no limit).

    ``shim_only``: just the job's shim (the process group leader the agent watches).
    """
    if timeout_s is None:
        return _find_processes(launch_id, shim_only)
    found = safefile.bounded(lambda: _find_processes(launch_id, shim_only), timeout_s, default=None,
                             what="proc-scan")
    if found is None:
        _log.warning("the search of /proc for the processes of %s did not end within %.0f s (a process "
                     "holds its memory map); going on without it", launch_id, timeout_s)
        return []
    return found


def _find_processes(launch_id: str, shim_only: bool) -> list[int]:
    if not launch_id:
        return []
    name = SHIM_MARKER if shim_only else LAUNCH_ID_VAR
    needle = f"\0{name}={launch_id}\0".encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _environ_has(pid, needle) and process_running(pid, None):
            found.append(pid)
    if shim_only and len(found) > 1:
        # Between fork and exec, the shim's child still carries the shim's environment: a
        # process whose parent is a match is that child, not a second shim.
        found = [pid for pid in found if _parent(pid) not in found]
    return sorted(found)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])  # field 4 overall: ppid


def kill_launch(launch_id: str, sig: int) -> list[int]:
    """Send ``sig`` to every process of ``launch_id`` (its group and whatever left it); the pids signalled."""
    hit = []
    for pid in find_processes(launch_id):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            pass
    return hit
