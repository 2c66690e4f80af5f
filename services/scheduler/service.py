"""The Scheduler gRPC service: the public API over the Redis state.

SubmitJob validates the spec, asks the Predictor (over gRPC) for ranked plans
on the GPU types the live cluster has, and only then writes the job in one
atomic script — bad input leaves nothing behind. Status codes follow gRPC
conventions: INVALID_ARGUMENT names the bad field, FAILED_PRECONDITION when
the cluster can never hold the job, NOT_FOUND for an unknown job id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc
import redis

from frenzy.common.grpc_server import start_server
from frenzy.common.keys import Keys
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.scheduler.states import JobState
from frenzy.scheduler.store import StateStore
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
GiB = 1024**3


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
    if len(spec.idempotency_key) > 200:
        raise ValueError("spec.idempotency_key: longer than 200 characters")


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, client: redis.Redis, keys: Keys, predictor: predictor_pb2_grpc.PredictorStub,
                 loop: SchedulerLoop | None = None) -> None:
        self.store = StateStore(client, keys)
        self.loop = loop or SchedulerLoop(client, keys)
        self.predictor = predictor

    # ---- helpers -------------------------------------------------------------------------------

    def _pools(self) -> list[types_pb2.GpuPool]:
        """One pool per GPU type among live, schedulable nodes."""
        total: dict[str, int] = {}
        per_node: dict[str, int] = {}
        for info, alive, gpus in self.store.load_nodes():
            if not alive or info.get("draining") == "1":
                continue
            counts: dict[str, int] = {}
            for g in gpus:
                if g.get("type"):
                    counts[g["type"]] = counts.get(g["type"], 0) + 1
            for t, c in counts.items():
                total[t] = total.get(t, 0) + c
                per_node[t] = max(per_node.get(t, 0), c)
        return [types_pb2.GpuPool(gpu_type=t, total_gpus=total[t], gpus_per_node=per_node[t]) for t in sorted(total)]

    def _job(self, job_id: str, context: grpc.ServicerContext):  # -> JobRecord
        if not job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id: empty")
        job = self.store.get(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {job_id!r}. To fix: see `frenzy jobs`")
        return job

    # ---- RPCs ----------------------------------------------------------------------------------

    def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest, context: grpc.ServicerContext):
        spec = request.spec
        try:
            validate_spec(spec)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if spec.idempotency_key:
            existing = self.store.r.get(self.store.k.idempotency(spec.idempotency_key))
            if existing and (job := self.store.get(existing)) is not None:
                return scheduler_pb2.SubmitJobResponse(job=job.to_proto(), duplicate=True)
        pools = self._pools()
        try:
            pred = self.predictor.Predict(
                predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits, pools=pools),
                timeout=30,
            )
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                context.abort(code, f"spec.{exc.details()}")
            context.abort(grpc.StatusCode.UNAVAILABLE, f"predictor unavailable: {exc.details()}")
        if not pred.plans:
            have = ", ".join(f"{p.total_gpus} x {p.gpu_type}" for p in pools) or "no live nodes (catalog checked)"
            why = "; ".join(pred.rejected) or "no layout fits"
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"spec: no GPU type in the cluster can hold {pred.model_name} with this recipe "
                          f"(cluster: {have}). {why}. To fix: lower recipe.micro_batch or recipe.seq_len, "
                          "allow recompute, or add larger GPUs")
        job_id, dup = self.store.submit(spec, list(pred.plans), pred.model_name, pred.parameter_count)
        self.loop.wake.set()
        job = self.store.get(job_id)
        assert job is not None
        return scheduler_pb2.SubmitJobResponse(job=job.to_proto(), duplicate=dup)

    def GetJob(self, request: scheduler_pb2.GetJobRequest, context: grpc.ServicerContext) -> types_pb2.Job:
        return self._job(request.job_id, context).to_proto()

    def ListJobs(self, request: scheduler_pb2.ListJobsRequest, context: grpc.ServicerContext):
        if request.limit < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: must be >= 0 (got {request.limit})")
        try:
            states = {JobState.from_proto(s) for s in request.states} or None
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"states: {exc}")
        jobs = self.store.list(states, request.limit or 100)
        return scheduler_pb2.ListJobsResponse(jobs=[j.to_proto() for j in jobs])

    def CancelJob(self, request: scheduler_pb2.CancelJobRequest, context: grpc.ServicerContext):
        job = self._job(request.job_id, context)
        ok, state = self.loop.cancel(job, request.reason or "requested by user")
        if not ok:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job_id: job {job.id} is already {state}")
        self.loop.wake.set()
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
        for info, alive, gpus in self.store.load_nodes():
            if not alive and not request.include_dead:
                continue
            node = types_pb2.Node(name=info.get("name", ""), addr=info.get("addr", ""), alive=alive,
                                  draining=info.get("draining") == "1",
                                  heartbeat_at=float(info.get("heartbeat_at", 0) or 0))
            for g in sorted(gpus, key=lambda g: int(g["index"])):
                node.gpus.add(index=int(g["index"]), uuid=g.get("uuid", ""), gpu_type=g.get("type", ""),
                              nvml_name=g.get("nvml_name", ""), memory_total=int(g.get("memory_total", 0)),
                              memory_free=int(g.get("memory_free", 0)), healthy=g.get("healthy", "1") == "1",
                              owner=g.get("owner", ""))
            out.append(node)
        return scheduler_pb2.ListNodesResponse(nodes=out)


class SchedulerServer:
    """Scheduler process: gRPC API + placement loop + event consumer."""

    def __init__(self, redis_url: str, predictor_addr: str, address: str = "127.0.0.1:50051",
                 prefix: str | None = None, tick_s: float = 0.25) -> None:
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.keys = Keys(prefix)
        self.channel = grpc.insecure_channel(predictor_addr)
        self.loop = SchedulerLoop(self.client, self.keys)
        servicer = SchedulerServicer(self.client, self.keys, predictor_pb2_grpc.PredictorStub(self.channel), self.loop)
        self.server, self.port, self.health = start_server(
            [lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s)], [SERVICE_NAME], address)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop.run, args=(self.stop_event, tick_s), name="scheduler-loop",
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        from frenzy.common.grpc_server import stop_server

        self.stop_event.set()
        self.loop.wake.set()
        stop_server(self.server, self.health)
        self.thread.join(timeout=5)
        self.channel.close()
        self.client.close()
