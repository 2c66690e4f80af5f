"""``frenzy.Client``: submit, inspect, follow and cancel jobs from Python, as `frenzy` does from a shell.

The client finds the scheduler and its token as the CLI does (``frenzy.auth.credentials``: the
arguments, else FRENZY_SCHEDULER / FRENZY_TOKEN, else the credentials file `frenzy up` writes),
builds every JobSpec through the CLI's validation (``frenzy.rpc.jobspec``) and packs the code
directory with the CLI's packer (``frenzy.code.pack``), so a job submitted either way is the same
job. Answers are dataclasses (``frenzy.sdk.models``), failures ``FrenzyError`` subclasses with the
CLI's text (``frenzy.sdk.errors``).

    from frenzy import Client

    client = Client()
    job = client.submit(model="gpt2-355m", seq_len=1024, global_batch=32, command=["python", "train.py"])
    job = job.wait()
    print(job.state, job.plan)
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc

from frenzy.auth.credentials import CredentialsError, resolve_scheduler, resolve_token
from frenzy.code.pack import PackedCode, PackError, pack
from frenzy.rpc.bearer import with_token
from frenzy.rpc.jobspec import JobSpecError, parse_entry
from frenzy.rpc.tls import open_channel
from frenzy.sdk.errors import CodeError, FrenzyError, InvalidSpec, NotAuthenticated, WaitTimeout, from_rpc
from frenzy.sdk.models import Job, Prediction
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

T = TypeVar("T")
MiB = 1024 * 1024
DEFAULT_MAX_CODE_MIB = 100.0
STATES = ("PENDING", "RESERVED", "LAUNCHING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


def build_spec(model: str, seq_len: int, global_batch: int, command: Iterable[str] | str,
               workdir: str | None = None, **recipe: Any) -> types_pb2.JobSpec:
    """The JobSpec for these arguments, validated as `frenzy submit` validates its flags (InvalidSpec
    naming the field). ``recipe``: any JobEntry field (micro_batch, precision, optimizer, train_steps,
    name, env, max_gpus, min_gpus, gpu_types, finetune, lora_rank, ...)."""
    entry: dict[str, Any] = {"model": model, "seq_len": seq_len, "global_batch": global_batch,
                             "command": command if isinstance(command, str) else list(command),
                             "workdir": workdir or "", **recipe}
    try:
        return parse_entry(entry).to_proto()
    except JobSpecError as exc:
        raise InvalidSpec(f"INVALID_ARGUMENT: {exc}") from None


def pack_code(code_dir: str | os.PathLike[str] | None, workdir: str | None,
              max_code_mib: float) -> PackedCode | None:
    """The packed code directory, or None when no code travels (``code_dir`` None, or a ``workdir``
    on the nodes is given). CodeError with the CLI's text when it cannot be packed."""
    if code_dir is None or workdir:
        return None
    try:
        return pack(code_dir, max_bytes=int(max_code_mib * MiB))
    except PackError as exc:
        raise CodeError(str(exc)) from None


def state_values(states: Iterable[str] | None) -> list[int]:
    out = []
    for s in states or ():
        name = s.upper()
        if name not in STATES:
            raise InvalidSpec(f"INVALID_ARGUMENT: states: unknown state {s!r}; one of {' '.join(STATES)}")
        out.append(types_pb2.JobState.Value(f"JOB_STATE_{name}"))
    return out


Since = str | float | datetime.datetime | datetime.timedelta | None


def list_request(states: Iterable[str] | None, limit: int, user: str, name: str,
                 since: Since) -> scheduler_pb2.ListJobsRequest:
    """A ListJobs request with the filters ``Client.jobs`` takes; InvalidSpec naming a bad one."""
    from frenzy.rpc.listing import since_time

    try:
        since_at = since_time(since)
    except ValueError as exc:
        raise InvalidSpec(f"INVALID_ARGUMENT: since: {exc}") from None
    return scheduler_pb2.ListJobsRequest(states=state_values(states), limit=limit, user=user, name=name,
                                         since=since_at)


def find_scheduler(scheduler: str | None, token: str | None) -> tuple[str, str | None]:
    """The address and token the CLI would use; NotAuthenticated when the credentials file is unusable."""
    try:
        return resolve_scheduler(scheduler), resolve_token(token)
    except CredentialsError as exc:
        raise NotAuthenticated(str(exc)) from None


class LineSplitter:
    """Log chunks (per node and attempt, split anywhere) -> whole lines, in order."""

    def __init__(self) -> None:
        self._partial: dict[tuple[str, int], str] = {}

    def feed(self, chunk: scheduler_pb2.LogChunk) -> list[str]:
        key = (chunk.node, chunk.attempt)
        text = self._partial.pop(key, "") + chunk.text
        *lines, rest = text.split("\n")
        if rest:
            self._partial[key] = rest
        return lines

    def flush(self) -> list[str]:
        left = [text for text in self._partial.values() if text]
        self._partial.clear()
        return left


class Client:
    """A connection to one scheduler, with the caller's token. Use as a context manager, or ``close()``."""

    def __init__(self, scheduler: str | None = None, token: str | None = None) -> None:
        from frenzy.rpc.client import client_tls

        self.address, self._token = find_scheduler(scheduler, token)
        try:
            tls = client_tls()
        except (CredentialsError, ValueError) as exc:
            raise NotAuthenticated(str(exc)) from None
        self._channel = with_token(open_channel(self.address, tls), self._token)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as exc:
            raise from_rpc(exc) from None

    # ---- jobs -------------------------------------------------------------------------------

    def submit(self, model: str, seq_len: int, global_batch: int, command: Iterable[str] | str,
               workdir: str | None = None, code_dir: str | os.PathLike[str] | None = ".",
               max_code_mib: float = DEFAULT_MAX_CODE_MIB, priority: int = 0, **recipe: Any) -> Job:
        """Submit a job: the model and recipe (never GPUs) and the command each node runs.

        ``priority``: -100..100, higher starts first (0: normal); above the scheduler's
        ``--max-user-priority`` (default 0) only with an admin token (PermissionDenied otherwise).

        ``code_dir`` (default: the current directory) is packed as `frenzy submit` packs it (what
        git would commit, at most ``max_code_mib``) and each node runs the command in a fresh copy
        of it; ``code_dir=None`` or a ``workdir`` on the nodes (a shared filesystem) sends no code.
        ``recipe``: micro_batch, precision, optimizer, train_steps, name, env, max_gpus, min_gpus,
        gpu_types, idempotency_key, finetune, ... (``frenzy.rpc.jobspec.JobEntry``), and the goal:
        ``objective`` ("time" | "cost" | "gpu-hours"), ``deadline`` ("12h" or seconds) and ``budget``
        (dollars), as `frenzy submit --objective/--deadline/--budget` (docs/cost.md)."""
        spec = build_spec(model, seq_len, global_batch, command, workdir, priority=priority, **recipe)
        packed = pack_code(code_dir, workdir, max_code_mib)
        if packed is not None:
            spec.code_sha256 = self.upload_code(packed)
        resp = self._call(self._stub.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=spec), timeout=60)
        return Job.from_proto(resp.job, self)

    def upload_code(self, packed: PackedCode) -> str:
        """Send packed code unless the scheduler holds it already; its sha256."""
        from frenzy.code.pack import CodeTooLarge
        from frenzy.code.upload import ensure_uploaded

        try:
            return self._call(ensure_uploaded, self._stub, packed).sha256
        except CodeTooLarge as exc:
            raise CodeError(str(exc)) from None

    def get(self, job_id: str) -> Job:
        return Job.from_proto(self._call(self._stub.GetJob, scheduler_pb2.GetJobRequest(job_id=job_id), timeout=30),
                              self)

    def jobs(self, states: Iterable[str] | None = None, limit: int = 100, *, user: str = "", name: str = "",
             since: Since = None) -> list[Job]:
        """Jobs newest first (yours; every user's for an admin token), at most ``limit`` of those that
        match: only in ``states``, only ``user``'s (an admin may name anyone; others only
        themselves: PermissionDenied), only those whose name contains ``name`` ignoring case, only
        those submitted since ``since`` ("2h", "7d", an ISO date, a ``datetime``, a ``timedelta``
        back from now or a unix time)."""
        req = list_request(states, limit, user, name, since)
        return [Job.from_proto(j, self) for j in self._call(self._stub.ListJobs, req, timeout=30).jobs]

    def cancel(self, job_id: str, reason: str = "requested by user") -> Job:
        """Cancel a job. A job that already ended: CannotSchedule naming its state."""
        req = scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        return Job.from_proto(self._call(self._stub.CancelJob, req, timeout=30).job, self)

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Follow ``job_id`` until it ends; the final job. WaitTimeout after ``timeout`` seconds."""
        stream = self._stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id), timeout=timeout)
        try:
            for _update in stream:
                pass
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise WaitTimeout(f"DEADLINE_EXCEEDED: job {job_id} did not end within {timeout} s") from None
            raise from_rpc(exc) from None
        return self.get(job_id)

    def logs(self, job_id: str, follow: bool = False, tail_lines: int = 0, node: str = "",
             attempt: int = 0) -> Iterator[str]:
        """The job's output as lines (no newline), in order per node; ``follow``: live until it ends."""
        req = scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=follow, tail_lines=tail_lines, node=node,
                                              attempt=attempt)
        lines = LineSplitter()
        stream = self._stub.StreamLogs(req, timeout=None if follow else 60)
        try:
            for chunk in stream:
                yield from lines.feed(chunk)
        except grpc.RpcError as exc:
            raise from_rpc(exc) from None
        finally:
            stream.cancel()
        yield from lines.flush()

    # ---- the cluster and plans --------------------------------------------------------------

    def pools(self) -> list[types_pb2.GpuPool]:
        """GPU pools of the live cluster (type, GPUs, GPUs per node), as the scheduler plans on them."""
        return pools_of(self._call(self._stub.ListNodes, scheduler_pb2.ListNodesRequest(), timeout=30).nodes)

    def predict(self, model: str, seq_len: int, global_batch: int, on_cluster: bool = True,
                **recipe: Any) -> Prediction:
        """MARP's ranked plans for this job: on the live cluster's GPUs (``on_cluster``), else on the
        GPU catalog's defaults. Runs here, as `frenzy predict` does; nothing is submitted. ``objective``,
        ``deadline`` and ``budget`` (as ``submit`` takes them) drop and order the plans (docs/cost.md)."""
        return predict_plans(model, seq_len, global_batch, self.pools() if on_cluster else [], **recipe)

    def nodes(self) -> list[dict[str, Any]]:
        """Each live node: name, address, and its GPUs (type, memory, owner) as plain dicts."""
        from frenzy.rpc.protojson import to_json  # the CLI's --json dialect, without importing the CLI

        nodes = self._call(self._stub.ListNodes, scheduler_pb2.ListNodesRequest(), timeout=30).nodes
        return [to_json(n) for n in nodes]


def pools_of(nodes: Iterable[types_pb2.Node]) -> list[types_pb2.GpuPool]:
    """One pool per GPU type of the healthy GPUs of nodes that take jobs (not draining)."""
    per: dict[str, list[int]] = {}
    for n in nodes:
        if n.draining:
            continue
        counts: dict[str, int] = {}
        for g in n.gpus:
            if g.gpu_type and g.healthy:
                counts[g.gpu_type] = counts.get(g.gpu_type, 0) + 1
        for gpu_type, count in counts.items():
            total, per_node = per.get(gpu_type, [0, 0])
            per[gpu_type] = [total + count, max(per_node, count)]
    return [types_pb2.GpuPool(gpu_type=t, total_gpus=v[0], gpus_per_node=v[1]) for t, v in sorted(per.items())]


def predict_plans(model: str, seq_len: int, global_batch: int, pools: list[types_pb2.GpuPool],
                  **recipe: Any) -> Prediction:
    """The predictor's answer for these arguments, computed in this process (no server needed)."""
    import marp
    from frenzy.predictor.planning import predict as run_predict
    from frenzy.sdk.models import Plan
    from frenzy.v1 import predictor_pb2

    spec = build_spec(model, seq_len, global_batch, ["-"], **recipe)
    try:
        resp = run_predict(predictor_pb2.PredictRequest(model=spec.model, recipe=spec.recipe, limits=spec.limits,
                                                        pools=pools, goal=spec.goal))
    except (marp.MarpError, ValueError) as exc:
        raise InvalidSpec(f"INVALID_ARGUMENT: {exc}") from None
    return Prediction(resp.model_name, resp.parameter_count, [Plan.from_proto(p) for p in resp.plans],
                      list(resp.rejected), list(resp.dropped))


__all__ = ["Client", "FrenzyError", "build_spec", "pack_code", "predict_plans"]
