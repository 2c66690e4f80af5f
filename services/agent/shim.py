"""The agent's shim: runs one job's command and records how it ended in a file.

The agent starts every job as ``python -I -S shim.py EXIT_FILE -- ARGV...`` in a
new session. The shim is the session and process-group leader; the command
runs as its child in the same group, so a cancel's ``killpg`` reaches both.
Why it exists: a job outlives an agent restart, and only a process's parent
can learn its exit status. The shim is that parent, independent of the
agent, and writes the status to EXIT_FILE (atomically) for whichever agent
run is watching: a restarted agent still reports "exited 0" instead of
"exit code unknown".

Stdlib only, no site-packages (``-I -S``), and only modules the interpreter loads anyway
(os, signal, sys): it starts in about the bare interpreter's time, paid once per job.
The job's environment does not reach the shim's own process: the agent starts
it with only its markers and sends the command's environment, and the user it
runs as (``--run-as``), on stdin (``encode_launch``). So nothing a job sets
(``LD_PRELOAD``, say) runs inside the shim, which stays the agent's user
while the command becomes the job's.
Exit status: the command's (killed by signal N -> the shim kills itself with N).
"""

import _signal as signal  # the C module: "signal" wraps it in enums, whose import doubles the start-up
import os
import sys

# The agent marks the shim (and only the shim: it is removed for the command)
# so that a restarted agent can find it in /proc by its launch id.
SHIM_MARKER = "FRENZY_SHIM"
# What a cancel sends: blocked from fork to the shim's handler (see main).
GUARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The launch on stdin: this tag, the identity ("" or "uid:gid:g1,g2"), the cgroup the command
# joins ("" for none), then the command's environment as KEY=VALUE entries, each field ending in
# NUL (no environment string or path can hold one). Not JSON: importing json (and subprocess)
# tripled the shim's start-up, paid per job.
HANDOVER_TAG = b"frenzy-shim/2"
# The exit file's second line when the shim, a child subreaper (the spawner's shims), saw every
# process of the job end: the agent then need not search /proc for stragglers.
CLEAN_MARK = "clean"
# Beside the exit file, for shims the spawner forks: "PID START_TICKS", written before the agent
# hears of the shim, so an agent that died before recording the job still finds it.
PID_SUFFIX = ".pid"
# What Python ignores for itself and the command gets back at the default, as subprocess does
# (restore_signals): a pipe reader that closes must stop a writer.
_DEFAULTED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))
# How many rounds of "kill what is left, reap it" before giving up on a job that forks as fast
# as it is killed (the agent's /proc search then takes over).
_STRAGGLER_ROUNDS = 1000


def encode_launch(env: dict[str, str], run_as: tuple[int, int, list[int]] | None, cgroup: str = "") -> bytes:
    """The stdin the shim reads (``read_launch``): the agent's side of the handover."""
    ident = "" if run_as is None else f"{run_as[0]}:{run_as[1]}:{','.join(str(g) for g in run_as[2])}"
    if "\0" in cgroup:
        raise ValueError("a cgroup path cannot hold NUL")
    fields = [HANDOVER_TAG, ident.encode(), cgroup.encode("utf-8", "surrogateescape")]
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"environment variable {key!r} cannot be passed to a process")
        fields.append(f"{key}={value}".encode("utf-8", "surrogateescape"))
    return b"\0".join(fields) + b"\0"


def read_launch(data: bytes) -> tuple[dict[str, str], tuple[int, int, list[int]] | None, str]:
    """The command's environment, the identity to run it as (None: the shim's own) and the cgroup it
    joins ("": none). ValueError when ``data`` is not a launch ``encode_launch`` made."""
    parts = data.split(b"\0")
    if len(parts) < 4 or parts[0] != HANDOVER_TAG or parts[-1] != b"":
        raise ValueError("not a frenzy launch")
    cgroup = parts[2].decode("utf-8", "surrogateescape")
    env: dict[str, str] = {}
    for item in parts[3:-1]:
        key, sep, value = item.decode("utf-8", "surrogateescape").partition("=")
        if not sep or not key:
            raise ValueError(f"bad environment entry {item[:40]!r}")
        env[key] = value
    ident = parts[1].decode()
    if not ident:
        return env, None, cgroup
    uid, gid, groups = ident.split(":")
    return env, (int(uid), int(gid), [int(g) for g in groups.split(",") if g]), cgroup


def write_atomic(path: str, text: str) -> None:
    """``text`` into ``path`` through a new temporary file beside it, renamed over it: created with
    O_EXCL and O_NOFOLLOW, so a link or a FIFO a job planted at either name is replaced, never
    followed or blocked on (the shim and the spawner may be root; see ``safefile``)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_status(path: str, code: int, clean: bool = False) -> None:
    """Record ``code`` (and, ``clean``, that nothing of the job outlived it) atomically."""
    try:
        write_atomic(path, f"{code}\n{CLEAN_MARK}\n" if clean else f"{code}\n")
    except OSError as exc:  # the agent then reports "exit code unknown"; the job itself is unaffected
        print(f"# frenzy shim: cannot write the exit status to {path}: {exc}", file=sys.stderr, flush=True)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _start(command: list[str], env: dict[str, str], identity: tuple[int, int, list[int]] | None,
           cgroup: str = "") -> int:
    """Start ``command``; its pid. OSError (with the exec's errno) when it could not start.

    posix_spawn where no identity switch is needed; otherwise os.fork and exec, switching in the
    child (posix_spawn cannot set ids). Not subprocess: the shim is single-threaded, so a plain
    fork is safe, and not importing subprocess is most of what keeps the shim's start-up near the
    bare interpreter's. A close-on-exec pipe tells the parent whether the exec happened (EOF) or
    why it failed.
    """
    if identity is None and not cgroup and hasattr(os, "posix_spawn"):
        # No identity to switch to: posix_spawn (vfork and exec: no copy of our page tables)
        # costs about a quarter of fork + exec here, and reports a failed exec as OSError itself.
        # The program is looked up on the *job's* PATH, as execvpe does (posix_spawnp would search
        # the shim's own).
        return os.posix_spawn(_which(command[0], env), command, env,
                              file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
                              setsigdef=_DEFAULTED)
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: become the command, or report why not
        try:
            os.close(rfd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            if null != 0:
                os.close(null)
            for sig in _DEFAULTED:
                signal.signal(sig, signal.SIG_DFL)
            if cgroup:  # the job's own cgroup, joined while still root: it cannot leave it (cgroups.py)
                cg = os.open(cgroup + "/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(cg, b"0")
                finally:
                    os.close(cg)
            if identity is not None:  # --run-as: groups, then gid, then uid
                uid, gid, groups = identity
                os.setgroups(groups)
                os.setgid(gid)
                os.setuid(uid)
            os.execvpe(command[0], command, env)
        except OSError as exc:
            os.write(wfd, f"{exc.errno or 0}:{exc.strerror or exc}".encode(errors="replace"))
        except BaseException as exc:  # noqa: BLE001 - nothing may escape a forked child
            os.write(wfd, f"0:{exc}".encode())
        os._exit(127)
    os.close(wfd)
    failure = _read_all(rfd)
    os.close(rfd)
    if failure:
        os.waitpid(pid, 0)
        errno_text, _, text = failure.decode(errors="replace").partition(":")
        raise OSError(int(errno_text) if errno_text.isdigit() else 0, text, command[0])
    return pid


def _which(program: str, env: dict[str, str]) -> str:
    """``program`` as exec would find it on ``env``'s PATH; FileNotFoundError when it is nowhere."""
    if "/" in program:
        return program
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", program)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    raise FileNotFoundError(2, "No such file or directory", program)


def _wait(pid: int, reaper: bool) -> int:
    """The child's exit as subprocess reports it: the code, or -N when killed by signal N.
    ``reaper``: orphans of the job are ours too; reap them as they end, so none lingers as a zombie."""
    while True:
        try:
            got, status = os.waitpid(-1 if reaper else pid, 0)
        except InterruptedError:  # (PEP 475 retries; kept for clarity on older kernels' EINTR)
            continue
        if got == pid:
            return os.waitstatus_to_exitcode(status)


def _children() -> list[int] | None:
    """This process's children (Linux /proc/self/task/*/children); None where the kernel does not say."""
    kids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as fh:
                kids.extend(int(p) for p in fh.read().split())
    except (OSError, ValueError):
        return None
    return kids


def end_stragglers() -> bool:
    """Kill and reap whatever of the job outlived its command; True when nothing is left.

    Only meaningful in a child subreaper (the spawner makes its shims so): every process the job
    left behind, in any session, has been re-parented to us, so "no children" means "nothing of
    the job runs". Each round kills the current children; their own children come to us next.
    """
    for _ in range(_STRAGGLER_ROUNDS):
        kids = _children()  # (zombies included: they are children until reaped)
        if kids is None:
            return False
        if not kids:
            return True
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for kid in kids:  # only these: a grandchild re-parented meanwhile is killed next round
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass
    return False


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: shim.py EXIT_FILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file, command = argv[1], argv[3:]
    try:
        env, identity, cgroup = read_launch(_read_all(0))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        print(f"# frenzy shim: bad launch on stdin: {exc}", file=sys.stderr, flush=True)
        _write_status(exit_file, 127)
        return 127
    return supervise(exit_file, command, env, identity, cgroup=cgroup)


def supervise(exit_file: str, command: list[str], env: dict[str, str],
              identity: tuple[int, int, list[int]] | None, reaper: bool = False, cgroup: str = "") -> int:
    """The shim's work once it leads the job's session with its output in place: take cancels,
    start ``command``, wait for it, record how it ended. -> its exit code (a signal: dies of it).
    ``reaper``: this process is a child subreaper (``spawner``); stragglers are ended here."""
    # Group signals (cancel) reach the command directly; the shim must outlive
    # it to record the status. Handlers (unlike SIG_IGN) are reset by exec, so
    # the command still gets the default dispositions. The agent starts us with
    # these signals blocked (launcher.start): a cancel that arrives while this
    # interpreter starts stays pending instead of killing us before we could
    # record anything, and is taken here, once the handler is in place.
    stopped: list[int] = []

    def _note(signum: int, _frame: object) -> None:
        stopped.append(signum)

    for sig in GUARDED:
        signal.signal(sig, _note)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, GUARDED)
    if stopped:  # cancelled before the command started: it never runs
        _write_status(exit_file, -stopped[0])
        signal.signal(stopped[0], signal.SIG_DFL)
        os.kill(os.getpid(), stopped[0])
        return 128 + stopped[0]
    try:
        child = _start(command, env, identity, cgroup)
    except OSError as exc:
        print(f"# frenzy shim: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_status(exit_file, 127)
        return 127
    if stopped:  # a cancel landed while the command was being started: pass it on
        try:
            os.kill(child, stopped[0])
        except ProcessLookupError:
            pass
    code = _wait(child, reaper)  # PEP 475: retried across the noted signals
    _write_status(exit_file, code, clean=reaper and end_stragglers())
    if code < 0:
        # Die the same way, so the agent watching us sees "killed by signal N".
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
