"""The scheduler's control loop: a state machine stepped by I/O at the edges.

Each ``tick``: read the cluster and the queue from Redis, ask HAS (pure) for
placements, then for each one run the atomic reservation and the atomic
dispatch. A reservation that loses a race (the view was stale) simply fails
and the job is retried on the next tick with fresh state — never a double
booking, because ownership is only taken inside the reservation script.

``drain_events`` consumes the agents' status events (consumer group, acked
after handling); a malformed event is logged, acked and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis

from frenzy.common.keys import SCHEDULER_GROUP, Keys
from frenzy.common.messages import AgentEvent, BadMessage, EventKind, LaunchMessage, LayoutEnv, decode_event
from frenzy.scheduler.states import JobState
from frenzy.scheduler.store import JobRecord, StateStore
from has import Placement, QueuePolicy, schedule

log = logging.getLogger(__name__)

MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 20000


@dataclass
class TickReport:
    placed: list[str]
    conflicts: list[str]
    pending: int


class SchedulerLoop:
    def __init__(self, client: redis.Redis, keys: Keys, policy: QueuePolicy | None = None,
                 consumer: str = "scheduler-1") -> None:
        self.r = client
        self.k = keys
        self.store = StateStore(client, keys)
        self.policy = policy or QueuePolicy()
        self.consumer = consumer
        self.wake = threading.Event()
        self._group_ready = False
        self._pending_checked = False

    # ---- placement ---------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> TickReport:
        now = time.time() if now is None else now
        queue = self.store.queue()
        if not queue:
            return TickReport([], [], 0)
        cluster = self.store.cluster()
        result = schedule(cluster, queue, now, self.policy)
        placed, conflicts = [], []
        for placement in result.placements:
            ok, why = self._reserve_and_dispatch(placement)
            (placed if ok else conflicts).append(placement.job_id if ok else f"{placement.job_id}: {why}")
        reasons = {job_id: r.summary for job_id, r in result.pending.items()}
        if result.blocked_by and result.blocked_by in reasons:
            reasons[result.blocked_by] += " (oldest waiting job: holding back backfill)"
        self.store.set_pending_reasons(reasons)
        for c in conflicts:
            log.info("reservation lost a race, retrying next tick: %s", c)
        return TickReport(placed, conflicts, len(result.pending))

    def _reserve_and_dispatch(self, placement: Placement) -> tuple[bool, str]:
        job = self.store.get(placement.job_id)
        if job is None or job.state != JobState.PENDING:
            return False, "job no longer pending"
        plan = job.plans[placement.plan_index]
        ok, fence_or_reason = self.store.reserve(placement, plan)
        if not ok:
            return False, str(fence_or_reason)
        fence = int(fence_or_reason)
        job = self.store.get(placement.job_id)
        assert job is not None
        launches = self.launch_messages(job, fence)
        ok, why = self.store.dispatch(job.id, fence, launches)
        if not ok:
            log.warning("dispatch of %s skipped: %s", job.id, why)
            return False, why
        log.info("job %s launched on %s", job.id, [n for n, _ in job.placement])
        return True, ""

    def launch_messages(self, job: JobRecord, fence: int) -> list[LaunchMessage]:
        assert job.plan is not None
        lay = job.plan.layout
        layout = LayoutEnv(gpu_type=job.plan.gpu_type, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage,
                           micro_batch=lay.micro_batch, grad_accum=lay.grad_accum, recompute=lay.recompute or "none")
        master_addr = self.store.node_addr(job.placement[0][0])
        # A port per reservation: fences are unique, so concurrently running jobs
        # get distinct ports within the span (a collision needs 20,000 live jobs).
        master_port = MASTER_PORT_BASE + fence % MASTER_PORT_SPAN
        out = []
        for rank, (node, idxs) in enumerate(job.placement):
            uuids = [self.r.hget(self.k.gpu(node, i), "uuid") or "" for i in idxs]
            out.append(LaunchMessage(
                job_id=job.id, attempt=job.attempt, fence=fence, node=node, node_rank=rank,
                nnodes=len(job.placement), nproc_per_node=len(idxs), gpu_indices=list(idxs), gpu_uuids=uuids,
                master_addr=master_addr, master_port=master_port, rdzv_id=f"{job.id}-{job.attempt}",
                command=list(job.spec.command), env=dict(job.spec.env), workdir=job.spec.workdir or None,
                layout=layout,
            ))
        return out

    # ---- events --------------------------------------------------------------------------------

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.r.xgroup_create(self.k.events_stream(), SCHEDULER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def drain_events(self, block_ms: int = 200, count: int = 100) -> int:
        """Handle the agents' events; returns how many entries were consumed."""
        self._ensure_group()
        # First our own unacknowledged entries (a crash mid-handling), then new ones.
        start = ">" if self._pending_checked else "0"
        resp = self.r.xreadgroup(SCHEDULER_GROUP, self.consumer, {self.k.events_stream(): start},
                                 count=count, block=None if start == "0" else block_ms)
        entries = resp[0][1] if resp else []
        if start == "0" and not entries:
            self._pending_checked = True
        for entry_id, fields in entries:
            try:
                event = decode_event(fields)
                self.handle_event(event)
            except BadMessage as exc:
                log.warning("dropping malformed event %s: %s", entry_id, exc)
            except Exception:
                # Leave it pending: it is retried on restart, never silently lost.
                log.exception("failed to handle event %s", entry_id)
                continue
            self.r.xack(self.k.events_stream(), SCHEDULER_GROUP, entry_id)
        return len(entries)

    def handle_event(self, event: AgentEvent) -> None:
        job = self.store.get(event.job_id)
        if job is None:
            log.warning("event for unknown job %s from %s ignored", event.job_id, event.node)
            return
        if event.attempt != job.attempt or event.node not in {n for n, _ in job.placement}:
            log.info("stale event for %s (attempt %s, node %s) ignored", job.id, event.attempt, event.node)
            return
        if event.kind == EventKind.RUNNING:
            if event.log_path:
                self.store.set_fields(job.id, **{f"log:{event.node}": event.log_path})
            if job.state == JobState.LAUNCHING:
                self.store.transition(job, JobState.RUNNING, f"process started on {event.node} (pid {event.pid})")
            return
        if event.kind == EventKind.LAUNCH_FAILED:
            code, reason = 127, f"launch failed on {event.node}: {event.message}"
        else:
            code = event.exit_code if event.exit_code is not None else -1
            reason = f"{event.node} exited with code {code}" + (" (cancelled)" if event.cancelled else "")
        status, state = self.store.record_exit(job, event.attempt, event.node, code, reason)
        log.info("job %s: %s -> %s (%s)", job.id, reason, state, status)
        if status == "recorded" and code != 0:
            # One rank failed: stop the others so the job ends instead of hanging.
            job = self.store.get(job.id) or job
            self.store.request_cancel(job, f"rank on {event.node} failed with code {code}", user=False)

    # ---- cancel --------------------------------------------------------------------------------

    def cancel(self, job: JobRecord, reason: str) -> tuple[bool, str]:
        """Cancel a job in any non-terminal state. -> (accepted, state or why not)"""
        if job.state == JobState.PENDING or job.state == JobState.RESERVED:
            moved, state = self.store.transition(job, JobState.CANCELLED, f"cancelled: {reason}", release=True)
            if moved:
                return True, JobState.CANCELLED.value
            job = self.store.get(job.id) or job  # it moved on meanwhile; try the running path
        if job.state in (JobState.LAUNCHING, JobState.RUNNING):
            ok, state = self.store.request_cancel(job, reason, user=True)
            return ok, state
        return False, job.state.value

    # ---- threads -------------------------------------------------------------------------------

    def run(self, stop: threading.Event, tick_s: float = 0.25) -> None:
        """Run placement ticks and event handling until ``stop`` is set."""
        events = threading.Thread(target=self._events_forever, args=(stop,), name="events", daemon=True)
        events.start()
        while not stop.is_set():
            try:
                self.tick()
            except redis.RedisError:
                log.exception("scheduling tick failed; retrying")
            self.wake.wait(tick_s)
            self.wake.clear()
        events.join(timeout=5)

    def _events_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if self.drain_events():
                    self.wake.set()  # GPUs may have been freed: schedule now
            except redis.RedisError:
                log.exception("event consumer failed; retrying")
                stop.wait(0.5)
