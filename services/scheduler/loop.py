"""The scheduler's control loop: a state machine stepped by I/O at the edges.

Each ``tick``: read the cluster and the queue from Redis, ask HAS (pure) for
placements, then reserve and launch them all in one ``place_jobs.lua`` call (each
job all or nothing: its GPUs, a rendezvous port and its launch messages in one
atomic step). A placement that loses a race (the view was stale) simply fails and
the job is retried on the next tick with fresh state — never a double booking,
because ownership is only taken inside that script. When HAS preempts (a job submitted seconds before a much
shorter one), the victim is requeued with a cancel to its agents and the
shorter job is placed on a later tick, once the victim's GPUs are back.

``reap`` (every few ticks) finds nodes whose heartbeat lease has been gone for
longer than ``dead_after_s`` (measured on the Redis clock, which is what the
agents' heartbeats are stamped with), declares them dead and requeues their
jobs: the job is stopped on its other nodes, re-planned by the predictor for
the cluster that is left (``replan``), and queued for attempt + 1 — or FAILED
once ``max_attempts`` is reached. It also frees what no live reservation
holds any more (GPUs of a requeued job whose node never reported, leaked
ports) after ``orphan_release_s``. Every ``code_renew_interval`` the reaper also renews the packed code
(``code:{sha256}``, ``frenzy.state.code_store``) of every job waiting or running, so a job queued
longer than the code's TTL (7 days) still finds its code when it is placed. A node's silence is counted from when Redis was reachable again
when that is later than its last heartbeat: an outage of Redis kills no node. What to do is
decided without I/O in ``reaping.decide_reap``; ``reap`` only reads and writes through the store.

``drain_events`` consumes the agents' status events (consumer group, acked
after handling); an event not signed with the key of the node it names (forged,
altered, replayed, expired: ``frenzy.state.signing``) or a malformed one is logged,
acked and dropped without changing anything; an event of
an older attempt only releases what that attempt still holds, except a clean exit 0 of
the attempt a requeue ended: once every node of it reported one, the job ends SUCCEEDED
and its next attempt is stopped (``finish_from_earlier_attempt.lua``). What an event
means is decided without I/O in ``agent_events.interpret``.

All state is read and written through ``StateStore``; the loop sends no Redis
command itself. What it does is counted in ``metrics`` (Prometheus counters and histograms), and
what it last read is kept in ``seen`` for the gauges built when /metrics is scraped
(``frenzy.scheduler.metrics``): no Redis command of its own. While Redis is out of reach every thread retries quietly: one log line
when the outage starts and one when it ends (``outage.RedisContact``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from frenzy.scheduler.agent_events import (
    Exited,
    LateSuccess,
    LaunchRefused,
    Stale,
    Started,
    UnknownJob,
    interpret,
)
from frenzy.scheduler.leader import LeaderLease
from frenzy.scheduler.metrics import ClusterCollector, SchedulerMetrics, Snapshots
from frenzy.scheduler.oom_policy import OomRetry, decide_oom, max_oom_retries, plan_share
from frenzy.scheduler.outage import RedisContact
from frenzy.scheduler.placing import Rendezvous, plan_from_stored, render_launches
from frenzy.scheduler.reaping import NodeLease, OrphanKey, ReapSettings, ReapSnapshot, decide_reap
from frenzy.state.attempts import requeue_limit
from frenzy.state.code_store import CodeStore
from frenzy.state.job_states import ACTIVE, JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, BadMessage, event_from, payload
from frenzy.state.outcomes import ExitCounted, ExitStatus, LateStatus, Moved
from frenzy.state.ports import DEFAULT_MASTER_PORTS
from frenzy.state.records import JobRecord, exit_note
from frenzy.state.signing import Refusal, Verifier
from frenzy.state.store import PlacementOrder, ScriptCall, StateStore
from frenzy.v1 import types_pb2
from has import Placement, QueuePolicy, schedule
from has.oom import plans_that_may_fit
from has.preemption import credit_progress, weighs_running

log = logging.getLogger(__name__)


class EventScriptFailed(Exception):
    """The script one event of a batch needed failed in Redis (the others of the batch stand)."""

# Re-plan a job for the cluster as it is now: new ranked plans, or None to keep the old ones.
Replanner = Callable[[JobRecord], "list[types_pb2.Plan] | None"]


class _Unread:
    """``handle_event``'s default: the job was not read by the caller."""


UNREAD = _Unread()


@dataclass
class TickReport:
    placed: list[str]
    conflicts: list[str]
    pending: int
    preempted: list[str] = field(default_factory=list)  # "victim for job" of this tick


@dataclass
class ReapReport:
    declared_dead: list[str]  # nodes declared dead this round
    requeued: list[str]  # job ids moved back to PENDING
    failed: list[str]  # job ids that ran out of attempts
    released: int  # GPUs and ports freed from ended reservations


class SchedulerLoop:
    def __init__(self, client: redis.Redis, keys: Keys, policy: QueuePolicy | None = None,
                 consumer: str = "scheduler-1", *, dead_after_s: float = 30.0, max_attempts: int = 3,
                 orphan_release_s: float = 120.0, master_ports: tuple[int, int] = DEFAULT_MASTER_PORTS,
                 replan: Replanner | None = None, code_ttl_s: float | None = None) -> None:
        if dead_after_s <= 0 or max_attempts < 1 or orphan_release_s < 0:
            raise ValueError(f"need dead_after_s > 0, max_attempts >= 1, orphan_release_s >= 0 "
                             f"(got {dead_after_s}, {max_attempts}, {orphan_release_s})")
        first, last = master_ports
        if not (1024 <= first <= last <= 65535):
            raise ValueError(f"master port range {first}-{last}: need 1024 <= first <= last <= 65535")
        self.store = StateStore(client, keys)
        # Ours by default, the simulator's `frenzy` (docs/has-policy.md): shortest-first with
        # aging over the ranked plans; QueuePolicy.named() has the other variants.
        self.policy = policy or QueuePolicy.frenzy()
        self.explain_every_s = 1.0
        self._last_explained = float("-inf")
        self.consumer = consumer
        self.dead_after_s = dead_after_s
        self.max_attempts = max_attempts
        self.orphan_release_s = orphan_release_s
        self.master_ports = master_ports
        self.replan = replan
        self.wake = threading.Event()
        self.lease: LeaderLease | None = None  # set by ``run``; None: this loop acts without one
        self.leading = threading.Event()  # set while this loop holds the lease (always, without one)
        self.leading.set()
        self._group_ready = False
        self._pending_checked = False
        self._orphans: dict[OrphanKey, float] = {}  # each orphan GPU or port -> when first seen
        self._last_reap = 0.0
        self._queue_read = False  # a tick read the queue (the code it names is known: renew_code)
        # Jobs' packed code: its TTL (FRENZY_CODE_TTL_S unless ``code_ttl_s``) is renewed by the reaper.
        self.code = CodeStore(client, keys, ttl_s=code_ttl_s)
        self._code_renewed = float("-inf")
        self.contact = RedisContact()
        self._count_from = 0.0  # Redis time since which node silence counts (after an outage)
        self._last_read: float | None = None  # monotonic time of the reaper's last read
        self._verifier = Verifier()  # agents' events: signature, expiry, replay
        self.metrics = SchedulerMetrics()
        self.seen = Snapshots()
        self.metrics.registry.register(ClusterCollector(self.seen))

    # ---- placement ---------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> TickReport:
        now = time.time() if now is None else now
        read = self.store.queue()
        self._queue_read = True
        queue = read.jobs
        self.seen.queue_length = len(queue)
        if not queue:
            return TickReport([], [], 0)
        if read.hold is not None:
            if now - self._last_explained >= self.explain_every_s:
                self._last_explained = now
                self.store.set_pending_reasons({q.job_id: f"the queue is held: {read.hold}. "
                                                          "To release: frenzy queue release" for q in queue})
            return TickReport([], [], len(queue))
        snap = self.store.cluster()
        cluster = snap.view
        self.seen.view = (time.time(), cluster)
        # Pending reasons cost several times the decision itself (docs/simulator.md), and
        # people read them at human speed: build them at most once a second.
        explain = now - self._last_explained >= self.explain_every_s
        policy = self.policy if explain == self.policy.explain else replace(self.policy, explain=explain)
        # Preemption weighs the jobs that started moments ago (QueuePolicy.preempt_within_s) and,
        # for the long-job stop (QueuePolicy.preempt_long_gain), the running jobs that resume
        # from a checkpoint (JobSpec.resumable): has.preemption.may_weigh, the simulator's rule too.
        # One preemption at a time: until the last victim's GPUs are back (its agents report
        # the exit) no other job is stopped — the simulator's stop and start are one instant,
        # and a second victim for the same waiting job would be lost work.
        running = snap.weighed(policy, now) if weighs_running(policy) and not snap.stopping else []
        # The per-user GPU quota (QueuePolicy.max_gpus_per_user) counts the GPUs each user's jobs
        # hold, from the owners the cluster read named (no read of its own).
        held = snap.gpus_by_user if policy.max_gpus_per_user else None
        result = schedule(cluster, queue, now, policy, running, held)
        # Jobs past the latest start of every plan that meets their deadline (HAS lists them in each
        # pass while they wait, and in the one that places them): flagged before any placement
        # moves them on, each once per attempt by the script. They still run, late.
        if result.deadline_missed:
            missed = self.store.mark_deadline_missed(result.deadline_missed, now)
            if missed:
                log.info("%d waiting job(s) can no longer meet their deadline; they run late, flagged", missed)
                self.metrics.deadline_missed.inc(missed)
        placed, conflicts, preempted = [], [], []
        # A preemption stops its victim now; the GPUs come back when the victim's agents report
        # the exit (release_stale), so the jobs placed on them (the one it was stopped for, and
        # with the long-job stop every taker of its GPUs) are placed on a later tick
        # (shortest-first puts them ahead of the requeued victim), not onto GPUs still in use.
        later: set[str] = set()
        if result.preemptions:
            by_owner = cluster.gpus_by_owner()  # (the pass built it to find its victims)
            held = {(g.node, g.index) for p in result.preemptions for g in by_owner.get(p.job_id, ())}
            later = {p.for_job for p in result.preemptions}
            later.update(p.job_id for p in result.placements if held.intersection(p.gpus()))
        stopped: list[tuple[str, bool]] = []
        for p in result.preemptions:
            kept = p.lost_s == 0.0  # the long-job stop: the victim resumes from its checkpoint
            if self.preempt(p.job_id, p.for_job, resumes=kept):
                preempted.append(f"{p.job_id} for {p.for_job}")
                stopped.append((p.job_id, kept))
        if stopped:  # one write for every job that waits for the victims' exits
            if len(stopped) == 1:
                victim, kept = stopped[0]
                waits = (f"{victim} has stopped (it was "
                         + ("stopped for shorter jobs; it resumes later)" if kept else "preempted for this shorter job)"))
            else:  # (a pair: the long-job stop)
                waits = (f"{' and '.join(j for j, _ in stopped)} have stopped (they were stopped for shorter "
                         "jobs; they resume later)")
            self.store.set_pending_reasons({j: f"starting once {waits}" for j in sorted(later)})
        for placement, ok, why in self._place([p for p in result.placements if p.job_id not in later]):
            (placed if ok else conflicts).append(placement.job_id if ok else f"{placement.job_id}: {why}")
            if not ok:  # the view may be stale on those nodes: read them whole next tick
                self.store.forget_nodes(node for node, _ in placement.nodes)
        if explain:
            self._last_explained = now
            reasons = {job_id: r.summary for job_id, r in result.pending.items()}
            if result.blocked_by and result.blocked_by in reasons:
                reasons[result.blocked_by] += " (oldest waiting job: holding back backfill)"
            self.store.set_pending_reasons(reasons)
        for c in conflicts:
            log.info("reservation lost a race, retrying next tick: %s", c)
        self.metrics.placements.inc(len(placed))
        self.metrics.conflicts.inc(len(conflicts))
        self.metrics.preemptions.inc(len(preempted))
        return TickReport(placed, conflicts, len(result.pending) + len(later), preempted)

    def _place(self, placements: list[Placement]) -> list[tuple[Placement, bool, str]]:
        """Reserve and launch ``placements`` in one ``place_jobs`` call (a chunk of jobs per call),
        each job all or nothing. -> (placement, placed, why not) for each, in order.

        Everything a launch is rendered from was read already: the spec and plans with the queue,
        addresses and GPU uuids with the cluster, the nodes' keys from their cache, the fences
        from a block; so a tick's placements cost one round trip (and a port-table read for a
        master node not seen before)."""
        if not placements:
            return []
        store = self.store
        rings = store.node_keys.rings({n for p in placements for n, _ in p.nodes})
        store.load_ports(p.nodes[0][0] for p in placements)
        fences = store.fences.take(len(placements))
        now = time.time()
        out: list[tuple[Placement, bool, str]] = []
        orders: list[tuple[Placement, PlacementOrder]] = []
        for placement, fence in zip(placements, fences, strict=True):
            order = self._order(placement, fence, rings, now)
            if isinstance(order, str):
                out.append((placement, False, order))
            else:
                orders.append((placement, order))
        results = store.place([o for _, o in orders])
        for (placement, order), outcome in zip(orders, results, strict=True):
            out.append((placement, outcome.placed, outcome.why))
            if outcome.placed:
                log.info("job %s attempt %d launched on %s (rendezvous %s:%d)", order.job_id, order.attempt,
                         [n for n, _ in order.nodes], order.master_addr, order.port,
                         extra={"job_id": order.job_id, "attempt": order.attempt, "node": order.nodes[0][0]})
        return out

    def _order(self, placement: Placement, fence: int, rings: dict, now: float) -> PlacementOrder | str:
        """The signed order for one placement, or why it cannot be placed now."""
        store = self.store
        source = store.launch_source(placement.job_id)
        if source is None:
            return "job no longer pending"
        attempt, spec, stored = source
        nodes = [n for n, _ in placement.nodes]
        # Launches are signed with each node's key: without one, nothing is reserved.
        keyless = [n for n in nodes if rings.get(n) is None]
        if keyless:
            return (f"node(s) {', '.join(keyless)} have no signing key. To fix: frenzy node key create "
                    f"{keyless[0]}")
        if not 0 <= placement.plan_index < len(stored):
            return f"plan {placement.plan_index} is gone (the job has {len(stored)} plans now)"
        plan = plan_from_stored(stored[placement.plan_index])
        port = store.ports.pick(nodes[0], placement.job_id, self.master_ports)
        if port is None:
            first, last = self.master_ports
            return f"no free rendezvous port on {nodes[0]}: all {last - first + 1} ports from {first} are in use"
        meet = Rendezvous(store.node_addr(nodes[0]), port)
        uuids = {n: store.gpu_uuids(n, idxs) for n, idxs in placement.nodes}
        messages = render_launches(placement.job_id, attempt, fence, spec, plan, placement.nodes, meet, uuids,
                                   user=store.queued.user(placement.job_id), node_dead_after_s=self.dead_after_s,
                                   parts=placement.parts)
        sealed = tuple(store.seal_for(m.node, m).model_dump_json() for m in messages)
        runtime = placement.plan.runtime_s
        # est_end: when these GPUs should free up again, what completion-time-aware plan choice
        # weighs against starting elsewhere now.
        return PlacementOrder(job_id=placement.job_id, attempt=attempt, fence=fence,
                              nodes=tuple((n, tuple(g)) for n, g in placement.nodes),
                              # (a mixed plan: the least any of its ranks needs; HAS checked each type's)
                              need_bytes=int(placement.plan.bytes_per_gpu if placement.plan.parts
                                             else plan.peak_bytes_per_gpu), port=port, master_addr=meet.addr,
                              gpu_type=plan.gpu_type, plan_json=json.dumps(stored[placement.plan_index]),
                              messages=sealed, est_end=None if runtime is None else now + runtime)

    # ---- node loss and leaks -------------------------------------------------------------------

    def reap(self) -> ReapReport:
        """Declare nodes dead, requeue (or fail) their jobs, free what ended reservations still hold.

        Read (``_reap_snapshot``), decide (``reaping.decide_reap``, pure), write (the store)."""
        report = ReapReport([], [], [], 0)
        snapshot = self._reap_snapshot()
        # After a queue read (the first reap of a tenure comes before it): its specs name the code.
        if self._queue_read and time.monotonic() - self._code_renewed >= self.code_renew_interval():
            self._code_renewed = time.monotonic()
            self.renew_code(snapshot.jobs.values())
        settings = ReapSettings(self.dead_after_s, self.orphan_release_s)
        mono = time.monotonic()
        plan = decide_reap(snapshot, mono, self._orphans, settings)
        came_back: set[str] = set()
        for death in plan.declare:
            if not self.store.declare_dead(death.node, death.heartbeat_at, snapshot.now):
                came_back.add(death.node)  # it heartbeated after the snapshot
                continue
            log.warning("node %s declared dead: no heartbeat for %.1f s (timeout %.1f s)", death.node,
                        death.age_s, self.dead_after_s, extra={"node": death.node})
            report.declared_dead.append(death.node)
        if came_back:
            plan = decide_reap(snapshot, mono, self._orphans, settings, came_back=frozenset(came_back))
        for lost in plan.requeue:
            job = snapshot.jobs[lost.job_id]
            assert job is not None
            state = self.requeue(job, list(lost.lost), lost.why)
            if state == JobState.PENDING.value:
                report.requeued.append(job.id)
            elif state == JobState.FAILED.value:
                report.failed.append(job.id)
        for gpu in plan.gpus:
            freed = self.store.release_stale(gpu.job_id, gpu.node, gpu.fence)
            if freed:
                log.warning("freed %d GPU(s) of %s still held by ended reservation %s of job %s%s",
                            freed, gpu.node, gpu.fence, gpu.job_id,
                            "" if gpu.waited_s is None else f" (no exit reported for {gpu.waited_s:.0f} s)",
                            extra={"node": gpu.node})
                report.released += freed
        for port in plan.ports:
            if self.store.release_port(port.node, port.port, port.job_id):
                log.info("freed rendezvous port %s on %s left by job %s", port.port, port.node, port.job_id,
                         extra={"node": port.node})
                report.released += 1
        self._orphans = plan.orphans
        for action, count in (("declared_dead", len(report.declared_dead)), ("requeued", len(report.requeued)),
                              ("failed", len(report.failed)), ("released", report.released)):
            if count:
                self.metrics.reaper.labels(action).inc(count)
        return report

    def code_renew_interval(self) -> float:
        """How often the reaper renews the code of waiting and running jobs: an eighth of the code's
        TTL (21 hours at the 7-day default), so a blob keeps at least 7/8 of its life while a job of
        it waits, and no placement has to touch it."""
        return self.code.ttl_ms / 8000

    def renew_code(self, jobs: Iterable[JobRecord | None]) -> int:
        """Renew the code of every job in the last queue read and of the active ones of ``jobs``
        (the reaper's: every job holding a GPU or a port), in one round trip; how many blobs were
        stored. Renewing here, not when a job is placed or re-planned, adds nothing to the placement
        path and also covers a job that waits for days: renewing at placement would come too late
        for it (its code gone at day 7), and a job re-planned after an OOM is queued again, so the
        next renewal covers it. Agents cannot renew (they only read code keys: frenzy.state.acl)."""
        shas = self.store.queued.codes()
        shas.update(j.spec.code_sha256 for j in jobs if j is not None and j.state in ACTIVE and j.spec.code_sha256)
        renewed = self.code.renew(shas)
        if shas:
            log.info("renewed the code of waiting and running jobs: %d of %d blobs stored", renewed, len(shas))
        return renewed

    def _reap_snapshot(self) -> ReapSnapshot:
        """What the reaper decides on: the nodes, then the port tables, then the jobs they name."""
        now = self.store.redis_time()
        mono = time.monotonic()
        # After an outage (seen by any thread, also one this scheduler started into) or a stall of
        # the reaper longer than a node may be silent: every node gets a full dead_after_s to beat.
        if self.contact.take_recovery() or (self._last_read is not None and mono - self._last_read > self.dead_after_s):
            self._count_from = max(self._count_from, now)
        self._last_read = mono
        records = self.store.load_nodes()
        self.seen.nodes = (time.time(), records)
        nodes = tuple(NodeLease.of(node) for node in records)
        # Read the port tables before any job: a port taken after this read is not looked at.
        ports = self.store.port_tables(n.name for n in nodes if n.name)
        owners = [g.owner for n in nodes for g in n.gpus if g.owner]
        owners += [owner for table in ports.values() for owner in table.values()]
        jobs = self.store.get_many(owners)
        held: dict[str, int] = {}
        for job in jobs.values():
            if job is not None and job.state in ACTIVE:
                held[job.state.value] = held.get(job.state.value, 0) + 1
        self.seen.jobs = (time.time(), held)
        return ReapSnapshot(now, nodes, ports, jobs, self._count_from)

    def preempt(self, job_id: str, for_job: str, resumes: bool = False) -> bool:
        """Stop ``job_id`` (HAS preempted it for the shorter ``for_job``) and queue it again: a
        new attempt, not counted against its attempt limit, that starts from scratch (it ran
        seconds, before any checkpoint) or, ``resumes``, from the job's own checkpoint (a
        resumable job stopped for much shorter ones). -> done (False when it had moved on
        meanwhile)."""
        job = self.store.get(job_id)
        if job is None or job.state not in ACTIVE:
            return False
        limit = self.attempt_limit(job, counted=False)
        why = (f"stopped for {for_job} and other much shorter jobs; it resumes from its checkpoint later"
               if resumes else f"preempted for {for_job}, a shorter job submitted right after it")
        fields = None
        plan = job.plan
        ran = max(0.0, time.time() - job.reserved_at)
        if resumes and plan is not None and plan.completion_s > 0:
            # Its work done so far, as the plan's runtime estimate measures it (capped:
            # has.preemption.credit_progress); the queue read scales its plans' runtimes to the rest.
            fields = {"done_fraction": f"{credit_progress(job.done_fraction, ran, plan.completion_s):.6f}"}
        done = self.store.requeue(job, [], why, limit, None, preempted=True, fields=fields).done
        if done:
            log.info("job %s preempted for %s (it ran %.0f s; requeued for attempt %d)", job_id, for_job, ran,
                     job.attempt + 1)
            self.wake.set()
        return done

    def attempt_limit(self, job: JobRecord, counted: bool) -> int:
        """The limit to requeue ``job``'s attempt under (``attempts.requeue_limit``): ``counted`` for
        an end that uses up an attempt (a lost node, a refused launch); a stop by HAS or an
        out-of-memory re-plan does not."""
        return requeue_limit(job.attempt, job.max_attempts or self.max_attempts, job.preemptions, job.oom_exits,
                             counted=counted)

    def requeue(self, job: JobRecord, lost: list[str], why: str, cause: str | None = None) -> str:
        """Take ``job`` off its nodes and queue its next attempt (re-planned), or fail it at the limit.

        ``cause``: what ended the attempt, for its record (default: "node lost" when nodes were lost).
        -> the job's new state ("PENDING", "FAILED") or "" when it had moved on."""
        limit = self.attempt_limit(job, counted=True)
        plans = None
        if job.attempt < limit and self.replan is not None:
            try:
                plans = self.replan(job)
            except Exception as exc:  # the predictor is down: the old plans still describe the job
                log.warning("re-planning %s for the remaining cluster failed (%s); keeping its plans", job.id, exc,
                            extra={"job_id": job.id})
        if plans and job.oom_threshold is not None:
            # Plans an earlier out-of-memory exit ruled out stay out (None: its stored plans, already filtered).
            plans = plans_that_may_fit(plans, job.oom_threshold, plan_share) or None
        moved = self.store.requeue(job, lost, why, limit, plans,
                                   cause=("node lost" if lost else "") if cause is None else cause)
        state = moved.state.value if moved.state is not None else "missing"
        if not moved.done:
            log.info("requeue of %s skipped: it is %s now", job.id, state, extra={"job_id": job.id})
            return ""
        if state == JobState.PENDING.value:
            log.warning("job %s requeued for attempt %d of %d: %s%s", job.id, job.attempt + 1, limit, why,
                        f" ({len(plans)} plans for the remaining cluster)" if plans else "",
                        extra={"job_id": job.id, "attempt": job.attempt + 1})
            self.wake.set()
        else:
            log.warning("job %s FAILED after attempt %d of %d: %s", job.id, job.attempt, limit, why,
                        extra={"job_id": job.id, "attempt": job.attempt})
        return state

    def _requeue_oom(self, job: JobRecord, event: AgentEvent, ended: Exited) -> bool:
        """The attempt ran out of GPU memory on ``event.node``: re-plan it on plans that may fit and
        queue the next attempt, or end it FAILED saying why (``oom_policy.decide_oom``). The node's
        exit is counted in the same step (its process is gone: its GPUs are freed); the other nodes
        are stopped. -> done (False: the job moved on; the exit is then counted as usual)."""
        assert job.plan is not None  # (interpret sets oom only for a placed attempt)
        fresh = None
        if self.replan is not None:
            try:
                fresh = self.replan(job)
            except Exception as exc:  # the predictor is down: the job's own plans, filtered the same way
                log.warning("re-planning %s after an out-of-memory exit failed (%s); choosing among its plans",
                            job.id, exc, extra={"job_id": job.id})
        decision = decide_oom(job.plan, job.oom_threshold, ended.peak, job.oom_exits + 1, max_oom_retries(job.spec),
                              fresh or job.plans)
        report = {"node": event.node, "code": ended.code, "cause": ended.cause, "tail": "\n".join(ended.tail),
                  "peak": ended.peak, "measured": ended.peak_measured}
        fields = {"oom_threshold": repr(decision.threshold)}
        if isinstance(decision, OomRetry):
            # (a re-plan is not counted against the job's attempts: oom_policy has its own limit)
            limit, plans = self.attempt_limit(job, counted=False), decision.plans
        else:  # at the limit now: requeue_job ends it FAILED
            limit, plans = job.attempt, None
        moved = self.store.requeue(job, [event.node], decision.why, limit, plans, exit_report=report, fields=fields)
        if not moved.done:
            log.info("job %s moved on before its out-of-memory exit was handled (%s now)", job.id, moved.state)
            return False
        (log.warning if moved.state == JobState.PENDING else log.error)("job %s: %s -> %s", job.id, decision.why,
                                                                       moved.state)
        self.wake.set()
        return True

    # ---- events --------------------------------------------------------------------------------

    def drain_events(self, block_ms: int = 200, count: int = 500) -> int:
        """Handle the agents' events in batches; returns how many entries were consumed.

        A batch costs a read, one pipelined read of the jobs it names per round, the state changes
        (a script per event) and one XACK: not four round trips per event. Events of one job are
        handled in stream order, in rounds (its k-th event in round k), so each is interpreted
        against the job as the events before it left it."""
        if not self._group_ready:
            self.store.ensure_events_group()
            self._group_ready = True
        # First our own unacknowledged entries (a crash mid-handling), then new ones.
        start = ">" if self._pending_checked else "0"
        entries = self.store.read_events(self.consumer, start, count, None if start == "0" else block_ms)
        if start == "0" and not entries:
            self._pending_checked = True
        done: list[str] = []  # handled, refused or malformed: acknowledged at the end
        rounds: list[list[tuple[str, AgentEvent]]] = []
        seen: dict[str, int] = {}  # job id -> events of it so far in this batch
        now = time.time()
        for entry_id, fields in entries:
            self.metrics.observe_event_lag(entry_id, now)
            try:
                event = self._verified(entry_id, fields)
            except BadMessage as exc:
                log.warning("dropping malformed event %s: %s", entry_id, exc)
                self.metrics.events.labels("malformed").inc()
                done.append(entry_id)
                continue
            if event is None:
                done.append(entry_id)
                continue
            k = seen.get(event.job_id, 0)
            seen[event.job_id] = k + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append((entry_id, event))
        try:
            for batch in rounds:
                jobs = self.store.get_many(e.job_id for _, e in batch)
                # The usual events (a launch ran, a node exited) are one script each: the batch's
                # go to Redis in one round trip instead of one each (issue 15: at 200 events a
                # second, serial round trips kept this thread busy and GPUs held after their jobs).
                deferred: list[tuple[str, ScriptCall, Callable[[Any], None]]] = []
                for entry_id, event in batch:
                    try:
                        step = self._event_step(event, jobs.get(event.job_id))
                        if step is not None:
                            deferred.append((entry_id, *step))
                            continue
                        self.handle_event(event, jobs.get(event.job_id))
                    except redis.RedisError:
                        raise
                    except Exception:
                        self._event_failed(entry_id)
                        continue
                    self.metrics.events.labels("handled").inc()
                    done.append(entry_id)
                replies = self.store.run_calls([call for _, call, _ in deferred])
                for (entry_id, _call, after), reply in zip(deferred, replies, strict=True):
                    try:
                        if isinstance(reply, Exception):  # its script failed (and changed nothing)
                            raise EventScriptFailed(str(reply)) from reply
                        after(reply)
                    except redis.RedisError:
                        raise
                    except Exception:
                        self._event_failed(entry_id)
                        continue
                    self.metrics.events.labels("handled").inc()
                    done.append(entry_id)
        except redis.RedisError:
            # Redis went away mid-batch: what was not acknowledged is read again first.
            self._pending_checked = False
            raise
        finally:
            try:
                self.store.ack_events(done)
            except redis.RedisError:
                self._pending_checked = False
        return len(entries)

    def _verified(self, entry_id: str, fields: dict) -> AgentEvent | None:
        """The event in this entry if it is signed with the key of the node it names, in time and
        never seen before; else None (one log line, nothing changed). Raises BadMessage."""
        obj = payload(fields)
        node = obj.get("node")
        ring = self.store.node_keys.ring(node) if isinstance(node, str) and node else None
        refusal = self._verifier.check(obj, ring, entry_id)
        if refusal in (Refusal.FORGED, Refusal.NO_KEY) and isinstance(node, str) and node:
            # Perhaps rotated since the cache read it: read the node's key again (at most once a second).
            fresh = self.store.node_keys.refresh(node)
            if fresh != ring:
                refusal = self._verifier.check(obj, fresh, entry_id)
        if refusal is None:
            return event_from(obj)
        self.metrics.events.labels("refused").inc()
        log.warning("refusing event %s from node %s for job %s: %s", entry_id, str(node)[:128],
                    str(obj.get("job_id"))[:128], refusal.value)
        return None

    def handle_event(self, event: AgentEvent, job: JobRecord | None | _Unread = UNREAD) -> None:
        """Carry out what ``event`` means for its job (``agent_events.interpret``, pure).

        ``job``: the job as read just before (a batch reads its jobs together); read here if not given."""
        if isinstance(job, _Unread):
            job = self.store.get(event.job_id)
        meaning = interpret(event, job)
        if isinstance(meaning, UnknownJob) or job is None:
            log.warning("event for unknown job %s from %s ignored", event.job_id, event.node,
                        extra={"node": event.node})
        elif isinstance(meaning, Stale):
            # An older attempt (requeued) or an ended job: its process is gone now,
            # so whatever it still held on that node can go.
            if meaning.release_fence is not None:
                freed = self.store.release_stale(job.id, event.node, meaning.release_fence)
                if freed:
                    log.info("job %s attempt %d ended on %s: freed %d GPU(s) of its old reservation", job.id,
                             event.attempt, event.node, freed, extra={"node": event.node})
                    self.wake.set()
                    return
            log.info("stale event for %s (%s, attempt %s, node %s) ignored", job.id, event.kind, event.attempt,
                     event.node, extra={"job_id": job.id})
        elif isinstance(meaning, LateSuccess):
            self._late_success(job, event, meaning)
        elif isinstance(meaning, Started) and meaning.to_running is None:
            if meaning.fields:
                self.store.set_fields(job.id, **meaning.fields)
        elif isinstance(meaning, LaunchRefused):
            self.requeue(job, list(meaning.lost), meaning.why, cause="launch refused")
        elif isinstance(meaning, Exited) and meaning.oom and self._requeue_oom(job, event, meaning):
            pass
        else:
            step = self._step_of(event, job, meaning)
            assert step is not None  # Started (to RUNNING) or a counted exit
            call, after = step
            after(self.store.run_call(call))

    def _event_step(self, event: AgentEvent, job: JobRecord | None) -> tuple[ScriptCall, Callable[[Any], None]] | None:
        """The one script ``event`` needs and what to do with its reply, for the events that are
        only that (a launch reported RUNNING, a node's exit counted); None for any other (they go
        through ``handle_event``)."""
        if job is None:
            return None
        meaning = interpret(event, job)
        if isinstance(meaning, Exited) and meaning.oom:
            return None  # re-planning reads and writes more than one script
        return self._step_of(event, job, meaning)

    def _step_of(self, event: AgentEvent, job: JobRecord,
                 meaning: object) -> tuple[ScriptCall, Callable[[Any], None]] | None:
        if isinstance(meaning, Started) and meaning.to_running is not None:
            started = meaning

            def after_start(reply: Moved) -> None:
                if not reply.done and started.fields:  # (it moved on meanwhile: the pid and log still count)
                    self.store.set_fields(job.id, **started.fields)
                if reply.done and job.submitted_at > 0:
                    self.metrics.submit_to_running.observe(max(0.0, time.time() - job.submitted_at))

            # the pid and log path land with the state change: one script
            return (self.store.transition_call(job, JobState.RUNNING, started.to_running, **started.fields),
                    after_start)
        if isinstance(meaning, Exited):
            ended = meaning
            note = exit_note(job, event.node, ended.code, ended.cause, ended.tail, ended.peak, ended.peak_measured)

            def after_exit(reply: ExitCounted) -> None:
                self._exit_recorded(job, event, ended, reply)

            return (self.store.record_exit_call(job, event.attempt, event.node, ended.code, ended.reason,
                                                told_to_stop=ended.told_to_stop, note=note), after_exit)
        return None

    def _event_failed(self, entry_id: str) -> None:
        # Left pending: it is retried on restart, never silently lost.
        log.exception("failed to handle event %s", entry_id)
        self.metrics.events.labels("failed").inc()

    def _late_success(self, job: JobRecord, event: AgentEvent, late: LateSuccess) -> None:
        """Count a late exit 0 of the attempt a requeue ended; the last one finishes the job."""
        status = LateStatus.RETRY
        for _ in range(3):  # RETRY: the current attempt moved on between our read and the script
            status = self.store.finish_from_earlier_attempt(job, late.attempt, late.fence, event.node).status
            if status != LateStatus.RETRY:
                break
            fresh = self.store.get(job.id)
            if fresh is None or not isinstance(interpret(event, fresh), LateSuccess):
                break
            job = fresh
        if status == LateStatus.FINISHED:
            log.warning("job %s: attempt %d succeeded late (its node %s was declared dead, its copy ran to the "
                        "end); SUCCEEDED, attempt %d stopped", job.id, late.attempt, event.node, job.attempt)
            self.wake.set()
        else:
            log.info("job %s: late exit 0 of attempt %d on %s: %s", job.id, late.attempt, event.node, status,
                     extra={"node": event.node})
        # Its process is gone: what that reservation still holds on the node can go.
        if self.store.release_stale(job.id, event.node, late.fence):
            self.wake.set()

    def _exit_recorded(self, job: JobRecord, event: AgentEvent, ended: Exited, counted: ExitCounted) -> None:
        """After ``record_exit.lua`` counted (or ignored) one node's exit: log it, and stop the
        job's other nodes when a rank failed and the job goes on."""
        log.info("job %s: %s -> %s (%s)", job.id, ended.reason, counted.state or "missing", counted.status.value,
                 extra={"job_id": job.id, "attempt": event.attempt, "node": event.node})
        if counted.status == ExitStatus.RECORDED and ended.stop_others:
            job = self.store.get(job.id) or job
            self.store.request_cancel(job, f"node {event.node} (node rank {job.node_rank(event.node)}) failed "
                                      f"with code {ended.code}", user=False)

    # ---- cancel --------------------------------------------------------------------------------

    def cancel(self, job: JobRecord, reason: str) -> Moved:
        """Cancel a job in any non-terminal state. -> accepted, and the job's state (CANCELLED, the
        one it is stopping from, or the one that refused the cancel)"""
        if job.state == JobState.PENDING or job.state == JobState.RESERVED:
            # Only from the state it was read in: a job placed meanwhile has launches out and is
            # stopped through its agents (below), never marked CANCELLED while its processes start.
            moved = self.store.transition(job, JobState.CANCELLED, f"cancelled: {reason}", release=True,
                                          from_states=(job.state,))
            if moved.done:
                return moved
            job = self.store.get(job.id) or job  # it moved on meanwhile; try the running path
        if job.state in (JobState.LAUNCHING, JobState.RUNNING):
            return self.store.request_cancel(job, reason, user=True)
        return Moved(False, job.state)

    # ---- threads -------------------------------------------------------------------------------

    def reap_interval(self) -> float:
        """How often ``run`` reaps: often enough to declare a node dead within ~1/4 of its timeout."""
        return max(0.2, min(self.dead_after_s / 4, 5.0))

    def run(self, stop: threading.Event, tick_s: float = 0.25, lease: LeaderLease | None = None) -> None:
        """Run placement ticks, reaping and event handling until ``stop`` is set, while this
        scheduler holds the leader lease (``leader.LeaderLease``; a standby waits for it).

        Each tenure starts with a reap. Besides its own wake (submissions in this process, events that freed GPUs), the
        loop wakes on a token another process pushes (``StateStore.wake_leader``: a standby's API,
        ``frenzy queue release``)."""
        self.lease = lease
        threads = [threading.Thread(target=self._events_forever, args=(stop,), name="events", daemon=True),
                   threading.Thread(target=self._wakes_forever, args=(stop,), name="wakes", daemon=True)]
        for t in threads:
            t.start()
        started = False
        while not stop.is_set():
            try:
                if not self._lead():
                    started = False  # a new tenure starts with a reap again
                    stop.wait(min(0.5, lease.ttl_s / 3) if lease is not None else 0.5)
                    continue
                if not started:
                    # The per-user queued counts (the queued-jobs quota) rebuilt from the queue:
                    # heals counts lost or written before they existed. Once per tenure.
                    self.store.recount_queue_users()
                if not started or time.monotonic() - self._last_reap >= self.reap_interval():
                    self._last_reap = time.monotonic()
                    self.reap()
                    started = True
                started_tick = time.perf_counter()
                self.tick()
                self.metrics.tick_seconds.observe(time.perf_counter() - started_tick)
                self.contact.reached()
            except redis.RedisError as exc:
                self.contact.lost("scheduling loop", exc)
            self.wake.wait(tick_s)
            self.wake.clear()
        if lease is not None:
            lease.release()
            self.store.lease = ""
        # The events thread ends within its read's block (200 ms); the wakes thread may sit in a
        # BLPOP for up to its timeout and touches nothing on the way out, so a stop does not wait
        # for it (a daemon thread: it ends on its own, or when the client is closed).
        threads[0].join(timeout=5)

    def _lead(self) -> bool:
        """Hold (renew or take) the leader lease. -> whether this scheduler leads now."""
        if self.lease is None:
            return True
        held = self.lease.hold()
        if held and self.store.lease != self.lease.value:
            self._pending_checked = False  # take over the last leader's unacknowledged events
        self.store.lease = self.lease.value if held else ""
        self.leading.set() if held else self.leading.clear()
        return held

    def nudge(self) -> None:
        """Run a pass soon: now when this process leads, else by a token to the leader."""
        self.wake.set()
        if self.lease is not None and not self.leading.is_set():
            self.store.wake_leader()

    def _wakes_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.leading.wait(0.5):
                continue
            try:
                if self.store.wait_wake(0.5):
                    self.wake.set()
            except redis.RedisError:
                stop.wait(0.5)  # the loop's own thread reports the outage

    def _events_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.leading.wait(0.5):  # a standby leaves the events to the leader
                continue
            try:
                if self.drain_events():
                    self.wake.set()  # GPUs may have been freed: schedule now
                self.contact.reached()
            except redis.RedisError as exc:
                self.contact.lost("event consumer", exc)
                stop.wait(0.5)
