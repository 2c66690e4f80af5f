"""`frenzy batch` (submit many jobs through the Celery queue) and `frenzy worker`.

``batch_app`` is a Typer group and ``worker_command`` a plain function with
typer options; the main CLI registers them as ``frenzy batch`` and
``frenzy worker``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from frenzy.cli.output import SchedulerOpt
from frenzy.cli.service_opts import LogFormatOpt, MetricsAddressOpt
from frenzy.rpc.client import DEFAULT_SCHEDULER

if TYPE_CHECKING:  # annotations only; imported where a command runs (a fast `frenzy --help`)
    import redis

    from frenzy.worker import batch as B

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

EXAMPLE_YAML = """\
    jobs:
      - name: gpt2-small
        model: gpt2-124m        # catalog name, config.json path or JSON
        seq_len: 1024
        global_batch: 32
        command: torchrun --nproc-per-node {nproc_per_node} train.py
      - name: qwen-tiny
        model: qwen2.5-0.5b
        seq_len: 2048
        global_batch: 16
        micro_batch: 2          # optional; absent: the planner chooses
        max_gpus: 4             # optional limits: max_gpus, gpu_types
        gpu_types:
          - A100-80GB
        command: python train.py --tp {tp} --pp {pp}
"""


batch_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help=f"""Submit many jobs at once through the Celery queue (needs `frenzy worker`).

\b
A batch file is YAML: a `jobs:` list (or a top-level list) of entries, each
the same fields as `frenzy submit` -- the model and the training recipe,
never GPUs:

\b
{EXAMPLE_YAML}
\b
An optional `defaults:` mapping is merged under every entry. Each entry
becomes one queued task; a worker validates it, submits it to the scheduler
and records the outcome, so one bad entry fails alone and the others go on.
A task redelivered after a worker crash finds the job it already made
(idempotency key batch:<batch id>:<index>): nothing lost, nothing doubled.

\b
Outcomes: submitted, duplicate (your idempotency_key named an existing job),
invalid (the message names the field), rejected (no GPU type can hold it),
error (scheduler unreachable after retries); queued / retrying while in flight.

\b
`frenzy batch submit` waits for those outcomes and prints each entry's job
id; --wait also follows the jobs until all have ended (exit 1 unless every
one SUCCEEDED), as `frenzy submit --wait` does for one job; --detach only
enqueues and returns.

\b
Examples:
  frenzy batch submit examples/jobs.yaml          # the outcomes and job ids
  frenzy batch submit examples/jobs.yaml --wait   # ... and the jobs to their end
  frenzy batch submit jobs.yaml --detach          # enqueue, return at once
  frenzy batch status 20250101-120000-3fa9c1 --json
  frenzy batch list
""",
)

def _status_style(status: str) -> str:
    from frenzy.worker import batch as B

    return {B.QUEUED: "dim", B.RETRYING: "yellow", B.SUBMITTED: "green", B.DUPLICATE: "cyan",
            B.INVALID: "red", B.REJECTED: "red", B.ERROR: "bold red"}.get(status, "")

RedisUrlOpt = Annotated[str, typer.Option(
    "--redis-url", envvar="REDIS_URL", help="Redis used as the Celery broker and for batch outcomes.")]
BatchRedisOpt = Annotated[str, typer.Option(
    "--redis-url", envvar="REDIS_URL", show_default=False,
    help="The stack's Redis (the Celery broker and batch outcomes) [default: the credentials file's, which "
         "`frenzy up` writes; there is no guess at 127.0.0.1:6379].")]
PrefixOpt = Annotated[str | None, typer.Option(
    "--prefix", envvar="FRENZY_PREFIX", help="Key prefix of the Frenzy stack (default: frenzy).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def batch_redis_url(explicit: str) -> str:
    """The Redis `frenzy batch` talks to: the worker's (the credentials file's ``batch_redis``). Never
    a default address: a batch sent to another Redis that happens to answer on 127.0.0.1:6379 would
    wait for a worker that never comes."""
    from frenzy.cli.output import stack_redis_url

    return stack_redis_url(explicit, "batch_redis", (
        "no Redis for batches: --redis-url and REDIS_URL are unset and the credentials file ({credentials}) names "
        "none. To fix: run `frenzy up` (it writes one there), or pass --redis-url / set REDIS_URL to the stack's "
        "Redis (the worker's redis:// URL)"))


def _connect(redis_url: str, prefix: str | None) -> redis.Redis:
    import redis

    from frenzy.auth.credentials import redact_url
    from frenzy.worker.app import configure

    redis_url = batch_redis_url(redis_url)

    configure(redis_url=redis_url, prefix=prefix)
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        typer.echo(f"error: cannot reach Redis at {redact_url(redis_url)} ({exc}). To fix: start Redis "
                   "(`frenzy up` or docker compose up redis) or pass --redis-url / set REDIS_URL", err=True)
        raise typer.Exit(1) from None
    return client


def _summary(outcomes: list[B.Outcome]) -> str:
    from frenzy.worker import batch as B

    counts = Counter(o.status for o in outcomes)
    parts = [f"{counts[s]} {s}" for s in (B.SUBMITTED, B.DUPLICATE, B.INVALID, B.REJECTED, B.ERROR,
                                          B.RETRYING, B.QUEUED) if counts[s]]
    return f"{len(outcomes)} entries: " + ", ".join(parts)


def _as_json(batch_id: str, outcomes: list[B.Outcome]) -> dict:
    from frenzy.worker import batch as B

    return {
        "batch_id": batch_id,
        "done": all(o.final for o in outcomes),
        "failed": sum(1 for o in outcomes if o.status in B.FAILED),
        "counts": dict(Counter(o.status for o in outcomes)),
        "entries": [{"index": o.index, "name": o.name, "status": o.status, "job_id": o.job_id, "error": o.error,
                     "attempts": o.attempts} for o in outcomes],
    }


def _print_outcomes(batch_id: str, outcomes: list[B.Outcome], as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    if as_json:
        typer.echo(json.dumps(_as_json(batch_id, outcomes), indent=2))
        return
    table = Table(title=f"batch {batch_id}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("name")
    table.add_column("status")
    table.add_column("job id", no_wrap=True)
    table.add_column("error", overflow="fold")
    for o in outcomes:
        table.add_row(str(o.index), o.name or "-", f"[{_status_style(o.status)}]{o.status}[/]",
                      o.job_id or "-", o.error or "")
    console = Console()
    console.print(table)
    console.print(_summary(outcomes))


def _wait(client: redis.Redis, keys, batch_id: str, total: int, timeout: float, quiet: bool) -> list[B.Outcome]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from frenzy.worker import batch as B

    deadline = time.monotonic() + timeout
    started = time.monotonic()
    outcomes = B.read_batch(client, keys, batch_id)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=quiet) as progress:
        task = progress.add_task("submitting", total=total)
        while True:
            outcomes = B.read_batch(client, keys, batch_id)
            finished = sum(1 for o in outcomes if o.final)
            note = "submitting"
            if finished == 0 and time.monotonic() - started > 5:
                note = "waiting for a worker (is `frenzy worker` running?)"
            elif any(o.status == B.RETRYING for o in outcomes):
                note = "submitting (scheduler unreachable, retrying)"
            progress.update(task, completed=finished, description=note)
            if finished >= total or time.monotonic() > deadline:
                return outcomes
            time.sleep(0.3)


@batch_app.command("submit")
def submit(
    jobs_yaml: Annotated[Path, typer.Argument(metavar="JOBS_YAML", help="YAML file: `jobs:` list of entries.",
                                              show_default=False)],
    wait: Annotated[bool, typer.Option("--wait", help="Also follow the submitted jobs until every one has ended "
                                       "(like `frenzy submit --wait`); exit 1 unless all SUCCEEDED.")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Enqueue the entries and return at once (the batch id "
                                         "is printed; see `frenzy batch status`).")] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", hidden=True, help="Deprecated: --detach.")] = False,
    timeout: Annotated[float, typer.Option(min=0.0, help="Seconds to wait for the submission outcomes; exit 3 when "
                                           "it runs out.")] = 300.0,
    as_json: JsonOpt = False,
    redis_url: BatchRedisOpt = "",
    prefix: PrefixOpt = None,
    scheduler: SchedulerOpt = "",
) -> None:
    """Submit the jobs of JOBS_YAML: each entry's outcome and job id (--wait: and the jobs' end).

    The entries are queued under a fresh batch id (see `frenzy batch --help` for the format); this
    waits until a worker has submitted each one and prints its outcome. --wait then follows the
    submitted jobs to their end (like `frenzy submit --wait`: their states, not their output, which
    `frenzy logs JOB` shows); --detach returns as soon as the entries are queued.

    Exit status: 0 all submitted (with --wait: and all SUCCEEDED); 1 some entry failed, or with
    --wait some job did not succeed (or Redis unreachable); 2 the file is unusable (nothing
    enqueued); 3 the submission outcomes timed out; 130 Ctrl-C (the jobs go on).
    """
    from frenzy.worker import batch as B

    if no_wait:
        typer.echo("warning: --no-wait is deprecated; it is --detach now", err=True)
        detach = True
    if wait and detach:
        typer.echo("error: --wait follows the jobs to their end and --detach returns at once: give one of them",
                   err=True)
        raise typer.Exit(2)
    try:
        entries = B.load_batch_file(jobs_yaml)
    except B.BatchFileError as exc:
        typer.echo(f"error: {exc}\nNothing was enqueued. See `frenzy batch --help` for the file format.", err=True)
        raise typer.Exit(2) from None
    client = _connect(redis_url, prefix)
    from frenzy.worker.app import app, enqueue, settings

    keys = settings.keys
    batch_id = B.new_batch_id()
    B.init_batch(client, keys, batch_id, entries)
    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for i, entry in enumerate(entries):
                enqueue(batch_id, i, entry, producer=producer)
                sent += 1
    except Exception as exc:  # broker trouble: say which entries never left, do not leave them "queued"
        for i in range(sent, len(entries)):
            B.record_outcome(client, keys, batch_id, B.Outcome(
                index=i, status=B.ERROR, name=B.entry_name(entries[i]), at=time.time(),
                error=f"not enqueued: {exc}"))
        typer.echo(f"error: enqueuing batch {batch_id} failed after {sent} of {len(entries)} entries: {exc}",
                   err=True)
        raise typer.Exit(1) from None
    if detach:
        if as_json:
            typer.echo(json.dumps({"batch_id": batch_id, "entries": len(entries), "queue": settings.queue}))
        else:
            typer.echo(f"batch {batch_id}: {len(entries)} entries queued. Follow it with: "
                       f"frenzy batch status {batch_id}")
        return
    outcomes = _wait(client, keys, batch_id, len(entries), timeout, quiet=as_json)
    if not (wait and as_json):  # with --wait --json, one document at the end holds both
        _print_outcomes(batch_id, outcomes, as_json)
    if not all(o.final for o in outcomes):
        if wait and as_json:
            _print_outcomes(batch_id, outcomes, as_json)
        left = sum(1 for o in outcomes if not o.final)
        typer.echo(f"timed out after {timeout:g}s with {left} entries in flight; they stay queued. "
                   f"Is a worker running (`frenzy worker`)? Check later: frenzy batch status {batch_id}", err=True)
        raise typer.Exit(3)
    failed = any(o.status in B.FAILED for o in outcomes)
    if wait:
        states = _follow_jobs(batch_id, outcomes, scheduler, quiet=as_json)
        if as_json:
            report = _as_json(batch_id, outcomes)
            for entry in report["entries"]:
                entry["job_state"] = states.get(entry["job_id"], {}).get("state", "")
                entry["job_reason"] = states.get(entry["job_id"], {}).get("reason", "")
            typer.echo(json.dumps(report, indent=2))
        else:
            _print_job_ends(outcomes, states)
        failed = failed or any(s["state"] != "SUCCEEDED" for s in states.values())
    if failed:
        raise typer.Exit(1)


# Between two rounds of GetJob over a batch's unfinished jobs: at least this, more for big batches
# (about 200 calls a second at most), so following a thousand jobs never floods the scheduler.
FOLLOW_POLL_S = 1.0


def _follow_jobs(batch_id: str, outcomes: list[B.Outcome], scheduler: str, quiet: bool,
                 ) -> dict[str, dict[str, str]]:
    """Poll the scheduler (GetJob, the caller's token) until every job the batch made has ended,
    printing each state change (to stderr with ``quiet``). -> {job id: {"state", "reason"}}."""
    import grpc

    from frenzy.cli import render
    from frenzy.cli.output import fail, scheduler_call
    from frenzy.v1 import scheduler_pb2

    names = {o.job_id: o.name or f"#{o.index}" for o in outcomes if o.job_id}
    states: dict[str, dict[str, str]] = {}
    seen: dict[str, int] = {}  # job id -> transitions printed
    con = render.console(stderr=quiet)
    if not names:
        return states
    con.print(f"following {len(names)} job(s) of batch {batch_id} until they end (Ctrl-C stops following, not "
              "the jobs)")
    width = max(len(n) for n in names.values())
    try:
        with scheduler_call(scheduler) as stub:
            left = list(names)
            while left:
                started = time.monotonic()
                news: list[tuple[float, str, str]] = []  # this round's transitions, printed in time order
                for job_id in list(left):
                    try:
                        job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30)
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                            raise
                        fail(f"cannot follow {job_id}: {exc.details()}. The jobs of a batch belong to the worker's "
                             "user (`batch`). To fix: follow them with an admin token, or leave out --wait and "
                             f"check later: frenzy batch status {batch_id}", 1)
                    name = render.user_text(names[job_id])
                    news += [(t.at, job_id, f"[dim]{render.when(t.at)}[/]  {name:<{width}}  {job_id}  "
                              f"{render.styled_state(t.state)}  [dim]{render.user_text(t.reason)}[/]")
                             for t in job.history[seen.get(job_id, 0):]]
                    seen[job_id] = len(job.history)
                    state = render.state_name(job.state)
                    if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                        states[job_id] = {"state": state, "reason": job.history[-1].reason if job.history else ""}
                        left.remove(job_id)
                for _at, _job, line in sorted(news, key=lambda n: n[:2]):  # stable: history order kept
                    con.print(line)
                if left:
                    interval = max(FOLLOW_POLL_S, len(left) / 200)
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        err = render.console(stderr=True)
        err.print(f"\nstopped following batch {batch_id}; its jobs keep running on the cluster.")
        err.print(f"  its jobs:   frenzy batch status {batch_id}   (one job: frenzy logs JOB --follow)")
        err.print("  cancel one: frenzy cancel JOB")
        raise typer.Exit(130) from None
    return states


def _print_job_ends(outcomes: list[B.Outcome], states: dict[str, dict[str, str]]) -> None:
    """How each submitted job ended, one row each, and a count."""
    from rich.table import Table

    from frenzy.cli import render

    table = Table(title="jobs", title_justify="left")
    for col in ("#", "name", "job id", "state", "reason"):
        table.add_column(col, justify="right" if col == "#" else "left", no_wrap=col == "job id",
                         overflow="fold")
    for o in outcomes:
        if o.job_id in states:
            s = states[o.job_id]
            table.add_row(str(o.index), render.user_text(o.name or "-"), o.job_id,
                          f"[{render.STATE_STYLE.get(s['state'], '')}]{s['state']}[/]",
                          render.user_text(s["reason"]))
    console = render.console()
    console.print(table)
    counts = Counter(s["state"] for s in states.values())
    console.print(f"{len(states)} jobs: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))


@batch_app.command("status")
def status(
    batch_id: Annotated[str, typer.Argument(metavar="BATCH_ID", help="As printed by `frenzy batch submit`.",
                                            show_default=False)],
    as_json: JsonOpt = False,
    redis_url: BatchRedisOpt = "",
    prefix: PrefixOpt = None,
) -> None:
    """Show each entry of a batch: status, job id, error. Exit 1 when an entry failed or the batch is unknown."""
    from frenzy.worker import batch as B

    client = _connect(redis_url, prefix)
    from frenzy.worker.app import settings

    outcomes = B.read_batch(client, settings.keys, batch_id)
    if not outcomes:
        typer.echo(f"error: no batch {batch_id!r}. Recent batches: frenzy batch list", err=True)
        raise typer.Exit(1)
    _print_outcomes(batch_id, outcomes, as_json)
    if any(o.status in B.FAILED for o in outcomes):
        raise typer.Exit(1)


@batch_app.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, help="How many recent batches.")] = 20,
    as_json: JsonOpt = False,
    redis_url: BatchRedisOpt = "",
    prefix: PrefixOpt = None,
) -> None:
    """Recent batches, newest first, with how their entries ended."""
    from rich.console import Console
    from rich.table import Table

    from frenzy.worker import batch as B

    client = _connect(redis_url, prefix)
    from frenzy.worker.app import settings

    rows = []
    for batch_id, created in B.list_batches(client, settings.keys, limit):
        outcomes = B.read_batch(client, settings.keys, batch_id)
        rows.append((batch_id, created, outcomes))
    if as_json:
        typer.echo(json.dumps([{"batch_id": b, "created_at": c, **{k: v for k, v in _as_json(b, o).items()
                                                                   if k in ("done", "failed", "counts")}}
                               for b, c, o in rows], indent=2))
        return
    table = Table(title="batches", title_justify="left")
    table.add_column("batch id", no_wrap=True)
    table.add_column("created (UTC)")
    table.add_column("outcome")
    for batch_id, created, outcomes in rows:
        table.add_row(batch_id, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(created)), _summary(outcomes))
    Console().print(table)


POOLS = ("threads", "solo", "prefork")


def worker_command(
    redis_url: RedisUrlOpt = DEFAULT_REDIS_URL,
    scheduler: Annotated[str, typer.Option(
        "--scheduler", envvar="FRENZY_SCHEDULER", help="Scheduler gRPC address (host:port).")] = DEFAULT_SCHEDULER,
    concurrency: Annotated[int, typer.Option(min=1, help="Entries submitted in parallel.")] = 2,
    loglevel: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    pool: Annotated[str, typer.Option(help="Celery pool: threads, solo or prefork (gRPC channels are made per "
                                           "task, so prefork is safe too).")] = "threads",
    prefix: PrefixOpt = None,
    metrics_address: MetricsAddressOpt = "",
    log_format: LogFormatOpt = "text",
) -> None:
    """Run a batch-submission worker (Celery) for `frenzy batch`.

    It takes `frenzy batch submit` entries off the Redis queue, submits each
    to the scheduler over gRPC and records its outcome. Run as many as you
    like, on any host that reaches Redis and the scheduler.

    \b
    Example:
      frenzy worker --redis-url redis://127.0.0.1:6379/0 \\
                    --scheduler 127.0.0.1:50051 --concurrency 4
    """
    if pool not in POOLS:
        raise typer.BadParameter(f"{pool!r} is not one of {', '.join(POOLS)}", param_hint="--pool")
    import logging

    from frenzy import logs
    from frenzy.cli.service_opts import check_metrics_address, setup_logging, start_metrics
    from frenzy.worker.app import app, configure
    from frenzy.worker.metrics import METRICS

    setup_logging(loglevel, log_format)  # until Celery's own set-up: our lines before the worker starts
    fmt = logs.check_format(log_format)
    check_metrics_address(metrics_address)
    if fmt == "json":
        from celery.signals import setup_logging as celery_setup_logging

        # A receiver of setup_logging makes Celery leave the root logger to us (its text format otherwise).
        celery_setup_logging.connect(lambda **_: logs.configure(loglevel, "json"), weak=False)
    if pool == "prefork" and metrics_address:
        typer.echo("warning: --pool prefork runs tasks in child processes; the metrics endpoint counts only "
                   "what the parent sees (use --pool threads)", err=True)
    s = configure(redis_url=redis_url, scheduler=scheduler, prefix=prefix)
    endpoint = start_metrics(METRICS.registry, metrics_address, "worker")
    if endpoint is not None:
        logging.getLogger("frenzy.worker").info("metrics on %s", endpoint.url)
    try:
        app.worker_main([
            *(["--quiet"] if fmt == "json" else []),  # celery's own option: no banner between the JSON lines
            "worker", f"--concurrency={concurrency}", f"--loglevel={loglevel.upper()}", f"--pool={pool}",
            f"--queues={s.queue}", "--hostname=frenzy-worker@%h", "--without-gossip", "--without-mingle",
        ])
    finally:
        if endpoint is not None:
            endpoint.stop()


PANEL = "Operate a cluster"


def register(app: typer.Typer) -> None:
    app.command("worker", rich_help_panel=PANEL)(worker_command)
    app.add_typer(batch_app, name="batch", rich_help_panel="Run jobs")
