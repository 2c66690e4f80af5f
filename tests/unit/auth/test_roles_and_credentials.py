"""Roles decide which RPC a token may call; the credentials file is found and refused when unsafe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frenzy.auth import credentials as creds_mod
from frenzy.auth.credentials import Credentials, CredentialsError, read_credentials, write_credentials
from frenzy.auth.roles import METHOD_PERMISSION, Role, allows, is_open, sees_all_jobs
from frenzy.auth.tokens import AuthError, bearer, parse_token
from frenzy.v1 import predictor_pb2, scheduler_pb2


def test_every_public_rpc_has_a_permission() -> None:
    """A new RPC without a permission would be refused to everyone; this catches it at once."""
    for descriptor in (scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"],
                       predictor_pb2.DESCRIPTOR.services_by_name["Predictor"]):
        for method in descriptor.methods:
            assert f"/{descriptor.full_name}/{method.name}" in METHOD_PERMISSION, method.name


def test_roles() -> None:
    submit, cancel, get = ("/frenzy.v1.Scheduler/SubmitJob", "/frenzy.v1.Scheduler/CancelJob",
                           "/frenzy.v1.Scheduler/GetJob")
    assert not allows(Role.READ, submit) and not allows(Role.READ, cancel) and allows(Role.READ, get)
    assert allows(Role.SUBMIT, submit) and allows(Role.SUBMIT, cancel)
    assert allows(Role.ADMIN, submit)
    assert not any(allows(Role.NODE, m) for m in METHOD_PERMISSION)
    assert not allows(Role.ADMIN, "/frenzy.v1.Scheduler/SomethingNew")  # unlisted: refused
    assert is_open("/grpc.health.v1.Health/Check") and not is_open(get)
    assert sees_all_jobs(Role.ADMIN) and not sees_all_jobs(Role.SUBMIT)
    assert Role.parse(" Admin ") is Role.ADMIN
    with pytest.raises(ValueError, match="unknown role 'root'"):
        Role.parse("root")


def test_token_and_header_parsing() -> None:
    good = "frz_0123456789ab_" + "A" * 43
    assert parse_token(good) == ("0123456789ab", "A" * 43)
    for bad in ("", "frz_0123456789ab_short", "ghp_" + "x" * 60, good + "x"):
        with pytest.raises(AuthError, match="malformed"):
            parse_token(bad)
    assert bearer(f"Bearer {good}") == good
    assert bearer(f"bearer   {good} ") == good
    for bad in (None, "", "Basic abc", "Bearer "):
        with pytest.raises(AuthError):
            bearer(bad)


def test_credentials_file_round_trip_and_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sub" / "credentials.json"
    write_credentials(path, Credentials(token="t", scheduler="127.0.0.1:1"))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_credentials(path) == Credentials(token="t", scheduler="127.0.0.1:1")
    monkeypatch.setenv("FRENZY_CREDENTIALS", str(path))
    monkeypatch.delenv("FRENZY_TOKEN", raising=False)
    monkeypatch.delenv("FRENZY_SCHEDULER", raising=False)
    assert creds_mod.resolve_token() == "t"
    assert creds_mod.resolve_scheduler() == "127.0.0.1:1"
    monkeypatch.setenv("FRENZY_TOKEN", "from-env")
    assert creds_mod.resolve_token() == "from-env"
    assert creds_mod.resolve_scheduler("explicit:1") == "explicit:1"
    os.chmod(path, 0o644)  # others can read it: refused, like ssh does with a private key
    with pytest.raises(CredentialsError, match="chmod 600"):
        read_credentials(path)


def test_credentials_missing_or_damaged(tmp_path: Path) -> None:
    assert read_credentials(tmp_path / "none.json") == Credentials()
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    os.chmod(bad, 0o600)
    with pytest.raises(CredentialsError, match="JSON object"):
        read_credentials(bad)
    bad.write_text('{"token": 5}')
    with pytest.raises(CredentialsError, match="token must be a string"):
        read_credentials(bad)
