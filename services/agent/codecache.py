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

Neither grows for ever (``prune``, run by the agent every few minutes, ``CachePolicy``): a tree
unused for ``max_age_s`` goes, then the least recently used until the cache holds at most
``max_bytes`` (``choose_evictions``, pure; a tree's use is the mtime of its ``used`` stamp, its
size is written once when unpacked); a job's working directory goes once its attempt has not run
here for ``work_max_age_s`` (neither the directory nor the attempt's log changed), never while
the agent runs it. Agents of one host may share the state directory, so the cache is guarded by
an flock on ``code/.lock``: making a working directory holds it shared, pruning exclusively (and
skips its turn when it cannot have it at once); each agent prunes only its own node's working
directories.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from frenzy.agent.run_as import JobUser
from frenzy.code.limits import DEFAULT_MAX_CODE_BYTES
from frenzy.code.unpack import DEFAULT_MAX_UNPACKED_BYTES, safe_extract

if TYPE_CHECKING:  # the agent's CLI imports CachePolicy from here: Redis' client waits until a cache is made
    from frenzy.state.code_store import CodeReader

log = logging.getLogger(__name__)


class CodeUnavailable(RuntimeError):
    """The job's code cannot be had or used here; the message is what the user reads."""


GiB = 1024**3
DAY_S = 24 * 3600.0


@dataclass(frozen=True)
class CachePolicy:
    """How much a node keeps (the agent's --code-cache-gib, --code-cache-days, --workdir-days)."""

    # 20 GiB: room for ~200 trees at the 100 MiB pack limit, small beside a GPU node's scratch disk.
    max_bytes: int = 20 * GiB
    max_age_s: float = 7 * DAY_S  # a tree unused this long goes (the blob's own TTL in Redis)
    # A finished attempt's working directory (what the job wrote next to its code) stays this long.
    work_max_age_s: float = 7 * DAY_S

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.max_age_s <= 0 or self.work_max_age_s <= 0:
            raise ValueError(f"code cache policy: need max_bytes >= 0 and ages above 0 (got {self.max_bytes}, "
                             f"{self.max_age_s}, {self.work_max_age_s})")


@dataclass(frozen=True)
class CachedTree:
    sha: str
    size: int  # bytes of its files
    used_at: float  # when a job last started from it (epoch seconds)


def choose_evictions(trees: Collection[CachedTree], policy: CachePolicy, now: float) -> list[str]:
    """The trees to remove, oldest use first: every one unused for ``policy.max_age_s``, then the
    least recently used until the rest fit in ``policy.max_bytes``. (A running job does not need its
    tree: it runs in a copy of its own, which ``prune`` never removes while it runs.)"""
    out: list[str] = []
    total = sum(t.size for t in trees)
    for tree in sorted(trees, key=lambda t: (t.used_at, t.sha)):
        if now - tree.used_at >= policy.max_age_s or total > policy.max_bytes:
            out.append(tree.sha)
            total -= tree.size
    return out


@dataclass
class PruneReport:
    trees: list[str]  # sha256 of the trees removed
    tree_bytes: int  # what they held
    workdirs: list[str]  # working directories removed ("job/attempt-N/node")
    skipped: bool = False  # another agent of this host held the cache: nothing removed from it


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
        # The cache is the agent's alone; the working directories' tree may be entered by jobs of other
        # accounts (to reach their own, 0700 each) but not listed.
        self.code_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        os.chmod(self.work_dir, 0o711)
        self._flock_path = self.code_dir / ".lock"
        for scratch in self.code_dir.glob(".scratch-*"):  # left by a run killed mid-unpack
            shutil.rmtree(scratch, ignore_errors=True)

    def tree(self, sha: str) -> Path:
        """The unpacked tree of blob ``sha``, fetched and unpacked first when it is not cached.

        Raises CodeUnavailable (missing, corrupt, unsafe); Redis errors propagate (retry later)."""
        from frenzy.state.code_store import check_sha256

        check_sha256(sha, "code_sha256")
        done = self.code_dir / sha / "tree"
        with self._lock:
            if done.is_dir():
                _stamp(self.code_dir / sha / "used")
                return done
            scratch = Path(tempfile.mkdtemp(prefix=".scratch-", dir=self.code_dir))
            try:
                blob = scratch / "code.tar.gz"
                with open(blob, "wb") as out:
                    size = self.reader.fetch(sha, out, self.max_blob_bytes)
                (scratch / "tree").mkdir()
                members = safe_extract(blob, scratch / "tree", max_bytes=self.max_unpacked_bytes)
                blob.unlink()
                (scratch / "size").write_text(str(_tree_bytes(scratch / "tree")))
                _stamp(scratch / "used")
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
        dest = self.work_dir / job_id / f"attempt-{attempt}" / node
        with self._shared():  # no agent of this host prunes the tree while it is copied
            tree = self.tree(sha)
            if dest.exists():  # an earlier start of this attempt that never ran: start from the code again
                shutil.rmtree(dest)
            for folder in (dest.parent.parent, dest.parent):  # work/JOB, work/JOB/attempt-N: enter, not list
                folder.mkdir(exist_ok=True, mode=0o711)
                os.chmod(folder, 0o711, follow_symlinks=False)
            try:
                shutil.copytree(tree, dest, symlinks=True)
            except OSError as exc:
                raise CodeUnavailable(f"code {sha[:12]}: cannot make the job's directory {dest}: {exc}") from exc
        if user is not None and user.switches():
            _give_to(dest, user)
        os.chmod(dest, 0o700)  # the job's code and what it writes beside it: its user's alone
        return dest


    @contextmanager
    def _shared(self) -> Iterator[None]:
        with open(self._flock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
            yield  # closing the file releases the lock

    def cached(self) -> list[CachedTree]:
        """The trees in the cache, with their size and last use."""
        out = []
        for entry in self.code_dir.iterdir():
            if entry.name.startswith(".") or not (entry / "tree").is_dir():
                continue
            try:
                size = int((entry / "size").read_text())
            except (OSError, ValueError):  # unpacked by an agent before sizes were kept
                size = _tree_bytes(entry / "tree")
            used = _mtime(entry / "used") or _mtime(entry) or 0.0
            out.append(CachedTree(entry.name, size, used))
        return out

    def prune(self, node: str, running: Collection[tuple[str, int]], policy: CachePolicy,
              log_dir: Path | None = None, now: float | None = None) -> PruneReport:
        """Remove what ``policy`` says is old or too much (module docstring). ``running``: the (job id,
        attempt) pairs this agent runs (their working directories stay); ``log_dir``: where the
        attempts' logs are (a log that changed lately keeps its working directory)."""
        now = time.time() if now is None else now
        report = PruneReport([], 0, [])
        with open(self._flock_path, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                report.skipped = True  # a launch copies from the cache now: next turn
            else:
                with self._lock:
                    trees = {t.sha: t for t in self.cached()}
                    for sha in choose_evictions(list(trees.values()), policy, now):
                        _remove(self.code_dir / sha, self.code_dir)
                        report.trees.append(sha)
                        report.tree_bytes += trees[sha].size
        for dest in self.work_dir.glob(f"*/attempt-*/{node}"):
            job_id, attempt_dir = dest.parent.parent.name, dest.parent.name
            try:
                attempt = int(attempt_dir.removeprefix("attempt-"))
            except ValueError:
                continue
            if (job_id, attempt) in running:
                continue
            log_path = log_dir / job_id / attempt_dir / f"{node}.log" if log_dir is not None else None
            last = max(_mtime(dest) or 0.0, (_mtime(log_path) or 0.0) if log_path is not None else 0.0)
            if now - last >= policy.work_max_age_s:
                shutil.rmtree(dest, ignore_errors=True)
                report.workdirs.append(f"{job_id}/{attempt_dir}/{node}")
                for parent in (dest.parent, dest.parent.parent):  # empty attempt and job directories
                    try:
                        parent.rmdir()
                    except OSError:
                        break  # another node's or attempt's directory is still there
        if report.trees or report.workdirs:
            log.info("code cache: removed %d tree(s) (%.1f MiB) and %d working director(y/ies) of ended jobs",
                     len(report.trees), report.tree_bytes / 2**20, len(report.workdirs))
        return report


def _stamp(path: Path) -> None:
    """Mark ``path`` as used now (its mtime)."""
    try:
        path.touch()
    except OSError as exc:  # a read-only cache still serves; only its pruning order suffers
        log.debug("cannot stamp %s: %s", path, exc)


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _remove(entry: Path, code_dir: Path) -> None:
    """Remove a cache entry: renamed to scratch first (gone from the cache at once, atomically),
    then deleted; scratch left by a crash here is removed at the next start."""
    scratch = Path(tempfile.mkdtemp(prefix=".scratch-", dir=code_dir))
    try:
        os.replace(entry, scratch / "old")
    except OSError:
        pass  # gone already
    shutil.rmtree(scratch, ignore_errors=True)


def _give_to(root: Path, user: JobUser) -> None:
    """Make ``root`` and everything in it ``user``'s (links themselves, never what they point at)."""
    os.lchown(root, user.uid, user.gid)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), user.uid, user.gid)
