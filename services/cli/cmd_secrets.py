"""``frenzy secrets init|tokens``: the credentials a container stack makes for itself at first start.

compose.yaml runs these as one-shot services so no secret is ever written in a
file under version control: ``init`` makes Redis' password before Redis starts,
``tokens`` makes the first API tokens once Redis answers. Both keep what is
already there, so a restart changes nothing and clients keep working.

Files, in ``--dir``:

    redis.acl   Redis' ACL file: ``default`` locked, user ``frenzy`` with the password's SHA-256
                (not the password, so Redis' own user may read the file), user ``health`` that
                may only PING (for the container's health check, which has no password to give)
    redis-url   redis://frenzy:PASSWORD@HOST:PORT/DB, mode 0600: what services read through
                REDIS_URL_FILE
    admin-token, worker-token (``tokens``), mode 0600: an admin token for the operator and the
                batch worker's own (role submit, user "batch")
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Annotated

import redis
import typer

from frenzy.auth.roles import Role
from frenzy.auth.tokens import AuthError, TokenStore
from frenzy.cli.output import fail
from frenzy.devstack.redis_server import unusable_default_user
from frenzy.state.keys import Keys

secrets_app = typer.Typer(help="Credentials a container stack makes for itself (compose.yaml's one-shot "
                               "services).", no_args_is_help=True)

ACL_FILE = "redis.acl"
URL_FILE = "redis-url"
ADMIN_TOKEN_FILE = "admin-token"
WORKER_TOKEN_FILE = "worker-token"
REDIS_USER = "frenzy"
HEALTH_USER = "health"

DirOpt = Annotated[Path, typer.Option("--dir", help="Where the files live (a volume).")]


def acl_text(password: str) -> str:
    """Redis' ACL file for ``password``: nobody without a password has any right but PING."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    # No comment line: Redis refuses an ACL file with anything but `user` lines.
    # `default` locked by a password nobody has, not turned off: see unusable_default_user.
    return (f"{unusable_default_user()}\n"
            f"user {HEALTH_USER} on nopass resetkeys resetchannels -@all +ping\n"
            f"user {REDIS_USER} on #{digest} ~* &* +@all\n")


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` with ``mode`` atomically: never a moment with other content or wider rights."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def init_redis_secrets(directory: Path, host: str = "redis", port: int = 6379, db: int = 0) -> bool:
    """Make Redis' password, ACL file and URL file in ``directory`` unless both files are there.

    -> True when it made them. A half-made pair (one file lost) is made again as a pair, so the
    ACL and the URL always agree."""
    acl, url = directory / ACL_FILE, directory / URL_FILE
    if acl.is_file() and url.is_file():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(32)  # URL-safe: goes into redis:// unquoted
    write_private(url, f"redis://{REDIS_USER}:{password}@{host}:{port}/{db}\n")
    # Only a hash: readable by Redis' own user (another uid in its container), useless to anyone else.
    write_private(acl, acl_text(password), mode=0o644)
    return True


def ensure_token(store: TokenStore, path: Path, user: str, role: Role, note: str) -> bool:
    """A token for ``user`` in ``path`` (0600) that Redis still knows. -> True when it made a new one.

    A token file whose token Redis has lost (its data volume dropped) is replaced."""
    if path.is_file():
        try:
            store.verify(path.read_text(encoding="utf-8").strip())
            return False
        except AuthError:
            pass
    token, _ = store.create(user, role, note=note)
    write_private(path, token + "\n")
    return True


@secrets_app.command("init")
def init(
    directory: DirOpt,
    redis_host: Annotated[str, typer.Option(help="Redis' host name, as services reach it.")] = "redis",
    redis_port: Annotated[int, typer.Option(help="Redis' port.")] = 6379,
    redis_db: Annotated[int, typer.Option(help="Redis database number.")] = 0,
) -> None:
    """Make Redis' password (its ACL file and a redis:// URL file) unless they exist.

    \b
    Example (compose.yaml's `init` service):
      frenzy secrets init --dir /secrets
    """
    try:
        made = init_redis_secrets(directory, redis_host, redis_port, redis_db)
    except OSError as exc:
        fail(f"cannot write Redis' secrets in {directory}: {exc.strerror}. To fix: make it writable by this user", 1)
    typer.echo(f"{'made' if made else 'kept'} {directory / ACL_FILE} and {directory / URL_FILE}")


@secrets_app.command("tokens")
def tokens(
    directory: DirOpt,
    redis_url: Annotated[str, typer.Option("--redis-url", envvar="REDIS_URL",
                                           help="The cluster's Redis (with credentials).")]
    = "redis://127.0.0.1:6379/0",
    prefix: Annotated[str, typer.Option(envvar="FRENZY_PREFIX", help="Redis key prefix.")] = "frenzy",
) -> None:
    """Make an admin token (user admin) and the batch worker's (user batch, role submit) unless
    the files hold tokens that still work.

    \b
    Example (compose.yaml's `bootstrap` service):
      frenzy secrets tokens --dir /tokens
    """
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)
    store = TokenStore(client, Keys(prefix), cache_s=0)
    wanted = [(ADMIN_TOKEN_FILE, "admin", Role.ADMIN, "the stack's admin (secrets tokens)"),
              (WORKER_TOKEN_FILE, "batch", Role.SUBMIT, "the stack's batch worker (secrets tokens)")]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, user, role, note in wanted:
            made = ensure_token(store, directory / name, user, role, note)
            typer.echo(f"{'made' if made else 'kept'} {directory / name} ({user}, {role.value})")
    except redis.AuthenticationError:
        fail("Redis refused the credentials in --redis-url / REDIS_URL / REDIS_URL_FILE", 1)
    except redis.ConnectionError:
        fail("cannot reach Redis at --redis-url / REDIS_URL / REDIS_URL_FILE", 1)
    except OSError as exc:
        fail(f"cannot write tokens in {directory}: {exc.strerror}. To fix: make it writable by this user", 1)
    finally:
        client.close()


def register(app: typer.Typer) -> None:
    app.add_typer(secrets_app, name="secrets")
