"""Celery app for batch submission: one task per job entry, submitted over gRPC.

Celery only *ingests* batches: it turns each entry of a batch file into one
``SubmitJob`` call and records the outcome. It never launches anything (that
is the scheduler's Redis Streams path) and never holds GPU state.

Delivery: Redis is the broker and the result backend (``REDIS_URL``). Tasks
ack late and are rejected back to the queue when a worker dies mid-task, so a
crash loses nothing; each task submits with the idempotency key
``batch:{batch_id}:{index}`` (unless the entry brings its own), so a
redelivered task finds the job the first delivery made instead of making a
second one. The queue is ``Keys.batch_queue()`` (``{prefix}:batch-queue``), so
stacks with different prefixes can share a Redis server.

Failures: a bad entry (JobSpecError, INVALID_ARGUMENT) is recorded ``invalid``
and a job no GPU type can hold (FAILED_PRECONDITION) ``rejected``; neither is
retried. An unreachable scheduler (UNAVAILABLE, DEADLINE_EXCEEDED) is retried
with exponential backoff up to ``MAX_RETRIES`` times, then recorded ``error``; so
is a submission over the scheduler's rate limit or queued-jobs quota
(RESOURCE_EXHAUSTED), which a later try may pass.

Settings come from the environment (``REDIS_URL``, ``FRENZY_SCHEDULER``,
``FRENZY_PREFIX``) or from ``configure()``, which must run before the app sends
or consumes anything. ``FRENZY_BATCH_VISIBILITY_TIMEOUT_S`` (default 300) is how
long a task held by a worker that died waits before another worker gets it.
gRPC channels are made per task, never shared across a fork, so any pool
works; ``frenzy worker`` uses threads (the work is I/O).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import grpc
import redis
from celery import Celery

from frenzy.rpc.client import DEFAULT_SCHEDULER, scheduler_stub
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2
from frenzy.worker import batch as B
from frenzy.worker.metrics import METRICS

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
MAX_RETRIES = 5  # after the first try: 1+5 attempts, about a minute with backoff
SUBMIT_TIMEOUT_S = 60.0  # the scheduler asks the predictor (30 s at most) before answering
# An unacked task comes back this long after its worker vanished; it must exceed one task's run plus a
# retry's countdown (the worker holds a retry message unacked until it is due).
VISIBILITY_TIMEOUT_S = float(os.environ.get("FRENZY_BATCH_VISIBILITY_TIMEOUT_S") or 300)

TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                             grpc.StatusCode.RESOURCE_EXHAUSTED})


@dataclass
class WorkerSettings:
    redis_url: str
    scheduler: str
    prefix: str | None = None

    @classmethod
    def from_env(cls) -> WorkerSettings:
        return cls(redis_url=os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL,
                   scheduler=os.environ.get("FRENZY_SCHEDULER") or DEFAULT_SCHEDULER,
                   prefix=os.environ.get("FRENZY_PREFIX") or None)

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    @property
    def queue(self) -> str:
        return self.keys.batch_queue()


settings = WorkerSettings.from_env()

app = Celery("frenzy", broker=settings.redis_url, backend=settings.redis_url)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_default_queue=settings.queue,
    # kombu sweeps for abandoned (unacked, timed-out) tasks every interval x throttle seconds, 100 s by
    # default; sweep every few seconds instead (one ZRANGE on a small index) so recovery is prompt.
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S,
                              "unacked_restore_interval": max(1, min(10, int(VISIBILITY_TIMEOUT_S // 2))),
                              "unacked_restore_throttle": 1},
    result_expires=24 * 3600,
    broker_connection_retry_on_startup=True,
    worker_send_task_events=False,
    enable_utc=True,
)

_clients: dict[str, redis.Redis] = {}


def configure(redis_url: str | None = None, scheduler: str | None = None, prefix: str | None = None) -> WorkerSettings:
    """Point the app (broker, backend, queue) and the task at a Redis server, a scheduler and a key prefix."""
    if redis_url and redis_url != settings.redis_url:
        settings.redis_url = redis_url
        app.conf.broker_url = redis_url
        app.conf.result_backend = redis_url
        app.close()  # drop a broker pool made for the old URL; the next use makes a new one
    if scheduler:
        settings.scheduler = scheduler
    if prefix:
        settings.prefix = prefix
    app.conf.task_default_queue = settings.queue
    return settings


def state_client() -> redis.Redis:
    """The Redis client the task records outcomes with (one per URL; redis-py is fork-aware)."""
    client = _clients.get(settings.redis_url)
    if client is None:
        client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        _clients[settings.redis_url] = client
    return client


class SchedulerUnreachable(Exception):
    """Transient: the scheduler did not answer; the task is retried with backoff."""


def auto_idempotency_key(batch_id: str, index: int) -> str:
    return f"batch:{batch_id}:{index}"


def process_entry(batch_id: str, index: int, entry: object, *, scheduler: str, client: redis.Redis, keys: Keys,
                  attempt: int = 1, final_attempt: bool = True) -> B.Outcome:
    """Validate, submit and record one entry. Raises SchedulerUnreachable when a retry should follow
    (after recording ``retrying``); every other outcome is recorded and returned."""
    name = B.entry_name(entry)

    def done(status: str, job_id: str = "", error: str = "") -> B.Outcome:
        outcome = B.Outcome(index=index, status=status, job_id=job_id, error=error, name=name, at=time.time(),
                            attempts=attempt)
        if not B.record_outcome(client, keys, batch_id, outcome):
            kept = B.get_outcome(client, keys, batch_id, index)
            log.info("batch %s[%d]: kept the recorded success (%s) over %s", batch_id, index,
                     kept.status if kept else "?", status)
            METRICS.entries.labels("already_done").inc()
            return kept or outcome
        log.info("batch %s[%d] %s: %s %s", batch_id, index, name or "-", status, job_id or error,
                 extra={"batch_id": batch_id, "job_id": job_id or None, "outcome": status})
        METRICS.entries.labels(status).inc()
        return outcome

    previous = B.get_outcome(client, keys, batch_id, index)
    if previous is not None and previous.ok:
        log.info("batch %s[%d]: already %s as %s; nothing to do", batch_id, index, previous.status, previous.job_id,
                 extra={"batch_id": batch_id, "job_id": previous.job_id or None})
        METRICS.entries.labels("already_done").inc()
        return previous

    try:
        job = parse_entry(entry)
        own_key = bool(job.idempotency_key)
        if not own_key:
            job = job.model_copy(update={"idempotency_key": auto_idempotency_key(batch_id, index)})
        spec = job.to_proto(read_model_files=False)  # entries come over Redis: never open a path they name
    except JobSpecError as exc:
        return done(B.INVALID, error=str(exc))
    name = name or job.name

    try:
        with scheduler_stub(scheduler) as stub, METRICS.submit_seconds.time():
            resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=SUBMIT_TIMEOUT_S)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return done(B.INVALID, error=details)
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return done(B.REJECTED, error=details)
        if code in TRANSIENT_CODES:
            why = (f"scheduler at {scheduler} refused for now ({details})"
                   if code == grpc.StatusCode.RESOURCE_EXHAUSTED
                   else f"scheduler at {scheduler} unreachable ({code.name}: {details})")
            if final_attempt:
                return done(B.ERROR, error=f"{why}; gave up after {attempt} attempts")
            done(B.RETRYING, error=why)
            raise SchedulerUnreachable(why) from exc
        return done(B.ERROR, error=f"{code.name}: {details}")

    # Our own key matching means this very entry was submitted before (a redelivered task): that is
    # the success it already was. Only a key the user chose can name somebody else's job.
    status = B.DUPLICATE if (resp.duplicate and own_key) else B.SUBMITTED
    return done(status, job_id=resp.job.id)


@app.task(bind=True, name="frenzy.submit_job", acks_late=True, reject_on_worker_lost=True,
          autoretry_for=(SchedulerUnreachable, redis.ConnectionError, redis.TimeoutError),
          retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=MAX_RETRIES)
def submit_job(self: Any, batch_id: str, index: int, entry: dict[str, Any]) -> dict[str, Any]:
    """Submit entry ``index`` of batch ``batch_id`` to the scheduler and record the outcome."""
    retries = int(self.request.retries or 0)
    outcome = process_entry(
        batch_id, int(index), entry, scheduler=settings.scheduler, client=state_client(), keys=settings.keys,
        attempt=retries + 1, final_attempt=retries >= self.max_retries,
    )
    return {"index": outcome.index, "status": outcome.status, "job_id": outcome.job_id, "error": outcome.error}


def enqueue(batch_id: str, index: int, entry: dict[str, Any], producer: Any = None) -> str:
    """Put one entry on the batch queue. -> Celery task id."""
    result = submit_job.apply_async(args=(batch_id, index, entry), queue=settings.queue, producer=producer)
    return str(result.id)
