"""Pack a submit directory into a deterministic tar.gz: the code a job takes to its nodes.

Which files: in a git work tree, what git would commit -- tracked files and untracked ones
not ignored (``git ls-files -co --exclude-standard``, below the directory); elsewhere every
file under it except version-control directories and obvious caches (``SKIP_DIRS``,
``*.pyc``). Symbolic links are kept when they point inside the directory and left out (named
in ``PackedCode.skipped``) when they point outside, which an agent would refuse to unpack.

Deterministic: members in sorted order, every time, owner and group zeroed, modes reduced to
0644 / 0755 (executable kept), gzip without a name or time stamp. The same tree gives the same
bytes, so the same sha256, so the scheduler stores it once (``frenzy.state.code_store``); with
another zlib build the bytes may differ, which costs a second copy, never a wrong one.

Bounded: the files' total size is checked against ``max_bytes`` before anything is read, and
the error names the biggest files, so a checkpoint or a dataset left in the directory is
found at once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from frenzy.code.limits import DEFAULT_MAX_CODE_BYTES, MiB

# Directories never packed outside git (inside a git tree, .gitignore decides).
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                       ".tox", ".nox", ".ipynb_checkpoints", ".venv", ".eggs", "node_modules"})
SKIP_SUFFIXES = (".pyc", ".pyo")
BIGGEST_SHOWN = 5


class PackError(ValueError):
    """The directory cannot be packed; the message says why and how to fix it."""


class CodeTooLarge(PackError):
    """The files add up to more than the limit; the message names the biggest."""


@dataclass(frozen=True)
class PackedCode:
    """A packed directory: the blob, its sha256 and what went into it."""

    data: bytes
    sha256: str
    files: int  # members packed (regular files and symbolic links)
    file_bytes: int  # their total size before compression
    root: str
    git: bool  # chosen by git (tracked + untracked not ignored)
    skipped: list[str] = field(default_factory=list)  # what was left out, and why

    @property
    def size(self) -> int:
        return len(self.data)


def _git_files(root: Path) -> list[str] | None:
    """Paths git would commit below ``root`` (relative, '/'-separated), or None when it is not a git work tree."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git on this machine: pack every file
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-c", "-o", "--exclude-standard", "--", "."],
                         capture_output=True, timeout=120)
    if out.returncode != 0:
        raise PackError(f"git ls-files failed in {root}: {out.stderr.decode(errors='replace').strip()[:300]}")
    names = [n for n in out.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    return sorted(set(names))


def _walk_files(root: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        keep = []
        for d in dirnames:
            if d in SKIP_DIRS:
                continue
            if (Path(dirpath) / d).is_symlink():
                found.append((rel_dir / d).as_posix())  # a link to a directory: packed as a link
            else:
                keep.append(d)
        dirnames[:] = keep
        found += [(rel_dir / f).as_posix() for f in filenames if not f.endswith(SKIP_SUFFIXES)]
    return sorted(found)


def _link_inside(rel: str, target: str) -> bool:
    """A symbolic link at ``rel`` (relative) pointing at ``target`` stays inside the packed directory."""
    if os.path.isabs(target):
        return False
    joined = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    return joined != ".." and not joined.startswith("../") and not os.path.isabs(joined)


def _members(root: Path, names: list[str]) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """(name, lstat) of what will be packed, and what is skipped (with why)."""
    members: list[tuple[str, os.stat_result]] = []
    skipped: list[str] = []
    for rel in names:
        path = root / rel
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue  # tracked by git but deleted in the work tree: git would not commit it either
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            if _link_inside(rel, target):
                members.append((rel, st))
            else:
                skipped.append(f"{rel} (a link to {target}, outside the directory)")
        elif stat.S_ISREG(st.st_mode):
            members.append((rel, st))
        elif stat.S_ISDIR(st.st_mode):
            skipped.append(f"{rel} (a git submodule or nested repository: not packed)")
        else:
            skipped.append(f"{rel} (not a regular file)")
    return members, skipped


def _too_large(members: list[tuple[str, os.stat_result]], total: int, max_bytes: int, root: Path) -> CodeTooLarge:
    biggest = sorted(((st.st_size, rel) for rel, st in members if stat.S_ISREG(st.st_mode)), reverse=True)
    shown = ", ".join(f"{rel} ({size / MiB:.1f} MiB)" for size, rel in biggest[:BIGGEST_SHOWN])
    return CodeTooLarge(
        f"code: {root} holds {total / MiB:.1f} MiB in {len(members)} files, above the limit of "
        f"{max_bytes / MiB:.0f} MiB. Biggest: {shown}. To fix: leave them out (.gitignore in a git "
        "repository), keep data and checkpoints on a shared filesystem (submit with --workdir), raise "
        "--max-code-mib, or submit with --no-code")


def _tarinfo(rel: str, st: os.stat_result, root: Path) -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(root / rel)
        info.mode = 0o777
    else:
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return info


def list_code(root: str | os.PathLike[str]) -> tuple[list[str], bool]:
    """The paths (relative, sorted) that ``pack`` would consider, and whether git chose them."""
    base = Path(root).resolve()
    if not base.is_dir():
        raise PackError(f"code: {root} is not a directory. To fix: run from your project's directory or pass "
                        "the directory to pack")
    names = _git_files(base)
    return (names, True) if names is not None else (_walk_files(base), False)


def pack(root: str | os.PathLike[str] = ".", max_bytes: int = DEFAULT_MAX_CODE_BYTES) -> PackedCode:
    """Pack ``root`` (see the module docstring). PackError / CodeTooLarge say what is wrong."""
    base = Path(root).resolve()
    names, git = list_code(base)
    members, skipped = _members(base, names)
    if not members:
        raise PackError(f"code: nothing to pack in {base} (no files{' git would commit' if git else ''}). "
                        "To fix: run from your project's directory, or submit with --no-code")
    total = sum(st.st_size for _rel, st in members if stat.S_ISREG(st.st_mode))
    if total > max_bytes:
        raise _too_large(members, total, max_bytes, base)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in members:
            info = _tarinfo(rel, st, base)
            if info.type == tarfile.SYMTYPE:
                tar.addfile(info)
                continue
            try:
                with open(base / rel, "rb") as fh:
                    data = fh.read(max_bytes + 1)
            except OSError as exc:
                raise PackError(f"code: cannot read {rel}: {exc.strerror}") from exc
            info.size = len(data)  # the file may have changed since it was listed: pack what was read
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    if len(blob) > max_bytes:
        raise _too_large(members, len(blob), max_bytes, base)
    return PackedCode(blob, hashlib.sha256(blob).hexdigest(), len(members), total, str(base), git, skipped)
