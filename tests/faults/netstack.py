"""The Frenzy stack on hosts of its own (issue 37): Redis, the predictor, two schedulers (the first
started leads, the second stands by), four agents with fake GPUs and, when asked, the REST API —
each a real ``python -m frenzy.cli.main ...`` process in its own network namespace
(``netns.Net``), talking over the test's bridge with the credentials a deployment would use: a
Redis whose ``default`` user nobody can be, one Redis user per service with only its role's rights
(``add_role_users``), a signing key per node (``node_keys.create``) and API tokens
(``TokenStore.create``) — the very functions ``frenzy up`` uses.

Beside it:

* ``JobStream``: jobs submitted at a steady rate, each a shell command that appends a ``start``
  line to a file all nodes share, sleeps, and appends an ``end`` line (``RunLog`` reads them): a
  job run twice, or a copy that was not stopped, shows;
* ``RedisMonitor``: Redis' MONITOR feed, parsed (who ran which script when, and what the script
  wrote): what Redis really executed, timed by Redis, is the evidence the tests judge by;
* ``settle``: the end state every fault test checks — every job ended, none holding a GPU.

The test process talks to every service over the bridge from the root namespace.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis
from faults.netns import Host, Net, why_no_namespaces

from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.devstack.redis_server import (
    STACK_USER,
    RoleUrls,
    add_role_users,
    redis_binary,
    unusable_default_user,
)
from frenzy.rpc.bearer import with_token
from frenzy.rpc.client import wait_healthy
from frenzy.rpc.jobspec import parse_entry
from frenzy.state import node_keys, scripts
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc

REDIS_PORT = 6379  # each host has its own network stack: the well-known ports cannot collide
SCHEDULER_PORT = 50051
PREDICTOR_PORT = 50052
PREDICTOR_TOKEN = "frzp_" + secrets.token_urlsafe(32)  # the scheduler's to the predictor (issue 34)
API_PORT = 8080
METRICS_PORT = 9100
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@dataclass
class Timing:
    """The services' clocks, short so that a fault plays out in seconds."""

    heartbeat_s: float = 0.25
    ttl_s: float = 1.0
    node_dead_after_s: float = 2.0
    leader_ttl_s: float = 1.5
    cancel_grace_s: float = 2.0
    orphan_release_s: float = 20.0


@dataclass
class Proc:
    name: str
    host: Host
    args: list[str]
    env: dict[str, str]
    log: Path
    popen: object = None  # subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid  # type: ignore[attr-defined]

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None  # type: ignore[attr-defined]


@dataclass
class NetStack:
    net: Net
    run_dir: Path
    timing: Timing = field(default_factory=Timing)
    nodes: int = 4
    gpus: str = "L4:1"
    lossy: tuple[str, ...] = ()  # host names on a lossy wire (netns.LossyLink)
    with_api: bool = False
    prefix: str = field(default_factory=lambda: f"nf{secrets.token_hex(4)}")
    admin_url: str = ""
    token: str = ""
    role_urls: RoleUrls | None = None
    procs: dict[str, Proc] = field(default_factory=dict)

    # ---- hosts

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def addr(self, name: str, port: int) -> str:
        return f"{self.host(name).ip}:{port}"

    @property
    def redis_host(self) -> Host:
        return self.host("redis")

    # ---- start

    def start(self) -> NetStack:
        names = ["redis", "predictor", "sched-a", "sched-b", *self.node_names] + (["api"] if self.with_api else [])
        for name in names:
            self.net.add_host(name, lossy=name in self.lossy)
        self._start_redis()
        client = self.admin()
        try:
            tokens = TokenStore(client, self.keys)
            self.token, _ = tokens.create("faults", Role.ADMIN, note="issue 37 fault test")
            for node in self.node_names:
                node_keys.create(client, self.keys, node)
        finally:
            client.close()
        self.role_urls = add_role_users(self.admin_url, self.prefix, self.node_names)
        self._frenzy("predictor", ["predictor", "--address", self.addr("predictor", PREDICTOR_PORT)],
                     {"FRENZY_PREDICTOR_TOKEN": PREDICTOR_TOKEN})
        self.start_scheduler("sched-a")
        self.wait(lambda: wait_healthy(self.addr("predictor", PREDICTOR_PORT), timeout_s=1), 60, "predictor healthy")
        self.wait(lambda: self.leader_host() == "sched-a", 60, "sched-a to take the leader lease")
        self.start_scheduler("sched-b")
        for node in self.node_names:
            self.start_agent(node)
        if self.with_api:
            self.start_api()
        self.wait(lambda: wait_healthy(self.addr("sched-b", SCHEDULER_PORT), timeout_s=1), 60, "sched-b healthy")
        self.wait(lambda: self.alive_nodes() == set(self.node_names), 60, "every agent registered")
        return self

    def _start_redis(self) -> None:
        password = secrets.token_urlsafe(24)
        workdir = self.run_dir / "redis"
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "redis.conf"  # the password in a file, never on a command line
        conf.write_text(f"{unusable_default_user()}\nuser {STACK_USER} on >{password} ~* &* +@all\n")
        conf.chmod(0o600)
        ip = self.redis_host.ip
        self._spawn("redis", [redis_binary(), str(conf), "--port", str(REDIS_PORT), "--bind", ip, "--dir",
                              str(workdir), "--save", "", "--appendonly", "no", "--daemonize", "no",
                              "--protected-mode", "yes"], env={"PATH": os.environ.get("PATH", "")})
        self.admin_url = f"redis://{STACK_USER}:{password}@{ip}:{REDIS_PORT}/0"

        def pings() -> bool:
            try:
                with redis.Redis.from_url(self.admin_url, socket_timeout=1, socket_connect_timeout=1) as c:
                    return bool(c.ping())
            except redis.RedisError:
                return False

        self.wait(pings, 20, "redis to answer on its host")

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        """A service's environment: no token or Redis URL from whoever runs the tests (as
        ``LocalStack._spawn``), its own when given."""
        base = {k: v for k, v in os.environ.items()
                if k not in ("FRENZY_TOKEN", "FRENZY_CREDENTIALS", "REDIS_URL", "REDIS_URL_FILE", "FRENZY_SCHEDULER")}
        return dict(base, FRENZY_PREFIX=self.prefix, PYTHONUNBUFFERED="1", **extra)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, self.host(name), argv, env, self.run_dir / f"{name}.log")
        proc.popen = self.net.spawn(proc.host, argv, proc.log, env=env)
        self.procs[name] = proc
        return proc

    def _frenzy(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        """``python -m frenzy.cli.main ARGS`` on host ``name``."""
        return self._spawn(name, [sys.executable, "-m", "frenzy.cli.main", *args], self._env(env or {}))

    def start_scheduler(self, name: str) -> Proc:
        assert self.role_urls is not None
        t = self.timing
        args = ["scheduler", "--address", self.addr(name, SCHEDULER_PORT),
                "--predictor", self.addr("predictor", PREDICTOR_PORT), "--prefix", self.prefix,
                "--leader-ttl-s", str(t.leader_ttl_s), "--node-dead-after-s", str(t.node_dead_after_s),
                "--orphan-release-s", str(t.orphan_release_s), "--metrics-address", self.addr(name, METRICS_PORT)]
        return self._frenzy(name, args, {"REDIS_URL": self.role_urls.scheduler,
                                         "FRENZY_PREDICTOR_TOKEN": PREDICTOR_TOKEN})

    def start_agent(self, node: str) -> Proc:
        assert self.role_urls is not None
        t = self.timing
        args = ["agent", "--node", node, "--fake-gpus", self.gpus, "--prefix", self.prefix,
                "--addr", self.host(node).ip, "--heartbeat-s", str(t.heartbeat_s), "--ttl-s", str(t.ttl_s),
                "--cancel-grace-s", str(t.cancel_grace_s), "--log-dir", str(self.run_dir / "logs" / node)]
        return self._frenzy(node, args, {"REDIS_URL": self.role_urls.agents[node]})

    def start_api(self) -> Proc:
        args = ["api", "--host", self.host("api").ip, "--port", str(API_PORT),
                "--scheduler", self.addr("sched-a", SCHEDULER_PORT)]
        proc = self._frenzy("api", args)
        self.wait(self.api_answers, 60, "the API to answer")
        return proc

    def api_url(self) -> str:
        return f"http://{self.addr('api', API_PORT)}"

    def api_answers(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.api_url() + "/healthz", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    # ---- reading the state

    def admin(self, timeout_s: float = 5.0) -> redis.Redis:
        return redis.Redis.from_url(self.admin_url, decode_responses=True, socket_timeout=timeout_s,
                                    socket_connect_timeout=timeout_s)

    def leader_value(self) -> str:
        with self.admin() as c:
            return c.get(self.keys.leader()) or ""

    def leader_host(self) -> str:
        """Which scheduler host holds the lease now ("" when none): its value names the pid."""
        value = self.leader_value()
        for name in ("sched-a", "sched-b"):
            proc = self.procs.get(name)
            if proc is not None and f"/{proc.pid}/" in value:
                return name
        return ""

    def alive_nodes(self) -> set[str]:
        with self.admin() as c:
            return {n for n in self.node_names if c.exists(self.keys.node_alive(n))}

    def dead_marks(self) -> dict[str, str]:
        with self.admin() as c:
            return {n: mark for n in self.node_names if (mark := c.hget(self.keys.node(n), "dead_at"))}

    def job_states(self, job_ids: list[str]) -> dict[str, tuple[str, int]]:
        """job id -> (state, attempt), read from Redis."""
        with self.admin() as c:
            pipe = c.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hmget(self.keys.job(job_id), "state", "attempt")
            rows = pipe.execute()
        return {j: (s or "", int(a or 1)) for j, (s, a) in zip(job_ids, rows, strict=True)}

    def gpu_owners(self) -> dict[str, str]:
        """'node:index' -> owning job id for every GPU that has an owner."""
        count = int(self.gpus.split(":")[1])
        with self.admin() as c:
            return {f"{n}:{i}": owner for n in self.node_names for i in range(count)
                    if (owner := c.hget(self.keys.gpu(n, i), "owner"))}

    def stub(self, scheduler: str = "sched-a") -> tuple[grpc.Channel, scheduler_pb2_grpc.SchedulerStub]:
        raw = grpc.insecure_channel(self.addr(scheduler, SCHEDULER_PORT))
        return raw, scheduler_pb2_grpc.SchedulerStub(with_token(raw, self.token))

    def wait(self, check: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
        """``support.waiting.wait_for`` that also fails at once, with its log, when a service died."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{self.log_tails()}")
            time.sleep(interval)

    def check_alive(self, allow: tuple[str, ...] = ()) -> None:
        for name, proc in self.procs.items():
            if name not in allow and not proc.alive() and not getattr(proc, "killed", False):
                raise AssertionError(f"service {name} exited ({proc.popen.returncode}):\n"  # type: ignore[attr-defined]
                                     f"{self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 1500) -> str:
        path = self.run_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def log_tails(self, chars: int = 800) -> str:
        return "\n".join(f"--- {name}.log\n{self.log_tail(name, chars)}" for name in self.procs)

    def kill(self, name: str) -> None:
        """SIGKILL one service (its process only, as a crash would)."""
        proc = self.procs[name]
        proc.killed = True  # type: ignore[attr-defined]
        proc.popen.kill()  # type: ignore[attr-defined]
        proc.popen.wait(timeout=10)  # type: ignore[attr-defined]


# ---- the jobs and their runs ---------------------------------------------------------------------

SPEC = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "micro_batch": 4}


def job_command(runs: Path, sleep_s: float) -> list[str]:
    """A job that appends ``start JOB ATTEMPT NODE PID TIME`` to ``runs``, sleeps, then appends ``end ...``
    (a copy stopped before its end writes no end line)."""
    stamp = f'$FRENZY_JOB_ID $FRENZY_ATTEMPT $FRENZY_NODE $$ $(date +%s.%N) >> {runs}'
    return ["/bin/sh", "-c", f"echo start {stamp}; sleep {sleep_s}; echo end {stamp}"]


@dataclass(frozen=True)
class Run:
    kind: str  # "start" or "end"
    job_id: str
    attempt: int
    node: str
    pid: int
    at: float  # unix time


class RunLog:
    """The lines the jobs wrote to the shared file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def runs(self) -> list[Run]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:
                out.append(Run(parts[0], parts[1], int(parts[2]), parts[3], int(parts[4]), float(parts[5])))
        return out

    def of_kind(self, kind: str) -> list[Run]:
        return [r for r in self.runs() if r.kind == kind]

    def of(self, job_id: str, kind: str | None = None) -> list[Run]:
        return [r for r in self.runs() if r.job_id == job_id and (kind is None or r.kind == kind)]


@dataclass
class Submitted:
    name: str
    at: float
    job_id: str = ""
    error: str = ""


class JobStream:
    """Submit a job every ``interval_s`` through ``target()`` (a scheduler host name) until stopped."""

    def __init__(self, stack: NetStack, runs: Path, sleep_s: float, interval_s: float,
                 target: Callable[[], str] = lambda: "sched-a", tag: str = "s") -> None:
        self.stack, self.runs, self.sleep_s, self.interval_s = stack, runs, sleep_s, interval_s
        self.target, self.tag = target, tag
        self.submitted: list[Submitted] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-stream", daemon=True)

    def __enter__(self) -> JobStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        channels: dict[str, tuple[grpc.Channel, scheduler_pb2_grpc.SchedulerStub]] = {}
        i = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                target = self.target()
                if target not in channels:
                    channels[target] = self.stack.stub(target)
                sub = Submitted(f"{self.tag}-{i:03d}", time.time())
                spec = parse_entry({"name": sub.name, **SPEC, "idempotency_key": sub.name,
                                    "command": job_command(self.runs, self.sleep_s)}).to_proto()
                try:
                    resp = channels[target][1].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5)
                    sub.job_id = resp.job.id
                except grpc.RpcError as exc:
                    sub.error = f"{exc.code()}: {exc.details()}"
                self.submitted.append(sub)
                i += 1
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            for raw, _ in channels.values():
                raw.close()

    @property
    def job_ids(self) -> list[str]:
        return [s.job_id for s in self.submitted if s.job_id]


def settle(stack: NetStack, job_ids: list[str], timeout: float) -> dict[str, tuple[str, int]]:
    """Wait until every job has ended -> job id -> (state, attempt)."""
    stack.wait(lambda: all(s in TERMINAL for s, _ in stack.job_states(job_ids).values()), timeout,
               f"all {len(job_ids)} jobs to end")
    return stack.job_states(job_ids)


# ---- what Redis executed -------------------------------------------------------------------------

_LINE = re.compile(r'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Command:
    at: float  # Redis' clock (this machine's: every namespace shares the kernel's)
    client: str  # "IP:port", or "lua" for a command run by a script
    args: tuple[str, ...]

    @property
    def ip(self) -> str:
        return self.client.rsplit(":", 1)[0]


@dataclass
class ScriptRun:
    """One EVALSHA as Redis ran it: who sent it, which script, its arguments, what it called."""

    at: float
    ip: str
    script: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    calls: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def writes(self) -> list[tuple[str, ...]]:
        reads = {"GET", "HGET", "HMGET", "HGETALL", "EXISTS", "HEXISTS", "ZSCORE", "ZRANGE", "TTL", "PTTL",
                 "TIME", "XLEN", "SMEMBERS", "SISMEMBER", "LLEN", "ZCARD", "SCARD", "TYPE", "HLEN", "MGET"}
        return [c for c in self.calls if c and c[0].upper() not in reads]


class RedisMonitor:
    """Redis' MONITOR feed, read in a thread over a socket of its own; ``script_runs`` groups each
    EVALSHA with the commands its script ran (Redis logs those right after it, as client ``lua``)."""

    def __init__(self, admin_url: str) -> None:
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(admin_url)
        self._addr = (parts.hostname or "", parts.port or REDIS_PORT)
        self._auth = (unquote(parts.username or ""), unquote(parts.password or ""))
        self.commands: list[Command] = []
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="redis-monitor", daemon=True)
        self._ready = threading.Event()
        self.shas = {hashlib.sha1(scripts.script_source(n).encode()).hexdigest(): n for n in scripts.names()}

    def __enter__(self) -> RedisMonitor:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("MONITOR did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        sock = socket.create_connection(self._addr, timeout=10)
        self._sock = sock
        user, password = self._auth
        sock.sendall(f"AUTH {user} {password}\r\nMONITOR\r\n".encode())
        fh = sock.makefile("rb")
        oks = 0
        try:
            while oks < 2:
                if fh.readline().startswith(b"+OK"):
                    oks += 1
            self._ready.set()
            sock.settimeout(None)
            for raw in fh:
                if self._stop.is_set():
                    break
                m = _LINE.match(raw.decode("utf-8", "replace").rstrip("\r\n"))
                if m is None:
                    continue
                args = tuple(a.encode().decode("unicode_escape", "replace") if "\\" in a else a
                             for a in _ARG.findall(m.group(3)))
                self.commands.append(Command(float(m.group(1)), m.group(2).split(" ")[-1], args))
        except (OSError, ValueError):
            pass
        finally:
            fh.close()
            sock.close()

    def script_runs(self, script: str | None = None) -> list[ScriptRun]:
        runs: list[ScriptRun] = []
        current: ScriptRun | None = None
        for cmd in list(self.commands):
            if cmd.client == "lua":
                if current is not None:
                    current.calls.append(cmd.args)
                continue
            current = None
            if cmd.args and cmd.args[0].upper() == "EVALSHA" and len(cmd.args) >= 3:
                name = self.shas.get(cmd.args[1], cmd.args[1])
                nkeys = int(cmd.args[2])
                current = ScriptRun(cmd.at, cmd.ip, name, cmd.args[3:3 + nkeys], cmd.args[3 + nkeys:])
                runs.append(current)
        # An EVALSHA answered NOSCRIPT (redis-py then loads the script and sends it again) ran nothing.
        return [r for r in runs if script is None or r.script == script]


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def net() -> Iterator[Net]:
    """A test network, removed after the test whatever happened (its close raises if anything of
    it is left: the test then errors)."""
    reason = why_no_namespaces()
    if reason:
        pytest.skip(f"multi-host fault tests need network namespaces: {reason}")
    with Net() as made:
        yield made


@pytest.fixture
def netstack(net: Net, tmp_path: Path) -> Callable[..., NetStack]:
    """``netstack(timing=Timing(...), lossy=("node1",), with_api=True)``: the started stack."""

    def start(**options: object) -> NetStack:
        stack = NetStack(net, tmp_path, **options)  # type: ignore[arg-type]
        stack.start()
        return stack

    return start
