"""The agent's spawner: a small process that forks each job's shim, so no job pays an interpreter.

Starting ``python shim.py`` for every job cost its node about 25 ms of CPU (the interpreter's
start-up) before the job ran; on a node starting many short jobs that was most of the agent's
work. The agent instead starts this process once (``python -I -S spawner.py FD``: stdlib only,
like the shim) and asks it, over a Unix socket, to start each job: it forks, and the child *is*
the shim (``shim.supervise``), in about a millisecond. The spawner stays single-threaded, which
is what makes a plain ``fork`` without ``exec`` safe here (forking the multi-threaded agent
would not be).

What a shim forked here does more than an exec'd one:
- it is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): whatever the job leaves behind,
  in any session, is re-parented to it, so when the command ends the shim kills and reaps the
  rest itself and writes ``clean`` in the exit file; the agent then skips its /proc search;
- its pid and start time go to a file beside its exit file (``PID_SUFFIX``) before the agent
  hears of it, so an agent that dies before recording the job finds it there on restart.

The spawner is the shims' parent and reaps them; a shim that died without writing its exit
file (SIGKILL) gets one written here from its wait status, as the agent's ``Popen.wait`` would
have reported it. The spawner exits when the agent's end of the socket closes; running shims
carry on (re-parented to init), as they did when the agent was their parent.

Protocol (SOCK_SEQPACKET, one message each way per job): the request is a JSON header line
(``exit_file``, ``argv``, ``cwd``) then the shim's launch bytes (``shim.encode_launch``), with
the job's log file descriptor attached (SCM_RIGHTS); the reply a JSON object, ``{"pid": N}``
or ``{"error": "..."}``.
"""

import ctypes
import json
import os
import signal
import socket
import sys

# Run as a script with -I, which leaves the script's directory off sys.path: the shim sits beside us.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import process_start_ticks  # noqa: E402
from shim import GUARDED, PID_SUFFIX, read_launch, supervise  # noqa: E402
from shim import write_atomic as _write_atomic  # noqa: E402  (never through a link: safefile)

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
MAX_REQUEST = 4 << 20


def _set_subreaper(libc: ctypes.CDLL) -> bool:
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0




def _become_shim(conn: socket.socket, wake: tuple[int, int], log_fd: int, header: dict, launch: bytes,
                 libc: ctypes.CDLL, session_w: int) -> None:
    """In the forked child: set up the job's session and output, then run the shim. Never returns."""
    code = 127
    try:
        conn.close()
        for fd in wake:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.close(session_w)  # tells the spawner the session exists
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        if log_fd > 2:
            os.close(log_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if null != 0:
            os.close(null)
        exit_file = header["exit_file"]
        try:
            env, identity, cgroup = read_launch(launch)
            if header.get("cwd"):
                os.chdir(header["cwd"])
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            print(f"# frenzy shim: cannot start {header['argv'][0]!r}: {exc}", file=sys.stderr, flush=True)
            _write_atomic(exit_file, "127\n")
            os._exit(127)
        reaper = _set_subreaper(libc)
        code = supervise(exit_file, list(header["argv"]), env, identity, reaper=reaper, cgroup=cgroup)
    except BaseException as exc:  # noqa: BLE001 - nothing may escape a forked child
        try:
            print(f"# frenzy shim: failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os._exit(code & 0xFF)


def _reap(shims: dict[int, str]) -> None:
    """Reap every ended child; a shim that left no exit status gets one from its wait status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exit_file = shims.pop(pid, None)
        if exit_file is not None and not os.path.exists(exit_file):
            try:
                _write_atomic(exit_file, f"{os.waitstatus_to_exitcode(status)}\n")
            except OSError:
                pass  # the agent reports "exit code unknown"


def _spawn(conn: socket.socket, wake: tuple[int, int], shims: dict[int, str], libc: ctypes.CDLL,
           data: bytes, fds: list[int]) -> dict:
    try:
        head, _, launch = data.partition(b"\n")
        header = json.loads(head)
        exit_file, argv = str(header["exit_file"]), [str(a) for a in header["argv"]]
        if not argv or len(fds) != 1:
            raise ValueError("a request needs a command and exactly one log descriptor")
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        return {"error": f"bad request: {exc}"}
    # The cancel signals stay blocked from the fork until the shim's handlers are in place
    # (shim.supervise unblocks them), so an early cancel is recorded, not lost.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, GUARDED)
    # The agent may signal the job's group the moment it has the pid: answer only once the
    # child leads its session (it closes its end of this pipe after setsid).
    session_r, session_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
        if pid == 0:
            os.close(session_r)
            _become_shim(conn, wake, fds[0], header, launch, libc, session_w)
    except OSError as exc:
        os.close(session_r)
        return {"error": f"cannot fork: {exc}"}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(fds[0])
        os.close(session_w)
    os.read(session_r, 1)  # EOF: setsid done (or the child already died)
    os.close(session_r)
    shims[pid] = exit_file
    ticks = process_start_ticks(pid)
    try:
        _write_atomic(exit_file + PID_SUFFIX, f"{pid} {ticks}\n")
    except OSError:
        pass  # only the crash-recovery hint is lost
    return {"pid": pid, "start_ticks": ticks}


def serve(conn: socket.socket) -> None:
    """Start a shim per request until the agent's end closes."""
    libc = ctypes.CDLL(None, use_errno=True)
    _set_subreaper(libc)  # a shim killed outright leaves its job's orphans to us, not to init
    wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    signal.set_wakeup_fd(wake[1], warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    shims: dict[int, str] = {}
    import select

    conn.send(b'{"ready": true}')  # the agent knows we run before it trusts us with a job
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    poller.register(wake[0], select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wake[0]:
                try:
                    while os.read(wake[0], 512):
                        pass
                except BlockingIOError:
                    pass
                _reap(shims)
                continue
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST, 4)
            if not data:
                return  # the agent is gone
            reply = _spawn(conn, wake, shims, libc, data, fds)
            conn.send(json.dumps(reply).encode())
        _reap(shims)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: spawner.py SOCKET_FD (started by the agent)", file=sys.stderr)
        return 2
    conn = socket.socket(fileno=int(argv[1]))
    # A Ctrl-C at the agent's terminal is the agent's to handle; we end when it closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        serve(conn)
    except (ConnectionError, OSError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
