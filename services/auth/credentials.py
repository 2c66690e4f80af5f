"""Where a client finds its token and its scheduler, with nothing to type.

Order, first found wins, for each of the two values:

    token      FRENZY_TOKEN, else the file FRENZY_TOKEN_FILE names, else the credentials file
    scheduler  --scheduler / FRENZY_SCHEDULER, else the credentials file, else 127.0.0.1:50051

The credentials file is ``$FRENZY_CREDENTIALS``, else ``$XDG_CONFIG_HOME/frenzy/credentials.json``
(``~/.config/...``). `frenzy up` and `frenzy demo` write one for the stack they start (an admin
token of their own), so the CLI on the same machine just works. Like ssh with a private key,
a credentials file that others can read is refused rather than used: a token is a login.
FRENZY_TOKEN_FILE (one token on its first line, same rule on its mode) is for services in
containers, which get their token as a file in a volume (compose.yaml's batch worker).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SCHEDULER = "127.0.0.1:50051"


class CredentialsError(Exception):
    """The credentials file exists but cannot be used (unsafe mode, not JSON, wrong shape)."""


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    scheduler: str | None = None
    api: str | None = None
    ca: str | None = None  # path of the CA certificate to trust (TLS); none: plaintext
    # `frenzy batch`'s Redis (the batch worker's least-privilege user, password included): batches
    # go through Celery on Redis, not the scheduler API. `frenzy up` writes it; none elsewhere.
    batch_redis: str | None = None
    # The operator's Redis URL, for `frenzy token`, `node`, `queue` on a stack `frenzy up` started
    # on this machine (its Redis password is in its run directory anyway); none elsewhere.
    redis: str | None = None


_FIELDS = ("token", "scheduler", "api", "ca", "batch_redis", "redis")


def redact_url(url: str) -> str:
    """``url`` fit for a message or a log line: a password in it replaced by ***."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{host}"))


def credentials_path() -> Path:
    explicit = os.environ.get("FRENZY_CREDENTIALS")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "frenzy" / "credentials.json"


def _refuse_if_shared(st: os.stat_result, what: str, path: Path) -> None:
    """A file holding a secret that group or others may read is refused, as ssh refuses such a key."""
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(f"{what} can be read by other users (mode {stat.S_IMODE(st.st_mode):o}). "
                               f"To fix: chmod 600 {path}")


def read_credentials(path: Path | None = None) -> Credentials:
    """The file's contents; an empty ``Credentials`` when there is no file."""
    path = path or credentials_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        return Credentials()
    except OSError as exc:
        raise CredentialsError(f"credentials file {path}: {exc.strerror}") from exc
    _refuse_if_shared(st, f"credentials file {path}", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CredentialsError(f"credentials file {path}: not readable JSON ({type(exc).__name__})") from exc
    if not isinstance(data, dict):
        raise CredentialsError(f"credentials file {path}: expected a JSON object")
    fields = {k: data.get(k) for k in _FIELDS}
    for key, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise CredentialsError(f"credentials file {path}: {key} must be a string")
    return Credentials(**fields)


def write_private(path: Path, content: str | bytes, mode: int = 0o600) -> None:
    """Write ``content`` with ``mode`` atomically: never a moment with other content or wider rights.
    Every secret Frenzy writes (credentials, tokens, Redis URLs and config, keys) goes through here."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, content.encode() if isinstance(content, str) else content)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_credentials(path: Path, creds: Credentials) -> None:
    """Write ``creds`` readable by the owner only, atomically (never a moment world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = {k: getattr(creds, k) for k in _FIELDS if getattr(creds, k) is not None}
    write_private(path, json.dumps(data, indent=1) + "\n")


def read_token_file(path: Path) -> str:
    """The token on the first line of ``path`` (FRENZY_TOKEN_FILE), a file only its owner may read."""
    try:
        st = path.stat()
        _refuse_if_shared(st, f"FRENZY_TOKEN_FILE={path}", path)
        with path.open(encoding="utf-8") as fh:
            token = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise CredentialsError(f"FRENZY_TOKEN_FILE={path}: cannot read it ({reason})") from exc
    if not token:
        raise CredentialsError(f"FRENZY_TOKEN_FILE={path}: the file's first line is empty; it should hold a token")
    return token


def resolve_token(explicit: str | None = None) -> str | None:
    given = explicit or os.environ.get("FRENZY_TOKEN")
    if given:
        return given
    token_file = os.environ.get("FRENZY_TOKEN_FILE")
    if token_file:
        return read_token_file(Path(token_file))
    return read_credentials().token


def resolve_scheduler(explicit: str | None = None) -> str:
    return (explicit or os.environ.get("FRENZY_SCHEDULER") or read_credentials().scheduler
            or DEFAULT_SCHEDULER)
