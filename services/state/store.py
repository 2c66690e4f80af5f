"""Job and cluster state in Redis: the scheduler's only I/O with state.

Every multi-key change goes through one Lua script (services/state/lua), so
a crash or a concurrent scheduler can never leave half a change behind. Reads
build plain values (``JobRecord``) and HAS's pure ``ClusterView``; the policy
itself lives in ``has`` and never sees Redis.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import redis
from google.protobuf import json_format

from frenzy.state import node_keys, scripts, signing
from frenzy.state.calls import PlacementOrder, ScriptCall, Submission, Submitted
from frenzy.state.job_states import ACTIVE, JobState, sources_of
from frenzy.state.keys import SCHEDULER_GROUP, Keys
from frenzy.state.messages import CancelMessage, Sealable, sealed
from frenzy.state.node_keys import NodeKeyMissing
from frenzy.state.plan_options import option_from_json as option_from_json
from frenzy.state.plan_options import plan_to_option as plan_to_option
from frenzy.state.records import (
    JobRecord,
    NodeRecord,
    attempt_base,
    decode_job,
    decode_node,
    fraction,
    gpu_count,
    history_entry,
    scheduled_gpu,
)
from frenzy.state.streams import ack_and_trim, ensure_group
from frenzy.v1 import types_pb2
from has import ClusterView, GpuSlot, NodeView, QueuedJob, RunningJob

log = logging.getLogger(__name__)

STREAM_MAXLEN = 10_000
# torchrun rendezvous ports handed out per master node; below Linux's ephemeral
# range (32768+), so an outgoing connection never holds one by chance.
DEFAULT_MASTER_PORTS = (29500, 32767)


def _as_is(reply: Any) -> Any:
    return reply


def _priority(raw: str | None) -> int:
    """A job hash's ``priority`` field (checked at submission): absent (a job written before
    priorities) or unreadable is 0, normal."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def _port_offset(job_id: str, span: int) -> int:
    """Where in the port range the search for ``job_id``'s rendezvous port starts: derived from the
    job id, so jobs of different stacks (prefixes) sharing a host rarely probe the same ports."""
    return int(uuid.uuid5(uuid.NAMESPACE_URL, job_id).int % span)


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
        self._set_draining = scripts.register(client, "set_draining")
        self._release_port = scripts.register(client, "release_port")
        self._read_nodes = scripts.register(client, "read_nodes")
        self._read_hashes = scripts.register(client, "read_hashes")
        # What the last tick read, reused while Redis says it has not changed (``queue`` and
        # ``cluster`` run on every tick; parsing 1,000 jobs' plans or building 10,000 GPU slots
        # again each time cost more than the decision itself).
        self._queued: dict[str, tuple[tuple[str, str, int], QueuedJob]] = {}
        self._nodes: dict[str, tuple[tuple[bool, str, list[list[str | None]]], frozenset[str], NodeView]] = {}
        self._ends: dict[str, float] = {}
        self._view: ClusterView | None = None
        # node → (rev, GPU count, its GPU rows, the jobs owning them) as last read; the rows are
        # re-read only when rev moved
        self._gpu_rows: dict[str, tuple[str, str, list[list[str | None]], frozenset[str]]] = {}
        # GPU owner -> (submitted, reserved, preemptions, priority, resumable)
        self._owners: dict[str, tuple[float, float, int, int, bool]] = {}
        # GPU owner -> its user, and node -> {owner: GPUs it holds there} (counted only for the
        # nodes re-read): what the per-user GPU quota counts (``gpus_held_by_user``)
        self._owner_users: dict[str, str] = {}
        self._owned: dict[str, dict[str, int]] = {}
        self._stopping: set[str] = set()
        self.full_read_s = full_read_s
        self._last_full_read = -math.inf
        self._unreadable: set[str] = set()  # jobs whose stored plans did not parse (logged once)
        self.hold: str | None = None  # as the last ``queue()`` read it: why an operator holds the queue
        self._heads_read: tuple[float, list[str], list[Any]] | None = None  # node names and heads read with the queue
        # As the last ``queue()`` read it: (time.monotonic() when the read began, PENDING jobs per
        # user, their ids), replaced whole so another thread never sees half of one read.
        self.queued_view: tuple[float, dict[str, int], frozenset[str]] | None = None
        # What a launch is rendered from, read with the plans when a job enters the queue
        # (job id -> (attempt as stored, spec JSON, the stored plans)): placing costs no read.
        self._sources: dict[str, tuple[str, str, list[dict[str, Any]]]] = {}
        self._addrs: dict[str, str] = {}  # node -> address, from the last cluster() read
        self._ports_used: dict[str, set[int]] = {}  # node -> rendezvous ports taken, as last read or taken here
        self._fences: list[int] = []  # fencing tokens taken from the counter (INCRBY), not used yet
        self._place = scripts.register(client, "place_jobs")
        self._events_trimmed_to = ""  # the MINID the events stream was last trimmed to
        # The leader lease value this store's scheduler holds ("" without one): the fenced scripts
        # (placing, declaring nodes dead) refuse to act for a lease that has passed to another.
        self.lease = ""
        self._set_reasons = scripts.register(client, "set_pending_reasons")
        self._reasons: dict[str, tuple[object, str]] = {}  # job -> (queued stamp, reason) as last written
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

    def queued_of(self, user: str) -> int:
        """How many of ``user``'s jobs wait in the queue (one HGET; lib/queue_users keeps it exact)."""
        return int(self.r.hget(self.k.queue_users(), user) or 0)

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

    def queue(self) -> list[QueuedJob]:
        """The PENDING jobs in FIFO order, as HAS sees them.

        One round trip (``read_hashes.lua``) for every queued job's state; plans are parsed only for
        jobs not seen before, or whose attempt changed (a requeue may bring new plans). The same
        ``QueuedJob`` object is handed out while a job waits, so HAS's per-job caches hold.
        """
        pipe = self.r.pipeline(transaction=False)
        pipe.zrange(self.k.queue(), 0, -1, withscores=True)
        pipe.get(self.k.queue_hold())
        # While jobs wait, the tick reads the cluster next: the node names and heads come with the
        # queue's reads, two round trips less (cluster() takes them if at most NAMES_REUSE_S old,
        # once). An empty or held queue is not placed: its ticks read no node.
        prefetch = bool(self._queued) and self.hold is None
        if prefetch:
            pipe.smembers(self.k.nodes())
        entries, hold, *names_read = pipe.execute()
        self.hold = hold  # the operator's reason while the queue is held, else None
        read_at = time.monotonic()
        calls = []
        if entries:
            calls.append(ScriptCall(self._read_hashes, [self.k.job(job_id) for job_id, _ in entries],
                                    ["attempt", "submitted_at", "state", "user"], _as_is))
        names = sorted(names_read[0]) if prefetch and entries and hold is None else None
        if names is not None:
            calls.append(self._node_heads_call(names))
        replies = self.read_calls(calls)
        self._heads_read = (read_at, names, replies[1]) if names is not None else None
        heads = replies[0] if entries else []
        pending: list[tuple[str, tuple[str, str, int]]] = []
        users: dict[str, int] = {}
        user_of: dict[str, str] = {}
        for (job_id, seq), (attempt, submitted_at, state, user) in zip(entries, heads, strict=True):
            if state == JobState.PENDING:
                pending.append((job_id, (attempt or "", submitted_at or "", int(seq))))
                users[user or ""] = users.get(user or "", 0) + 1
                user_of[job_id] = user or ""
        # What admission control counts against a user's queued-jobs quota without a read of its own.
        self.queued_view = (read_at, users, frozenset(job_id for job_id, _ in pending))
        cached = self._queued
        # (also a job whose launch source went with a placement and that is PENDING again at the
        # same attempt, which no script does today: read again rather than placed without one)
        missing = [job_id for job_id, stamp in pending
                   if cached.get(job_id, ((),))[0] != stamp or job_id not in self._sources]
        if missing:
            pipe = self.r.pipeline(transaction=False)
            for job_id in missing:
                pipe.hmget(self.k.job(job_id), "plans", "attempt", "submitted_at", "spec", "priority", "done_fraction")
            stamps = dict(pending)
            for job_id, (raw, attempt, submitted_at, spec, priority, done) in zip(missing, pipe.execute(),
                                                                                   strict=True):
                stamp = stamps[job_id]
                if (attempt or "", submitted_at or "") != stamp[:2]:
                    continue  # changed between the two reads: left for the next tick
                try:
                    stored = json.loads(raw or "[]")
                    options = tuple(option_from_json(p) for p in stored)
                    left = 1.0 - fraction(done)  # a resumable job stopped part-way: what is left of it
                    if left < 1.0:
                        options = tuple(o if o.runtime_s is None else replace(o, runtime_s=o.runtime_s * left)
                                        for o in options)
                except (ValueError, TypeError, AttributeError) as exc:  # not what submit writes
                    if job_id not in self._unreadable:
                        self._unreadable.add(job_id)
                        log.error("job %s: stored plans unreadable (%s); it is not scheduled", job_id, exc)
                    continue
                cached[job_id] = (stamp, QueuedJob(job_id=job_id, seq=stamp[2], submitted_at=float(submitted_at or 0),
                                                   plans=options, priority=_priority(priority),
                                                   user=user_of.get(job_id, "")))
                self._sources[job_id] = (attempt or "1", spec or "{}", stored)
        out = [cached[job_id][1] for job_id, stamp in pending if cached.get(job_id, ((),))[0] == stamp]
        if len(cached) > 2 * len(pending) + 64:  # forget jobs that left the queue, now and then
            keep = {job_id for job_id, _ in pending}
            self._queued = {j: v for j, v in cached.items() if j in keep}
            self._sources = {j: v for j, v in self._sources.items() if j in keep}
        return out

    def queue_hold(self) -> str | None:
        """Why the queue is held now, or None."""
        return self.r.get(self.k.queue_hold())

    def set_pending_reasons(self, reasons: dict[str, str]) -> None:
        """Write each job's pending reason, only where it differs from what this store last wrote
        for the same queued attempt (no read: with 10,000 jobs waiting, reasons written once a
        second must not cost 10,000 reads). A reason another writer changed meanwhile (a requeue,
        a placement) belongs to a new attempt or to a job that left the queue."""
        if not reasons:
            return
        written = self._reasons
        changed: dict[str, str] = {}
        for job_id, reason in reasons.items():
            stamp = self._queued.get(job_id, ((),))[0]
            if written.get(job_id) != (stamp, reason):
                written[job_id] = (stamp, reason)
                changed[job_id] = reason
        if len(written) > 2 * len(self._queued) + 64:
            self._reasons = {j: v for j, v in written.items() if j in self._queued}
        if changed:
            self._set_reasons(keys=[self.k.job(j) for j in changed], args=list(changed.values()))

    # ---- placement (place_jobs.lua: a tick's jobs reserved and launched in one call) -------------

    def launch_source(self, job_id: str) -> tuple[int, types_pb2.JobSpec, list[dict[str, Any]]] | None:
        """What a launch of ``job_id`` is rendered from, as the queue read it: (attempt, spec, stored
        plans). None when the job is not in the last ``queue()`` read."""
        hit = self._sources.get(job_id)
        if hit is None:
            return None
        attempt, spec, plans = hit
        return int(attempt), json_format.Parse(spec, types_pb2.JobSpec(), ignore_unknown_fields=True), plans

    def queued_user(self, job_id: str) -> str:
        """The submitter of ``job_id`` as the last ``queue()`` read it ("" when it is not there):
        its launches name it, so an agent with a user map runs the job as that user's account."""
        hit = self._queued.get(job_id)
        return hit[1].user if hit is not None else ""

    def queued_code(self) -> set[str]:
        """The code sha256 of every job in the last ``queue()`` read that runs in packed code, from
        the specs that read kept (no Redis read; a job that left the queue since may be among them
        until the read forgets it: its code lives a little longer, nothing more)."""
        shas: set[str] = set()
        for _attempt, spec, _plans in self._sources.values():
            if "ha256" not in spec:  # no "codeSha256" (or "code_sha256"): nothing to parse
                continue
            try:
                raw = json.loads(spec)
            except ValueError:
                continue
            sha = raw.get("codeSha256") or raw.get("code_sha256") if isinstance(raw, dict) else None
            if isinstance(sha, str) and sha:
                shas.add(sha)
        return shas

    def fences(self, count: int, block: int = 512) -> list[int]:
        """``count`` fencing tokens never handed out before, from a block taken with one INCRBY on the
        shared counter (a round trip per ``block`` placements, not per placement). Unique across
        schedulers; tokens of a block not used are skipped, never reused."""
        short = count - len(self._fences)
        if short > 0:
            take = max(block, short)
            top = int(self.r.incrby(self.k.seq(), take))
            self._fences.extend(range(top - take + 1, top + 1))
        out, self._fences = self._fences[:count], self._fences[count:]
        return out

    def load_ports(self, nodes: Iterable[str]) -> None:
        """Read the port tables of ``nodes`` not known yet (one pipelined round trip)."""
        missing = sorted({n for n in nodes if n not in self._ports_used})
        if missing:
            self.port_tables(missing)  # (it records what it read for pick_port)

    def pick_port(self, node: str, job_id: str, ports: tuple[int, int] = DEFAULT_MASTER_PORTS) -> int | None:
        """A rendezvous port on ``node`` that is free as far as this scheduler knows (``load_ports`` first),
        starting at one derived from the job id so stacks sharing a host rarely probe the same
        ports. Counted as taken from now on (two jobs of one batch never get the same port); the
        script checks it again. None when the whole range is taken."""
        first, last = ports
        span = last - first + 1
        used = self._ports_used.setdefault(node, set())
        start = _port_offset(job_id, span)
        for step in range(span):
            port = first + (start + step) % span
            if port not in used:
                used.add(port)
                return port
        return None

    def forget_ports(self, node: str) -> None:
        """Read ``node``'s port table again before its next placement (a port it thought free was not)."""
        self._ports_used.pop(node, None)

    def place(self, orders: list[PlacementOrder], chunk: int = 128) -> list[tuple[bool, str]]:
        """Reserve and launch each order, all or nothing per job, in one ``place_jobs`` call per
        ``chunk`` jobs (a script blocks Redis while it runs: a chunk takes a few ms).
        -> (placed, why not) per order, in order."""
        results: list[tuple[bool, str]] = []
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
                placed = int(ok) == 1
                results.append((placed, str(why)))
                master = o.nodes[0][0]
                if placed:
                    self._ports_used.setdefault(master, set()).add(o.port)
                    self._sources.pop(o.job_id, None)
                elif str(why).startswith("port taken"):
                    self.forget_ports(master)
                else:
                    self._ports_used.get(master, set()).discard(o.port)
        return results

    def transition(
        self, job: JobRecord, to: JobState, reason: str = "", release: bool = False,
        from_states: Iterable[JobState] | None = None, **fields: str,
    ) -> tuple[bool, str]:
        """Move ``job`` to ``to`` if it is in one of ``from_states`` (default: every state the state
        machine lets move to ``to``) and the move is allowed. -> (moved, previous or current state)"""
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
                          lambda res: (int(res[0]) == 1, str(res[1])))

    def record_exit(self, job: JobRecord, attempt: int, node: str, exit_code: int, reason: str,
                    told_to_stop: bool = False, note: str = "") -> tuple[str, str]:
        """Count one node's exit; the last one finishes the job. -> (ignored|recorded|finished, state)

        ``told_to_stop``: the node ended because it was cancelled, so its exit code
        is not the job's failure. ``note``: the node's report for the attempt's record (``exit_note``;
        "": the plan's record only)."""
        return self.run_call(  # type: ignore[no-any-return]
            self.record_exit_call(job, attempt, node, exit_code, reason, told_to_stop, note))

    def record_exit_call(self, job: JobRecord, attempt: int, node: str, exit_code: int, reason: str,
                         told_to_stop: bool = False, note: str = "") -> ScriptCall:
        """``record_exit`` as a call ``run_calls`` can send with others."""
        return ScriptCall(
            self._record_exit,
            [self.k.job(job.id), self.k.job_history(job.id), self.k.ports(job.master_node or "-"),
             *job.gpu_keys(self.k)],
            [job.id, str(attempt), node, str(exit_code), len(job.placement), repr(time.time()), reason,
             job.node_rank(node), "1" if told_to_stop else "0",
             note or json.dumps({"base": attempt_base(job.attempt, job.plan)})],
            lambda res: (str(res[0]), str(res[1])))

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

    def finish_from_earlier_attempt(self, job: JobRecord, attempt: int, fence: int, node: str) -> tuple[str, str]:
        """Count ``node``'s late exit 0 of ``attempt`` (the one the last requeue ended, under
        ``fence``); once every node of it has one, the job ends SUCCEEDED and its current attempt
        (as ``job`` was read) is stopped. -> (ignored|recorded|retry|finished, state); "retry":
        the current attempt moved on since ``job`` was read (read it again)."""
        res = self._finish_earlier(
            keys=[self.k.job(job.id), self.k.job_history(job.id), self.k.queue(), self.k.ports(job.master_node or "-"),
                  *job.gpu_keys(self.k), *[self.k.launch_stream(n) for n, _ in job.placement]],
            args=[job.id, str(attempt), str(fence), node, repr(time.time()),
                  sum(len(idxs) for _, idxs in job.placement), job.state.value, str(job.fence),
                  self._cancels(job, f"attempt {attempt} of the job already succeeded"), STREAM_MAXLEN,
                  *[n for n, idxs in job.placement for _ in idxs]],
        )
        return str(res[0]), str(res[1])

    def requeue(self, job: JobRecord, lost: list[str], why: str, max_attempts: int,
                plans: list[types_pb2.Plan] | None = None, preempted: bool = False, cause: str = "",
                exit_report: dict[str, Any] | None = None, fields: dict[str, str] | None = None) -> tuple[bool, str]:
        """Stop the job's attempt everywhere and queue the next one (or fail it at the limit).

        ``preempted``: HAS stopped it for a shorter job; its ``preemptions`` count goes up in
        the same step. For the attempt's record: ``cause`` when no agent reported one ("node
        lost"), ``exit_report`` the report of the node whose exit ends the attempt (``exit_note``'s
        ``exit``: give that node in ``lost`` too, its process is gone); ``fields`` are set on the
        job in the same step (its out-of-memory threshold).

        -> (done, new state: PENDING or FAILED; or the current state when nothing was done)."""
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
        return int(res[0]) == 1, str(res[1])

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

    def set_draining(self, node: str, draining: bool) -> bool:
        """An operator's drain / undrain. -> False when the node does not exist."""
        return int(self._set_draining(keys=[self.k.node(node)], args=["1" if draining else "0"])) == 1

    def redis_time(self) -> float:
        """The Redis server clock: heartbeat times are written with it, so ages are computed with it too."""
        sec, usec = self.r.time()
        return sec + usec / 1e6

    def release_port(self, node: str, port: str, job_id: str) -> bool:
        """Free a rendezvous port entry if it still names ``job_id`` (a leak sweep; single-key check-and-delete)."""
        return int(self._release_port(keys=[self.k.ports(node)], args=[port, job_id])) == 1

    def request_cancel(self, job: JobRecord, reason: str, user: bool = True) -> tuple[bool, str]:
        """Send a cancel command to every node of a LAUNCHING/RUNNING job.

        ``user=True`` marks a user cancel (the job ends CANCELLED); ``False`` is
        the scheduler stopping the other ranks after one failed (it ends FAILED)."""
        now = time.time()
        res = self._cancel(
            keys=[self.k.job(job.id), self.k.job_history(job.id), *[self.k.launch_stream(n) for n, _ in job.placement]],
            args=[repr(now), history_entry(job.state, f"cancel requested: {reason}", now), STREAM_MAXLEN,
                  self._cancels(job, reason), "cancel_requested" if user else "stop_requested"],
        )
        return int(res[0]) == 1, str(res[1])

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

    def _read_owners(self, job_ids: set[str]) -> dict[str, float]:
        """For the jobs holding GPUs, one round trip (``read_hashes.lua``): job id -> when MARP expects it to finish
        (set at reservation; jobs without one are left out). Also what preemption needs: into
        ``self._owners`` (submitted_at, reserved_at, preemptions, priority, resumable) of each live one, into
        ``self._stopping`` the preempted jobs whose GPUs are not back yet."""
        ids = sorted(job_ids)
        rows = self._read_hashes(keys=[self.k.job(j) for j in ids],
                                 args=("est_end", "submitted_at", "reserved_at", "preemptions", "state", "priority",
                                       "resumable", "user")
                                 ) if ids else []
        ends: dict[str, float] = {}
        owners: dict[str, tuple[float, float, int, int, bool]] = {}
        stopping: set[str] = set()
        users: dict[str, str] = {}
        for job_id, (end, submitted, reserved, preempted, state, priority, resumable, user) in zip(ids, rows,
                                                                                                   strict=True):
            if user:
                users[job_id] = user
            if end:
                ends[job_id] = float(end)
            if state in ACTIVE and submitted and reserved:
                owners[job_id] = (float(submitted), float(reserved), int(preempted or 0), _priority(priority),
                                  resumable == "1")
            elif state == JobState.PENDING.value and int(preempted or 0) > 0:
                stopping.add(job_id)  # requeued by a preemption, its processes still stopping
        self._owners, self._stopping, self._owner_users = owners, stopping, users
        return ends

    def gpus_held_by_user(self) -> dict[str, int]:
        """GPUs each user's jobs hold (reserved, launching, running, or stopping after a
        preemption), on any node, healthy or not, as the last ``cluster()`` read them: what the
        per-user GPU quota counts (``QueuePolicy.max_gpus_per_user``). No Redis read: the owners'
        users come with the owners' read, the counts per node with the nodes re-read."""
        users = self._owner_users
        out: dict[str, int] = {}
        for counts in self._owned.values():
            for job_id, n in counts.items():
                user = users.get(job_id)
                if user is not None:
                    out[user] = out.get(user, 0) + n
        return out

    def stopping_victims(self) -> set[str]:
        """Preempted jobs still holding GPUs in the last ``cluster()`` read (their agents have not
        reported the exit yet). Read from Redis, so it survives a scheduler restart."""
        return set(self._stopping)

    def running_jobs(self, now: float, within_s: float, resumable: bool = False) -> list[RunningJob]:
        """The jobs holding GPUs in the last ``cluster()`` read that were submitted at most
        ``within_s`` ago (``QueuePolicy.preempt_within_s``), and with ``resumable`` those whose
        spec says they resume from a checkpoint (``JobSpec.resumable``; the long-job stop,
        ``QueuePolicy.preempt_long_gain``), as preemption sees them: ``stops`` is how often HAS
        stopped it already (the policy decides whether a job is stopped again:
        ``QueuePolicy.preempt_long_every_s``; by default never), ``started_at`` this attempt's
        reservation."""
        out = []
        for job_id, (submitted, reserved, preempted, priority, can_resume) in sorted(self._owners.items()):
            recent = 0.0 <= now - submitted <= within_s
            if recent or (resumable and can_resume):
                out.append(RunningJob(job_id, reserved, submitted, priority=priority, stops=preempted))
        return out

    # The GPU fields a ClusterView is built from (not utilization or processes: they change on
    # every heartbeat and the scheduler never reads them).
    _GPU_FIELDS = ("index", "type", "memory_total", "memory_free", "owner", "healthy", "uuid")

    def forget_nodes(self, nodes: Iterable[str]) -> None:
        """Re-read these nodes' GPUs on the next ``cluster()`` whatever their ``rev`` says (the
        loop calls it when a reservation on them lost a race: the view may be stale there)."""
        for node in nodes:
            self._gpu_rows.pop(node, None)

    def cluster(self) -> ClusterView:
        """The cluster as HAS sees it, built from the previous tick's view.

        Reads: every node's head (name, GPU count, draining, liveness, ``rev``) in one
        read-only script, then the GPUs of only the nodes whose ``rev`` moved since the last
        read (every script that changes what the view is built from bumps it; keys.py), in
        another — O(nodes + changed GPUs) per tick, not O(GPUs). Every ``full_read_s`` all
        GPUs are read again. Building: a node whose GPU fields, liveness, draining flag and
        jobs' expected ends are as they were keeps its ``NodeView``, and
        ``ClusterView.updated`` re-indexes only the others."""
        # Two read-only scripts, one round trip each: one command per GPU through a pipeline
        # cost ~30 µs a GPU in redis-py, 10,000 GPUs a tick. (The first of them usually came
        # with the tick's queue read.)
        names, raw_heads = self._recent_heads()
        heads = [((name, count, draining), rev, bool(alive)) for name, count, draining, rev, alive, _ in raw_heads]
        self._addrs = {n: head[5] or "127.0.0.1" for n, head in zip(names, raw_heads, strict=True)}
        now = time.monotonic()
        full = now - self._last_full_read >= self.full_read_s
        if full:
            self._last_full_read = now
        known = self._gpu_rows
        # A node is re-read when its rev or GPU count moved, or it has no rev (not written by
        # the scripts: nothing to compare).
        stale_set: set[str] = set()
        gpu_keys = []
        for n, ((_, count, _), rev, _) in zip(names, heads, strict=True):
            hit = known.get(n)
            if full or rev is None or hit is None or hit[0] != rev or hit[1] != count:
                stale_set.add(n)
                gpu_keys.extend(self.k.gpu(n, g) for g in range(gpu_count(count)))
        rows = iter(self._read_hashes(keys=gpu_keys, args=self._GPU_FIELDS) if gpu_keys else [])
        fresh_rows: dict[str, tuple[str, str, list[list[str | None]], frozenset[str]]] = {}
        per_node = []
        owners: set[str] = set()
        owned, fresh_owned = self._owned, {}
        for member, ((name, count, draining), rev, alive) in zip(names, heads, strict=True):
            if member in stale_set:
                gpus = [row for row in (next(rows) for _ in range(gpu_count(count))) if row[0]]
                jobs = frozenset(row[4] for row in gpus if row[4])
                held: dict[str, int] = {}
                for row in gpus:
                    if row[4]:
                        held[row[4]] = held.get(row[4], 0) + 1
                fresh_owned[member] = held
            else:  # (unchanged rows: their owners as well, without a walk over the GPUs)
                _, _, gpus, jobs = known[member]
                fresh_owned[member] = owned.get(member, {})
            fresh_rows[member] = (rev, count, gpus, jobs)
            if name is None and not gpus:
                continue  # registered name without a node hash (being removed): nothing to place on
            owners |= jobs
            per_node.append((name or member, alive, draining or "", gpus, jobs))
        self._gpu_rows = fresh_rows
        self._owned = fresh_owned
        ends = self._read_owners(owners)
        moved = {j for j in ends.keys() | self._ends.keys() if ends.get(j) != self._ends.get(j)}
        self._ends = ends
        cache = self._nodes
        fresh: dict[str, tuple[tuple[bool, str, list[list[str | None]]], frozenset[str], NodeView]] = {}
        views = []
        for name, alive, draining, gpus, jobs in per_node:
            key = (alive, draining, gpus)
            hit = cache.get(name)
            if hit is not None and hit[0] == key and hit[1].isdisjoint(moved):
                fresh[name] = hit
                views.append(hit[2])
                continue
            # (what an agent wrote that the scheduler does not know: that GPU unhealthy, not the read failed)
            slots = tuple(
                GpuSlot(node=name, index=read[0], gpu_type=read[1], memory_total=read[2], memory_free=read[3],
                        owner=owner or None, healthy=read[4], free_at=ends.get(owner or ""))
                for index, gpu_type, total, free, owner, healthy, _uuid in gpus
                if (read := scheduled_gpu(index, gpu_type, total, free, healthy)) is not None
            )
            view = NodeView(name=name, gpus=slots, alive=alive, draining=draining == "1")
            fresh[name] = (key, jobs, view)
            views.append(view)
        self._nodes = fresh
        self._view = ClusterView(views) if self._view is None else self._view.updated(views)
        return self._view

    def node_addr(self, node: str) -> str:
        """The node's address as the last ``cluster()`` read it (asked of Redis for a node it did not see)."""
        known = self._addrs.get(node)
        return known if known is not None else (self.r.hget(self.k.node(node), "addr") or "127.0.0.1")

    def gpu_uuids(self, node: str, indices: Iterable[int]) -> list[str]:
        """The UUID of each of ``node``'s GPUs ``indices`` ("" when unknown): what a launch names
        so the agent can tell the GPU the scheduler reserved from one that took its index. From
        the last ``cluster()`` read (a GPU's uuid does not change while its node's rev holds)."""
        wanted = list(indices)
        rows = self._gpu_rows.get(node)
        by_index = {str(row[0]): row[6] for row in rows[2]} if rows is not None else {}
        if all(str(i) in by_index for i in wanted):
            return [by_index[str(i)] or "" for i in wanted]
        return [self.r.hget(self.k.gpu(node, i), "uuid") or "" for i in wanted]

    def port_tables(self, nodes: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each node's rendezvous ports in use: node -> {port: job id} (one pipelined round trip; it
        also refreshes what ``pick_port`` knows of those nodes)."""
        names = list(nodes)
        pipe = self.r.pipeline(transaction=False)
        for node in names:
            pipe.hgetall(self.k.ports(node))
        tables = dict(zip(names, pipe.execute(), strict=True)) if names else {}
        for node, table in tables.items():
            self._ports_used[node] = {int(p) for p in table if str(p).isdigit()}
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
