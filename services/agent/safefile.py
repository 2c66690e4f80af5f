"""Opening files a job can reach, without letting the job stall or steer the agent.

A job may plant anything where it can write: its run directory (``FRENZY_RUN_DIR``), and, when it
runs as the agent's own user, the whole attempt directory next to its log (the exit and pid files,
the log itself). The agent is root on a GPU host, so a plain ``open()`` of such a path is a door:

- a FIFO blocks ``open()`` until someone opens the other end (issue 34: a job made ``peak_bytes`` a
  FIFO, the agent's watcher blocked for ever, the job stayed RUNNING and held its GPU, and a
  restarted agent blocked again on adoption);
- a symlink makes root read or write a file of the job's choosing (``/etc/shadow``, a credential);
- a device or a huge file makes a read endless.

So every such open here is ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once, or fails with ENXIO
for a writer), checked to be a regular file with ``fstat`` before a byte is read, and every read
is capped. A directory on the way is opened the same way (``O_DIRECTORY | O_NOFOLLOW``) and the
file under it with ``dir_fd``, so a symlinked run directory leads nowhere either. A read that
could still stall (a file on a hung network filesystem: ``O_NONBLOCK`` means nothing for regular
files) runs under ``bounded``, which gives up after a timeout and lets the agent go on.

Stdlib only, and importable by the shim and the spawner (``python -I -S``), which write the exit
and pid files through ``write_atomic``.
"""

import itertools
import os
import stat

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


_SERIAL = itertools.count()  # temporary names of one process's concurrent writes differ


class NotRegular(OSError):
    """The path is there but is not a plain file (a FIFO, a device, a directory, a socket)."""


def _split(path):
    path = os.fspath(path)
    return os.path.dirname(path) or ".", os.path.basename(path)


def open_dir(path) -> int:
    """A descriptor of the directory ``path`` itself (OSError when it is a symlink or not a directory)."""
    return os.open(os.fspath(path), _DIR)


def open_regular(path, flags: int = os.O_RDONLY, mode: int = 0o600, dir_fd: int | None = None) -> int:
    """``os.open`` with O_NOFOLLOW and O_NONBLOCK added, refusing whatever is not a regular file
    (NotRegular) before the caller reads or writes it. The last component only: see ``open_in``."""
    fd = os.open(os.fspath(path), flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, mode,
                 dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegular(f"{os.fspath(path)!r} is not a regular file")
    return fd


def open_in(path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """``open_regular`` of ``path`` through its directory opened without following a symlink: neither
    the file nor its directory may be a link."""
    folder, name = _split(path)
    dfd = open_dir(folder)
    try:
        return open_regular(name, flags, mode, dir_fd=dfd)
    finally:
        os.close(dfd)


def read_capped(path, max_bytes: int, tail: bool = False, through_dir: bool = True) -> bytes:
    """At most ``max_bytes`` of the regular file ``path`` (its last ones with ``tail``). OSError
    (FileNotFoundError, NotRegular, ELOOP for a symlink, ...) when it cannot be read safely."""
    fd = open_in(path) if through_dir else open_regular(path)
    try:
        if tail:
            size = os.fstat(fd).st_size
            if size > max_bytes:
                os.lseek(fd, size - max_bytes, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text_capped(path, max_bytes: int) -> str:
    return read_capped(path, max_bytes).decode("utf-8", "replace")


def write_atomic(path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a fresh temporary file beside it (O_EXCL, O_NOFOLLOW: never a
    file someone planted) renamed over it; what was at ``path`` (a link, a FIFO) is replaced, never
    followed."""
    folder, name = _split(path)
    dfd = open_dir(folder)
    try:
        tmp = f".{name}.tmp.{os.getpid()}.{next(_SERIAL)}"
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            data = text.encode()
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def append(path, data: bytes) -> None:
    """Append ``data`` to the regular file ``path`` (not created; never through a link, never a FIFO)."""
    fd = open_in(path, os.O_WRONLY | os.O_APPEND)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def bounded(fn, timeout_s: float, default=None, what: str = ""):
    """``fn()``, or ``default`` when it has not returned within ``timeout_s`` (it goes on in a daemon
    thread: a read stuck in the kernel cannot be interrupted, only left behind) or raised."""
    import threading  # (not at the top: the shim and the spawner import this module, and need no threads)

    box: list = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except Exception as exc:  # noqa: BLE001 - the caller gets ``default``
            box.append((False, exc))

    worker = threading.Thread(target=run, name=f"bounded-{what or 'read'}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not box or not box[0][0]:
        return default
    return box[0][1]
