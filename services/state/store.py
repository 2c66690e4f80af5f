"""Job and cluster state in Redis: the scheduler's I/O with state.

Every change to a job goes through one Lua script (services/state/lua), so a crash or a
concurrent scheduler can never leave half a change behind; each script's answer comes back as a
typed outcome (``outcomes.py``), never a ``(bool, str)`` pair. Reads hand their replies to the
read models, which keep what a tick reuses and return snapshot values: ``queue_read.py`` (the
queue as HAS sees it) and ``cluster_read.py`` (HAS's ``ClusterView`` and the running jobs);
records are decoded by their codecs in ``records.py``. The rendezvous ports and fencing tokens
handed out are the ``PortAllocator`` (``ports.py``) and the ``FenceBlock`` (``fences.py``). The
policy itself lives in ``has`` and never sees Redis.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from google.protobuf import json_format

from frenzy.state import node_keys, scripts, signing
from frenzy.state.calls import PlacementOrder, ScriptCall, Submission, Submitted
from frenzy.state.cluster_read import ClusterReadModel, ClusterSnapshot
from frenzy.state.fences import FenceBlock
from frenzy.state.job_states import JobState, sources_of
from frenzy.state.keys import SCHEDULER_GROUP, Keys
from frenzy.state.messages import CancelMessage, Sealable, sealed
from frenzy.state.node_keys import NodeKeyMissing
from frenzy.state.outcomes import ExitCounted, LateCounted, Moved, PlaceOutcome
from frenzy.state.ports import PortAllocator
from frenzy.state.queue_read import QueueReadModel, QueueSnapshot
from frenzy.state.records import (
    JobRecord,
    NodeRecord,
    attempt_base,
    decode_job,
    decode_node,
    gpu_count,
    history_entry,
)
from frenzy.state.streams import ack_and_trim, ensure_group
from frenzy.v1 import types_pb2

log = logging.getLogger(__name__)

STREAM_MAXLEN = 10_000


def _as_is(reply: Any) -> Any:
    return reply


def plans_to_json(plans: list[types_pb2.Plan]) -> str:
    """Plans as the job hash stores them (a JSON list of ``MessageToDict``)."""
    return json.dumps([json_format.MessageToDict(p) for p in plans])


class StateStore:
    """Typed access to Frenzy's Redis state for the scheduler."""

    def __init__(self, client: redis.Redis, keys: Keys, full_read_s: float = 30.0) -> None:
        """``full_read_s``: how often ``cluster()`` re-reads every GPU, not only the nodes whose
        ``rev`` moved (a safety net: a write that bypassed the scripts is seen within that)."""
        if not client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("StateStore needs a Redis client with decode_responses=True")
        self.r = client
        self.k = keys
        self._submit = scripts.register(client, "submit_job")
        self._recount_queue_users = scripts.register(client, "recount_queue_users")
        self._transition = scripts.register(client, "transition_job")
        self._record_exit = scripts.register(client, "record_exit")
        self._cancel = scripts.register(client, "request_cancel")
        self._requeue = scripts.register(client, "requeue_job")
        self._finish_earlier = scripts.register(client, "finish_from_earlier_attempt")
        self._release_stale = scripts.register(client, "release_stale")
        self._declare_dead = scripts.register(client, "declare_node_dead")
        self._release_port = scripts.register(client, "release_port")
        self._read_nodes = scripts.register(client, "read_nodes")
        self._read_hashes = scripts.register(client, "read_hashes")
        # What the last tick read, reused while Redis says it has not changed (``queue`` and
        # ``cluster`` run on every tick; parsing 1,000 jobs' plans or building 10,000 GPU slots
        # again each time cost more than the decision itself).
        self.queued = QueueReadModel()
        self.nodes = ClusterReadModel()
        self.full_read_s = full_read_s
        self._last_full_read = -math.inf
        self._heads_read: tuple[float, list[str], list[Any]] | None = None  # node names and heads read with the queue
        self.ports = PortAllocator()  # rendezvous ports in use, as last read or taken here
        self.fences = FenceBlock(lambda n: int(self.r.incrby(self.k.seq(), n)))
        self._place = scripts.register(client, "place_jobs")
        self._events_trimmed_to = ""  # the MINID the events stream was last trimmed to
        # The leader lease value this store's scheduler holds ("" without one): the fenced scripts
        # (placing, declaring nodes dead) refuse to act for a lease that has passed to another.
        self.lease = ""
        self._set_reasons = scripts.register(client, "set_pending_reasons")
        self._mark_missed = scripts.register(client, "mark_deadline_missed")
        # Nodes' signing keys, re-read every few seconds: sealing a message costs no round trip.
        self.node_keys = signing.KeyCache(lambda nodes: node_keys.read_many(self.r, self.k, nodes), time.monotonic)

    # ---- jobs -------------------------------------------------------------------------------

    def submit(
        self, spec: types_pb2.JobSpec, plans: list[types_pb2.Plan], model_name: str, parameter_count: int,
        pending_reason: str = "waiting for the first scheduling pass", max_attempts: int = 0, user: str = "",
    ) -> tuple[str, bool]:
        """Create a PENDING job owned by ``user`` (or return the one this user submitted with the same
        idempotency key: keys are per user, so nobody learns of or gets another's job). -> (id, duplicate)"""
        made = self.submit_prepared(self.prepare_submission(spec, plans, model_name, parameter_count, pending_reason,
                                                            max_attempts, user))
        return made.job_id, made.duplicate

    def prepare_submission(
        self, spec: types_pb2.JobSpec, plans: list[types_pb2.Plan], model_name: str, parameter_count: int,
        pending_reason: str = "waiting for the first scheduling pass", max_attempts: int = 0, user: str = "",
        plans_json: str | None = None,
    ) -> Submission:
        """Everything ``submit_prepared`` writes, rendered (no I/O): the JSON is made here, outside
        whatever lock the caller holds around the write. ``plans_json``: ``plans`` as JSON when the
        caller kept it from an earlier submission with the same prediction."""
        job_id = f"job-{uuid.uuid4().hex[:12]}"
        now = time.time()
        fields = {
            "user": user,
            "name": spec.name or model_name,
            "spec": json_format.MessageToJson(spec, indent=None),
            "plans": plans_json if plans_json is not None else plans_to_json(plans),
            "model_name": model_name,
            "parameter_count": str(parameter_count),
            "pending_reason": pending_reason,
            # (also in the spec; a field of its own so the queue read need not parse the spec)
            "priority": str(spec.priority),
        }
        if max_attempts > 0:
            fields["max_attempts"] = str(max_attempts)
        if spec.resumable:  # (read with the GPU owners every tick: preemption weighs it)
            fields["resumable"] = "1"
        return Submission(job_id=job_id, at=now, spec=spec, plans=list(plans), fields=fields,
                          history=history_entry(JobState.PENDING, "submitted", now), user=user)

    def submit_prepared(self, sub: Submission, max_queued: int = 0) -> Submitted:
        """Write a prepared submission (``submit_job.lua``, one round trip, which also wakes the
        leader's placement loop). -> the new job's record
        as written (no read back), or the earlier job's id when the idempotency key names one, or
        (``max_queued`` > 0) ``over_quota`` when its user has that many jobs queued already."""
        idem = sub.spec.idempotency_key
        idem_key = self.idempotency_key(idem, sub.user) if idem else self.k.idempotency("-unused-")
        argv: list[Any] = [sub.job_id, repr(sub.at), sub.history, "1" if idem else "0", str(max(0, max_queued))]
        for kv in sub.fields.items():
            argv.extend(kv)
        res = self._submit(
            keys=[idem_key, self.k.job(sub.job_id), self.k.job_history(sub.job_id), self.k.jobs(), self.k.queue(),
                  self.k.seq(), self.k.wake()],
            args=argv,
        )
        if int(res[1]) == 2:
            return Submitted("", False, None, over_quota=int(res[2]))
        job_id, duplicate = str(res[0]), bool(int(res[1]))
        if duplicate:
            return Submitted(job_id, True, None)
        record = JobRecord(
            id=job_id, state=JobState.PENDING, seq=int(res[2]), submitted_at=sub.at, attempt=1, spec=sub.spec,
            plans=sub.plans, model_name=sub.fields["model_name"], parameter_count=int(sub.fields["parameter_count"]),
            plan=None, placement=[], fence=0, pending_reason=sub.fields["pending_reason"], cancel_requested=False,
            exit_codes={}, log_paths={}, history=[json.loads(sub.history)], user=sub.user,
            max_attempts=int(sub.fields.get("max_attempts", 0)))
        return Submitted(job_id, False, record)

    def recount_queue_users(self) -> int:
        """Rebuild the per-user queued counts from the queue (``recount_queue_users.lua``). -> jobs queued."""
        return int(self._recount_queue_users(keys=[self.k.queue(), self.k.queue_users()],
                                             args=[self.k.job("")]))

    def get(self, job_id: str) -> JobRecord | None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(self.k.job(job_id))
        pipe.lrange(self.k.job_history(job_id), 0, -1)
        raw, hist = pipe.execute()
        if not raw:
            return None
        return decode_job(raw, hist)

    def get_many(self, job_ids: Iterable[str]) -> dict[str, JobRecord | None]:
        """Several jobs in one round trip (None for a job that does not exist)."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.k.job(job_id))
            pipe.lrange(self.k.job_history(job_id), 0, -1)
        res = pipe.execute()
        return {job_id: decode_job(res[2 * i], res[2 * i + 1]) if res[2 * i] else None
                for i, job_id in enumerate(ids)}

    def idempotency_key(self, key: str, user: str) -> str:
        return self.k.idempotency(f"{user}/{key}" if user else key)

    def job_by_idempotency_key(self, key: str, user: str) -> JobRecord | None:
        existing = self.r.get(self.idempotency_key(key, user))
        return self.get(existing) if existing else None

    def list(self, states: set[JobState] | None = None, limit: int = 100, user: str | None = None,
             name: str = "", since: float = 0.0) -> list[JobRecord]:
        """Newest first, at most ``limit`` matching jobs: only ``user``'s when given, only those whose
        name contains ``name`` ignoring case, only those submitted at or after ``since`` (unix seconds;
        0: any time)."""
        filtered = bool(states) or user is not None or bool(name)
        if since > 0:
            # The jobs zset is scored by submission time: the range leaves older jobs unread.
            window = {} if filtered else {"start": 0, "num": max(limit, 1)}
            ids = self.r.zrevrangebyscore(self.k.jobs(), "+inf", repr(float(since)), **window)
        else:
            ids = self.r.zrevrange(self.k.jobs(), 0, -1 if filtered else max(limit, 1) - 1)
        needle = name.casefold()
        out: list[JobRecord] = []
        for job_id in ids:
            rec = self.get(job_id)
            if rec is None or (states and rec.state not in states) or (user is not None and rec.user != user):
                continue
            if needle and needle not in rec.spec.name.casefold():
                continue
            out.append(rec)
            if len(out) >= limit:
                break
        return out

    def queue(self) -> QueueSnapshot:
        """The PENDING jobs in FIFO order, as HAS sees them, and the queue's hold (read model:
        ``queue_read.QueueReadModel``).

        One round trip (``read_hashes.lua``) for every queued job's state; plans are parsed only for
        jobs not seen before, or whose attempt changed (a requeue may bring new plans). The same
        ``QueuedJob`` object is handed out while a job waits, so HAS's per-job caches hold.
        """
        model = self.queued
        pipe = self.r.pipeline(transaction=False)
        pipe.zrange(self.k.queue(), 0, -1, withscores=True)
        pipe.get(self.k.queue_hold())
        # While jobs wait, the tick reads the cluster next: the node names and heads come with the
        # queue's reads, two round trips less (cluster() takes them if at most NAMES_REUSE_S old,
        # once). An empty or held queue is not placed: its ticks read no node.
        prefetch = model.waiting()
        if prefetch:
            pipe.smembers(self.k.nodes())
        entries, hold, *names_read = pipe.execute()
        read_at = time.monotonic()
        calls = []
        if entries:
            calls.append(ScriptCall(self._read_hashes, [self.k.job(job_id) for job_id, _ in entries],
                                    list(model.HEAD_FIELDS), _as_is))
        names = sorted(names_read[0]) if prefetch and entries and hold is None else None
        if names is not None:
            calls.append(self._node_heads_call(names))
        replies = self.read_calls(calls)
        self._heads_read = (read_at, names, replies[1]) if names is not None else None
        pending = model.pending(entries, replies[0] if entries else [], hold)
        missing = model.missing(pending)
        if missing:
            pipe = self.r.pipeline(transaction=False)
            for job_id in missing:
                pipe.hmget(self.k.job(job_id), *model.BODY_FIELDS)
            model.admit(pending, dict(zip(missing, pipe.execute(), strict=True)))
        return model.snapshot(pending, hold, read_at)

    def set_pending_reasons(self, reasons: dict[str, str]) -> None:
        """Write each job's pending reason, only where it differs from what this store last wrote
        for the same queued attempt (no read: with 10,000 jobs waiting, reasons written once a
        second must not cost 10,000 reads)."""
        changed = self.queued.changed_reasons(reasons) if reasons else {}
        if changed:
            self._set_reasons(keys=[self.k.job(j) for j in changed], args=list(changed.values()))

    def mark_deadline_missed(self, job_ids: Iterable[str], now: float) -> int:
        """Flag the waiting jobs whose deadline HAS can no longer meet (``ScheduleResult.deadline_missed``),
        each once per attempt, with a history note (``mark_deadline_missed.lua``). -> jobs newly flagged."""
        keys: list[str] = []
        args: list[object] = [now]
        for job_id in job_ids:
            source = self.queued.source(job_id)
            if source is None:
                continue
            keys += [self.k.job(job_id), self.k.job_history(job_id)]
            args += [source[0], history_entry(JobState.PENDING, "its deadline can no longer be met: it runs late "
                                              "(frenzy cancel stops it)", now)]
        return int(self._mark_missed(keys=keys, args=args)) if keys else 0

    # ---- placement (place_jobs.lua: a tick's jobs reserved and launched in one call) -------------

    def launch_source(self, job_id: str) -> tuple[int, types_pb2.JobSpec, list[dict[str, Any]]] | None:
        """What a launch of ``job_id`` is rendered from, as the queue read it: (attempt, spec, stored
        plans). None when the job is not in the last ``queue()`` read."""
        hit = self.queued.source(job_id)
        if hit is None:
            return None
        attempt, spec, plans = hit
        return int(attempt), json_format.Parse(spec, types_pb2.JobSpec(), ignore_unknown_fields=True), plans

    def load_ports(self, nodes: Iterable[str]) -> None:
        """Read the port tables of ``nodes`` the allocator does not know yet (one pipelined round trip)."""
        missing = sorted({n for n in nodes if not self.ports.known(n)})
        if missing:
            self.port_tables(missing)  # (it hands what it read to the allocator)

    def place(self, orders: list[PlacementOrder], chunk: int = 128) -> list[PlaceOutcome]:
        """Reserve and launch each order, all or nothing per job, in one ``place_jobs`` call per
        ``chunk`` jobs (a script blocks Redis while it runs: a chunk takes a few ms).
        -> each order's outcome, in order."""
        results: list[PlaceOutcome] = []
        now = time.time()
        for start in range(0, len(orders), chunk):
            part = orders[start:start + chunk]
            keys: list[str] = [self.k.queue(), self.k.seq(), self.k.leader()]
            args: list[Any] = [repr(now), STREAM_MAXLEN, len(part), self.lease]
            for o in part:
                nodes = [n for n, _ in o.nodes]
                keys += [self.k.job(o.job_id), self.k.job_history(o.job_id), self.k.ports(nodes[0]),
                         *(self.k.gpu(n, i) for n, idxs in o.nodes for i in idxs),
                         *(self.k.node_alive(n) for n in nodes), *(self.k.node(n) for n in nodes),
                         *(self.k.launch_stream(n) for n in nodes)]
                gpus = sum(len(idxs) for _, idxs in o.nodes)
                args += [o.job_id, str(o.attempt), o.fence, gpus, len(nodes), o.need_bytes, o.port, nodes[0],
                         o.master_addr, "" if o.est_end is None else repr(o.est_end), o.plan_json,
                         json.dumps([[n, list(g)] for n, g in o.nodes]),
                         history_entry(JobState.RESERVED, f"{gpus} x {o.gpu_type} on " + ", ".join(nodes), now),
                         history_entry(JobState.LAUNCHING, f"launch sent to {len(nodes)} node(s)", now),
                         *o.messages]
            flat = self._place(keys=keys, args=args)
            for o, ok, why in zip(part, flat[0::2], flat[1::2], strict=True):
                outcome = PlaceOutcome(True) if int(ok) == 1 else PlaceOutcome(False, str(why))
                results.append(outcome)
                master = o.nodes[0][0]
                if outcome.placed:
                    self.ports.taken(master, o.port)
                    self.queued.placed(o.job_id)
                elif outcome.why.startswith("port taken"):
                    self.ports.forget(master)
                else:
                    self.ports.unused(master, o.port)
        return results

    def transition(
        self, job: JobRecord, to: JobState, reason: str = "", release: bool = False,
        from_states: Iterable[JobState] | None = None, **fields: str,
    ) -> Moved:
        """Move ``job`` to ``to`` if it is in one of ``from_states`` (default: every state the state
        machine lets move to ``to``) and the move is allowed. -> done and the state it is in now"""
        return self.run_call(  # type: ignore[no-any-return]
            self.transition_call(job, to, reason, release, from_states, **fields))

    def transition_call(
        self, job: JobRecord, to: JobState, reason: str = "", release: bool = False,
        from_states: Iterable[JobState] | None = None, **fields: str,
    ) -> ScriptCall:
        """``transition`` as a call ``run_calls`` can send with others."""
        now = time.time()
        sources = sources_of(to) if from_states is None else list(from_states)
        argv: list[Any] = [job.id, ",".join(sources), to.value, repr(now), history_entry(to, reason, now)]
        for kv in fields.items():
            argv.extend(kv)
        gpu_keys = job.gpu_keys(self.k) if release else []
        argv.insert(5, "1" if release else "0")
        return ScriptCall(self._transition, [self.k.job(job.id), self.k.job_history(job.id), self.k.queue(),
                                             self.k.ports(job.master_node or "-"), *gpu_keys], argv,
                          Moved.to(to))

    def record_exit_call(self, job: JobRecord, attempt: int, node: str, exit_code: int, reason: str,
                         told_to_stop: bool = False, note: str = "") -> ScriptCall:
        """Count one node's exit (``record_exit.lua``); the last one finishes the job. Its reply
        reads as an ``ExitCounted``.

        ``told_to_stop``: the node ended because it was cancelled, so its exit code
        is not the job's failure. ``note``: the node's report for the attempt's record (``exit_note``;
        "": the plan's record only)."""
        return ScriptCall(
            self._record_exit,
            [self.k.job(job.id), self.k.job_history(job.id), self.k.ports(job.master_node or "-"),
             *job.gpu_keys(self.k)],
            [job.id, str(attempt), node, str(exit_code), len(job.placement), repr(time.time()), reason,
             job.node_rank(node), "1" if told_to_stop else "0",
             note or json.dumps({"base": attempt_base(job.attempt, job.plan)})],
            ExitCounted.of)

    def run_call(self, call: ScriptCall) -> Any:
        """One call, on its own: its reply as ``call.read`` gives it. Redis errors raise."""
        return call.read(call.script(keys=call.keys, args=call.args))

    def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Several script calls in one round trip, each atomic on its own as if sent alone (the
        events of a batch touch different jobs). -> each call's reply as ``call.read`` gives it, or
        the exception its script raised (that call changed nothing; the others stand). Scripts
        Redis does not have (restarted, flushed) are loaded and those calls sent again. Connection
        errors raise: which calls ran is unknown, and each is safe to repeat (fenced, idempotent)."""
        if not calls:
            return []
        out: list[Any] = []
        for c, reply in zip(calls, self._replies(calls), strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                out.append(c.read(reply))
            except Exception as exc:  # noqa: BLE001 - returned in its place, for its caller to report
                out.append(exc)
        return out

    def read_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Read-only script calls in one round trip; the first error raises (as one call alone would)."""
        out = self.run_calls(calls)
        for reply in out:
            if isinstance(reply, Exception):
                raise reply
        return out

    def _replies(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Each call's raw reply or error, in one round trip (two more when Redis lost scripts)."""
        replies = self._evalsha_all(calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)]
        if missing:  # none of those ran: load each script once, send them again
            for script in {calls[i].script.sha: calls[i].script for i in missing}.values():
                self.r.script_load(script.script)
            for i, reply in zip(missing, self._evalsha_all([calls[i] for i in missing]), strict=True):
                replies[i] = reply
        return replies

    def _evalsha_all(self, calls: Sequence[ScriptCall]) -> list[Any]:
        pipe = self.r.pipeline(transaction=False)
        for c in calls:
            pipe.evalsha(c.script.sha, len(c.keys), *c.keys, *c.args)
        return list(pipe.execute(raise_on_error=False))

    def finish_from_earlier_attempt(self, job: JobRecord, attempt: int, fence: int, node: str) -> LateCounted:
        """Count ``node``'s late exit 0 of ``attempt`` (the one the last requeue ended, under
        ``fence``); once every node of it has one, the job ends SUCCEEDED and its current attempt
        (as ``job`` was read) is stopped. ``LateStatus.RETRY``: the current attempt moved on since
        ``job`` was read (read it again)."""
        res = self._finish_earlier(
            keys=[self.k.job(job.id), self.k.job_history(job.id), self.k.queue(), self.k.ports(job.master_node or "-"),
                  *job.gpu_keys(self.k), *[self.k.launch_stream(n) for n, _ in job.placement]],
            args=[job.id, str(attempt), str(fence), node, repr(time.time()),
                  sum(len(idxs) for _, idxs in job.placement), job.state.value, str(job.fence),
                  self._cancels(job, f"attempt {attempt} of the job already succeeded"), STREAM_MAXLEN,
                  *[n for n, idxs in job.placement for _ in idxs]],
        )
        return LateCounted.of(res)

    def requeue(self, job: JobRecord, lost: list[str], why: str, max_attempts: int,
                plans: list[types_pb2.Plan] | None = None, preempted: bool = False, cause: str = "",
                exit_report: dict[str, Any] | None = None, fields: dict[str, str] | None = None) -> Moved:
        """Stop the job's attempt everywhere and queue the next one (or fail it at the limit).

        ``preempted``: HAS stopped it for a shorter job; its ``preemptions`` count goes up in
        the same step. For the attempt's record: ``cause`` when no agent reported one ("node
        lost"), ``exit_report`` the report of the node whose exit ends the attempt (``exit_note``'s
        ``exit``: give that node in ``lost`` too, its process is gone); ``fields`` are set on the
        job in the same step (its out-of-memory threshold).

        -> done, and the new state (PENDING, or FAILED at the limit; the current one when not done)."""
        res = self._requeue(
            keys=[self.k.job(job.id), self.k.job_history(job.id), self.k.queue(), self.k.ports(job.master_node or "-"),
                  *job.gpu_keys(self.k), *[self.k.launch_stream(n) for n, _ in job.placement]],
            args=[job.id, job.attempt, job.fence, max_attempts, repr(time.time()),
                  sum(len(idxs) for _, idxs in job.placement), ",".join(lost), why,
                  self._cancels(job, why), STREAM_MAXLEN,
                  json.dumps([json_format.MessageToDict(p) for p in plans]) if plans else "",
                  *[node for node, idxs in job.placement for _ in idxs], "1" if preempted else "0",
                  json.dumps({"base": attempt_base(job.attempt, job.plan), "cause": cause,
                              **({"exit": exit_report} if exit_report else {}),
                              **({"fields": fields} if fields else {})})],
        )
        return Moved.of(res)

    def release_stale(self, job_id: str, node: str, fence: int) -> int:
        """Free the GPUs of ``node`` still held by an ended reservation (``fence``) of ``job_id``."""
        count = gpu_count(self.r.hget(self.k.node(node), "gpu_count"))
        if count == 0:
            return 0
        return int(self._release_stale(keys=[self.k.job(job_id), self.k.node(node),
                                             *[self.k.gpu(node, i) for i in range(count)]],
                                       args=[job_id, fence]))

    def declare_dead(self, node: str, heartbeat_at: str, now: float) -> bool:
        """Mark ``node`` dead unless it heartbeated since ``heartbeat_at`` (or this scheduler no
        longer holds the leader lease it names). -> marked (or already was)"""
        done = int(self._declare_dead(keys=[self.k.node(node), self.k.node_alive(node), self.k.leader()],
                                      args=[heartbeat_at, repr(now), self.lease]))
        if done == -1:
            log.warning("node %s not declared dead: this scheduler's leader lease %s has passed to another",
                        node, self.lease)
        return done == 1

    def wake_leader(self) -> None:
        """Ask the leader's loop to run a pass now (from a standby's API, or an operator command)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.lpush(self.k.wake(), "1")
        pipe.ltrim(self.k.wake(), 0, 0)
        pipe.execute()

    def wait_wake(self, timeout_s: float) -> bool:
        """Block until a wake token arrives (taking it) or ``timeout_s`` passes. -> woken"""
        return self.r.blpop([self.k.wake()], timeout=max(0.01, timeout_s)) is not None

    def redis_time(self) -> float:
        """The Redis server clock: heartbeat times are written with it, so ages are computed with it too."""
        sec, usec = self.r.time()
        return sec + usec / 1e6

    def release_port(self, node: str, port: str, job_id: str) -> bool:
        """Free a rendezvous port entry if it still names ``job_id`` (a leak sweep; single-key check-and-delete)."""
        return int(self._release_port(keys=[self.k.ports(node)], args=[port, job_id])) == 1

    def request_cancel(self, job: JobRecord, reason: str, user: bool = True) -> Moved:
        """Send a cancel command to every node of a LAUNCHING/RUNNING job.

        ``user=True`` marks a user cancel (the job ends CANCELLED); ``False`` is
        the scheduler stopping the other ranks after one failed (it ends FAILED)."""
        now = time.time()
        res = self._cancel(
            keys=[self.k.job(job.id), self.k.job_history(job.id), *[self.k.launch_stream(n) for n, _ in job.placement]],
            args=[repr(now), history_entry(job.state, f"cancel requested: {reason}", now), STREAM_MAXLEN,
                  self._cancels(job, reason), "cancel_requested" if user else "stop_requested"],
        )
        return Moved.of(res)

    def seal_for(self, node: str, msg: Sealable) -> Sealable:
        """``msg`` signed with ``node``'s key (for its launch stream). Raises NodeKeyMissing."""
        ring = self.node_keys.ring(node)
        if ring is None:
            raise NodeKeyMissing(node)
        return sealed(msg, ring.signing_key(time.time()), ttl_s=signing.LAUNCH_TTL_S)

    def _cancels(self, job: JobRecord, reason: str) -> str:
        """One signed cancel per node of the job, as the JSON array the cancel scripts take."""
        msg = CancelMessage(job_id=job.id, attempt=job.attempt, reason=reason)
        out = []
        for node, _ in job.placement:
            try:
                out.append(self.seal_for(node, msg).model_dump_json())
            except NodeKeyMissing as exc:  # its agent cannot run without a key; sent for the record
                log.warning("cancel of job %s sent unsigned: %s", job.id, exc)
                out.append(msg.model_dump_json())
        return json.dumps(out)

    def set_fields(self, job_id: str, **fields: str) -> None:
        self.r.hset(self.k.job(job_id), mapping=fields)

    # ---- cluster ----------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return sorted(self.r.smembers(self.k.nodes()))

    # How old the node names and heads ``queue()`` read with the queue may be for the
    # ``cluster()`` right after it (one tick); older, or used once already, they are read again.
    NAMES_REUSE_S = 0.5

    def _node_heads_call(self, names: list[str]) -> ScriptCall:
        return ScriptCall(self._read_nodes, [key for n in names for key in (self.k.node(n), self.k.node_alive(n))],
                          [], _as_is)

    def _recent_heads(self) -> tuple[list[str], list[Any]]:
        """(node names, their heads from ``read_nodes.lua``): the ones read with the queue, else now."""
        read = self._heads_read
        self._heads_read = None
        if read is not None and time.monotonic() - read[0] <= self.NAMES_REUSE_S:
            return read[1], read[2]
        names = self.node_names()
        return names, self.run_call(self._node_heads_call(names))

    def load_nodes(self) -> list[NodeRecord]:
        """Every registered node with its lease and GPUs, decoded (``records.decode_node``)."""
        names = self.node_names()
        pipe = self.r.pipeline(transaction=False)
        for n in names:
            pipe.hgetall(self.k.node(n))
            pipe.exists(self.k.node_alive(n))
        res = pipe.execute()
        infos = [(res[2 * i], bool(res[2 * i + 1])) for i in range(len(names))]
        counts = [gpu_count(info.get("gpu_count")) for info, _ in infos]
        # Every GPU of every node in one more round trip (two per tick in all, not one per node).
        pipe = self.r.pipeline(transaction=False)
        for n, count in zip(names, counts, strict=True):
            for g in range(count):
                pipe.hgetall(self.k.gpu(n, g))
        flat = iter(pipe.execute())
        nodes = []
        for (info, alive), count in zip(infos, counts, strict=True):
            nodes.append(decode_node(info, alive, [g for g in (next(flat) for _ in range(count)) if g]))
        return nodes

    def forget_nodes(self, nodes: Iterable[str]) -> None:
        """Re-read these nodes' GPUs on the next ``cluster()`` whatever their ``rev`` says (the
        loop calls it when a reservation on them lost a race: the view may be stale there)."""
        self.nodes.forget(nodes)

    def cluster(self) -> ClusterSnapshot:
        """The cluster as HAS sees it, built from the previous tick's view (read model:
        ``cluster_read.ClusterReadModel``), with the jobs holding its GPUs.

        Reads: every node's head (name, GPU count, draining, liveness, ``rev``) in one
        read-only script, then the GPUs of only the nodes whose ``rev`` moved since the last
        read (every script that changes what the view is built from bumps it; keys.py), in
        another, then the jobs owning GPUs in a third — O(nodes + changed GPUs + owners) per tick,
        not O(GPUs). Every ``full_read_s`` all GPUs are read again."""
        # Read-only scripts, one round trip each: one command per GPU through a pipeline cost
        # ~30 µs a GPU in redis-py, 10,000 GPUs a tick. (The first of them usually came with the
        # tick's queue read.)
        model = self.nodes
        names, heads = self._recent_heads()
        now = time.monotonic()
        full = now - self._last_full_read >= self.full_read_s
        if full:
            self._last_full_read = now
        stale = model.stale(names, heads, full)
        by_name = dict(zip(names, heads, strict=True))
        gpu_keys = [self.k.gpu(n, g) for n in stale for g in range(gpu_count(by_name[n][1]))]
        rows = self._read_hashes(keys=gpu_keys, args=model.GPU_FIELDS) if gpu_keys else []
        owners = sorted(model.take_rows(names, heads, stale, rows))
        owner_rows = self._read_hashes(keys=[self.k.job(j) for j in owners], args=model.OWNER_FIELDS) if owners else []
        return model.build(owners, owner_rows)

    def node_prices(self, nodes: Sequence[str]) -> dict[str, float]:
        """Each node's operator price per GPU-hour (``frenzy agent --price-per-gpu-hour``; absent: the
        catalog's list price), in one read-only script call. A value that does not parse counts as absent."""
        rows = self._read_hashes(keys=[self.k.node(n) for n in nodes], args=["price_per_gpu_hour"]) if nodes else []
        out = {}
        for node, (raw,) in zip(nodes, rows, strict=True):
            try:
                price = float(raw) if raw else 0.0
            except ValueError:
                continue
            if 0.0 < price < math.inf:
                out[node] = price
        return out

    def node_addr(self, node: str) -> str:
        """The node's address as the last ``cluster()`` read it (asked of Redis for a node it did not see)."""
        known = self.nodes.addrs.get(node)
        return known if known is not None else (self.r.hget(self.k.node(node), "addr") or "127.0.0.1")

    def gpu_uuids(self, node: str, indices: Iterable[int]) -> list[str]:
        """The UUID of each of ``node``'s GPUs ``indices`` ("" when unknown): what a launch names
        so the agent can tell the GPU the scheduler reserved from one that took its index. From
        the last ``cluster()`` read (a GPU's uuid does not change while its node's rev holds)."""
        wanted = list(indices)
        by_index = self.nodes.uuids(node) or {}
        if all(str(i) in by_index for i in wanted):
            return [by_index[str(i)] or "" for i in wanted]
        return [self.r.hget(self.k.gpu(node, i), "uuid") or "" for i in wanted]

    def port_tables(self, nodes: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each node's rendezvous ports in use: node -> {port: job id} (one pipelined round trip; it
        also refreshes what the port allocator knows of those nodes)."""
        names = list(nodes)
        pipe = self.r.pipeline(transaction=False)
        for node in names:
            pipe.hgetall(self.k.ports(node))
        tables = dict(zip(names, pipe.execute(), strict=True)) if names else {}
        for node, table in tables.items():
            self.ports.learn(node, table)
        return tables

    # ---- agent events -----------------------------------------------------------------------

    def ensure_events_group(self) -> None:
        """Create the scheduler's consumer group on the agents' event stream (once is enough)."""
        ensure_group(self.r, self.k.events_stream(), SCHEDULER_GROUP)

    def read_events(self, consumer: str, start: str, count: int,
                    block_ms: int | None) -> list[tuple[str, dict[str, str]]]:
        """Up to ``count`` event entries for ``consumer``: ``start`` ">" for new ones (waiting up to
        ``block_ms``), "0" for those delivered to it before and never acknowledged."""
        resp = self.r.xreadgroup(SCHEDULER_GROUP, consumer, {self.k.events_stream(): start}, count=count,
                                 block=block_ms)
        return resp[0][1] if resp else []

    def ack_events(self, entry_ids: list[str]) -> None:
        """These events are handled (or dropped as malformed or refused): they are not delivered
        again, and the stream is trimmed below the oldest event still pending: a round trip for
        the batch (XACK, XPENDING) and one XTRIM."""
        if entry_ids:
            self._events_trimmed_to = ack_and_trim(self.r, self.k.events_stream(), SCHEDULER_GROUP, entry_ids,
                                                   self._events_trimmed_to)
