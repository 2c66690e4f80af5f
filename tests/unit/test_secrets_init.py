"""`frenzy secrets init`: one Redis user per role, each password made once, into files only their
owner may read, and an ACL file with only hashes and the rules the dev stack uses."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

from typer.testing import CliRunner

from frenzy.cli.cmd_secrets import ACL_FILE, URL_FILE, acl_text, init_redis_secrets, role_users, url_file
from frenzy.cli.main import app
from frenzy.state import acl
from frenzy.state.acl import RedisRole

NODES = ["agent-a", "agent-b"]
ROLE_FILES = {URL_FILE: "frenzy-operator", "redis-url-scheduler": "frenzy-scheduler",
              "redis-url-worker": "frenzy-worker", "redis-url-agent-agent-a": "frenzy-agent-agent-a",
              "redis-url-agent-agent-b": "frenzy-agent-agent-b"}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _password(url_file: Path, user: str) -> str:
    url = url_file.read_text().strip()
    assert url.startswith(f"redis://{user}:") and url.endswith("@redis:6379/0"), url
    return url.removeprefix(f"redis://{user}:").rsplit("@", 1)[0]


def _acl_users(text: str) -> dict[str, list[str]]:
    return {line.split()[1]: line.split()[2:] for line in text.splitlines()}


def _init(directory: Path, *nodes: str) -> str:
    argv = ["secrets", "init", "--dir", str(directory)]
    for node in nodes:
        argv += ["--node", node]
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 0, out.output
    return out.output


def test_init_writes_one_url_per_role_0600_and_only_hashes_in_the_acl(tmp_path: Path) -> None:
    assert "made" in _init(tmp_path / "s", *NODES)
    directory = tmp_path / "s"
    # (and the predictor token, issue 34: frenzy.predictor.guard)
    assert sorted(p.name for p in directory.iterdir()) == sorted([ACL_FILE, "predictor-token", *ROLE_FILES])
    assert _mode(directory / "predictor-token") == 0o600
    text = (directory / ACL_FILE).read_text()
    users = _acl_users(text)
    passwords = set()
    for name, user in ROLE_FILES.items():
        assert _mode(directory / name) == 0o600, name
        password = _password(directory / name, user)
        assert len(password) >= 40
        assert password not in text  # Redis' own user reads this file: no password is in it
        assert f"#{hashlib.sha256(password.encode()).hexdigest()}" in users[user], user
        passwords.add(password)
    assert len(passwords) == len(ROLE_FILES)  # each role its own password
    assert _mode(directory / ACL_FILE) & 0o022 == 0  # nobody else may change who Redis lets in
    assert all(line.startswith("user ") for line in text.splitlines())  # Redis refuses anything else


def test_the_rules_are_the_dev_stack_s(tmp_path: Path) -> None:
    """One policy, one place: each user's rules are frenzy.state.acl.role_rules for its role."""
    init_redis_secrets(tmp_path, nodes=NODES)
    users = _acl_users((tmp_path / ACL_FILE).read_text())
    wanted = [(RedisRole.OPERATOR, None), (RedisRole.SCHEDULER, None), (RedisRole.WORKER, None),
              (RedisRole.AGENT, "agent-a"), (RedisRole.AGENT, "agent-b")]
    assert sorted(users) == sorted(["default", "health", *(acl.user_name(r, "frenzy", n) for r, n in wanted)])
    for role, node in wanted:
        rules = users[acl.user_name(role, "frenzy", node)]
        assert rules[:2] == ["reset", "on"] and rules[2].startswith("#")
        # compared as text: a selector "(~key -@all +xadd)" holds spaces
        assert " ".join(rules[3:]) == " ".join(acl.role_rules(role, "frenzy", node, selectors=True)), (role, node)
    old = _acl_users(acl_text([(u, "pw") for u in role_users("frenzy", ["n"], selectors=False)]))
    assert " ".join(old["frenzy-agent-n"][3:]) == " ".join(acl.role_rules(RedisRole.AGENT, "frenzy", "n", selectors=False))
    assert url_file(RedisRole.AGENT, "n") == "redis-url-agent-n" and url_file(RedisRole.OPERATOR) == URL_FILE


def test_init_is_idempotent_and_keeps_what_still_agrees(tmp_path: Path) -> None:
    assert init_redis_secrets(tmp_path, nodes=NODES)
    urls = {name: (tmp_path / name).read_text() for name in ROLE_FILES}
    acl_before = (tmp_path / ACL_FILE).read_text()
    assert "kept" in _init(tmp_path, *NODES)
    assert {name: (tmp_path / name).read_text() for name in ROLE_FILES} == urls
    assert (tmp_path / ACL_FILE).read_text() == acl_before
    # The ACL file lost: made again from the URL files, so every service keeps working.
    (tmp_path / ACL_FILE).unlink()
    assert init_redis_secrets(tmp_path, nodes=NODES)
    assert {name: (tmp_path / name).read_text() for name in ROLE_FILES} == urls
    assert _acl_users((tmp_path / ACL_FILE).read_text())["frenzy-worker"] == _acl_users(acl_before)["frenzy-worker"]
    # One URL file lost: that role alone gets a new password, and the ACL follows.
    (tmp_path / "redis-url-worker").unlink()
    assert init_redis_secrets(tmp_path, nodes=NODES)
    password = _password(tmp_path / "redis-url-worker", "frenzy-worker")
    assert password not in urls["redis-url-worker"]
    assert f"#{hashlib.sha256(password.encode()).hexdigest()}" in _acl_users((tmp_path / ACL_FILE).read_text())["frenzy-worker"]
    assert (tmp_path / "redis-url-scheduler").read_text() == urls["redis-url-scheduler"]


def test_a_node_added_or_removed_changes_only_its_user(tmp_path: Path) -> None:
    init_redis_secrets(tmp_path, nodes=NODES)
    before = {name: (tmp_path / name).read_text() for name in ROLE_FILES}
    assert init_redis_secrets(tmp_path, nodes=[*NODES, "agent-c"])
    assert "frenzy-agent-agent-c" in _acl_users((tmp_path / ACL_FILE).read_text())
    assert {name: (tmp_path / name).read_text() for name in ROLE_FILES} == before
    assert init_redis_secrets(tmp_path, nodes=["agent-a"])
    users = _acl_users((tmp_path / ACL_FILE).read_text())
    assert "frenzy-agent-agent-b" not in users and "frenzy-agent-agent-c" not in users
    assert not (tmp_path / "redis-url-agent-agent-b").exists() and not (tmp_path / "redis-url-agent-agent-c").exists()


def test_a_url_of_another_stack_or_the_old_single_user_is_replaced(tmp_path: Path) -> None:
    (tmp_path / URL_FILE).write_text("redis://frenzy:" + "x" * 43 + "@redis:6379/0\n")  # before one user per role
    assert init_redis_secrets(tmp_path)
    assert _password(tmp_path / URL_FILE, "frenzy-operator") != "x" * 43
    assert init_redis_secrets(tmp_path, host="elsewhere")  # another host: every URL written again
    assert (tmp_path / "redis-url-scheduler").read_text().strip().endswith("@elsewhere:6379/0")


def test_acl_gives_no_rights_without_a_password() -> None:
    text = acl_text([(u, "pw") for u in role_users("frenzy", NODES)])
    lines = _acl_users(text)
    # default is locked behind a password nobody has (a hash of discarded random bytes), not turned
    # off: Redis replays the append-only file's transactions as default (redis/redis#14541)
    default = lines["default"]
    assert "nopass" not in default and not any(r.startswith(">") for r in default)
    assert [r for r in default if r.startswith("#")] and len(default[1]) == 65
    assert text.splitlines()[0] != acl_text([]).splitlines()[0]  # a new lock each time
    health = lines["health"]
    assert "nopass" in health and health[-2:] == ["-@all", "+ping"]  # a health check may PING, nothing more
    for user, rules in lines.items():
        if user not in ("default", "health"):
            assert "on" in rules and not any(r == "nopass" or r.startswith(">") for r in rules), user


def test_init_where_no_dir_can_be_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")  # a path under a file works even for root (tests may run as root)
    out = CliRunner().invoke(app, ["secrets", "init", "--dir", str(tmp_path / "a-file" / "secrets")])
    assert out.exit_code == 1 and "cannot write" in out.output, out.output


def test_a_node_name_that_is_not_one_is_refused(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["secrets", "init", "--dir", str(tmp_path), "--node", "../etc"])
    assert out.exit_code == 2 and "node name" in out.output, out.output
    assert not list(tmp_path.iterdir())
