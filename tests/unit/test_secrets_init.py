"""`frenzy secrets init`: Redis' password made once, into files only their owner may read."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

from typer.testing import CliRunner

from frenzy.cli.cmd_secrets import ACL_FILE, URL_FILE, acl_text, init_redis_secrets
from frenzy.cli.main import app


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _password(url_file: Path) -> str:
    url = url_file.read_text().strip()
    assert url.startswith("redis://frenzy:") and url.endswith("@redis:6379/0"), url
    return url.removeprefix("redis://frenzy:").rsplit("@", 1)[0]


def test_init_writes_the_url_0600_and_only_a_hash_in_the_acl(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["secrets", "init", "--dir", str(tmp_path / "s")])
    assert out.exit_code == 0 and "made" in out.output, out.output
    acl, url = tmp_path / "s" / ACL_FILE, tmp_path / "s" / URL_FILE
    assert _mode(url) == 0o600
    password = _password(url)
    assert len(password) >= 40
    text = acl.read_text()
    assert password not in text  # Redis' own user reads this file: the password is not in it
    assert f"#{hashlib.sha256(password.encode()).hexdigest()}" in text
    assert _mode(acl) & 0o022 == 0  # nobody else may change who Redis lets in


def test_init_is_idempotent_and_remakes_a_broken_pair(tmp_path: Path) -> None:
    assert init_redis_secrets(tmp_path)
    first = (tmp_path / URL_FILE).read_text(), (tmp_path / ACL_FILE).read_text()
    out = CliRunner().invoke(app, ["secrets", "init", "--dir", str(tmp_path)])
    assert out.exit_code == 0 and "kept" in out.output, out.output
    assert ((tmp_path / URL_FILE).read_text(), (tmp_path / ACL_FILE).read_text()) == first
    (tmp_path / ACL_FILE).unlink()  # half a pair: both made again, so they agree
    assert init_redis_secrets(tmp_path)
    password = _password(tmp_path / URL_FILE)
    assert password not in first[0]
    assert hashlib.sha256(password.encode()).hexdigest() in (tmp_path / ACL_FILE).read_text()


def test_acl_gives_no_rights_without_a_password() -> None:
    lines = {line.split()[1]: line.split()[2:] for line in acl_text("pw").splitlines()
             if line.startswith("user ")}
    # default is locked behind a password nobody has (a hash of discarded random bytes), not turned
    # off: Redis replays the append-only file's transactions as default (redis/redis#14541)
    default = lines["default"]
    assert "nopass" not in default and not any(r.startswith(">") for r in default)
    assert [r for r in default if r.startswith("#")] and len(default[1]) == 65
    assert acl_text("pw").splitlines()[0] != acl_text("pw").splitlines()[0]  # a new lock each time
    health = lines["health"]
    assert "nopass" in health and health[-2:] == ["-@all", "+ping"]  # a health check may PING, nothing more
    assert "on" in lines["frenzy"] and not any(r in ("nopass",) or r.startswith(">") for r in lines["frenzy"])


def test_init_where_no_dir_can_be_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")  # a path under a file works even for root (tests may run as root)
    out = CliRunner().invoke(app, ["secrets", "init", "--dir", str(tmp_path / "a-file" / "secrets")])
    assert out.exit_code == 1 and "cannot write" in out.output, out.output
