"""Code that travels (issue 20): HasCode / UploadCode over real gRPC into real Redis -- stored once
per tree, sizes and sha256 checked by the scheduler, nothing half-stored -- and a submission
naming code that is not there refused. An agent's Redis user may read the blobs, not write them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from frenzy.code.pack import pack
from frenzy.code.upload import chunks, ensure_uploaded
from frenzy.devstack.redis_server import add_role_users, remove_role_users
from frenzy.rpc.jobspec import parse_entry
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2
from support.servers import Servers, running_servers


@pytest.fixture
def servers(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Servers]:
    monkeypatch.setenv("FRENZY_MAX_CODE_MIB", "1")  # 1 MiB: the limit is easy to pass in a test
    with running_servers(redis_url, prefix) as s:
        yield s


def _code_keys(client: redis.Redis, keys: Keys) -> list[str]:
    return sorted(client.scan_iter(f"{keys.prefix}:code*"))


def _project(root: Path, text: str = "print('hi')\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(text)
    (root / "lib.py").write_text("X = 1\n" * 1000)
    return root


def test_the_same_tree_uploaded_twice_is_stored_once(servers: Servers, redis_client: redis.Redis, keys: Keys,
                                                      tmp_path: Path, redis_url: str) -> None:
    packed = pack(_project(tmp_path / "a"))
    again = pack(_project(tmp_path / "b"))  # the same files elsewhere: the same blob
    assert again.sha256 == packed.sha256
    before = servers.stub.HasCode(scheduler_pb2.HasCodeRequest(sha256=packed.sha256), timeout=5)
    assert not before.present and before.max_bytes == 1024 * 1024
    first = ensure_uploaded(servers.stub, packed)
    second = ensure_uploaded(servers.stub, again)
    assert first.sent and not second.sent
    # Even sent in full a second time, the scheduler keeps one copy.
    ref = servers.stub.UploadCode(chunks(again), timeout=10)
    assert ref.existed and ref.sha256 == packed.sha256
    assert _code_keys(redis_client, keys) == [keys.code(packed.sha256)]
    raw = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        assert raw.get(keys.code(packed.sha256)) == packed.data
        assert 0 < raw.pttl(keys.code(packed.sha256)) <= 7 * 24 * 3600 * 1000
    finally:
        raw.close()


def _upload(servers: Servers, pieces: list[scheduler_pb2.CodeChunk]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        servers.stub.UploadCode(iter(pieces), timeout=10)
    return err.value


def test_uploads_that_lie_or_are_too_big_store_nothing(servers: Servers, redis_client: redis.Redis,
                                                        keys: Keys) -> None:
    data = b"some bytes that are not what they claim"
    wrong = hashlib.sha256(b"other").hexdigest()
    err = _upload(servers, [scheduler_pb2.CodeChunk(sha256=wrong, size=len(data), data=data)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "hash to" in err.details()
    right = hashlib.sha256(data).hexdigest()
    err = _upload(servers, [scheduler_pb2.CodeChunk(sha256=right, size=len(data) + 5, data=data)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "claimed" in err.details()
    err = _upload(servers, [scheduler_pb2.CodeChunk(sha256=right, size=len(data) - 5, data=data)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than" in err.details()
    # Over the scheduler's limit: refused on the first chunk's claim, before any byte is kept.
    err = _upload(servers, [scheduler_pb2.CodeChunk(sha256=right, size=2 * 1024 * 1024, data=data)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 1 MiB" in err.details()
    err = _upload(servers, [scheduler_pb2.CodeChunk(sha256="../../etc", size=3, data=b"abc")])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a sha256" in err.details()
    bad = servers.stub_for(servers.token)
    with pytest.raises(grpc.RpcError) as has_err:
        bad.HasCode(scheduler_pb2.HasCodeRequest(sha256="xyz"), timeout=5)
    assert has_err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _code_keys(redis_client, keys) == []


def test_a_submission_naming_code_that_is_not_stored_is_refused(servers: Servers, redis_client: redis.Redis,
                                                                keys: Keys) -> None:
    spec = parse_entry({"model": "gpt2-124m", "seq_len": 128, "global_batch": 8, "command": ["python", "t.py"]}
                       ).to_proto()
    spec.code_sha256 = hashlib.sha256(b"never uploaded").hexdigest()
    with pytest.raises(grpc.RpcError) as err:
        servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "upload it first" in err.value.details()
    spec.code_sha256 = "NOT-HEX"
    with pytest.raises(grpc.RpcError) as err:
        servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.code_sha256" in err.value.details()
    spec.code_sha256 = hashlib.sha256(b"x").hexdigest()
    spec.workdir = "/shared/project"
    with pytest.raises(grpc.RpcError) as err:
        servers.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in err.value.details()
    assert redis_client.zcard(keys.jobs()) == 0


def test_a_read_token_may_not_upload(servers: Servers, tmp_path: Path) -> None:
    from frenzy.auth.roles import Role

    token, _ = servers.scheduler.tokens.create("reader", Role.READ)
    packed = pack(_project(tmp_path / "p"))
    with pytest.raises(grpc.RpcError) as err:
        ensure_uploaded(servers.stub_for(token), packed)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_an_agent_reads_code_but_cannot_write_it(redis_url: str, prefix: str, keys: Keys,
                                                 redis_client: redis.Redis) -> None:
    """On Redis 7 (selectors): GET / GETRANGE / STRLEN on code:*, nothing else (Redis 6.2's
    limits are in frenzy.state.acl's docstring; the sha256 check makes a rewritten blob harmless)."""
    users = add_role_users(redis_url, prefix, ["n1"])
    blob = keys.code("a" * 64)
    redis_client.set(blob, "blob")
    agent = redis.Redis.from_url(users.agents["n1"], decode_responses=True, protocol=2)
    try:
        assert agent.getrange(blob, 0, 1) == "bl" and agent.strlen(blob) == 4 and agent.get(blob) == "blob"
        for attempt in (lambda: agent.set(blob, "evil"), lambda: agent.delete(blob),
                        lambda: agent.append(keys.code("b" * 64), "x"), lambda: agent.pexpire(blob, 1),
                        lambda: agent.get(keys.code_upload("x"))):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        agent.close()
        remove_role_users(redis_url, prefix, ["n1"])
    assert redis_client.get(blob) == "blob"
