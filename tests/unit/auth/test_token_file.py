"""FRENZY_TOKEN_FILE: a service in a container finds its token in a file (compose.yaml's worker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frenzy.auth import credentials as creds_mod
from frenzy.auth.credentials import Credentials, CredentialsError, write_credentials


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("FRENZY_TOKEN", "FRENZY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    creds = tmp_path / "credentials.json"
    write_credentials(creds, Credentials(token="from-credentials"))
    monkeypatch.setenv("FRENZY_CREDENTIALS", str(creds))
    return monkeypatch


def _token_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_order_env_then_file_then_credentials(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert creds_mod.resolve_token() == "from-credentials"
    clean_env.setenv("FRENZY_TOKEN_FILE", str(_token_file(tmp_path / "token", "from-file\nignored\n")))
    assert creds_mod.resolve_token() == "from-file"
    clean_env.setenv("FRENZY_TOKEN", "from-env")
    assert creds_mod.resolve_token() == "from-env"
    assert creds_mod.resolve_token("explicit") == "explicit"


@pytest.mark.parametrize(("text", "mode", "message"), [
    ("tok\n", 0o644, "chmod 600"),  # readable by others: refused, like the credentials file
    ("\n", 0o600, "first line is empty"),
])
def test_unusable_token_file_is_named(clean_env: pytest.MonkeyPatch, tmp_path: Path, text: str, mode: int,
                                      message: str) -> None:
    clean_env.setenv("FRENZY_TOKEN_FILE", str(_token_file(tmp_path / "token", text, mode)))
    with pytest.raises(CredentialsError, match=message) as err:
        creds_mod.resolve_token()
    assert "FRENZY_TOKEN_FILE=" in str(err.value)


def test_missing_token_file_is_an_error_not_a_fallback(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Falling back to another identity when the named file is gone would hide a broken deployment.
    clean_env.setenv("FRENZY_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(CredentialsError, match="FRENZY_TOKEN_FILE=.*absent"):
        creds_mod.resolve_token()
