"""The SDK (frenzy.Client / AsyncClient) against real gRPC servers and Redis: dataclasses back,
errors as FrenzyError subclasses with the CLI's text, the same validation as `frenzy submit`."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from frenzy import AsyncClient, Client
from frenzy.sdk import (
    CannotSchedule,
    CodeError,
    InvalidSpec,
    JobNotFound,
    NotAuthenticated,
    PermissionDenied,
    SchedulerUnavailable,
    WaitTimeout,
)
from frenzy.sdk.client import LineSplitter
from frenzy.v1 import scheduler_pb2
from support.servers import Servers, running_servers


@pytest.fixture
def servers(redis_url: str, prefix: str) -> Iterator[Servers]:
    with running_servers(redis_url, prefix) as s:
        yield s


@pytest.fixture
def client(servers: Servers) -> Iterator[Client]:
    with Client(servers.scheduler_addr, servers.token) as c:
        yield c


def test_submit_get_jobs_cancel_as_dataclasses(client: Client, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    job = client.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["python", "train.py"],
                        code_dir=tmp_path, name="sdk", micro_batch=2)
    assert job.state == "PENDING" and job.name == "sdk" and job.model == "gpt2-124m" and len(job.code_sha256) == 64
    assert job.candidate_plans and job.candidate_plans[0].layout.micro_batch == 2 and job.attempts == []
    assert client.get(job.id).id == job.id
    assert [j.id for j in client.jobs(states=["pending"])] == [job.id]
    cancelled = client.cancel(job.id)
    assert cancelled.state == "CANCELLED" and cancelled.done and not cancelled.succeeded
    assert client.wait(job.id, timeout=5).state == "CANCELLED"
    with pytest.raises(CannotSchedule, match="already CANCELLED"):
        client.cancel(job.id)
    # A workdir on the nodes sends no code.
    shared = client.submit(model="gpt2-124m", seq_len=128, global_batch=8, command="python train.py",
                           workdir="/shared/project")
    assert shared.code_sha256 == "" and client.get(shared.id).command == ["python", "train.py"]


def test_errors_carry_the_cli_s_text(client: Client, servers: Servers, tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="seq_len: Input should be greater than 0"):
        client.submit(model="gpt2-124m", seq_len=0, global_batch=8, command=["true"], code_dir=None)
    with pytest.raises(InvalidSpec, match="no_such_knob"):
        client.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None,
                      no_such_knob=1)
    with pytest.raises(JobNotFound, match="NOT_FOUND: job_id: no job 'job-000000000000'") as err:
        client.get("job-000000000000")
    assert err.value.code == "NOT_FOUND"
    with pytest.raises(CannotSchedule, match="FAILED_PRECONDITION: spec: no GPU type"):
        client.submit(model="llama-2-70b", seq_len=4096, global_batch=8, command=["true"], code_dir=None,
                      gpu_types=["L4"], max_gpus=1)
    with pytest.raises(CodeError, match="nothing to pack"):
        (tmp_path / "empty").mkdir()
        client.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=tmp_path / "empty")
    with Client(servers.scheduler_addr, "not-a-token") as bad, pytest.raises(NotAuthenticated):
        bad.jobs()
    from frenzy.auth.roles import Role

    reader, _ = servers.scheduler.tokens.create("reader", Role.READ)
    with Client(servers.scheduler_addr, reader) as ro, pytest.raises(PermissionDenied):
        ro.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None)


def test_an_unreachable_scheduler_says_how_to_fix_as_the_cli_does() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with Client(f"127.0.0.1:{port}", "t") as c, pytest.raises(SchedulerUnavailable) as err:
        c.jobs()
    assert "To fix: start the stack (`frenzy up`)" in str(err.value)
    cli = subprocess.run([str(Path(sys.executable).with_name("frenzy")), "jobs", "--scheduler", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=60, env={"FRENZY_TOKEN": "t", "PATH": "/usr/bin"})
    assert "To fix: start the stack (`frenzy up`)" in cli.stderr


def test_wait_times_out_and_logs_come_as_lines(client: Client, servers: Servers) -> None:
    job = client.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None)
    with pytest.raises(WaitTimeout):
        job.wait(timeout=0.5)  # no agent: it stays PENDING
    assert list(client.logs(job.id)) == []
    lines = LineSplitter()
    got = [*lines.feed(scheduler_pb2.LogChunk(node="a", attempt=1, text="one\ntw")),
           *lines.feed(scheduler_pb2.LogChunk(node="b", attempt=1, text="other\n")),
           *lines.feed(scheduler_pb2.LogChunk(node="a", attempt=1, text="o\nthree")), *lines.flush()]
    assert got == ["one", "other", "two", "three"]


def test_predict_plans_on_the_live_cluster(client: Client, servers: Servers) -> None:
    from support.state import add_node

    add_node(servers.scheduler.client, servers.scheduler.keys, "n1", "A100-80GB", 4)
    pred = client.predict(model="gpt2-355m", seq_len=1024, global_batch=32)
    assert pred.model == "gpt2-355m" and pred.plans and {p.gpu_type for p in pred.plans} == {"A100-80GB"}
    assert all(p.num_gpus <= 4 for p in pred.plans) and pred.plans[0].rank == 1


def test_the_async_client(servers: Servers, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")

    async def run() -> None:
        async with AsyncClient(servers.scheduler_addr, servers.token) as ac:
            job = await ac.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["python", "train.py"],
                                  code_dir=tmp_path)
            assert job.state == "PENDING" and job.code_sha256
            assert [j.id for j in await ac.jobs()] == [job.id]
            assert (await ac.cancel(job.id)).state == "CANCELLED"
            assert (await ac.wait(job.id, timeout=5)).state == "CANCELLED"
            with pytest.raises(JobNotFound):
                await ac.get("job-000000000000")
            with pytest.raises(InvalidSpec):
                await ac.submit(model="gpt2-124m", seq_len=-1, global_batch=8, command=["true"], code_dir=None)

    asyncio.run(run())


def test_priority_goes_with_the_job_and_a_user_may_only_lower_it(redis_url: str, prefix: str) -> None:
    from frenzy.auth.roles import Role
    from frenzy.scheduler.service import UserQuotas

    with running_servers(redis_url, prefix, quotas=UserQuotas(max_priority=10)) as s:
        user_token, _ = s.scheduler.tokens.create("alice", Role.SUBMIT)
        with Client(s.scheduler_addr, user_token) as alice:
            low = alice.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None,
                               priority=-3)
            assert low.priority == -3 and alice.get(low.id).priority == -3
            at_cap = alice.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None,
                                  priority=10)  # up to the scheduler's --max-user-priority
            assert at_cap.priority == 10
            with pytest.raises(PermissionDenied, match=r"PERMISSION_DENIED: spec.priority: 11 is above 10, .*To fix:"):
                alice.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None,
                             priority=11)
            with pytest.raises(InvalidSpec, match="priority: Input should be less than or equal to 100"):
                alice.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None,
                             priority=101)
            assert sorted(j.priority for j in alice.jobs()) == [-3, 10]
        with Client(s.scheduler_addr, s.token) as admin:  # an admin may ask any priority
            assert admin.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"], code_dir=None,
                                priority=100).priority == 100

        async def run() -> None:
            async with AsyncClient(s.scheduler_addr, user_token) as ac:
                job = await ac.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"],
                                      code_dir=None, priority=-1)
                assert job.priority == -1
                with pytest.raises(PermissionDenied, match="To fix:"):
                    await ac.submit(model="gpt2-124m", seq_len=128, global_batch=8, command=["true"],
                                    code_dir=None, priority=50)

        asyncio.run(run())
