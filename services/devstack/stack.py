"""Run the whole Frenzy stack on one machine as separate processes.

Used by `frenzy up` (until Ctrl-C) and `frenzy demo` (up, one job, down) and
by the end-to-end tests. Every service is a real subprocess running a real
`frenzy` subcommand; only Redis may come from outside (``REDIS_URL``).
Process output goes to ``<run dir>/<service>.log`` so a failure can be read.
Tests can kill an agent (``kill_agent``, e.g. SIGKILL mid-job) and start it
again with the same node name and state (``start_agent``), and shorten the
scheduler's node-loss timeouts.

Every service serves Prometheus ``/metrics`` on a loopback port of its own
(``metrics_ports``: "scheduler", "predictor", "agent-<node>", "api", "worker"), and
``<run dir>/prometheus.yml`` is a scrape config listing them all
(``prometheus --config.file <run dir>/prometheus.yml``; docs/observability.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis
import yaml

import marp
from frenzy.auth.credentials import Credentials, redact_url, write_credentials, write_private
from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.devstack.procs import die_with_parent
from frenzy.devstack.redis_server import (
    RedisProcess,
    RoleUrls,
    add_role_users,
    free_port,
    memory_policy_problem,
    remove_role_users,
    start_redis,
)
from frenzy.predictor import guard
from frenzy.rpc.auth import with_token
from frenzy.rpc.client import wait_healthy
from frenzy.state import node_keys
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc
from has.cluster_spec import ClusterSpec, ClusterSpecError, parse_cluster

DEFAULT_CLUSTER = {
    "nodes": [
        {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 4, "name_prefix": "a100"},
        {"gpu": "L4", "count": 2, "gpus_per_node": 2, "name_prefix": "l4"},
        {"gpu": "T4", "count": 1, "gpus_per_node": 4, "name_prefix": "t4"},
    ]
}


def load_cluster_file(path: str | None) -> ClusterSpec:
    """Parse and validate a cluster file (GPU names checked against the catalog)."""
    if path is None:
        spec = parse_cluster(DEFAULT_CLUSTER)
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except OSError as exc:
            raise ClusterSpecError(f"cluster file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ClusterSpecError(f"cluster file {path}: not valid YAML: {exc}") from exc
        spec = parse_cluster(data)
    for i, g in enumerate(spec.groups):
        try:
            marp.get_gpu(g.gpu)
        except marp.MarpError as exc:
            raise ClusterSpecError(f"nodes[{i}].gpu: {exc}") from exc
    return spec


JOB_ACCOUNT = "frenzy-job"  # the unprivileged account `frenzy up` as root runs jobs as


def _ensure_account(name: str) -> str:
    """``name``, a system account without a home or a login shell, made with useradd if missing; "" when
    it cannot be (then jobs run as root, and ``start`` says so)."""
    import pwd

    try:
        pwd.getpwnam(name)
        return name
    except KeyError:
        pass
    try:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                        "/usr/sbin/nologin", "--user-group", name], check=True, capture_output=True, timeout=30)
        pwd.getpwnam(name)
        return name
    except (OSError, subprocess.SubprocessError, KeyError):
        return ""


def _runs_python_as(account: str) -> bool:
    """Whether ``account`` can start this interpreter (as the agents' jobs will, ``python`` being
    the stack's on their PATH) and import Frenzy's job helper from it."""
    try:
        done = subprocess.run([sys.executable, "-c", "import frenzy.train"], user=account, cwd="/",
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _blocked_for(account: str | None, path: Path) -> str:
    """The first directory from / to ``path`` that ``account`` (None: an account in no group of the
    path's) may not enter ("" when none)."""
    import pwd
    import stat

    uid, groups = -1, set()
    if account is not None:
        entry = pwd.getpwnam(account)
        uid, groups = entry.pw_uid, set(os.getgrouplist(account, entry.pw_gid))
    current = Path("/")
    for part in (path.resolve().parts[1:]):
        current = current / part
        info = current.stat()
        bit = (stat.S_IXUSR if info.st_uid == uid else
               stat.S_IXGRP if info.st_gid in groups else stat.S_IXOTH)
        if not info.st_mode & bit:
            return str(current)
    return ""


def _local_user() -> str:
    """The OS user, as a valid Frenzy user name (tokens name who owns a job)."""
    import getpass
    import re

    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = ""
    name = re.sub(r"[^A-Za-z0-9._@-]", "-", name)[:64].lstrip("._@-")
    return name or "admin"


SCRAPE_INTERVAL = "5s"  # the scheduler's gauges change with each reaper round (5 s by default)


def prometheus_config(ports: dict[str, int], host: str = "127.0.0.1") -> dict:
    """A Prometheus configuration scraping ``ports`` (service name -> port on ``host``): one job per
    kind of service (frenzy-scheduler, frenzy-predictor, frenzy-agent, frenzy-api, frenzy-worker).
    An agent's series carry their ``node`` label themselves."""
    jobs: dict[str, list[str]] = {}
    for name, port in sorted(ports.items()):
        kind = name.partition("-")[0]
        jobs.setdefault(f"frenzy-{kind}", []).append(f"{host}:{port}")
    return {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in jobs.items()]}


def write_prometheus_config(path: Path, ports: dict[str, int]) -> None:
    text = ("# Written by `frenzy up`: every service of this stack's /metrics (docs/observability.md).\n"
            "# prometheus --config.file " + str(path) + "\n")
    path.write_text(text + yaml.safe_dump(prometheus_config(ports), sort_keys=False), encoding="utf-8")


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log_path: Path


@dataclass
class LocalStack:
    cluster: ClusterSpec
    run_dir: Path
    redis_url: str = ""
    scheduler_addr: str = ""
    predictor_addr: str = ""
    api_port: int = 0
    metrics_port: int = 0  # the scheduler's Prometheus /metrics on 127.0.0.1 (0: a free port)
    # Every service's /metrics port on 127.0.0.1, by service name (the scheduler's too), once started.
    metrics_ports: dict[str, int] = field(default_factory=dict)
    with_worker: bool = True
    with_api: bool = False
    prefix: str = "frenzy"
    heartbeat_s: float = 1.0
    ttl_s: float = 5.0
    node_dead_after_s: float | None = None  # scheduler --node-dead-after-s (None: its default)
    max_attempts: int | None = None
    policy: str | None = None  # scheduler --policy (None: its default, or FRENZY_POLICY)
    orphan_release_s: float | None = None
    cancel_grace_s: float | None = None  # agents' --cancel-grace-s
    agent_args: list[str] = field(default_factory=list)  # extra options for every agent
    # The account every job runs as (the agents' --run-as). None: when the stack runs as root,
    # JOB_ACCOUNT (made if missing), so no job runs as root or can read the stack's secrets; "": as
    # whoever started the stack.
    job_account: str | None = None
    # Two scheduler processes: "scheduler" serves the API only (--serve api) and "scheduler-loop"
    # places jobs (--serve loop), so submissions never wait on a placement pass's interpreter.
    split_scheduler: bool = False
    scheduler_loop_addr: str = ""  # the loop process's health-only port (split_scheduler)
    services: list[Service] = field(default_factory=list)
    redis: RedisProcess | None = None
    token: str = ""  # an admin token made for this stack (also in <run dir>/credentials.json)
    worker_token: str = ""  # the batch worker's own (role submit, user "batch")
    # Each service's own Redis user and URL (frenzy.state.acl); redis_url stays the admin's (the operator's).
    role_urls: RoleUrls | None = None
    _agent_cmds: dict[str, list[str]] = field(default_factory=dict)
    _own_users: bool = False  # role users made on a server we did not start: removed at stop

    @classmethod
    def create(cls, cluster: ClusterSpec, run_dir: str | None = None, redis_url: str | None = None,
               **kwargs: object) -> LocalStack:
        path = Path(run_dir or tempfile.mkdtemp(prefix="frenzy-run-")).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return cls(cluster=cluster, run_dir=path, redis_url=redis_url or "", **kwargs)  # type: ignore[arg-type]

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, progress: callable | None = None) -> None:  # type: ignore[valid-type]
        say = progress or (lambda _msg: None)
        try:
            account = self._job_account()
            say(f"single-user stack: every job runs as {account or _local_user() + ' (you)'}, whoever "
                "submits it -- for one person's use, not for users who must be kept apart "
                "(docs/security.md: a user map and a real agent per host)")
            if not self.redis_url:
                self.redis = start_redis(workdir=str(self.run_dir / "redis"))
                self.redis_url = self.redis.url
                say(f"redis        {redact_url(self.redis_url)} (private server)")
            else:
                say(f"redis        {redact_url(self.redis_url)}")
                self._check_memory_policy(say)
            self._make_tokens()
            self._make_node_keys()
            urls = self._make_redis_users(say)
            self.predictor_addr = f"127.0.0.1:{free_port()}"
            # The predictor answers only the scheduler: they share this stack's predictor token (issue 34).
            predictor_env = {guard.TOKEN_FILE_ENV: str(self._make_predictor_token())}
            self._spawn("predictor", ["predictor", "--address", self.predictor_addr,
                                      *self._metrics_args("predictor")], env=predictor_env)
            self.scheduler_addr = f"127.0.0.1:{free_port()}"
            self.metrics_port = self.metrics_port or free_port()
            self.metrics_ports["scheduler"] = self.metrics_port
            common = ["--predictor", self.predictor_addr, "--prefix", self.prefix]
            for flag, value in (("--node-dead-after-s", self.node_dead_after_s), ("--max-attempts", self.max_attempts),
                                ("--orphan-release-s", self.orphan_release_s), ("--policy", self.policy)):
                if value is not None:
                    common += [flag, str(value)]
            sched = ["scheduler", "--address", self.scheduler_addr, *common,
                     "--metrics-address", f"127.0.0.1:{self.metrics_port}"]
            waits = [("predictor", self.predictor_addr), ("scheduler", self.scheduler_addr)]
            if self.split_scheduler:
                self.scheduler_loop_addr = f"127.0.0.1:{free_port()}"
                sched += ["--serve", "api"]
                self._spawn("scheduler-loop", ["scheduler", "--address", self.scheduler_loop_addr, *common,
                                               *self._metrics_args("scheduler-loop"), "--serve", "loop"],
                            env={"REDIS_URL": urls.scheduler, **predictor_env})
                waits.append(("scheduler-loop", self.scheduler_loop_addr))
            self._spawn("scheduler", sched, env={"REDIS_URL": urls.scheduler, **predictor_env})
            self.write_credentials(self.credentials_file)
            for name, addr in waits:
                if not wait_healthy(addr, timeout_s=30):
                    raise RuntimeError(f"{name} did not become healthy on {addr}; see {self.run_dir}/{name}.log")
                say(f"{name:<12} {addr} (healthy)")
            say(f"metrics      http://127.0.0.1:{self.metrics_port}/metrics (the scheduler's, Prometheus)")
            for node, group in self.cluster.nodes():
                cmd = ["agent", "--node", node, "--fake-gpus", f"{group.gpu}:{group.gpus_per_node}",
                       "--prefix", self.prefix, "--addr", "127.0.0.1",
                       "--heartbeat-s", str(self.heartbeat_s), "--ttl-s", str(self.ttl_s),
                       "--log-dir", str(self.run_dir / "jobs"),
                       # One directory all the fake nodes share, as a cluster's shared filesystem would be.
                       "--checkpoint-root", str(self.run_dir / "checkpoints"),
                       *(["--run-as", account] if account else []),
                       *self._metrics_args(f"agent-{node}"),
                       *self.agent_args]
                if self.cancel_grace_s is not None:
                    cmd += ["--cancel-grace-s", str(self.cancel_grace_s)]
                if group.price_per_gpu_hour is not None:  # the cluster file's own rate (docs/cost.md)
                    cmd += ["--price-per-gpu-hour", repr(group.price_per_gpu_hour)]
                self._agent_cmds[node] = cmd
                self._spawn(f"agent-{node}", cmd, env={"REDIS_URL": urls.agents[node]})
            # Each agent is a Python process that takes a second or so of CPU to start: on a small
            # machine a hundred of them need longer than a handful.
            self.wait_nodes(len(self.cluster.nodes()), timeout_s=max(30.0, 0.6 * len(self.cluster.nodes())))
            say(f"agents       {len(self.cluster.nodes())} nodes, {self.cluster.total_gpus} fake GPUs registered")
            if self.with_worker:
                self._spawn("worker", ["worker", "--scheduler", self.scheduler_addr, "--concurrency", "2",
                                       *self._metrics_args("worker")],
                            env={"FRENZY_TOKEN": self.worker_token, "REDIS_URL": urls.worker})
                say("worker       celery worker on the same Redis")
            if self.with_api:
                self.api_port = self.api_port or free_port()
                self._spawn("api", ["api", "--host", "127.0.0.1", "--port", str(self.api_port),
                                    "--scheduler", self.scheduler_addr, *self._metrics_args("api")])
                say(f"api          http://127.0.0.1:{self.api_port}/ (dashboard)")
                self.write_credentials(self.credentials_file)
            self.write_prometheus_config(self.prometheus_file)
            say(f"prometheus   {len(self.metrics_ports)} /metrics endpoints on 127.0.0.1; scrape config "
                f"{self.prometheus_file}")
        except BaseException:
            self.stop()
            raise

    @property
    def predictor_token_file(self) -> Path:
        return self.run_dir / guard.TOKEN_FILE

    def _make_predictor_token(self) -> Path:
        """This stack's predictor token, in a 0600 file of the run directory (the predictor and the
        schedulers read it; a restart of the stack makes a new one)."""
        write_private(self.predictor_token_file, guard.new_token() + "\n")
        return self.predictor_token_file

    def _check_memory_policy(self, say: callable) -> None:  # type: ignore[valid-type]
        """A server we did not start: say so when it could evict Frenzy's state (issue 34)."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=10)
        try:
            problem = memory_policy_problem(client)
        except redis.ResponseError:  # no CONFIG right: an operator's server, its settings are theirs
            problem = ""
        finally:
            client.close()
        if problem:
            say(f"warning: {problem}")

    @property
    def credentials_file(self) -> Path:
        return self.run_dir / "credentials.json"

    def _job_account(self) -> str:
        """The account jobs run as ("" for the stack's own user); see ``job_account``. As root, the run
        directory becomes enterable but not listable (0711) so the jobs reach their own directories in
        it, and Redis' directory (its data: tokens, node keys, job specs) the stack's alone."""
        if self.job_account is not None:
            account = self.job_account
        elif os.geteuid() == 0 and "--run-as" not in self.agent_args and "--user-map" not in self.agent_args:
            # Not where the account could not reach the run directory (under pytest's 0700 tmp, say):
            # its jobs could not reach their own files. (Checked before an account is made for nothing.)
            account = "" if _blocked_for(None, self.run_dir.parent) else _ensure_account(JOB_ACCOUNT)
            # Nor where it cannot run this Python (a venv on an interpreter under /root, 0700): every
            # `python ...` job would fail to start. Asked of the account itself, not worked out.
            if account and not _runs_python_as(account):
                account = ""
        else:
            account = ""
        if account and os.geteuid() == 0:
            os.chmod(self.run_dir, 0o711)
            (self.run_dir / "redis").mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.run_dir / "redis", 0o700)
        return account

    @property
    def prometheus_file(self) -> Path:
        return self.run_dir / "prometheus.yml"

    def _metrics_args(self, service: str) -> list[str]:
        """``--metrics-address`` for ``service``: a free loopback port, kept for a restart."""
        port = self.metrics_ports.get(service) or free_port()
        self.metrics_ports[service] = port
        return ["--metrics-address", f"127.0.0.1:{port}"]

    def metrics_url(self, service: str) -> str:
        """``service``'s /metrics ("scheduler", "predictor", "agent-<node>", "api", "worker")."""
        if service not in self.metrics_ports:
            raise KeyError(f"no metrics endpoint for {service!r}; these have one: {', '.join(self.metrics_ports)}")
        return f"http://127.0.0.1:{self.metrics_ports[service]}/metrics"

    def write_prometheus_config(self, path: Path) -> None:
        """A Prometheus scrape config for every service of this stack (one job per kind of service)."""
        write_prometheus_config(path, self.metrics_ports)

    def _make_tokens(self) -> None:
        """An admin token for whoever started the stack, and the worker's own: made straight in
        Redis, as an operator's `frenzy token create` would."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            tokens = TokenStore(client, Keys(self.prefix))
            self.token, _ = tokens.create(_local_user(), Role.ADMIN, note=f"frenzy up in {self.run_dir}")
            self.worker_token, _ = tokens.create("batch", Role.SUBMIT, note="the stack's batch worker")
        finally:
            client.close()

    def _make_node_keys(self) -> None:
        """Every fake node's signing key, before its agent starts (`frenzy node key create`; kept if made)."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            for node, _ in self.cluster.nodes():
                node_keys.create(client, Keys(self.prefix), node)
        finally:
            client.close()

    def _make_redis_users(self, say: callable) -> RoleUrls:  # type: ignore[valid-type]
        """A Redis user per role (scheduler, worker, each node's agent) with only its rights; the admin
        URL stays the operator's. A Redis given from outside that refuses ACL SETUSER (its URL is not
        an admin's) runs every service on that one URL, and says so."""
        nodes = [node for node, _ in self.cluster.nodes()]
        try:
            self.role_urls = add_role_users(self.redis_url, self.prefix, nodes)
        except redis.ResponseError as exc:
            if self.redis is not None:
                raise
            say(f"redis        cannot make a user per service ({exc}); every service uses REDIS_URL's user")
            self.role_urls = RoleUrls(self.redis_url, self.redis_url, dict.fromkeys(nodes, self.redis_url))
            return self.role_urls
        self._own_users = self.redis is None
        say(f"redis        one user per service: {self.prefix}-scheduler, {self.prefix}-worker, "
            f"{self.prefix}-agent-<node>")
        return self.role_urls

    def write_credentials(self, path: Path) -> None:
        """The token and addresses in a 0600 file the CLI reads (FRENZY_CREDENTIALS or the default path)."""
        api = f"http://127.0.0.1:{self.api_port}" if self.api_port else None
        batch = self.role_urls.worker if (self.with_worker and self.role_urls is not None) else None
        write_credentials(path, Credentials(token=self.token, scheduler=self.scheduler_addr, api=api,
                                            batch_redis=batch, redis=self.redis_url or None))

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Service:
        log_path = self.run_dir / f"{name}.log"
        # No service inherits a token or a Redis URL from whoever started the stack: the worker gets
        # its own token, and each service that uses Redis its own user's URL (``env``).
        base = {k: v for k, v in os.environ.items()
                if k not in ("FRENZY_TOKEN", "FRENZY_CREDENTIALS", "REDIS_URL", "REDIS_URL_FILE",
                             "FRENZY_PREDICTOR_TOKEN", "FRENZY_PREDICTOR_TOKEN_FILE")}
        env = dict(base, FRENZY_PREFIX=self.prefix,
                   FRENZY_SCHEDULER=self.scheduler_addr, PYTHONUNBUFFERED="1", **(env or {}))
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", *args], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=die_with_parent)
        svc = Service(name, proc, log_path)
        self.services.append(svc)
        return svc

    def agent(self, node: str) -> Service | None:
        """The running agent process of ``node`` (None when it was killed and not started again)."""
        return next((s for s in self.services if s.name == f"agent-{node}"), None)

    def kill_agent(self, node: str, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int:
        """Send ``sig`` to ``node``'s agent (only the agent: its jobs run in sessions of their own) and
        wait for it to end. -> its exit status."""
        svc = self.agent(node)
        if svc is None:
            raise RuntimeError(f"no running agent for node {node!r}")
        svc.proc.send_signal(sig)
        code = svc.proc.wait(timeout=timeout_s)
        self.services.remove(svc)
        return code

    def start_agent(self, node: str) -> Service:
        """Start ``node``'s agent again: same name, options and state directory (a restart)."""
        if self.agent(node) is not None:
            raise RuntimeError(f"the agent of {node!r} is still running")
        return self._spawn(f"agent-{node}", self._agent_cmds[node], env={"REDIS_URL": self.role_urls.agents[node]})

    def wait_nodes(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.scheduler_addr) as raw:
            stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, self.token))
            while time.monotonic() < deadline:
                self.check_alive()
                nodes = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes
                if len([n for n in nodes if n.alive]) >= count:
                    return
                time.sleep(0.2)
        raise RuntimeError(f"only some of {count} agents registered within {timeout_s:.0f} s; see {self.run_dir}")

    def check_alive(self) -> None:
        """Raise if a service process died (with the tail of its log)."""
        for svc in self.services:
            code = svc.proc.poll()
            if code is not None:
                tail = svc.log_path.read_text(errors="replace")[-2000:] if svc.log_path.exists() else ""
                raise RuntimeError(f"service {svc.name} exited with code {code}:\n{tail}")

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every service (agents first, Redis last), then SIGKILL stragglers."""
        for svc in reversed(self.services):
            if svc.proc.poll() is None:
                try:
                    os.killpg(svc.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for svc in self.services:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                svc.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(svc.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                svc.proc.wait(timeout=5)
        self.services.clear()
        if self._own_users:
            try:
                remove_role_users(self.redis_url, self.prefix, list(self.role_urls.agents))
            except redis.RedisError:
                pass  # the server is gone or refuses: nothing left to clean
            self._own_users = False
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
