"""Join files name the host they are for and expire unused (issue 34).

Before: a file from `frenzy node join` was a bearer credential until the next join for its node: no
expiry, good on any host. Now the agent refuses one written for another host, and one past its
--ttl that its host never used, each with "To fix:"; the host that used it keeps restarting after
the expiry (its state directory remembers the file), a copy taken to another host does not."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from frenzy.agent.cli import JoinFileError, check_join_file, mark_enrolled, read_join_file
from frenzy.cli.main import app
from frenzy.state import acl

NODE = "gpu-join-34"


@pytest.fixture
def join(redis_url: str, prefix: str, tmp_path: Path) -> Iterator:
    """Run `frenzy node join NODE ...extra` -> the file's path; the node's Redis user is removed afterwards."""

    def run(*extra: str, name: str = "join.json") -> Path:
        path = tmp_path / name
        done = CliRunner().invoke(app, ["node", "join", NODE, "--redis-url", redis_url, "--prefix", prefix,
                                        "--out", str(path), *extra])
        assert done.exit_code == 0, done.output
        return path

    yield run
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "DELUSER", acl.user_name(acl.RedisRole.AGENT, prefix, NODE))
    admin.close()


def _agent(path: Path, tmp_path: Path, state: str = "state") -> object:
    """`frenzy agent --join-file` up to where it would connect: a refusal exits 2 first."""
    return CliRunner().invoke(app, ["agent", "--join-file", str(path), "--fake-gpus", "L4:1", "--drain",
                                    "--log-dir", str(tmp_path / "logs"), "--state-dir", str(tmp_path / state)])


def test_the_file_names_its_host_and_expiry(join) -> None:  # noqa: ANN001
    before = time.time()
    data = json.loads(join("--host", "gpu-17.example.org", "--ttl", "2h").read_text())
    assert data["host"] == "gpu-17.example.org"
    assert before + 7200 - 5 <= data["expires_at"] <= time.time() + 7200 + 5
    data = json.loads(join().read_text())
    assert data["host"] == NODE and data["expires_at"] > time.time() + 23 * 3600  # defaults: NODE, 24 h


def test_an_agent_on_another_host_refuses_it(join, tmp_path: Path) -> None:  # noqa: ANN001
    path = join("--host", "some-other-host.example.org")
    done = _agent(path, tmp_path)
    assert done.exit_code == 2, done.output
    assert "written for host 'some-other-host.example.org'" in done.output and "To fix:" in done.output
    assert f"--host {socket.gethostname()}" in done.output
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())  # nothing marked


def test_an_expired_unused_file_is_refused(join, tmp_path: Path) -> None:  # noqa: ANN001
    path = join("--host", socket.gethostname())
    data = json.loads(path.read_text())
    data["expires_at"] = time.time() - 1
    path.write_text(json.dumps(data))
    done = _agent(path, tmp_path)
    assert done.exit_code == 2, done.output
    assert "expired at" in done.output and "To fix:" in done.output and "frenzy node join" in done.output


def test_a_file_without_host_or_expiry_is_refused(join, tmp_path: Path) -> None:  # noqa: ANN001
    path = join("--host", socket.gethostname())
    data = json.loads(path.read_text())
    for field in ("host", "expires_at"):
        old = {k: v for k, v in data.items() if k != field}
        path.write_text(json.dumps(old))
        done = _agent(path, tmp_path)
        assert done.exit_code == 2 and "names no host or expiry" in done.output and "To fix:" in done.output


def test_its_host_keeps_using_it_after_expiry_and_a_copy_elsewhere_does_not(tmp_path: Path) -> None:
    path = tmp_path / "join.json"
    path.write_text(json.dumps({"node": NODE, "redis_url": "redis://u:p@redis:6379/0", "prefix": "frenzy",
                                "host": "gpu-17", "expires_at": 1000.0}))
    path.chmod(0o600)
    joined = read_join_file(path)
    here, state, elsewhere = {"gpu-17", "gpu-17.example.org"}, tmp_path / "state", tmp_path / "other"
    check_join_file(path, joined, state, names=here, now=999.0)  # first use, in time
    mark_enrolled(state, joined)
    assert (state / f"joined-{NODE}").stat().st_mode & 0o777 == 0o600
    check_join_file(path, joined, state, names=here, now=10**10)  # a restart long after: still fine
    with pytest.raises(JoinFileError, match="expired at"):  # another state directory never used it
        check_join_file(path, joined, elsewhere, names=here, now=10**10)
    with pytest.raises(JoinFileError, match="written for host 'gpu-17'"):
        check_join_file(path, joined, state, names={"gpu-18"}, now=999.0)
    # a new join (a new password) is a new file: the old mark does not cover it
    rotated = read_join_file(path).__class__(**{**joined.__dict__, "redis_url": "redis://u:q@redis:6379/0"})
    with pytest.raises(JoinFileError, match="expired at"):
        check_join_file(path, rotated, state, names=here, now=10**10)


def test_join_refuses_a_bad_host_or_ttl(redis_url: str, prefix: str, tmp_path: Path) -> None:
    for extra, words in ((["--host", "a b"], "not a host name"), (["--ttl", "forever"], "not a duration"),
                         (["--ttl", "90d"], "1 minute to 30 days")):
        done = CliRunner().invoke(app, ["node", "join", NODE, "--redis-url", redis_url, "--prefix", prefix,
                                        "--out", str(tmp_path / "j.json"), *extra])
        assert done.exit_code == 2 and words in done.output and "To fix:" in done.output, done.output
        assert not (tmp_path / "j.json").exists()
