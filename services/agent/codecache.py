"""A node's cache of unpacked job code, and each job's working directory made from it.

A launch that carries ``code_sha256`` runs in a directory of its own: the agent reads the blob
from Redis (``frenzy.state.code_store.CodeReader``, sha256 checked), unpacks it once per hash
into ``STATE_DIR/code/<sha256>/tree`` (``frenzy.code.unpack.safe_extract``: nothing may land
outside), and copies that tree into ``STATE_DIR/work/<job>/attempt-<n>/<node>``, the job's working
directory. A copy, not hard links: a job that rewrites one of its files in place must not
change the cached tree the next job of the same hash starts from.

The cache entry appears atomically (unpacked in a scratch directory, renamed when complete),
so an agent killed mid-unpack leaves only scratch that the next run removes. With
``--run-as`` the working directory is given to the job's user; the cache stays the agent's.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from frenzy.agent.run_as import JobUser
from frenzy.code.unpack import DEFAULT_MAX_UNPACKED_BYTES, safe_extract
from frenzy.state.code_store import DEFAULT_MAX_CODE_BYTES, CodeReader, check_sha256

log = logging.getLogger(__name__)


class CodeUnavailable(RuntimeError):
    """The job's code cannot be had or used here; the message is what the user reads."""


class CodeCache:
    """``STATE_DIR/code`` (unpacked trees by sha256) and ``STATE_DIR/work`` (one copy per job attempt)."""

    def __init__(self, state_dir: str | os.PathLike[str], reader: CodeReader,
                 max_blob_bytes: int = DEFAULT_MAX_CODE_BYTES,
                 max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES) -> None:
        base = Path(state_dir)
        self.code_dir = base / "code"
        self.work_dir = base / "work"
        self.reader = reader
        self.max_blob_bytes = max_blob_bytes
        self.max_unpacked_bytes = max_unpacked_bytes
        self._lock = threading.Lock()
        for d in (self.code_dir, self.work_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for scratch in self.code_dir.glob(".scratch-*"):  # left by a run killed mid-unpack
            shutil.rmtree(scratch, ignore_errors=True)

    def tree(self, sha: str) -> Path:
        """The unpacked tree of blob ``sha``, fetched and unpacked first when it is not cached.

        Raises CodeUnavailable (missing, corrupt, unsafe); Redis errors propagate (retry later)."""
        check_sha256(sha, "code_sha256")
        done = self.code_dir / sha / "tree"
        with self._lock:
            if done.is_dir():
                return done
            scratch = Path(tempfile.mkdtemp(prefix=".scratch-", dir=self.code_dir))
            try:
                blob = scratch / "code.tar.gz"
                with open(blob, "wb") as out:
                    size = self.reader.fetch(sha, out, self.max_blob_bytes)
                (scratch / "tree").mkdir()
                members = safe_extract(blob, scratch / "tree", max_bytes=self.max_unpacked_bytes)
                blob.unlink()
                try:
                    os.replace(scratch, self.code_dir / sha)
                except OSError:
                    if not done.is_dir():  # not another agent of this host that got there first
                        raise
            except ValueError as exc:  # CodeError (missing, corrupt), UnsafeArchive
                raise CodeUnavailable(f"code {sha[:12]}: {exc}") from exc
            finally:
                if scratch.exists():
                    shutil.rmtree(scratch, ignore_errors=True)
            log.info("code %s: %d bytes fetched, %d members unpacked into %s", sha[:12], size, members, done)
            return done

    def workdir(self, sha: str, job_id: str, attempt: int, node: str, user: JobUser | None = None) -> Path:
        """A fresh copy of code ``sha`` for one job attempt on ``node``: the directory it runs in.

        The node is part of the path: agents of several nodes may share a state directory on one
        host (``frenzy up``), and each rank of a job gets a copy of its own."""
        tree = self.tree(sha)
        dest = self.work_dir / job_id / f"attempt-{attempt}" / node
        if dest.exists():  # an earlier start of this attempt that never ran: start from the code again
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            shutil.copytree(tree, dest, symlinks=True)
        except OSError as exc:
            raise CodeUnavailable(f"code {sha[:12]}: cannot make the job's directory {dest}: {exc}") from exc
        if user is not None and user.switches():
            _give_to(dest, user)
        return dest


def _give_to(root: Path, user: JobUser) -> None:
    """Make ``root`` and everything in it ``user``'s (links themselves, never what they point at)."""
    os.lchown(root, user.uid, user.gid)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), user.uid, user.gid)
