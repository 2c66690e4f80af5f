"""``frenzy agent``: the command line of the node agent.

``agent_command`` is a plain function with typer annotations; the main CLI
registers it (``app.command("agent")(agent_command)``) and ``python -m
frenzy.agent`` runs it alone. It only turns options into an ``Agent`` and
signals into a stop event; all behaviour lives in ``daemon``. ``--drain`` /
``--undrain`` do not start an agent: they are the operator's client for the
node's drain flag (``drain``). ``--join-file`` reads the node's name, Redis URL and prefix from
the file ``frenzy node join`` wrote (``read_join_file``).
"""

from __future__ import annotations

import json
import logging
import socket
import stat
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from frenzy import logs
from frenzy.agent.codecache import CachePolicy
from frenzy.cli.service_opts import (
    LogFormatOpt,
    MetricsAddressOpt,
    check_metrics_address,
    setup_logging,
    start_metrics,
)
from frenzy.cli.typed_options import options_command

if TYPE_CHECKING:  # annotations only: the agent's parts are imported when the command runs
    from frenzy.agent.daemon import Agent
    from frenzy.agent.gpus import GpuBackend


@dataclass(frozen=True)
class JoinFile:
    """What ``frenzy node join`` gives a node: who it is, how it reaches Redis, the host it is for
    and until when it may first be used (epoch seconds)."""

    node: str
    redis_url: str
    prefix: str
    host: str = ""
    expires_at: float = 0.0

    @property
    def fingerprint(self) -> str:
        """Names this file's credential without showing it (the enrollment mark holds it)."""
        import hashlib

        return hashlib.sha256(f"{self.node}\n{self.redis_url}".encode()).hexdigest()


class JoinFileError(ValueError):
    """A join file the agent will not use (the message names the option and the fix)."""


def host_names() -> set[str]:
    """The names this host answers to: its hostname and fully qualified name, and their first labels."""
    names = {socket.gethostname(), socket.getfqdn()}
    return {n.lower() for name in names if name for n in (name, name.split(".", 1)[0])}


def _enrolled_mark(state_dir: Path, joined: JoinFile) -> Path:
    return state_dir / f"joined-{joined.node}"


def check_join_file(path: Path, joined: JoinFile, state_dir: Path, *, names: set[str] | None = None,
                    now: float | None = None) -> None:
    """Refuse a join file written for another host, or one past its expiry that this host has not
    used before (issue 34). The first use on its host leaves a mark in the agent's state directory
    (``mark_enrolled``), so the agent restarts after the file expired; a copy taken elsewhere does not."""
    import time

    here = names if names is not None else host_names()
    this = socket.gethostname() if names is None else min(here, default="THIS_HOST")
    rejoin = f"run `frenzy node join {joined.node} --host {this}` again on the admin host and copy the new file here"
    if not joined.host or not joined.expires_at:
        raise JoinFileError(f"--join-file {path}: it names no host or expiry (written before join files did). "
                            f"To fix: {rejoin}")
    if joined.host.lower() not in here:
        raise JoinFileError(f"--join-file {path}: written for host {joined.host!r}, and this host is "
                            f"{', '.join(sorted(here)) or 'unnamed'}; a join file works on its own host only. "
                            f"To fix: {rejoin}")
    mark = _enrolled_mark(state_dir, joined)
    try:
        enrolled = mark.read_text(encoding="utf-8").strip() == joined.fingerprint
    except OSError:
        enrolled = False
    if (now if now is not None else time.time()) > joined.expires_at and not enrolled:
        from datetime import UTC, datetime

        when = datetime.fromtimestamp(joined.expires_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        raise JoinFileError(f"--join-file {path}: expired at {when} before this host first used it. "
                            f"To fix: {rejoin} (that also rotates the node's Redis password)")


def mark_enrolled(state_dir: Path, joined: JoinFile) -> None:
    """Remember that this host used ``joined`` (so restarts after its expiry keep working)."""
    from frenzy.auth.credentials import write_private

    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(_enrolled_mark(state_dir, joined), joined.fingerprint + "\n")


def read_join_file(path: Path) -> JoinFile:
    """The join file at ``path``. Refused when group or others may read it, as ssh refuses a private
    key: it holds the node's Redis password."""
    from frenzy.state.messages import is_safe_name

    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JoinFileError(f"--join-file {path}: cannot read it ({exc.strerror})") from None
    if mode & 0o077:
        raise JoinFileError(f"--join-file {path}: its mode is {mode:04o}, so other users may read the node's Redis "
                            f"password; refusing to use it. To fix: chmod 600 {path}")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("node", "redis_url", "prefix")):
        raise JoinFileError(f"--join-file {path}: not a join file (JSON with node, redis_url and prefix). "
                            "To fix: write it with `frenzy node join NODE`")
    node, url = data["node"], data["redis_url"]
    if not is_safe_name(node) or not url.startswith(("redis://", "rediss://")):
        raise JoinFileError(f"--join-file {path}: bad node name or Redis URL. To fix: write it again with "
                            "`frenzy node join NODE`")
    host = data.get("host") if isinstance(data.get("host"), str) else ""
    expires = data.get("expires_at")
    expires_at = float(expires) if isinstance(expires, int | float) and not isinstance(expires, bool) else 0.0
    return JoinFile(node=data["node"], redis_url=data["redis_url"], prefix=data["prefix"], host=host,
                    expires_at=expires_at)


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"  # not REDIS_URL / FRENZY_PREFIX or a default


@dataclass(frozen=True)
class AgentOptions:
    """Every option of ``frenzy agent`` (a field is an option: ``heartbeat_s`` is ``--heartbeat-s``)."""

    redis_url: Annotated[str, typer.Option(
        envvar="REDIS_URL", help="Redis holding the cluster state.")] = "redis://127.0.0.1:6379/0"
    node: Annotated[str | None, typer.Option(help="Node name (unique in the cluster). Default: hostname.")] = None
    join_file: Annotated[Path | None, typer.Option(
        "--join-file", dir_okay=False,
        help="The file `frenzy node join NODE` wrote (mode 0600): gives the node name, Redis URL and prefix "
        "instead of --node, --redis-url and --prefix.")] = None
    fake_gpus: Annotated[str | None, typer.Option(
        "--fake-gpus", metavar="TYPE:N,...",
        help='Pretend to have these catalog GPUs instead of asking NVML, e.g. "A100-80GB:4,L4:2".')] = None
    fake_gpus_file: Annotated[Path | None, typer.Option(
        "--fake-gpus-file", exists=True, dir_okay=False,
        help="YAML/JSON file with fake GPUs: {gpus: [{type: A100-80GB, count: 4}]}.")] = None
    addr: Annotated[str, typer.Option(help="Address other nodes use to reach this host (rendezvous).")] = "127.0.0.1"
    heartbeat_s: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 2.0
    price_per_gpu_hour: Annotated[float | None, typer.Option(
        help="Dollars per GPU-hour of this node's GPUs (an internal rate or a cloud price): plans on them are "
             "priced and their jobs charged with it (docs/cost.md). Default: the GPU catalog's list price "
             "(frenzy gpus).")] = None
    ttl_s: Annotated[float, typer.Option(
        help="Lease TTL: the node counts as dead this long after its last heartbeat.")] = 10.0
    log_dir: Annotated[Path, typer.Option(
        help="Job logs go to LOG_DIR/JOB/attempt-N/NODE.log.")] = Path("./var/logs")
    prefix: Annotated[str | None, typer.Option(
        envvar="FRENZY_PREFIX", help="Redis key prefix (one per Frenzy stack). Default: frenzy.")] = None
    cancel_grace_s: Annotated[float, typer.Option(
        help="On cancel: seconds between SIGTERM and SIGKILL.")] = 10.0
    kill_on_exit: Annotated[bool, typer.Option(
        "--kill-on-exit", help="Stop the running jobs when the agent stops (default: leave them; "
        "a restarted agent adopts them).")] = False
    verify_fence: Annotated[bool, typer.Option(
        help="Refuse launches whose fencing token no longer matches the GPUs' reservation.")] = True
    spawner: Annotated[bool, typer.Option(
        help="Fork each job's shim from one small spawner process (about 1 ms a job). --no-spawner "
        "starts a new Python interpreter per job instead (about 25 ms of CPU), as the agent falls "
        "back to by itself where the spawner cannot run.")] = True
    env: Annotated[list[str] | None, typer.Option(
        "--env", metavar="KEY=VALUE",
        help="Add to every job's environment on this host (repeat), e.g. NCCL_SOCKET_IFNAME=ib0. "
        "A job's own env wins.")] = None
    pass_env: Annotated[list[str] | None, typer.Option(
        "--pass-env", metavar="NAME",
        help="Pass this variable of the agent's environment on to jobs (repeat; a trailing * matches a prefix, "
        "e.g. NCCL_*). Jobs get only PATH, HOME, LANG, LANGUAGE, LC_*, TZ, USER, LOGNAME, SHELL, TMPDIR, TERM "
        "and LD_LIBRARY_PATH otherwise; credentials (REDIS_URL, FRENZY_TOKEN, *PASSWORD*, *SECRET*, *TOKEN*) "
        "are refused.")] = None
    workdir_root: Annotated[list[Path] | None, typer.Option(
        "--workdir-root", metavar="PATH",
        help="A directory jobs may use as working directory, with what is below it (repeat). Default: the "
        "home of the user jobs run as, the agent's current directory and the system temp directory.")] = None
    run_as: Annotated[str | None, typer.Option(
        "--run-as", metavar="USER",
        help="Run jobs as this user (name or uid): its uid, groups and HOME. Needs the agent to run as root.")] = None
    user_map: Annotated[Path | None, typer.Option(
        "--user-map", metavar="FILE",
        help="Run each Frenzy user's jobs as their own Unix account: lines 'FRENZY_USER ACCOUNT' (# comments). "
        "Root and system accounts (uid below --min-job-uid) are refused. Re-read when it changes. Needs root.")] = None
    min_job_uid: Annotated[int, typer.Option(
        "--min-job-uid", min=1,
        help="The lowest uid a --user-map account may have (system accounts are below).")] = 1000
    unmapped: Annotated[str, typer.Option(
        "--unmapped", metavar="refuse|run-as",
        help="With --user-map: refuse jobs of users the map does not name (default), or run them as the "
        "--run-as account (they then share it).")] = "refuse"
    cgroup_root: Annotated[str, typer.Option(
        "--cgroup-root", metavar="auto|off|PATH",
        help="A cgroup v2 per job under PATH/NODE (auto: 'frenzy' at the top of the cgroup2 mount): one kill "
        "for all it started, and the limits below. Where the host does not allow it, the agent says so "
        "once and runs jobs without.")] = "auto"
    job_memory_max: Annotated[str, typer.Option(
        "--job-memory-max", metavar="BYTES",
        help="memory.max of each job's cgroup (8G, 512M; 'none': no limit). The whole job is killed when "
        "it is out of memory.")] = "none"
    job_pids_max: Annotated[int, typer.Option(
        "--job-pids-max", min=0, help="pids.max of each job's cgroup (0: no limit): a fork bomb stops there.")] = 16384
    checkpoint_root: Annotated[Path | None, typer.Option(
        "--checkpoint-root", metavar="PATH", envvar="FRENZY_CHECKPOINT_ROOT",
        help="Give every job FRENZY_CHECKPOINT_DIR=PATH/<job id>, the same directory for all its attempts "
        "(made by the agent), so a job re-planned after an out-of-memory exit or a lost node resumes from "
        "its checkpoint. An absolute path on a filesystem every node shares. Default: no checkpoint "
        "directory.")] = None
    state_dir: Annotated[Path | None, typer.Option(
        help="Where the agent keeps its ledger of running jobs (default: LOG_DIR/.agent). Must survive "
        "agent restarts.")] = None
    code_cache_gib: Annotated[float, typer.Option(
        min=0, help="Keep at most this much unpacked job code (STATE_DIR/code), dropping the least recently "
        "used first.")] = CachePolicy.max_bytes / 2**30
    code_cache_days: Annotated[float, typer.Option(
        min=0.001, help="Drop unpacked job code no job started from for this long.")] = CachePolicy.max_age_s / 86400
    workdir_days: Annotated[float, typer.Option(
        min=0.001, help="Remove a job attempt's working directory (STATE_DIR/work: its copy of the code and what "
        "it wrote there) this long after it last ran here; never while it runs.")] = CachePolicy.work_max_age_s / 86400
    log_poll_s: Annotated[float, typer.Option(help="Seconds between shipping new job output to Redis.")] = 0.25
    log_stream_maxlen: Annotated[int, typer.Option(
        min=100, help="Cap on the entries of this node's Redis log stream of a job (the file on disk is complete).")] = 10_000
    log_retention_s: Annotated[float, typer.Option(
        help="This node's log stream of a job expires this long after its last output (0: never).")] = 7 * 24 * 3600.0
    drain: Annotated[bool, typer.Option(
        "--drain", help="Do not run an agent: mark NODE draining (no new jobs; running ones finish) and wait "
        "until none is left.")] = False
    undrain: Annotated[bool, typer.Option("--undrain", help="Do not run an agent: let NODE take jobs again.")] = False
    wait: Annotated[bool, typer.Option(help="With --drain: wait for the running jobs to finish.")] = True
    drain_timeout_s: Annotated[float, typer.Option(
        help="With --drain: give up (exit 1) after this long; 0 waits forever.")] = 0.0
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO"
    log_format: LogFormatOpt = "text"
    metrics_address: MetricsAddressOpt = ""


@options_command(AgentOptions)
def agent_command(ctx: typer.Context, opts: AgentOptions) -> None:
    """Run the node agent: register this host's GPUs, heartbeat, and launch the jobs the scheduler sends.

    \b
    Examples:
      frenzy agent                     # real GPUs (NVML); node name = hostname
      frenzy agent --join-file /etc/frenzy/join.json   # from `frenzy node join`
      frenzy agent --node n1 --fake-gpus "A100-80GB:4,L4:2"
      frenzy agent --node n2 --fake-gpus-file gpus.yaml --addr 10.0.0.2
      REDIS_URL=redis://head:6379/0 frenzy agent --log-dir /data/frenzy/logs
      sudo frenzy agent --run-as train --workdir-root /data/jobs --pass-env 'NCCL_*'
      sudo frenzy agent --user-map /etc/frenzy/users --job-memory-max 200G   # each user as their account
      frenzy agent --checkpoint-root /shared/frenzy/checkpoints   # FRENZY_CHECKPOINT_DIR for every job
      frenzy agent --drain             # no new jobs here; returns when the running ones are done
      frenzy agent --undrain

    Stop with Ctrl-C or SIGTERM. Running jobs keep running (unless --kill-on-exit):
    a restarted agent adopts them. If the agent stays away longer than the
    scheduler's node timeout, the node is declared dead and its jobs are requeued.
    """
    from frenzy.agent.drain import drain as drain_node
    from frenzy.state.keys import Keys

    setup_logging(opts.log_level, opts.log_format)
    check_metrics_address(opts.metrics_address)
    if opts.join_file is not None:
        # over REDIS_URL / FRENZY_PREFIX; refused on another host or past its expiry (issue 34)
        node, redis_url, prefix = _joined(ctx, opts.join_file, opts.state_dir or opts.log_dir / ".agent")
        opts = replace(opts, node=node, redis_url=redis_url, prefix=prefix)
    node = opts.node or socket.gethostname()
    # An agent is one node: each JSON log line carries it, about a job or not (GPU health, Redis).
    logs.set_context(node=node)
    if opts.drain or opts.undrain:
        if opts.drain and opts.undrain:
            typer.echo("error: give --drain or --undrain, not both", err=True)
            raise typer.Exit(2)
        raise typer.Exit(drain_node(opts.redis_url, Keys(opts.prefix), node, undrain=opts.undrain, wait=opts.wait,
                                    timeout_s=opts.drain_timeout_s, say=typer.echo))
    _run_until_stopped(_agent(opts, node), node, opts.metrics_address)


def _agent(opts: AgentOptions, node: str) -> Agent:
    """The agent ``opts`` describe, on ``node``; exit 2 naming a bad value (an --env, a byte size, a
    fake GPU spec, a user map that cannot be read)."""
    from frenzy.agent.daemon import Agent
    from frenzy.state.keys import Keys

    extra_env = _env_option(opts.env or [])
    try:
        from frenzy.agent.cgroups import parse_bytes

        memory_max = parse_bytes(opts.job_memory_max)
        backend = _gpu_backend(opts.fake_gpus, opts.fake_gpus_file, node)
        return Agent(opts.redis_url, node, backend, keys=Keys(opts.prefix), addr=opts.addr,
                     heartbeat_s=opts.heartbeat_s, ttl_s=opts.ttl_s, log_dir=opts.log_dir,
                     cancel_grace_s=opts.cancel_grace_s, kill_on_exit=opts.kill_on_exit,
                     verify_fence=opts.verify_fence, state_dir=opts.state_dir, extra_env=extra_env,
                     log_poll_s=opts.log_poll_s, log_stream_maxlen=opts.log_stream_maxlen,
                     log_retention_s=opts.log_retention_s, pass_env=list(opts.pass_env or []),
                     workdir_roots=list(opts.workdir_root) if opts.workdir_root else None, run_as=opts.run_as,
                     checkpoint_root=opts.checkpoint_root, use_spawner=opts.spawner, user_map=opts.user_map,
                     min_job_uid=opts.min_job_uid, unmapped=opts.unmapped, cgroup_root=opts.cgroup_root,
                     job_memory_max=memory_max, job_pids_max=opts.job_pids_max or None,
                     price_per_gpu_hour=opts.price_per_gpu_hour,
                     cache_policy=CachePolicy(int(opts.code_cache_gib * 2**30), opts.code_cache_days * 86400,
                                              opts.workdir_days * 86400))
    except (ValueError, OSError) as exc:  # (OSError: the user map cannot be read)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _gpu_backend(fake_gpus: str | None, fake_gpus_file: Path | None, node: str) -> GpuBackend:
    """Fake GPUs from --fake-gpus or --fake-gpus-file, else NVML's (ValueError: a bad fake spec)."""
    from frenzy.agent.gpus import FakeBackend, NvmlBackend

    if fake_gpus and fake_gpus_file:
        raise typer.BadParameter("give --fake-gpus or --fake-gpus-file, not both")
    if fake_gpus:
        return FakeBackend(fake_gpus, node)
    if fake_gpus_file:
        return FakeBackend.from_file(fake_gpus_file, node)
    return NvmlBackend()


def _joined(ctx: typer.Context, join_file: Path, state_dir: Path) -> tuple[str, str, str]:
    """(node, Redis URL, prefix) from ``--join-file``; exit 2 when the command line also gives one, or
    the file is for another host or expired unused (``check_join_file``)."""
    given = [f"--{n.replace('_', '-')}" for n in ("node", "redis_url", "prefix") if _from_command_line(ctx, n)]
    if given:
        typer.echo(f"error: --join-file gives the node, Redis URL and prefix: drop {', '.join(given)}", err=True)
        raise typer.Exit(2)
    try:
        joined = read_join_file(join_file)
        check_join_file(join_file, joined, state_dir)
    except JoinFileError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        mark_enrolled(state_dir, joined)
    except OSError as exc:
        logging.getLogger("frenzy.agent").warning(
            "cannot note in %s that this host used its join file (%s): after the file expires a restart will "
            "refuse it. To fix: make the state directory writable (--state-dir)", state_dir, exc.strerror)
    return joined.node, joined.redis_url, joined.prefix


def _env_option(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a mapping; exit 2 naming a malformed one."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.echo(f"error: --env {item!r}: expected KEY=VALUE", err=True)
            raise typer.Exit(2)
        out[key] = value
    return out


def _run_until_stopped(agent: Agent, node: str, metrics_address: str) -> None:
    """Run ``agent`` until SIGINT/SIGTERM, serving its metrics; exit 2 on a start-up refusal
    (no GPU found, no node key)."""
    from frenzy.agent.gpus import GpuDiscoveryError
    from frenzy.signals import stop_on_signals
    from frenzy.state.node_keys import NodeKeyMissing

    stop = threading.Event()
    stop_on_signals(stop, on_signal=lambda sig: logging.getLogger(__name__).info("received %s; stopping", sig.name))
    endpoint = start_metrics(agent.metrics.registry, metrics_address, f"agent {node}")
    if endpoint is not None:
        logging.getLogger(__name__).info("metrics on %s", endpoint.url)
    try:
        agent.run(stop)
    except (GpuDiscoveryError, NodeKeyMissing) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        if endpoint is not None:
            endpoint.stop()


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.command("agent", rich_help_panel=PANEL)(agent_command)
