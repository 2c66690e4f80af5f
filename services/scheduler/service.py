"""The Scheduler gRPC service: the public API over the Redis state.

SubmitJob validates the spec, asks the Predictor (over gRPC) for ranked plans
on the GPU types the live cluster has, and only then writes the job in one
atomic script — bad input leaves nothing behind. The same predictor call
re-plans a job that lost a node, for the cluster that is left. StreamLogs
serves the output the agents ship into Redis (a stream per node of the job, merged in time
order: ``frenzy.state.job_logs``), so `frenzy logs` works from any machine that reaches the
scheduler. Status codes follow gRPC conventions: INVALID_ARGUMENT names the bad field,
FAILED_PRECONDITION when the cluster can never hold the job, NOT_FOUND for an
unknown job id, RESOURCE_EXHAUSTED naming the limit when a user is over a quota
(queued jobs, GPUs held), the submission rate or the open-stream cap.

Answers never carry internals (issue 14 item 10): a job id is checked against
``JOB_ID`` before it reaches a Redis key, a JobSpec against JobEntry's bounds
(``frenzy.rpc.spec_limits``), a predictor failure other than bad input is
"predictor unavailable" with the detail only in the log, and whatever escapes a
servicer is mapped to a clean status by ``frenzy.rpc.errors.CleanErrors``.
Listings are summaries capped in count and bytes (``frenzy.rpc.listing``).

A submission costs a handful of Redis commands, not a read of every node and GPU (issue 15):
the pools it plans for come from a cluster view at most ``pools_max_age_s`` old
(``ClusterPools``: the loop's last tick, else one incremental ``StateStore.cluster()`` read
shared by the submissions of that moment), and the predictor's answers are kept per (model,
recipe, limits, pools) (``Predictions``). A refusal is only given after the pools were read
afresh, so a node that has just joined is never missed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import redis

from frenzy.auth.roles import priority_refusal, sees_all_jobs
from frenzy.auth.tokens import TokenStore
from frenzy.rpc.auth import TokenAuth, current_identity, with_token
from frenzy.rpc.convert import recipe_from_proto
from frenzy.rpc.jobspec import MAX_PRIORITY, MIN_PRIORITY
from frenzy.rpc.limits import DEFAULT_WORKERS, RateLimit, StreamCaps, SubmitRate
from frenzy.rpc.listing import (
    MAX_GPU_LINKS,
    MAX_GPU_PROCESSES,
    MAX_LIST_JOBS,
    MAX_SUMMARY_TEXT,
    clip,
    fit,
    job_summary,
)
from frenzy.rpc.server import start_server
from frenzy.rpc.server import stop_server as stop_grpc
from frenzy.rpc.spec_limits import check_spec
from frenzy.rpc.tls import ClientTls, ServerTls, open_channel
from frenzy.scheduler.leader import DEFAULT_TTL_S, LeaderLease
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.scheduler.metrics import MetricsServer, PredictionCacheCollector, serve_metrics
from frenzy.scheduler.no_plan import goal_unmet_reason, no_plan_reason
from frenzy.scheduler.submit_pools import (
    DEFAULT_POOLS_MAX_AGE_S,
    DEFAULT_POOLS_MAX_STALE_S,
    ClusterPools,
    Predictions,
)
from frenzy.scheduler.usage_api import UsageCollector, UsageDesk, UsageRefused
from frenzy.state import connect, scripts
from frenzy.state.code_store import CodeError, CodeStore, max_code_bytes_from_env
from frenzy.state.connect import scheduler_timeouts
from frenzy.state.job_logs import LogReader
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import SAFE_NAME_RE, LogChunk
from frenzy.state.ports import DEFAULT_MASTER_PORTS
from frenzy.state.records import JobRecord, gpu_type_problem
from frenzy.state.store import StateStore, plans_to_json
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from has import QueuePolicy

log = logging.getLogger(__name__)

TOKEN_PRUNE_EVERY_S = 3600.0  # every scheduler deletes long-expired tokens this often (keep_agent_scripts)

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
GiB = 1024**3
JOB_ID = SAFE_NAME_RE  # one rule for job ids: frenzy.state.messages
DEFAULT_MAX_QUEUED_PER_USER = 1000
SERVE_MODES = ("all", "api", "loop")  # what one scheduler process does (SchedulerServer's ``serve``)
DEFAULT_MAX_GPUS_PER_USER = 0  # 0: no limit; the right number depends on the cluster, as in Slurm
# StreamLogs' initial metadata: the byte cap of a node's log stream of a job and of a node's log file (0: none)
LOG_CAP_HEADER = "frenzy-log-cap-bytes"
LOG_FILE_CAP_HEADER = "frenzy-log-file-cap-bytes"
LOG_NODES_REFRESH_S = 2.0  # a follower re-reads the job's nodes this often while output flows
LOG_FINAL_READS = 5  # reads after the job ended (each up to 10,000 entries): a node still writing cannot hold it
DEFAULT_MAX_USER_PRIORITY = 0  # users may lower their jobs' priority; raising it is an admin's call


@dataclass(frozen=True)
class UserQuotas:
    """What one user may have at once: PENDING jobs, GPUs held (0: no limit), the submission rate,
    and the highest priority a non-admin may give a job (``max_priority``)."""

    max_queued: int = DEFAULT_MAX_QUEUED_PER_USER
    max_gpus: int = DEFAULT_MAX_GPUS_PER_USER
    rate: RateLimit = field(default_factory=RateLimit)
    max_priority: int = DEFAULT_MAX_USER_PRIORITY

    def __post_init__(self) -> None:
        if self.max_queued < 1 or self.max_gpus < 0:
            raise ValueError(f"quotas: max queued jobs must be >= 1 and max GPUs >= 0 "
                             f"(got {self.max_queued}, {self.max_gpus})")
        if not MIN_PRIORITY <= self.max_priority <= MAX_PRIORITY:
            raise ValueError(f"quotas: max user priority must be {MIN_PRIORITY}..{MAX_PRIORITY} "
                             f"(got {self.max_priority})")


def check_job_id(job_id: str) -> None:
    """ValueError('job_id: why') unless ``job_id`` could be a job's id."""
    if not job_id:
        raise ValueError("job_id: empty")
    if JOB_ID.fullmatch(job_id) is None:
        raise ValueError("job_id: not a job id (letters, digits, '.', '_' and '-', at most 128, starting with a "
                         "letter or digit). To fix: see `frenzy jobs`")


def validate_spec(spec: types_pb2.JobSpec) -> None:
    """Checks the scheduler owns (the predictor checks the model and recipe). Raises ValueError('field: why')."""
    if not spec.HasField("model"):
        raise ValueError("spec.model: missing. To fix: name a catalog model (see `frenzy models`) or give a config.json")
    if not spec.HasField("recipe"):
        raise ValueError("spec.recipe: missing (seq_len and global_batch at least)")
    if not spec.command or not spec.command[0].strip():
        raise ValueError("spec.command: empty. To fix: give the program to run, e.g. ['torchrun', 'train.py']")
    for key in spec.env:
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"spec.env: invalid variable name {key!r}")
    check_spec(spec)


def parse_port_range(text: str) -> tuple[int, int]:
    """``"29500-32767"`` -> (29500, 32767); ValueError naming the problem."""
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), int(last if sep else first)
    except ValueError:
        raise ValueError(f"master port range {text!r}: expected FIRST-LAST, e.g. 29500-32767") from None
    if not (1024 <= lo <= hi <= 65535):
        raise ValueError(f"master port range {text!r}: need 1024 <= FIRST <= LAST <= 65535")
    return lo, hi


class PlansJson:
    """Plans rendered as the job hash stores them, kept by their content: a sweep of jobs with the
    same prediction renders its 50-odd plans once, not per submission (``MessageToDict`` of every
    plan was most of a submission's CPU). The last ``size`` contents are kept."""

    def __init__(self, size: int = 256) -> None:
        self._render = functools.lru_cache(maxsize=size)(_plans_json_of)

    def render(self, plans: list[types_pb2.Plan]) -> str:
        return self._render(predictor_pb2.PredictResponse(plans=plans).SerializeToString(deterministic=True))


def _plans_json_of(serialized: bytes) -> str:
    return plans_to_json(list(predictor_pb2.PredictResponse.FromString(serialized).plans))


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, client: redis.Redis, keys: Keys, predictor: predictor_pb2_grpc.PredictorStub,
                 loop: SchedulerLoop | None = None, quotas: UserQuotas | None = None,
                 pools_max_age_s: float = DEFAULT_POOLS_MAX_AGE_S) -> None:
        self.store = StateStore(client, keys)
        self.quotas = quotas or UserQuotas()
        self.submit_rate = SubmitRate(self.quotas.rate)
        self.loop = loop or SchedulerLoop(client, keys)
        self.predictor = predictor
        seen = getattr(self.loop, "seen", None)
        self.pools = ClusterPools(self.store, lambda: seen.view if seen is not None else None, pools_max_age_s,
                                  max_stale_s=max(DEFAULT_POOLS_MAX_STALE_S, pools_max_age_s))
        self.predictions = Predictions()
        self.plans_json = PlansJson()
        self.code = CodeStore(client, keys, max_bytes=max_code_bytes_from_env())
        self.usage = UsageDesk(client, keys)  # GetUsage and the budget check (issue 35)
        if self.loop.replan is None:
            self.loop.replan = self.replan

    # ---- helpers -------------------------------------------------------------------------------

    def predict(self, spec: types_pb2.JobSpec, timeout_s: float = 30.0, fresh: bool = False,
                ) -> tuple[predictor_pb2.PredictResponse, list[types_pb2.GpuPool]]:
        """Ranked plans for ``spec`` on the GPU types live, schedulable nodes have now. Raises grpc.RpcError.

        ``fresh``: pools from a cluster read made now, not a recent view. No plan on a recent
        view is checked against a fresh one before it is believed (a node may just have joined)."""
        pools = self._pools(fresh)
        pred = self._ask(spec, pools, timeout_s)
        if not pred.plans and not fresh:
            latest = self._pools(fresh=True)
            if latest != pools:
                pools, pred = latest, self._ask(spec, latest, timeout_s)
        return pred, pools

    def _ask(self, spec: types_pb2.JobSpec, pools: list[types_pb2.GpuPool],
             timeout_s: float) -> predictor_pb2.PredictResponse:
        # mixed: plans over two GPU types too when the cluster has several (HAS places them unless
        # the policy is frenzy-single-type; docs/mixed-plans.md).
        # goal: the job's objective orders its plans and its deadline and budget drop those that
        # miss them (issue 35; docs/cost.md), as `frenzy predict` shows them.
        request = predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits, pools=pools,
                                               mixed=True, goal=spec.goal)
        kept = self.predictions.get(request)
        if kept is not None:
            return kept
        pred = self.predictor.Predict(request, timeout=timeout_s)
        self.predictions.put(request, pred)
        return pred

    def replan(self, job: JobRecord) -> list[types_pb2.Plan] | None:
        """New plans for a requeued job on the cluster that is left; None keeps its old plans."""
        # Short timeout: this runs on the scheduling loop; without an answer the old plans stay.
        # Fresh pools: the node just declared dead must not be planned on.
        pred, pools = self.predict(job.spec, timeout_s=5.0, fresh=True)
        if not pred.plans:
            log.warning("no plan for %s fits the remaining cluster (%s); keeping its plans until it grows", job.id,
                        ", ".join(f"{p.total_gpus} x {p.gpu_type}" for p in pools) or "no live nodes",
                        extra={"job_id": job.id})
            return None
        return list(pred.plans)

    def _pools(self, fresh: bool = False) -> list[types_pb2.GpuPool]:
        """One pool per GPU type among live, schedulable nodes (``ClusterPools``)."""
        return self.pools.current(fresh)

    def _job(self, job_id: str, context: grpc.ServicerContext):  # -> JobRecord
        try:
            check_job_id(job_id)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        job = self.store.get(job_id)
        who = current_identity()
        # One answer for a job that is absent and one that is another user's (issue 34): a
        # different one would tell whether another user's job id exists.
        if job is None or (who is not None and not sees_all_jobs(who.role) and job.user != who.user):
            context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {job_id!r} of yours. To fix: see `frenzy jobs`")
        return job

    @staticmethod
    def _user() -> str:
        who = current_identity()
        return who.user if who is not None else ""

    @staticmethod
    def _visible_user() -> str | None:
        """Whose jobs a listing shows: the caller's, or everyone's (None) for admins."""
        who = current_identity()
        return None if who is None or sees_all_jobs(who.role) else who.user

    def _within_quota(self, plans: list[types_pb2.Plan]) -> list[types_pb2.Plan]:
        """The plans a job of one user may run with: none larger than the per-user GPU quota, so a
        job never takes more than its user may hold (as ``limits.max_gpus`` does for one job)."""
        if not self.quotas.max_gpus:
            return plans
        return [p for p in plans if p.num_gpus <= self.quotas.max_gpus]

    def _over_quota(self, user: str, plans: list[types_pb2.Plan]) -> str | None:
        """Why no job of ``user`` with these plans could ever run under the GPU quota, or None.

        At submission only a job whose smallest plan is over the quota is refused (it could never
        run). What the user holds is counted at placement (issue 34 item 4): the loop's HAS pass
        (``QueuePolicy.max_gpus_per_user``) places no job that would take its user over the
        quota; such a job is accepted and waits, its pending reason naming the quota and the
        GPUs held, as Slurm's QOS limits keep a job pending. The queued-jobs cap is checked by
        the write itself (``submit_job.lua``), exactly, however many processes admit at once."""
        if self.quotas.max_gpus:
            smallest = min(p.num_gpus for p in plans)
            if not self._within_quota(plans):
                return (f"quota: the smallest plan for this job needs {smallest} GPUs; the limit is "
                        f"{self.quotas.max_gpus} GPUs per user (scheduler option --max-gpus-per-user). "
                        "To fix: set limits.max_gpus or a smaller recipe")
        return None

    def _queued_refusal(self, user: str, queued: int) -> str:
        return (f"quota: user {user!r} has {queued} queued jobs; the limit is {self.quotas.max_queued} per user "
                "(scheduler option --max-queued-per-user). To fix: wait for some to start, or cancel some")

    # ---- RPCs ----------------------------------------------------------------------------------

    def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest, context: grpc.ServicerContext):
        spec = request.spec
        user = self._user()
        too_fast = self.submit_rate.take(user)
        if too_fast is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, too_fast)
        try:
            validate_spec(spec)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        who = current_identity()  # (None: tokens are off, everyone acts as an operator)
        refused = None if who is None else priority_refusal(who.role, spec.priority, self.quotas.max_priority)
        if refused is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        if spec.idempotency_key:
            job = self.store.job_by_idempotency_key(spec.idempotency_key, user)
            if job is not None:
                return scheduler_pb2.SubmitJobResponse(job=job.to_proto(), duplicate=True)
        # The code must be here before the job is: an agent could not start it otherwise. Touching
        # it renews its expiry, so it outlives the job's wait in the queue by FRENZY_CODE_TTL_S.
        if spec.code_sha256 and self.code.touch(spec.code_sha256) is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"spec.code_sha256: no code {spec.code_sha256[:12]} is stored (never uploaded, or it "
                          "expired). To fix: upload it first (Scheduler.UploadCode); `frenzy submit` and the SDK "
                          "do this for you")
        try:
            pred, pools = self.predict(spec)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                context.abort(code, f"spec.{clip(exc.details() or '', 2000)}")
            # The predictor's own words stay in the log: they may be an exception's text.
            log.warning("predictor failed for a submission by %r: %s %s", user, code, exc.details())
            context.abort(grpc.StatusCode.UNAVAILABLE, "predictor unavailable, try again")
        if not pred.plans and pred.dropped:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, goal_unmet_reason(list(pred.dropped)))
        if not pred.plans:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, no_plan_reason(
                pred.model_name, recipe_from_proto(spec.recipe, spec.limits).precision,
                [(p.gpu_type, p.total_gpus) for p in pools], list(spec.limits.allowed_gpu_types), list(pred.rejected)))
        # Rendered before the admission lock: one user's submissions wait for each other only for
        # the quota check and the one-round-trip write.
        plans = self._within_quota(list(pred.plans))
        prepared = self.store.prepare_submission(spec, plans, pred.model_name, pred.parameter_count,
                                                 max_attempts=self.loop.max_attempts, user=user,
                                                 plans_json=self.plans_json.render(plans))
        over = self._over_quota(user, list(pred.plans))
        if over is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, over)
        over = self.usage.refusal(user, plans)
        if over is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, over)
        made = self.store.submit_prepared(prepared, max_queued=self.quotas.max_queued)
        if made.over_quota is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._queued_refusal(user, made.over_quota))
        # submit_job.lua woke the leader wherever it runs; this process's own loop, if it leads,
        # need not wait for that token to come round.
        self.loop.wake.set()
        job = made.record or self.store.get(made.job_id)
        assert job is not None
        return scheduler_pb2.SubmitJobResponse(job=job.to_proto(), duplicate=made.duplicate)

    def GetJob(self, request: scheduler_pb2.GetJobRequest, context: grpc.ServicerContext) -> types_pb2.Job:
        return self._job(request.job_id, context).to_proto()

    def ListJobs(self, request: scheduler_pb2.ListJobsRequest, context: grpc.ServicerContext):
        if request.limit < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: must be >= 0 (got {request.limit})")
        try:
            states = {JobState.from_proto(s) for s in request.states} or None
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"states: {exc}")
        limit = min(request.limit or 100, MAX_LIST_JOBS)
        for name in ("user", "name"):
            if len(getattr(request, name)) > MAX_SUMMARY_TEXT:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: at most {MAX_SUMMARY_TEXT} characters")
        if not request.since >= 0 or request.since == float("inf"):  # (also NaN)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"since: must be a unix time >= 0 (got {request.since})")
        owner = self._visible_user()
        if request.user:
            # Roles (frenzy.auth.roles): a user sees only their own jobs. Naming another user is
            # refused rather than answered with the caller's own jobs, which would read as "that
            # user has none".
            if owner is not None and request.user != owner:
                context.abort(grpc.StatusCode.PERMISSION_DENIED,
                              f"user: only admins may list another user's jobs; this token is for {owner!r}. "
                              "To fix: leave the user out (your own jobs) or use an admin token")
            owner = request.user
        jobs = self.store.list(states, limit, user=owner, name=request.name, since=request.since)
        return scheduler_pb2.ListJobsResponse(jobs=fit(job_summary(j.to_proto()) for j in jobs),
                                              all_users=owner is None)

    def GetUsage(self, request: scheduler_pb2.GetUsageRequest, context: grpc.ServicerContext):
        try:
            return self.usage.answer(request, self._visible_user())
        except UsageRefused as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

    def CancelJob(self, request: scheduler_pb2.CancelJobRequest, context: grpc.ServicerContext):
        job = self._job(request.job_id, context)
        moved = self.loop.cancel(job, request.reason or "requested by user")
        if not moved.done:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job_id: job {job.id} is already {moved.state or 'gone'}")
        self.loop.nudge()
        updated = self.store.get(job.id)
        assert updated is not None
        return scheduler_pb2.CancelJobResponse(job=updated.to_proto())

    def WatchJob(self, request: scheduler_pb2.WatchJobRequest, context: grpc.ServicerContext) -> Iterator:
        job = self._job(request.job_id, context)
        sent = 0
        while context.is_active():
            if len(job.history) > sent:
                proto = job.to_proto()
                for t in proto.history[sent:]:
                    yield scheduler_pb2.JobUpdate(job=proto, transition=t)
                sent = len(job.history)
            if job.state.terminal:
                return
            time.sleep(0.1)
            job = self.store.get(request.job_id) or job

    def ListNodes(self, request: scheduler_pb2.ListNodesRequest, context: grpc.ServicerContext):
        out = []
        for rec in self.store.load_nodes():
            if not rec.alive and not request.include_dead:
                continue
            gpus = sorted((g for g in rec.gpus if g.index >= 0), key=lambda g: g.index)
            # A GPU type the catalog does not know is the node's problem, not the cluster's (issue 34).
            refused = {g.index: gpu_type_problem(g.gpu_type) for g in gpus}
            node_reason = rec.health_reason or "; ".join(f"GPU {i}: {why}" for i, why in refused.items() if why)
            node = types_pb2.Node(name=clip(rec.name), addr=clip(rec.addr), alive=rec.alive, draining=rec.draining,
                                  heartbeat_at=_seconds(rec.heartbeat_at), declared_dead_at=_seconds(rec.dead_at),
                                  health_reason=clip(node_reason, 1024))
            for g in gpus:
                gpu = node.gpus.add(
                    index=g.index, uuid=clip(g.uuid), gpu_type=clip(g.gpu_type), nvml_name=clip(g.nvml_name),
                    memory_total=g.memory_total, memory_free=g.memory_free, healthy=g.healthy and not refused[g.index],
                    owner=clip(g.owner), pci_bus_id=clip(g.pci_bus_id), utilization_pct=g.utilization,
                    health_reason=clip(refused[g.index] or g.health_reason, 1024), type_from_memory=g.type_from_memory)
                for pid, used in _json(g.processes, [])[:MAX_GPU_PROCESSES]:
                    gpu.processes.add(pid=int(pid), used_memory=int(used))
                links = list(_json(g.links, {}).items())[:MAX_GPU_LINKS]
                gpu.links.update({int(k): clip(str(v)) for k, v in links})
            out.append(node)
        return scheduler_pb2.ListNodesResponse(nodes=fit(out))

    def StreamLogs(self, request: scheduler_pb2.StreamLogsRequest, context: grpc.ServicerContext) -> Iterator:
        """The job's output: the log streams of the nodes it was placed on, in any attempt,
        merged by entry id (time order; ``frenzy.state.job_logs``). Following, the streams of
        nodes a requeue places it on are picked up as it goes."""
        job = self._job(request.job_id, context)
        if request.tail_lines < 0 or request.attempt < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "tail_lines: must be >= 0" if request.tail_lines < 0 else "attempt: must be >= 0")
        reader = LogReader(self.store.r, self.store.k, job, request.node, request.attempt)
        # The caps the agents ship under (append_log.lua keeps them beside the offsets; per node):
        # readers say what a trimmed start or a gap means (issue 34 item 6).
        cap, file_cap = reader.caps()
        context.send_initial_metadata(((LOG_CAP_HEADER, str(cap)), (LOG_FILE_CAP_HEADER, str(file_cap))))
        if request.tail_lines:
            for chunk in reader.tail(request.tail_lines):
                yield _chunk_proto(chunk)
        refreshed = time.monotonic()
        while context.is_active():
            read, chunks = reader.read(block_ms=1000 if request.follow else None)
            for chunk in chunks:
                yield _chunk_proto(chunk)
            if request.follow and time.monotonic() - refreshed >= LOG_NODES_REFRESH_S:
                refreshed = time.monotonic()  # (a busy job: nodes a requeue added, without waiting for a lull)
                reader.refresh(self.store.get(job.id) or job)
            if read:
                continue
            if not request.follow:
                return
            current = self.store.get(job.id)
            if current is not None:
                reader.refresh(current)
            if current is None or current.state.terminal:
                # Agents ship a node's last output before reporting its exit, and the job
                # ends with the last exit: a few more reads and the streams are complete.
                for _ in range(LOG_FINAL_READS):
                    read, chunks = reader.read(count=10_000)
                    for chunk in chunks:
                        yield _chunk_proto(chunk)
                    if not read:
                        break
                return

    def HasCode(self, request: scheduler_pb2.HasCodeRequest, context: grpc.ServicerContext):
        try:
            size = self.code.touch(request.sha256)
        except CodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return scheduler_pb2.HasCodeResponse(present=size is not None, size=size or 0, max_bytes=self.code.max_bytes)

    def UploadCode(self, request_iterator: Iterator[scheduler_pb2.CodeChunk], context: grpc.ServicerContext):
        """Chunks appended as they come (bounded by the claimed size and the limit, hashed on the
        way), stored under their sha256 only when all of it checks (``CodeStore``)."""
        upload = None
        try:
            for chunk in request_iterator:
                if upload is None:
                    upload = self.code.begin(chunk.sha256, chunk.size)
                elif (chunk.sha256 and chunk.sha256 != upload.sha) or (chunk.size and chunk.size != upload.size):
                    raise CodeError("sha256: later chunks must not change the sha256 or size the first one claimed")
                upload.add(chunk.data)
            if upload is None:
                raise CodeError("data: no chunk was sent")
            stored = upload.finish()
        except CodeError as exc:
            if upload is not None:
                upload.abandon()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BaseException:
            if upload is not None:
                upload.abandon()  # the client went away mid-upload, or Redis did: nothing half-stored
            raise
        log.info("code %s stored for %r: %d bytes%s", stored.sha256[:12], self._user(), stored.size,
                 " (already held)" if stored.existed else "")
        return scheduler_pb2.CodeRef(sha256=stored.sha256, size=stored.size, existed=stored.existed)


def _seconds(text: str) -> float:
    """A stored time (unix seconds) as written; 0 when absent or unreadable."""
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def _json(text: str | None, default: object) -> Any:
    try:
        value = json.loads(text) if text else default
    except ValueError:
        return default
    return value if isinstance(value, type(default)) else default


def _chunk_proto(chunk: LogChunk) -> scheduler_pb2.LogChunk:
    return scheduler_pb2.LogChunk(node=chunk.node, attempt=chunk.attempt, offset=chunk.offset, text=chunk.text,
                                  at=chunk.at)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def keep_agent_scripts(client: redis.Redis, stop: threading.Event, every_s: float = scripts.LOAD_EVERY_S,
                       tokens: TokenStore | None = None, prune_every_s: float = TOKEN_PRUNE_EVERY_S) -> None:
    """Load the scripts agents call (``scripts.AGENT_SCRIPTS``) now and again every ``every_s``
    when Redis lacks them (a restarted Redis keeps no script): an agent may not load them itself,
    and waits with a log line until they are there. One SCRIPT EXISTS a round. With ``tokens``,
    also delete long-expired tokens every ``prune_every_s`` (``TokenStore.prune``)."""
    failing = False
    pruned_at = -prune_every_s
    while True:
        try:
            loaded = scripts.ensure_loaded(client)
            if loaded:
                log.info("loaded the agents' scripts Redis lacked: %s", ", ".join(loaded))
            if tokens is not None and time.monotonic() - pruned_at >= prune_every_s:
                pruned_at = time.monotonic()
                if removed := tokens.prune():
                    log.info("removed %d token(s) expired over a week ago", removed)
            failing = False
        except redis.RedisError as exc:
            if not failing:
                log.warning("could not load the agents' scripts or sweep tokens (%s); retrying every %g s", exc, every_s)
            failing = True
        if stop.wait(every_s):
            return


class SchedulerServer:
    """Scheduler process: gRPC API + placement loop + event consumer + node reaper.

    ``metrics_address`` (host:port, port 0 for a free one): serve Prometheus metrics there
    (``frenzy.scheduler.metrics``); None: no metrics endpoint.

    Several may run on one Redis: each serves the API, the leader lease's holder runs the loop
    (``leader_ttl_s``, default ``FRENZY_LEADER_TTL_S`` or 3: how long a dead leader's lease
    outlives it, so how soon a standby takes over).

    ``serve``: "all" (the API and a loop that campaigns for the lease), "api" (the API only: it
    never leads; a submission wakes the leader through Redis) or "loop" (the loop only; its gRPC
    port answers health checks and nothing else). Split, the API's submissions and the loop's
    passes run in separate interpreters and never wait for each other's GIL.

    Node-loss settings default to ``FRENZY_NODE_DEAD_AFTER_S`` (30), ``FRENZY_MAX_ATTEMPTS`` (3),
    ``FRENZY_ORPHAN_RELEASE_S`` (120) and ``FRENZY_MASTER_PORTS`` (29500-32767) when not given.
    """

    def __init__(self, redis_url: str, predictor_addr: str, address: str = "127.0.0.1:50051",
                 prefix: str | None = None, tick_s: float = 0.25, dead_after_s: float | None = None,
                 max_attempts: int | None = None, orphan_release_s: float | None = None,
                 master_ports: tuple[int, int] | None = None, policy: QueuePolicy | None = None,
                 quotas: UserQuotas | None = None, stream_caps: StreamCaps | None = None,
                 max_workers: int = DEFAULT_WORKERS, tls: ServerTls | None = None,
                 predictor_tls: ClientTls | None = None, metrics_address: str | None = None,
                 leader_ttl_s: float | None = None, serve: str = "all", predictor_token: str | None = None) -> None:
        if serve not in SERVE_MODES:
            raise ValueError(f"serve: one of {', '.join(SERVE_MODES)} (got {serve!r})")
        self.serve = serve
        lease_ttl_s = leader_ttl_s if leader_ttl_s is not None else env_float("FRENZY_LEADER_TTL_S", DEFAULT_TTL_S)
        # Behind a silent partition a call fails within the leader lease instead of hanging (connect.py).
        self.client = connect.client(redis_url, scheduler_timeouts(lease_ttl_s), decode_responses=True)
        self.keys = Keys(prefix)
        # The predictor answers only its token's holder (frenzy.predictor.guard; issue 34 item 8).
        self.channel = with_token(open_channel(predictor_addr, predictor_tls), predictor_token)
        ports = os.environ.get("FRENZY_MASTER_PORTS")
        if quotas is not None and quotas.max_gpus:  # enforced at placement by HAS (issue 34 item 4)
            policy = dataclasses.replace(policy or QueuePolicy.frenzy(), max_gpus_per_user=quotas.max_gpus)
        self.loop = SchedulerLoop(
            self.client, self.keys, policy,
            dead_after_s=dead_after_s if dead_after_s is not None else env_float("FRENZY_NODE_DEAD_AFTER_S", 30.0),
            max_attempts=max_attempts if max_attempts is not None else int(env_float("FRENZY_MAX_ATTEMPTS", 3)),
            orphan_release_s=(orphan_release_s if orphan_release_s is not None
                              else env_float("FRENZY_ORPHAN_RELEASE_S", 120.0)),
            master_ports=master_ports or (parse_port_range(ports) if ports else DEFAULT_MASTER_PORTS))
        servicer = SchedulerServicer(self.client, self.keys, predictor_pb2_grpc.PredictorStub(self.channel), self.loop,
                                     quotas)
        # Every call but health and reflection needs a token (issue 14): there is no switch to
        # turn this off, so no deployment can be left open by a forgotten flag.
        self.tokens = TokenStore(self.client, self.keys)
        api = [lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s)] if serve != "loop" else []
        self.server, self.port, self.health = start_server(
            api, [SERVICE_NAME], address,
            interceptors=[TokenAuth(self.tokens)], max_workers=max_workers, stream_caps=stream_caps, tls=tls,
            token_alive=self.tokens.alive)
        self.loop.metrics.registry.register(PredictionCacheCollector(servicer.predictions))
        self.loop.metrics.registry.register(UsageCollector(servicer.usage.ledger))
        self.metrics: MetricsServer | None = None
        if metrics_address:
            try:
                self.metrics = serve_metrics(self.loop.metrics.registry, metrics_address, "scheduler")
            except BaseException:
                stop_grpc(self.server, self.health)
                raise
        self.stop_event = threading.Event()
        # Only the lease's holder places jobs; another scheduler on this Redis stands by (leader.py).
        self.lease = LeaderLease(self.client, self.keys, ttl_s=lease_ttl_s)
        self.thread = threading.Thread(target=self.loop.run, args=(self.stop_event, tick_s, self.lease),
                                       name="scheduler-loop", daemon=True)
        # Agents may call scripts but not load them (issue 34): every scheduler keeps them loaded.
        self.scripts_thread = threading.Thread(target=keep_agent_scripts, args=(self.client, self.stop_event),
                                               kwargs={"tokens": self.tokens}, name="agent-scripts", daemon=True)
        self.scripts_thread.start()
        if serve == "api":
            # Never leads: nudges go to whichever process does, as a standby's do.
            self.loop.lease = self.lease
            self.loop.leading.clear()
        else:
            self.thread.start()

    def stop(self) -> None:
        from frenzy.rpc.server import stop_server

        self.stop_event.set()
        self.loop.wake.set()  # (this process's own loop: let it see the stop)
        stop_server(self.server, self.health)
        if self.metrics is not None:
            self.metrics.stop()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self.channel.close()
        self.client.close()
