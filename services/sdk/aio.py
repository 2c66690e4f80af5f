"""``frenzy.AsyncClient``: the SDK's asyncio twin (grpc.aio), same arguments and answers as ``Client``.

    async with AsyncClient() as client:
        job = await client.submit(model="gpt2-355m", seq_len=1024, global_batch=32, command=["python", "train.py"])
        job = await client.wait(job.id)
        async for line in client.logs(job.id):
            print(line)

Packing the code directory reads files and runs git: it runs in a worker thread, so the event
loop stays free. Returned ``Job`` objects are not bound to a client (their ``wait`` is the
synchronous one's): use ``await client.wait(job.id)``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from frenzy.code.pack import PackedCode
from frenzy.code.upload import chunks, upload_timeout_s
from frenzy.sdk.client import (
    DEFAULT_MAX_CODE_MIB,
    LineSplitter,
    Since,
    build_spec,
    find_scheduler,
    list_request,
    pack_code,
    pools_of,
    predict_plans,
)
from frenzy.sdk.errors import CodeError, FrenzyError, NotAuthenticated, WaitTimeout, from_rpc
from frenzy.sdk.models import Job, Prediction
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2


class AsyncClient:
    """A grpc.aio connection to one scheduler with the caller's token; ``async with`` or ``await close()``."""

    def __init__(self, scheduler: str | None = None, token: str | None = None) -> None:
        from frenzy.auth.credentials import CredentialsError
        from frenzy.rpc.client import client_tls

        self.address, token = find_scheduler(scheduler, token)
        try:
            tls = client_tls()
        except (CredentialsError, ValueError) as exc:
            raise NotAuthenticated(str(exc)) from None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = (grpc.aio.secure_channel(self.address, tls.credentials()) if tls is not None
                         else grpc.aio.insecure_channel(self.address))
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: Any, request: Any, timeout: float | None = 30) -> Any:
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc(exc) from None

    async def submit(self, model: str, seq_len: int, global_batch: int, command: Iterable[str] | str,
                     workdir: str | None = None, code_dir: str | os.PathLike[str] | None = ".",
                     max_code_mib: float = DEFAULT_MAX_CODE_MIB, priority: int = 0, **recipe: Any) -> Job:
        """As ``Client.submit``."""
        spec = build_spec(model, seq_len, global_batch, command, workdir, priority=priority, **recipe)
        packed = await asyncio.to_thread(pack_code, code_dir, workdir, max_code_mib)
        if packed is not None:
            spec.code_sha256 = await self.upload_code(packed)
        resp = await self._call(self._stub.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=spec), timeout=60)
        return Job.from_proto(resp.job)

    async def upload_code(self, packed: PackedCode) -> str:
        have = await self._call(self._stub.HasCode, scheduler_pb2.HasCodeRequest(sha256=packed.sha256))
        if have.present:
            return packed.sha256
        if have.max_bytes and packed.size > have.max_bytes:
            raise CodeError(f"code: the packed directory is {packed.size / 1024 / 1024:.1f} MiB; the scheduler "
                            f"takes at most {have.max_bytes / 1024 / 1024:.0f} MiB")
        try:
            ref = await self._stub.UploadCode(chunks(packed), timeout=upload_timeout_s(packed.size),
                                              metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc(exc) from None
        return ref.sha256

    async def get(self, job_id: str) -> Job:
        return Job.from_proto(await self._call(self._stub.GetJob, scheduler_pb2.GetJobRequest(job_id=job_id)))

    async def jobs(self, states: Iterable[str] | None = None, limit: int = 100, *, user: str = "", name: str = "",
                   since: Since = None) -> list[Job]:
        """As ``Client.jobs``: the matching jobs, newest first."""
        req = list_request(states, limit, user, name, since)
        return [Job.from_proto(j) for j in (await self._call(self._stub.ListJobs, req)).jobs]

    async def cancel(self, job_id: str, reason: str = "requested by user") -> Job:
        req = scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        return Job.from_proto((await self._call(self._stub.CancelJob, req)).job)

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Follow ``job_id`` until it ends; the final job. WaitTimeout after ``timeout`` seconds."""
        call = self._stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id), timeout=timeout,
                                   metadata=self._metadata)
        try:
            async for _update in call:
                pass
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise WaitTimeout(f"DEADLINE_EXCEEDED: job {job_id} did not end within {timeout} s") from None
            raise from_rpc(exc) from None
        return await self.get(job_id)

    async def logs(self, job_id: str, follow: bool = False, tail_lines: int = 0, node: str = "",
                   attempt: int = 0) -> AsyncIterator[str]:
        """As ``Client.logs``, asynchronously."""
        req = scheduler_pb2.StreamLogsRequest(job_id=job_id, follow=follow, tail_lines=tail_lines, node=node,
                                              attempt=attempt)
        lines = LineSplitter()
        call = self._stub.StreamLogs(req, timeout=None if follow else 60, metadata=self._metadata)
        try:
            async for chunk in call:
                for line in lines.feed(chunk):
                    yield line
        except grpc.aio.AioRpcError as exc:
            raise from_rpc(exc) from None
        finally:
            call.cancel()
        for line in lines.flush():
            yield line

    async def predict(self, model: str, seq_len: int, global_batch: int, on_cluster: bool = True,
                      **recipe: Any) -> Prediction:
        pools: list[types_pb2.GpuPool] = []
        if on_cluster:
            pools = pools_of((await self._call(self._stub.ListNodes, scheduler_pb2.ListNodesRequest())).nodes)
        return await asyncio.to_thread(predict_plans, model, seq_len, global_batch, pools, **recipe)


__all__ = ["AsyncClient", "FrenzyError"]
