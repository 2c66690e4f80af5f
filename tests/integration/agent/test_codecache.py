"""A node's code cache (frenzy.agent.codecache) on real Redis: blobs fetched in ranges and checked
against their sha256, unpacked once per hash, each job attempt given its own copy."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
import redis

from frenzy.agent.codecache import DAY_S, CachePolicy, CodeCache, CodeUnavailable
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


def _stored(raw: redis.Redis, keys: Keys, root: Path, text: str) -> str:
    root.mkdir(parents=True)
    (root / "train.py").write_text(text)
    packed = pack(root)
    raw.set(keys.code(packed.sha256), packed.data)
    return packed.sha256


def _age(path: Path, days: float) -> None:
    """Make ``path`` look last changed ``days`` ago."""
    when = time.time() - days * DAY_S
    os.utime(path, (when, when))


def test_prune_drops_old_and_surplus_trees_and_old_workdirs_never_a_running_ones(
        raw: redis.Redis, keys: Keys, tmp_path: Path) -> None:
    cache = CodeCache(tmp_path / "state", CodeReader(raw, keys))
    old, lru, fresh = (_stored(raw, keys, tmp_path / n, f"print({n!r})\n" * 50) for n in ("old", "lru", "fresh"))
    logs = tmp_path / "logs"
    for i, sha in enumerate((old, lru, fresh)):
        cache.workdir(sha, f"job-{i}", 1, "n1")
    cache.workdir(fresh, "job-2", 1, "n2")  # another node's agent sharing this state directory
    code, work = tmp_path / "state" / "code", tmp_path / "state" / "work"
    _age(code / old / "used", 8)
    _age(code / lru / "used", 2)
    for job in ("job-0", "job-1"):  # ended 8 days ago here; job-1 still runs
        _age(work / job / "attempt-1" / "n1", 8)
    # job-2's copy is 8 days old too, but its log was written a minute ago (adopted, still running)
    _age(work / "job-2" / "attempt-1" / "n1", 8)
    (logs / "job-2" / "attempt-1").mkdir(parents=True)
    (logs / "job-2" / "attempt-1" / "n1.log").write_text("step 1\n")
    size = int((code / fresh / "size").read_text())
    assert size > 0

    # Room for one tree: "old" goes by age, "lru" by size (fresh was used last).
    policy = CachePolicy(max_bytes=size, max_age_s=7 * DAY_S, work_max_age_s=7 * DAY_S)
    report = cache.prune("n1", running={("job-1", 1)}, policy=policy, log_dir=logs)
    assert sorted(report.trees) == sorted([old, lru]) and not report.skipped
    assert report.workdirs == ["job-0/attempt-1/n1"]
    assert [p.name for p in code.iterdir() if not p.name.startswith(".")] == [fresh]
    assert not (work / "job-0").exists()  # empty job directories go with their last attempt
    assert (work / "job-1" / "attempt-1" / "n1" / "train.py").exists()  # running here
    assert (work / "job-2" / "attempt-1" / "n1" / "train.py").exists()  # its log is recent
    assert (work / "job-2" / "attempt-1" / "n2" / "train.py").exists()  # another node's: not n1's to prune
    # A dropped tree comes back from Redis when a job needs it again.
    assert (cache.workdir(old, "job-3", 1, "n1") / "train.py").exists()


def test_prune_skips_the_cache_while_another_agent_of_the_host_copies_from_it(
        raw: redis.Redis, keys: Keys, tmp_path: Path) -> None:
    cache = CodeCache(tmp_path / "state", CodeReader(raw, keys))
    sha = _stored(raw, keys, tmp_path / "p", "print(1)\n")
    cache.tree(sha)
    other = CodeCache(tmp_path / "state", CodeReader(raw, keys))  # a second agent on the same state dir
    with other._shared():  # it is making a working directory now
        report = cache.prune("n1", running=set(), policy=CachePolicy(max_bytes=0))
    assert report.skipped and report.trees == []
    assert (tmp_path / "state" / "code" / sha / "tree").is_dir()
    assert cache.prune("n1", running=set(), policy=CachePolicy(max_bytes=0)).trees == [sha]
