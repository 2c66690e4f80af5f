"""Unpack a job's code archive on a node, refusing anything that could reach outside it.

The archive came through Redis from a user: its sha256 was checked, but a user may pack
anything, so every member is judged before a byte is written. Allowed: regular files and
directories with relative names that stay inside (no absolute path, no ``..`` component, no
NUL), and symbolic links whose target is relative and resolves inside the tree. Refused, the
whole archive with it: hard links, device files, FIFOs, links out, names that climb out, and
more than ``max_bytes`` of file contents or ``max_members`` entries (a decompression bomb).
Files are created with ``O_NOFOLLOW | O_EXCL`` under a parent whose real path is checked to be
inside the destination, so a link unpacked earlier cannot redirect a later file, and once all is
written every link is resolved (through the others) and must land inside. Modes keep the
executable bit only (no setuid, setgid or sticky bit, no world-writable file).
"""

from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path

DEFAULT_MAX_UNPACKED_BYTES = 1024 * 1024 * 1024  # 1 GiB of file contents (the packed limit is 100 MiB)
DEFAULT_MAX_MEMBERS = 200_000


class UnsafeArchive(ValueError):
    """The archive holds a member that must not be unpacked, or is not a readable tar.gz; says which."""


def _check_name(name: str) -> str:
    if not name or "\0" in name:
        raise UnsafeArchive(f"member {name!r}: empty name or NUL character")
    if name.startswith("/") or posixpath.isabs(name):
        raise UnsafeArchive(f"member {name!r}: absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        raise UnsafeArchive(f"member {name!r}: names the archive's root")
    if ".." in parts:
        raise UnsafeArchive(f"member {name!r}: a '..' component would climb out of the job's directory")
    return "/".join(parts)


def _check_link(name: str, target: str) -> None:
    if not target or "\0" in target:
        raise UnsafeArchive(f"link {name!r}: empty target or NUL character")
    if posixpath.isabs(target):
        raise UnsafeArchive(f"link {name!r} -> {target!r}: absolute target, outside the job's directory")
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if joined == ".." or joined.startswith("../"):
        raise UnsafeArchive(f"link {name!r} -> {target!r}: points outside the job's directory")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _parent_dir(dest: str, name: str) -> str:
    """The directory a member goes in, created as needed, its real path checked to be inside ``dest``."""
    parent = os.path.join(dest, *name.split("/")[:-1])
    os.makedirs(parent, mode=0o755, exist_ok=True)
    real = os.path.realpath(parent)
    if not _inside(real, dest):
        raise UnsafeArchive(f"member {name!r}: its directory resolves to {real}, outside the job's directory")
    return real


def safe_extract(archive: str | os.PathLike[str], dest: str | os.PathLike[str],
                 max_bytes: int = DEFAULT_MAX_UNPACKED_BYTES, max_members: int = DEFAULT_MAX_MEMBERS) -> int:
    """Unpack the tar.gz ``archive`` into the existing, empty directory ``dest``; the number of members.

    Raises UnsafeArchive at the first member that is refused (what was written so far stays: the
    caller unpacks into a scratch directory and removes it)."""
    root = os.path.realpath(dest)
    total = count = 0
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for member in tar:  # streamed: headers are judged as they come, before their contents are read
                count += 1
                if count > max_members:
                    raise UnsafeArchive(f"more than {max_members} members")
                name = _check_name(member.name)
                if member.isdir():
                    path = os.path.join(root, *name.split("/"))
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    if not _inside(os.path.realpath(path), root):
                        raise UnsafeArchive(f"directory {name!r}: resolves outside the job's directory")
                elif member.issym():
                    _check_link(name, member.linkname)
                    parent = _parent_dir(root, name)
                    os.symlink(member.linkname, os.path.join(parent, name.rsplit("/", 1)[-1]))
                elif member.isreg():
                    total += member.size
                    if total > max_bytes:
                        raise UnsafeArchive(f"the files add up to more than {max_bytes} bytes")
                    parent = _parent_dir(root, name)
                    _write_file(tar, member, os.path.join(parent, name.rsplit("/", 1)[-1]))
                elif member.islnk():
                    raise UnsafeArchive(f"member {name!r}: a hard link (not allowed in job code)")
                else:
                    raise UnsafeArchive(f"member {name!r}: a device file, FIFO or other special file")
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, FileExistsError):
            raise UnsafeArchive(f"a member is in the archive twice or replaces a link: {exc.filename}") from exc
        raise UnsafeArchive(f"not a readable tar.gz: {exc}") from exc
    _check_links_resolve_inside(root)
    return count


def _check_links_resolve_inside(root: str) -> None:
    """Each link judged alone stays inside, but a chain can climb out (``up -> ../..`` at depth 2,
    then ``x -> up/..``): every unpacked link must also resolve, through the others, inside."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                rel = os.path.relpath(path, root)
                raise UnsafeArchive(f"link {rel!r} -> {os.readlink(path)!r}: resolves outside the job's directory "
                                    "through other links")


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise UnsafeArchive(f"member {member.name!r}: no contents")
    mode = 0o755 if member.mode & 0o111 else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    os.fchmod(fd, mode)  # the mode asked for, whatever the umask
    with os.fdopen(fd, "wb") as out, source:
        left = member.size
        while left > 0:
            block = source.read(min(left, 1024 * 1024))
            if not block:
                raise UnsafeArchive(f"member {member.name!r}: the archive ends inside it")
            out.write(block)
            left -= len(block)


def tree_files(root: str | os.PathLike[str]) -> list[str]:
    """Every file and link under ``root``, relative and sorted (tests, tools)."""
    base = Path(root)
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() or p.is_symlink())
