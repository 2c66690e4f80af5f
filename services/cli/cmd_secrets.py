"""``frenzy secrets init|tokens``: the credentials a container stack makes for itself at first start.

compose.yaml runs these as one-shot services so no secret is ever written in a
file under version control: ``init`` makes Redis' users and passwords before Redis
starts, ``tokens`` makes the first API tokens once Redis answers. Both keep what is
already there, so a restart changes nothing and clients keep working.

Each service gets its own least-privilege Redis user, with the rules the dev stack
gives it (``frenzy.state.acl.role_rules``: one policy, one place): the operator (the
admin: the one-shot ``bootstrap`` and ``node-keys`` services), the scheduler, the
batch worker and one agent per node (``--node``). Files, in ``--dir``:

    redis.acl   Redis' ACL file: ``default`` locked, user ``health`` that may only PING (for
                the container's health check, which has no password to give), then one user
                per role with its password's SHA-256 (not the password, so Redis' own user may
                read the file; mode 0644)
    redis-url   the operator's redis://{prefix}-operator:PASSWORD@HOST:PORT/DB, mode 0600
    redis-url-scheduler, redis-url-worker, redis-url-agent-<node>
                each role's own URL, mode 0600: what its service reads through REDIS_URL_FILE
    predictor-token  (``init``; ``--predictor-token`` puts it elsewhere), mode 0600: the secret the
                scheduler sends the predictor, which answers no one else (frenzy.predictor.guard);
                both read it via FRENZY_PREDICTOR_TOKEN_FILE
    admin-token, worker-token (``tokens``), mode 0600: an admin token for the operator and the
                batch worker's own (role submit, user "batch")
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from frenzy.cli.output import fail
from frenzy.state import acl

if TYPE_CHECKING:  # annotations only; imported where the command runs
    from frenzy.auth.roles import Role
    from frenzy.auth.tokens import TokenStore

secrets_app = typer.Typer(help="Credentials a container stack makes for itself (compose.yaml's one-shot "
                               "services).", no_args_is_help=True)

ACL_FILE = "redis.acl"
URL_FILE = "redis-url"  # the operator's (the admin's): only the one-shot services read it
ADMIN_TOKEN_FILE = "admin-token"
WORKER_TOKEN_FILE = "worker-token"
PREDICTOR_TOKEN_FILE = "predictor-token"  # frenzy.predictor.guard.TOKEN_FILE
HEALTH_USER = "health"
HEALTH_LINE = f"user {HEALTH_USER} on nopass resetkeys resetchannels -@all +ping"
_AGENT_URL_PREFIX = f"{URL_FILE}-agent-"

DirOpt = Annotated[Path, typer.Option("--dir", help="Where the files live (a volume).")]


def url_file(role: acl.RedisRole, node: str | None = None) -> str:
    """The name of the file holding ``role``'s redis:// URL (per node for agents)."""
    if role is acl.RedisRole.OPERATOR:
        return URL_FILE
    if role is acl.RedisRole.AGENT:
        if not node:
            raise ValueError("an agent's URL file is per node: give the node name")
        return f"{_AGENT_URL_PREFIX}{node}"
    return f"{URL_FILE}-{role.value}"


@dataclass(frozen=True)
class RoleUser:
    """One service's Redis user in a container stack: its role, name, rules and URL file."""

    role: acl.RedisRole
    node: str | None
    name: str
    rules: tuple[str, ...]
    url_file: str


def role_users(prefix: str, nodes: Sequence[str], db: int = 0, selectors: bool = True) -> list[RoleUser]:
    """The operator, the scheduler, the worker and one agent per node of ``nodes``, each with
    ``frenzy.state.acl``'s rules for its role. ``selectors``: the server is Redis 7.0+."""
    from frenzy.state.messages import is_safe_name

    bad = [n for n in nodes if not is_safe_name(n)]
    if bad:
        raise ValueError(f"node name(s) {', '.join(map(repr, bad))}: use letters, digits, '.', '_' and '-' "
                         "(at most 128, starting with a letter or digit, no '..'), as `frenzy agent --node`")
    wanted = [(acl.RedisRole.OPERATOR, None), (acl.RedisRole.SCHEDULER, None), (acl.RedisRole.WORKER, None),
              *((acl.RedisRole.AGENT, n) for n in dict.fromkeys(nodes))]
    return [RoleUser(role, node, acl.user_name(role, prefix, node),
                     acl.role_rules(role, prefix, node, db=db, selectors=selectors), url_file(role, node))
            for role, node in wanted]


def acl_text(passwords: Sequence[tuple[RoleUser, str]]) -> str:
    """Redis' ACL file giving each user its rules behind its password (as a hash): nobody without
    a password has any right but PING."""
    from frenzy.devstack.redis_server import unusable_default_user

    # No comment line: Redis refuses an ACL file with anything but `user` lines.
    # `default` locked by a password nobody has, not turned off: see unusable_default_user.
    return "\n".join([unusable_default_user(), *_user_lines(passwords)]) + "\n"


def _user_lines(passwords: Sequence[tuple[RoleUser, str]]) -> list[str]:
    return [HEALTH_LINE, *(acl.acl_file_line(u.name, pw, u.rules) for u, pw in passwords)]


def role_url(user: RoleUser, password: str, host: str, port: int, db: int) -> str:
    """The redis:// URL ``user`` connects with (the password is URL-safe: it goes in unquoted)."""
    return f"redis://{user.name}:{password}@{host}:{port}/{db}"


def _password_in(path: Path, user: RoleUser, host: str, port: int, db: int) -> str | None:
    """The password in ``user``'s URL file when it is the URL this stack would write, else None."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    m = re.fullmatch(rf"redis://{re.escape(user.name)}:([A-Za-z0-9_-]{{32,}})@(.+)", text)
    if m is None or text != role_url(user, m.group(1), host, port, db):
        return None
    return m.group(1)


def init_redis_secrets(directory: Path, host: str = "redis", port: int = 6379, db: int = 0, *,
                       prefix: str = "frenzy", nodes: Sequence[str] = (), selectors: bool = True) -> bool:
    """Make each role's password, its URL file and Redis' ACL file in ``directory`` unless they are
    all there and agree.

    -> True when it wrote anything. A URL file that is there (and names this stack's user, host,
    port and database) keeps its password, so its service keeps working; a missing one gets a new
    password. The ACL file is rewritten from the URL files whenever its users differ from what they
    and ``acl.role_rules`` say (a lost file, a node added, a rule changed), so the ACL and the URLs
    always agree. An agent URL file for a node no longer listed is removed with its user."""
    from frenzy.auth.credentials import write_private

    users = role_users(prefix, nodes, db, selectors)
    found = {u: _password_in(directory / u.url_file, u, host, port, db) for u in users}
    acl_path = directory / ACL_FILE
    if all(found.values()) and acl_path.is_file():
        kept = [ln for ln in acl_path.read_text(encoding="utf-8").splitlines() if not ln.startswith("user default ")]
        if kept == _user_lines([(u, pw) for u, pw in found.items() if pw]):
            return False
    directory.mkdir(parents=True, exist_ok=True)
    passwords: list[tuple[RoleUser, str]] = []
    for user, password in found.items():
        if password is None:
            password = secrets.token_urlsafe(32)  # URL-safe: goes into redis:// unquoted
            write_private(directory / user.url_file, role_url(user, password, host, port, db) + "\n")
        passwords.append((user, password))
    # Only hashes: readable by Redis' own user (another uid in its container), useless to anyone else.
    write_private(acl_path, acl_text(passwords), mode=0o644)
    wanted = {u.url_file for u in users}
    for stale in directory.glob(f"{_AGENT_URL_PREFIX}*"):
        if stale.name not in wanted:
            stale.unlink()
    return True


def ensure_token(store: TokenStore, path: Path, user: str, role: Role, note: str) -> bool:
    """A token for ``user`` in ``path`` (0600) that Redis still knows. -> True when it made a new one.

    A token file whose token Redis has lost (its data volume dropped) is replaced."""
    from frenzy.auth.credentials import write_private
    from frenzy.auth.tokens import AuthError

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
    node: Annotated[list[str] | None, typer.Option(
        "--node", help="An agent's node name: it gets its own Redis user (repeat for each agent).")] = None,
    prefix: Annotated[str, typer.Option(envvar="FRENZY_PREFIX", help="Redis key prefix.")] = "frenzy",
    selectors: Annotated[bool, typer.Option(
        "--selectors/--no-selectors",
        help="Redis is 7.0+ (ACL selectors: an agent may only read its launch stream and only append "
             "events); --no-selectors for Redis 6.2.")] = True,
    predictor_token: Annotated[Path | None, typer.Option(
        "--predictor-token", dir_okay=False,
        help="Where the predictor token goes (default: DIR/predictor-token): a file of its own, so the "
             "predictor can be given it without the Redis passwords.")] = None,
) -> None:
    """Make each service's Redis user and password (Redis' ACL file and one redis:// URL file per
    role) unless they exist.

    \b
    Example (compose.yaml's `init` service):
      frenzy secrets init --dir /secrets --node agent-a --node agent-b
    """
    nodes = node or []
    try:
        made = init_redis_secrets(directory, redis_host, redis_port, redis_db, prefix=prefix, nodes=nodes,
                                  selectors=selectors)
    except ValueError as exc:
        fail(f"{exc}", 2)
    except OSError as exc:
        fail(f"cannot write Redis' secrets in {directory}: {exc.strerror}. To fix: make it writable by this user", 1)
    token_path = predictor_token or directory / PREDICTOR_TOKEN_FILE
    try:
        made_token = ensure_predictor_token(token_path)
    except OSError as exc:
        fail(f"cannot write the predictor token {token_path}: {exc.strerror}", 1)
    files = ", ".join(u.url_file for u in role_users(prefix, nodes, redis_db, selectors))
    typer.echo(f"{'made' if made else 'kept'} {directory / ACL_FILE} and {files}; "
               f"{'made' if made_token else 'kept'} {token_path}")


def ensure_predictor_token(path: Path) -> bool:
    """The predictor token (the secret the scheduler sends the predictor, frenzy.predictor.guard) in
    ``path``, mode 0600, made unless a usable one is there. -> True when it made one."""
    from frenzy.auth.credentials import write_private
    from frenzy.predictor.guard import PredictorTokenError, new_token, read_token_file

    directory = path.parent
    if path.is_file():
        try:
            read_token_file(path)
            return False
        except PredictorTokenError:
            pass
    directory.mkdir(parents=True, exist_ok=True)
    write_private(path, new_token() + "\n")
    return True


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
    import redis

    from frenzy.auth.roles import Role
    from frenzy.auth.tokens import TokenStore
    from frenzy.state.keys import Keys

    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)
    store = TokenStore(client, Keys(prefix), cache_s=0)
    wanted = [(ADMIN_TOKEN_FILE, "admin", Role.ADMIN, "the stack's admin (secrets tokens)"),
              (WORKER_TOKEN_FILE, "batch", Role.SUBMIT, "the stack's batch worker (secrets tokens)")]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, user, role, note in wanted:
            made = ensure_token(store, directory / name, user, role, note)
            typer.echo(f"{'made' if made else 'kept'} {directory / name} ({user}, {role.value})")
        # Agents may only call Frenzy's scripts by hash (frenzy.state.acl): loaded here, with the
        # operator's rights, so compose's agents register before any scheduler is up.
        from frenzy.state.scripts import ensure_loaded

        ensure_loaded(client)
    except redis.AuthenticationError:
        fail("Redis refused the credentials in --redis-url / REDIS_URL / REDIS_URL_FILE", 1)
    except redis.ConnectionError:
        fail("cannot reach Redis at --redis-url / REDIS_URL / REDIS_URL_FILE", 1)
    except OSError as exc:
        fail(f"cannot write tokens in {directory}: {exc.strerror}. To fix: make it writable by this user", 1)
    finally:
        client.close()


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.add_typer(secrets_app, name="secrets", rich_help_panel=PANEL)
