"""Packing a submit directory (frenzy.code.pack) and unpacking it on a node (frenzy.code.unpack):
deterministic bytes, git-aware selection, the size limit, and archives that must be refused."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from frenzy.code.pack import CodeTooLarge, PackError, pack
from frenzy.code.unpack import UnsafeArchive, safe_extract, tree_files


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_the_same_tree_packs_to_the_same_bytes_whatever_its_times(tmp_path: Path) -> None:
    files = {"train.py": "print('hi')\n", "lib/model.py": "X = 1\n", "run.sh": "#!/bin/sh\necho\n"}
    a = _tree(tmp_path / "a", files)
    b = _tree(tmp_path / "b", dict(reversed(files.items())))  # created in another order
    (a / "run.sh").chmod(0o755)
    (b / "run.sh").chmod(0o755)
    os.utime(b / "train.py", (1, 1))
    pa, pb = pack(a), pack(b)
    assert pa.sha256 == pb.sha256 and pa.data == pb.data
    assert pa.files == 3 and not pa.git
    (b / "train.py").write_text("print('changed')\n")
    assert pack(b).sha256 != pa.sha256


def test_outside_git_caches_and_vcs_directories_are_left_out(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p", {"train.py": "1", "__pycache__/x.cpython-311.pyc": "c", ".venv/lib/big": "v",
                                  "pkg/mod.pyc": "c", "pkg/mod.py": "m"})
    out = tmp_path / "out"
    out.mkdir()
    blob = tmp_path / "c.tar.gz"
    blob.write_bytes(pack(root).data)
    safe_extract(blob, out)
    assert tree_files(out) == ["pkg/mod.py", "train.py"]


def test_in_a_git_tree_what_git_would_commit_travels(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo", {"train.py": "1", ".gitignore": "data/\n*.ckpt\n", "data/shard0": "d",
                                     "model.ckpt": "w", "notes.md": "untracked but not ignored",
                                     "sub/train2.py": "2"})
    _git(root, "init", "-q")
    _git(root, "add", "train.py", ".gitignore")
    _git(root, "commit", "-q", "-m", "x")
    packed = pack(root)
    assert packed.git
    out = tmp_path / "out"
    out.mkdir()
    blob = tmp_path / "c.tar.gz"
    blob.write_bytes(packed.data)
    safe_extract(blob, out)
    assert tree_files(out) == [".gitignore", "notes.md", "sub/train2.py", "train.py"]
    # From a subdirectory: only what lies below it, named from there.
    sub = pack(root / "sub")
    blob.write_bytes(sub.data)
    out2 = tmp_path / "out2"
    out2.mkdir()
    safe_extract(blob, out2)
    assert tree_files(out2) == ["train2.py"]


def test_over_the_limit_the_error_names_the_biggest_files(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p", {"train.py": "x" * 100})
    (root / "weights.bin").write_bytes(b"\0" * 300_000)
    (root / "cache.npy").write_bytes(b"\0" * 200_000)
    with pytest.raises(CodeTooLarge) as err:
        pack(root, max_bytes=250_000)
    text = str(err.value)
    assert "weights.bin (0.3 MiB)" in text and "cache.npy" in text and "--max-code-mib" in text
    assert text.index("weights.bin") < text.index("cache.npy")  # biggest first
    assert pack(root, max_bytes=1_000_000).files == 3


def test_links_inside_travel_links_outside_are_left_out_by_name(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p", {"train.py": "1", "conf/base.yaml": "a: 1"})
    (root / "current.yaml").symlink_to("conf/base.yaml")
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "up").symlink_to("../..")
    packed = pack(root)
    assert sorted(packed.skipped) == ["passwd (a link to /etc/passwd, outside the directory)",
                                      "up (a link to ../.., outside the directory)"]
    out = tmp_path / "out"
    out.mkdir()
    blob = tmp_path / "c.tar.gz"
    blob.write_bytes(packed.data)
    safe_extract(blob, out)
    assert (out / "current.yaml").is_symlink() and (out / "current.yaml").read_text() == "a: 1"


def test_an_empty_directory_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackError, match="nothing to pack"):
        pack(tmp_path / "empty")
    with pytest.raises(PackError, match="not a directory"):
        pack(tmp_path / "missing")


# ---- archives a user could craft by hand ----------------------------------------------------

def _archive(tmp_path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            body = (data or {}).get(m.name)
            if body is not None:
                m.size = len(body)
            tar.addfile(m, io.BytesIO(body) if body is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(("members", "data", "needle"), [
    ([_file("../escaped.txt")], {"../escaped.txt": b"x"}, "'..' component"),
    ([_file("ok/../../escaped.txt")], {"ok/../../escaped.txt": b"x"}, "'..' component"),
    ([_file("/tmp/escaped-abs.txt")], {"/tmp/escaped-abs.txt": b"x"}, "absolute path"),
    ([_link("etc", "/etc")], None, "absolute target"),
    ([_link("up", "../..")], None, "points outside"),
    # a link that is fine alone, then a file written through it: refused when the link is judged
    ([_link("out", "../"), _file("out/escaped.txt")], {"out/escaped.txt": b"x"}, "points outside"),
    # each link inside on its own, but the chain climbs out
    ([tarfile.TarInfo("d1/d2/keep"), _link("d1/d2/up", "../.."), _link("d1/d2/x", "up/..")],
     {"d1/d2/keep": b""}, "through other links"),
    ([_file("a.txt"), _link("b.txt", "a.txt", tarfile.LNKTYPE)], {"a.txt": b"x"}, "hard link"),
    ([_link("dev", "", tarfile.CHRTYPE)], None, "device file"),
    ([_link("fifo", "", tarfile.FIFOTYPE)], None, "device file"),
])
def test_unsafe_members_are_refused_and_nothing_lands_outside(tmp_path: Path, members: list, data: dict | None,
                                                              needle: str) -> None:
    dest = tmp_path / "work" / "job"
    dest.mkdir(parents=True)
    with pytest.raises(UnsafeArchive, match=needle):
        safe_extract(_archive(tmp_path, members, data), dest)
    assert not (tmp_path / "work" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/escaped-abs.txt").exists()


def test_too_much_content_and_garbage_are_refused(tmp_path: Path) -> None:
    dest = tmp_path / "d"
    dest.mkdir()
    big = _archive(tmp_path, [_file("a"), _file("b")], {"a": b"x" * 600, "b": b"y" * 600})
    with pytest.raises(UnsafeArchive, match="more than 1000 bytes"):
        safe_extract(big, dest, max_bytes=1000)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar at all")
    with pytest.raises(UnsafeArchive, match="not a readable tar.gz"):
        safe_extract(junk, tmp_path / "d")


def test_modes_keep_only_the_executable_bit(tmp_path: Path) -> None:
    info = _file("run.sh")
    info.mode = 0o6777  # setuid, setgid, world-writable
    dest = tmp_path / "d"
    dest.mkdir()
    safe_extract(_archive(tmp_path, [info], {"run.sh": b"#!/bin/sh\n"}), dest)
    assert (dest / "run.sh").stat().st_mode & 0o7777 == 0o755
