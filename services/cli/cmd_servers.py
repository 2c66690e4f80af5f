"""``frenzy predictor`` and ``frenzy scheduler``: the two control-plane servers.

The agent, worker and API commands live next to their services (``frenzy.agent.cli`` ...);
these two are here because their services are libraries the tests drive directly.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Annotated

import typer

from frenzy.cli.output import SchedulerOpt, TlsCaOpt, TlsCertOpt, TlsKeyOpt, fail  # noqa: F401
from frenzy.cli.service_opts import LogFormatOpt, MetricsAddressOpt, setup_logging
from frenzy.rpc.client import DEFAULT_PREDICTOR, DEFAULT_SCHEDULER
from frenzy.signals import stop_on_signals

PANEL = "Operate a cluster"


def _logging(level: str, fmt: str = "text") -> None:
    setup_logging(level, fmt)


def _stop_event() -> threading.Event:
    """Set on SIGINT/SIGTERM. Installed before a server starts, so a signal during start-up
    stops it cleanly once it is up instead of killing it half-started."""
    stop = threading.Event()
    stop_on_signals(stop)
    return stop


def predictor_cmd(
    address: Annotated[str, typer.Option(help="host:port to listen on.")] = DEFAULT_PREDICTOR,
    token_file: Annotated[Path | None, typer.Option(
        envvar="FRENZY_PREDICTOR_TOKEN_FILE", dir_okay=False,
        help="File (mode 0600) holding the predictor token the scheduler sends (its FRENZY_PREDICTOR_TOKEN_FILE "
             "names the same file); FRENZY_PREDICTOR_TOKEN gives the token itself. Every call without it is "
             "refused (UNAUTHENTICATED). Needed unless --tls-ca is given.")] = None,
    max_concurrent: Annotated[int, typer.Option(
        envvar="FRENZY_PREDICTOR_MAX_CONCURRENT", min=1,
        help="Predict calls computed at once; more wait up to 10 s for a slot, then RESOURCE_EXHAUSTED.")] = 2,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_ca: TlsCaOpt = None,
    metrics_address: MetricsAddressOpt = "",
    log_level: Annotated[str, typer.Option()] = "INFO",
    log_format: LogFormatOpt = "text",
) -> None:
    """Run the Predictor gRPC server (MARP; stateless). Only the scheduler may call it: it sends the
    predictor token (--token-file), or a client certificate the --tls-ca trusts; every other call is
    refused (UNAUTHENTICATED), and each call's work is bounded (docs/security.md)."""
    from frenzy.cli.service_opts import check_metrics_address, start_metrics
    from frenzy.predictor.guard import PredictLimits, PredictorTokenError, read_token_file, token_from_env
    from frenzy.predictor.server import PredictorMetrics, serve
    from frenzy.rpc.server import stop_server
    from frenzy.rpc.tls import ServerTls, TlsConfigError

    _logging(log_level, log_format)
    check_metrics_address(metrics_address)
    try:
        tls = ServerTls.from_files(tls_cert, tls_key, tls_ca)
        token = read_token_file(token_file) if token_file is not None else token_from_env()
    except (TlsConfigError, PredictorTokenError) as exc:
        fail(str(exc), 2)
    if token is None and tls_ca is None:
        fail("the predictor would answer anyone who reaches it: give it the token the scheduler sends "
             "(--token-file FILE or FRENZY_PREDICTOR_TOKEN_FILE, a 0600 file) or --tls-ca (only clients with a "
             "certificate). To fix: `frenzy secrets init --dir DIR` writes DIR/predictor-token; give both the "
             "predictor and the scheduler FRENZY_PREDICTOR_TOKEN_FILE=DIR/predictor-token", 2)
    stop = _stop_event()
    metrics = PredictorMetrics()
    server, port, health = serve(address, tls=tls, metrics=metrics, token=token,
                                 limits=PredictLimits(max_concurrent=max_concurrent))
    try:
        endpoint = start_metrics(metrics.registry, metrics_address, "predictor")
    except BaseException:
        stop_server(server, health)
        raise
    log = logging.getLogger("frenzy.predictor")
    log.info("predictor listening on %s (port %d)", address, port)
    if endpoint is not None:
        log.info("metrics on %s", endpoint.url)
    stop.wait()
    stop_server(server, health)
    if endpoint is not None:
        endpoint.stop()


def scheduler_cmd(
    address: Annotated[str, typer.Option(help="host:port to listen on.")] = DEFAULT_SCHEDULER,
    predictor: Annotated[str, typer.Option(envvar="FRENZY_PREDICTOR", help="Predictor address.")] = DEFAULT_PREDICTOR,
    redis_url: Annotated[str, typer.Option(envvar="REDIS_URL")] = "redis://127.0.0.1:6379/0",
    prefix: Annotated[str, typer.Option(envvar="FRENZY_PREFIX", help="Redis key prefix.")] = "frenzy",
    tick_s: Annotated[float, typer.Option(help="Seconds between scheduling passes.")] = 0.25,
    node_dead_after_s: Annotated[float, typer.Option(
        envvar="FRENZY_NODE_DEAD_AFTER_S",
        help="A node whose last heartbeat is this old (its lease gone too) is declared dead and its jobs are "
             "requeued; each launch tells its agent, which stops the job itself a little before, so that a node "
             "cut off from Redis never runs a job beside its rerun.")] = 30.0,
    max_attempts: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_ATTEMPTS", min=1, help="Attempts per job before a node loss fails it.")] = 3,
    orphan_release_s: Annotated[float, typer.Option(
        envvar="FRENZY_ORPHAN_RELEASE_S",
        help="Free GPUs/ports of an ended reservation whose node never reported the exit after this long.")] = 120.0,
    master_ports: Annotated[str, typer.Option(
        envvar="FRENZY_MASTER_PORTS", help="torchrun rendezvous ports handed out per node, FIRST-LAST.")]
    = "29500-32767",
    policy: Annotated[str, typer.Option(
        envvar="FRENZY_POLICY",
        help="Queue policy, by the name the simulator gives it (`frenzy simulate --policies`): 'frenzy' "
             "(shortest-first with aging over MARP's ranked plans -- a job goes first once it has waited 4 h "
             "and 10x its own runtime --, waiting for a better-ranked plan when "
             "that finishes over 20 % sooner, and stopping a long job that says it resumes from a checkpoint "
             "(submit --resumable), or two of one GPU type, once for a burst of much shorter ones; the "
             "default, chosen on the simulator's tuning split, docs/simulator.md), 'frenzy-wait4h' (a job "
             "goes first after 4 h whatever its length), 'frenzy-single' (one "
             "job at a time), 'frenzy-restop' (that, a job stopped again after an hour's run), "
             "'frenzy-nostop' (no stop), "
             "'frenzy-ranked' (without the wait or the stop), 'frenzy-completion' "
             "(completion-time-aware plan choice, and stopping a job submitted under a minute ago for a "
             "much shorter one), 'frenzy-nopreempt' (frenzy-completion never stopping a running job), "
             "'frenzy-fifo' (frenzy in submit order) or 'frenzy-paper' (FIFO with backfill, first "
             "satisfiable plan; the Frenzy paper's HAS; 'paper' works too).")] = "frenzy",
    max_queued_per_user: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_QUEUED_PER_USER", min=1,
        help="PENDING jobs one user may have; more submissions are refused (RESOURCE_EXHAUSTED).")] = 1000,
    max_gpus_per_user: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_GPUS_PER_USER", min=0,
        help="GPUs one user's jobs may hold at once: a job that would go over waits (its pending reason says "
             "so) until the user's other jobs free GPUs; a submission whose smallest plan alone needs more is "
             "refused. 0: no limit.")] = 0,
    max_user_priority: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_USER_PRIORITY", min=-100, max=100,
        help="Highest --priority a non-admin token may give a job (lower is always allowed); admins may give "
             "any of -100..100. Above it: PERMISSION_DENIED.")] = 0,
    submit_rate: Annotated[float, typer.Option(
        envvar="FRENZY_SUBMIT_RATE", min=0.001, help="Submissions a second per user, sustained (token bucket).")]
    = 20.0,
    submit_burst: Annotated[int, typer.Option(
        envvar="FRENZY_SUBMIT_BURST", min=1, help="Submissions one user may make at once before the rate applies.")]
    = 200,
    max_streams: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_STREAMS", min=1,
        help="Open streams (watch, logs -f) in all; must stay below --grpc-workers so unary calls and health "
             "checks always get a thread.")] = 16,
    max_streams_per_user: Annotated[int, typer.Option(
        envvar="FRENZY_MAX_STREAMS_PER_USER", min=1, help="Open streams one user may have.")] = 4,
    grpc_workers: Annotated[int, typer.Option(
        envvar="FRENZY_GRPC_WORKERS", min=2, help="Threads serving gRPC calls.")] = 32,
    leader_ttl_s: Annotated[float, typer.Option(
        envvar="FRENZY_LEADER_TTL_S", min=0.5,
        help="Run several schedulers on one Redis: each serves the API, one leads (places jobs, reaps nodes). "
             "A dead leader's lease lasts this long; then a standby takes over.")] = 3.0,
    serve: Annotated[str, typer.Option(
        envvar="FRENZY_SCHEDULER_SERVE", metavar="all|api|loop",
        help="What this process does: all (the API, and the loop when it leads), api (the API only, never "
             "leads), loop (placement only; its port answers health checks). Run one 'loop' and one or more "
             "'api' on the same Redis so submissions and placement passes never wait for each other.")] = "all",
    metrics_address: MetricsAddressOpt = "",
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_ca: TlsCaOpt = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
    log_format: LogFormatOpt = "text",
) -> None:
    """Run the Scheduler: gRPC API, placement loop (HAS), agent-event consumer and node reaper.

    Its calls to the predictor carry the predictor token (FRENZY_PREDICTOR_TOKEN_FILE, a 0600 file, or
    FRENZY_PREDICTOR_TOKEN) and use TLS when FRENZY_TLS_CA names the CA to trust (with
    FRENZY_TLS_CERT/FRENZY_TLS_KEY as its client certificate for a predictor that asks)."""
    from frenzy.cli.service_opts import check_metrics_address
    from frenzy.predictor.guard import token_from_env
    from frenzy.rpc.limits import RateLimit, StreamCaps
    from frenzy.rpc.tls import ClientTls, ServerTls
    from frenzy.scheduler.service import SchedulerServer, UserQuotas, parse_port_range

    _logging(log_level, log_format)
    check_metrics_address(metrics_address)
    try:
        ports = parse_port_range(master_ports)
        tls, predictor_tls = ServerTls.from_files(tls_cert, tls_key, tls_ca), ClientTls.from_env()
        predictor_token = token_from_env()
    except ValueError as exc:
        fail(str(exc), 2)
    from has import QueuePolicy

    try:  # 'paper': the name before the simulator and the scheduler shared one registry
        queue_policy = QueuePolicy.named("frenzy-paper" if policy == "paper" else policy)
    except ValueError as exc:
        fail(f"--policy: {exc}", 2)
    if serve not in ("all", "api", "loop"):
        fail(f"--serve: unknown mode {serve!r}; one of all, api, loop", 2)
    if max_streams >= grpc_workers:
        fail(f"--max-streams ({max_streams}) must be below --grpc-workers ({grpc_workers}), or open streams can "
             "take every thread", 2)
    quotas = UserQuotas(max_queued=max_queued_per_user, max_gpus=max_gpus_per_user,
                        rate=RateLimit(per_s=submit_rate, burst=submit_burst), max_priority=max_user_priority)
    stop = _stop_event()
    server = SchedulerServer(redis_url, predictor, address, prefix=prefix, tick_s=tick_s,
                             dead_after_s=node_dead_after_s, max_attempts=max_attempts,
                             orphan_release_s=orphan_release_s, master_ports=ports, policy=queue_policy,
                             quotas=quotas, stream_caps=StreamCaps(max_streams, max_streams_per_user),
                             max_workers=grpc_workers, tls=tls, predictor_tls=predictor_tls,
                             predictor_token=predictor_token,
                             metrics_address=metrics_address or None, leader_ttl_s=leader_ttl_s, serve=serve)
    logging.getLogger("frenzy.scheduler").info("scheduler (%s) listening on %s (port %d)", serve, address,
                                               server.port)
    if server.metrics is not None:
        logging.getLogger("frenzy.scheduler").info("metrics on %s", server.metrics.url)
    stop.wait()
    server.stop()


def register(app: typer.Typer) -> None:
    app.command("predictor", rich_help_panel=PANEL)(predictor_cmd)
    app.command("scheduler", rich_help_panel=PANEL)(scheduler_cmd)
