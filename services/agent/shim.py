"""The agent's shim: runs one job's command and records how it ended in a file.

The agent starts every job as ``python -I -S shim.py EXIT_FILE -- ARGV...`` in a
new session. The shim is the session and process-group leader; the command
runs as its child in the same group, so a cancel's ``killpg`` reaches both.
Why it exists: a job outlives an agent restart, and only a process's parent
can learn its exit status. The shim is that parent, independent of the
agent, and writes the status to EXIT_FILE (atomically) for whichever agent
run is watching: a restarted agent still reports "exited 0" instead of
"exit code unknown".

Stdlib only and no site-packages (``-I -S``), so it starts in milliseconds.
The job's environment does not reach the shim's own process: the agent starts
it with only its markers and sends the command's environment, and the user it
runs as (``--run-as``), as one JSON object on stdin. So nothing a job sets
(``LD_PRELOAD``, say) runs inside the shim, which stays the agent's user
while the command becomes the job's.
Exit status: the command's (killed by signal N -> the shim kills itself with N).
"""

import json
import os
import signal
import subprocess
import sys

# The agent marks the shim (and only the shim: it is removed for the command)
# so that a restarted agent can find it in /proc by its launch id.
SHIM_MARKER = "FRENZY_SHIM"
# What a cancel sends: blocked from fork to the shim's handler (see main).
GUARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _write_status(path: str, code: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(f"{code}\n")
        os.replace(tmp, path)
    except OSError as exc:  # the agent then reports "exit code unknown"; the job itself is unaffected
        print(f"# frenzy shim: cannot write the exit status to {path}: {exc}", file=sys.stderr, flush=True)


def _read_launch(stream: object) -> tuple[dict[str, str], tuple[int, int, list[int]] | None]:
    """The command's environment and the identity to run it as (None: the shim's own), from the agent."""
    data = json.loads(stream.read())  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in data["env"].items()}
    run_as = data.get("run_as")
    if run_as is None:
        return env, None
    uid, gid, groups = run_as
    return env, (int(uid), int(gid), [int(g) for g in groups])


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: shim.py EXIT_FILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file, command = argv[1], argv[3:]
    try:
        env, identity = _read_launch(sys.stdin.buffer)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"# frenzy shim: bad launch on stdin: {exc}", file=sys.stderr, flush=True)
        _write_status(exit_file, 127)
        return 127

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
        if identity is None:
            child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
        else:  # --run-as: groups, then gid, then uid, in the child before exec
            uid, gid, groups = identity
            child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, user=uid, group=gid,
                                     extra_groups=groups)
    except OSError as exc:
        print(f"# frenzy shim: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_status(exit_file, 127)
        return 127
    if stopped:  # a cancel landed while the command was being started: pass it on
        child.send_signal(stopped[0])
    code = child.wait()  # PEP 475: retried across the noted signals
    _write_status(exit_file, code)
    if code < 0:
        # Die the same way, so the agent watching us sees "killed by signal N".
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
