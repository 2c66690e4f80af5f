"""A node's code cache (frenzy.agent.codecache) on real Redis: blobs fetched in ranges and checked
against their sha256, unpacked once per hash, each job attempt given its own copy."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import redis

from frenzy.agent.codecache import CodeCache, CodeUnavailable
from frenzy.code.pack import pack
from frenzy.state import code_store
from frenzy.state.code_store import CodeReader
from frenzy.state.keys import Keys


@pytest.fixture
def raw(redis_url: str) -> redis.Redis:
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    client.close()


def test_a_blob_is_checked_unpacked_once_and_copied_per_attempt(raw: redis.Redis, keys: Keys, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('v1')\n")
    (proj / "big.bin").write_bytes(bytes(range(256)) * 400)  # 100 KiB: several ranges below
    packed = pack(proj)
    raw.set(keys.code(packed.sha256), packed.data)
    monkeypatch.setattr(code_store, "READ_BYTES", 4096)  # many GETRANGE calls for one blob
    cache = CodeCache(tmp_path / "state", CodeReader(raw, keys))
    one = cache.workdir(packed.sha256, "job-1", 1, "n1")
    assert one == tmp_path / "state" / "work" / "job-1" / "attempt-1" / "n1"
    assert (one / "train.py").read_text() == "print('v1')\n" and (one / "big.bin").stat().st_size == 102400
    (one / "train.py").write_text("changed by the job\n")  # a job editing its own copy ...
    raw.delete(keys.code(packed.sha256))  # ... and the blob gone from Redis: the cache serves
    two = cache.workdir(packed.sha256, "job-2", 1, "n1")
    assert (two / "train.py").read_text() == "print('v1')\n"


def test_missing_or_corrupt_blobs_are_refused(raw: redis.Redis, keys: Keys, tmp_path: Path) -> None:
    cache = CodeCache(tmp_path / "state", CodeReader(raw, keys))
    sha = hashlib.sha256(b"the real bytes").hexdigest()
    with pytest.raises(CodeUnavailable, match="not in the store"):
        cache.tree(sha)
    raw.set(keys.code(sha), b"other bytes under its name")
    with pytest.raises(CodeUnavailable, match="do not hash to their name"):
        cache.tree(sha)
    assert not (tmp_path / "state" / "code" / sha).exists()
    assert not list((tmp_path / "state" / "code").glob(".scratch-*"))  # nothing left behind
    with pytest.raises(ValueError, match="not a sha256"):
        cache.tree("../../etc")
