"""Batch submission through Celery: a real Redis broker, a real Celery worker
(in a thread of this process), a real scheduler and predictor on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import redis
from celery.contrib.testing.worker import start_worker
from integration.agent.agent_cluster import Cluster
from typer.testing import CliRunner

from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, types_pb2
from frenzy.worker import app as worker_app
from frenzy.worker import batch as B
from frenzy.worker.cli import batch_app
from support.servers import Servers, running_servers
from support.state import add_node

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")]  # celery, not us

GiB = 1024**3
ROOT = Path(__file__).resolve().parents[3]
DONE = (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED)


def _good(name: str, model: str = "gpt2-124m", **over: object) -> dict:
    return {"name": name, "model": model, "seq_len": 512, "global_batch": 8, "command": "python -c 'print(1)'",
            **over}


@pytest.fixture
def settings_restored() -> Iterator[None]:
    saved = replace(worker_app.settings)
    yield
    worker_app.settings.redis_url, worker_app.settings.scheduler, worker_app.settings.prefix = (
        saved.redis_url, saved.scheduler, saved.prefix)


@pytest.fixture
def servers(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys) -> Iterator[Servers]:
    add_node(redis_client, keys, "a100-0", "A100-80GB", 4)
    add_node(redis_client, keys, "l4-0", "L4", 2, memory=23 * GiB)
    with running_servers(redis_url, prefix) as s:
        yield s


@pytest.fixture
def worker(servers: Servers, redis_url: str, prefix: str, settings_restored: None) -> Iterator[None]:
    s = worker_app.configure(redis_url=redis_url, scheduler=servers.scheduler_addr, prefix=prefix)
    with start_worker(worker_app.app, pool="threads", concurrency=2, perform_ping_check=False,
                      queues=[s.queue], loglevel="WARNING", shutdown_timeout=10):
        yield


def _wait_batch(client: redis.Redis, keys: Keys, batch_id: str, n: int, timeout_s: float = 60) -> list[B.Outcome]:
    deadline = time.monotonic() + timeout_s
    outcomes: list[B.Outcome] = []
    while time.monotonic() < deadline:
        outcomes = B.read_batch(client, keys, batch_id)
        if len(outcomes) == n and all(o.final for o in outcomes):
            return outcomes
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} not finished in {timeout_s}s: {outcomes}")


def _jobs(servers: Servers) -> list:
    return list(servers.stub.ListJobs(scheduler_pb2.ListJobsRequest(limit=1000), timeout=10).jobs)


def test_good_entries_become_jobs_and_bad_ones_fail_alone(
    worker: None, servers: Servers, redis_client: redis.Redis, keys: Keys,
) -> None:
    entries = [
        _good("one"),
        _good("bad-batch", global_batch=-4),  # the worker's own validation (JobSpecError)
        _good("two", model="qwen2.5-0.5b"),
        _good("unknown-model", model="llama-9-7b"),  # the predictor's INVALID_ARGUMENT
        _good("too-big", model="llama-2-70b", seq_len=4096, gpu_types=["L4"]),  # FAILED_PRECONDITION
        "not a mapping",
        _good("three", idempotency_key="mine-1"),
    ]
    batch_id = B.new_batch_id()
    B.init_batch(redis_client, keys, batch_id, entries)  # type: ignore[arg-type]
    for i, entry in enumerate(entries):
        worker_app.enqueue(batch_id, i, entry)  # type: ignore[arg-type]
    out = _wait_batch(redis_client, keys, batch_id, len(entries))
    by_name = {o.name or f"#{o.index}": o for o in out}

    for name in ("one", "two", "three"):
        assert by_name[name].status == B.SUBMITTED, by_name[name]
        job = servers.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=by_name[name].job_id), timeout=5)
        assert job.spec.name == name
    assert by_name["bad-batch"].status == B.INVALID
    assert by_name["bad-batch"].error.startswith("global_batch:"), by_name["bad-batch"].error
    assert by_name["unknown-model"].status == B.INVALID and "model" in by_name["unknown-model"].error
    assert by_name["too-big"].status == B.REJECTED and "L4" in by_name["too-big"].error
    assert by_name["#5"].status == B.INVALID
    # Every failure is final after one attempt (never retried), and only the good ones are jobs.
    assert all(o.attempts == 1 for o in out)
    jobs = _jobs(servers)
    assert sorted(j.spec.name for j in jobs) == ["one", "three", "two"]
    keys_used = {j.spec.idempotency_key for j in jobs}
    assert keys_used == {f"batch:{batch_id}:0", f"batch:{batch_id}:2", "mine-1"}
    assert redis_client.zscore(keys.batches(), batch_id) is not None


def test_redelivered_task_returns_the_same_job(
    worker: None, servers: Servers, redis_client: redis.Redis, keys: Keys,
) -> None:
    batch_id = B.new_batch_id()
    entry = _good("once")
    # The same message delivered twice (what acks_late does after a worker dies mid-task).
    first = worker_app.submit_job.AsyncResult(worker_app.enqueue(batch_id, 0, entry)).get(timeout=30)
    again = worker_app.submit_job.AsyncResult(worker_app.enqueue(batch_id, 0, entry)).get(timeout=30)
    assert first["status"] == again["status"] == B.SUBMITTED
    assert first["job_id"] and first["job_id"] == again["job_id"]
    # A crash after the scheduler accepted the job but before the outcome was written: the record is
    # gone, the redelivered task submits again and the scheduler answers with the first job.
    redis_client.hdel(keys.batch(batch_id), "0")
    third = worker_app.submit_job.AsyncResult(worker_app.enqueue(batch_id, 0, entry)).get(timeout=30)
    assert third["status"] == B.SUBMITTED and third["job_id"] == first["job_id"]
    assert len(_jobs(servers)) == 1
    assert B.get_outcome(redis_client, keys, batch_id, 0).job_id == first["job_id"]  # type: ignore[union-attr]


def test_entry_with_an_existing_idempotency_key_is_a_duplicate(
    worker: None, servers: Servers, redis_client: redis.Redis, keys: Keys,
) -> None:
    first, second = B.new_batch_id(), B.new_batch_id()
    a = worker_app.submit_job.AsyncResult(worker_app.enqueue(first, 0, _good("x", idempotency_key="k"))).get(30)
    b = worker_app.submit_job.AsyncResult(worker_app.enqueue(second, 0, _good("x", idempotency_key="k"))).get(30)
    assert a["status"] == B.SUBMITTED and b["status"] == B.DUPLICATE and a["job_id"] == b["job_id"]
    assert len(_jobs(servers)) == 1


def test_unreachable_scheduler_is_retried_then_recorded_as_error(
    redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys, settings_restored: None,
) -> None:
    from frenzy.devstack.redis_server import free_port

    worker_app.configure(redis_url=redis_url, scheduler=f"127.0.0.1:{free_port()}", prefix=prefix)
    batch_id = B.new_batch_id()
    # Eager: Celery runs the task and its autoretries in this thread (countdowns skipped).
    result = worker_app.submit_job.apply(args=(batch_id, 0, _good("lonely"))).get(timeout=60)
    assert result["status"] == B.ERROR and "unreachable" in result["error"], result
    outcome = B.get_outcome(redis_client, keys, batch_id, 0)
    assert outcome is not None and outcome.attempts == worker_app.MAX_RETRIES + 1


def test_a_recorded_success_is_never_overwritten_by_a_failure(redis_client: redis.Redis, keys: Keys) -> None:
    B.record_outcome(redis_client, keys, "b1", B.Outcome(index=0, status=B.SUBMITTED, job_id="job-1"))
    assert not B.record_outcome(redis_client, keys, "b1", B.Outcome(index=0, status=B.ERROR, error="x"))
    assert B.get_outcome(redis_client, keys, "b1", 0).job_id == "job-1"  # type: ignore[union-attr]
    assert B.record_outcome(redis_client, keys, "b1", B.Outcome(index=1, status=B.RETRYING, error="x"))
    assert B.record_outcome(redis_client, keys, "b1", B.Outcome(index=1, status=B.SUBMITTED, job_id="job-2"))
    assert [o.status for o in B.read_batch(redis_client, keys, "b1")] == [B.SUBMITTED, B.SUBMITTED]


def test_cli_submits_the_example_batch_and_waits_for_the_submissions_only(
    worker: None, servers: Servers, redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys,
) -> None:
    """Without --wait the command returns once every entry has its outcome and job id: the jobs
    here never start (no agent runs them) and the command does not wait for them."""
    runner = CliRunner()
    res = runner.invoke(batch_app, ["submit", str(ROOT / "examples" / "jobs.yaml"), "--json", "--timeout", "60",
                                    "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["done"] and report["failed"] == 0
    statuses = {e["name"]: e["status"] for e in report["entries"]}
    assert statuses == {"gpt2-small": B.SUBMITTED, "qwen-tiny": B.SUBMITTED, "gpt2-medium-l4": B.SUBMITTED}
    jobs = _jobs(servers)
    assert len(jobs) == 3 and {j.id for j in jobs} == {e["job_id"] for e in report["entries"]}
    assert all(j.state not in DONE for j in jobs)
    assert all("job_state" not in e for e in report["entries"])

    res = runner.invoke(batch_app, ["status", report["batch_id"], "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 0 and "gpt2-medium-l4" in res.stdout and "submitted" in res.stdout, res.output
    res = runner.invoke(batch_app, ["list", "--json", "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["batch_id"] == report["batch_id"]


def test_cli_rejects_a_broken_file_and_enqueues_nothing(
    tmp_path: Path, redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys, settings_restored: None,
) -> None:
    runner = CliRunner()
    cases = {
        "syntax.yaml": "jobs:\n  - name: a\n    model: b: c\n",
        "scalar.yaml": "just a string\n",
        "items.yaml": "jobs:\n  - 42\n",
        "empty.yaml": "jobs: []\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        res = runner.invoke(batch_app, ["submit", str(path), "--redis-url", redis_url, "--prefix", prefix])
        assert res.exit_code == 2, (name, res.output)
        assert "Nothing was enqueued" in res.output
    res = runner.invoke(batch_app, ["submit", str(tmp_path / "syntax.yaml"), "--redis-url", redis_url])
    assert "line 3" in res.output, res.output
    assert redis_client.zcard(keys.batches()) == 0
    assert redis_client.llen(keys.batch_queue()) == 0


def test_cli_detach_prints_the_batch_id_and_status_of_unknown_batch(
    redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys, settings_restored: None,
) -> None:
    runner = CliRunner()
    res = runner.invoke(batch_app, ["submit", str(ROOT / "examples" / "jobs.yaml"), "--detach", "--json",
                                    "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 0, res.output
    batch_id = json.loads(res.stdout)["batch_id"]
    assert redis_client.llen(keys.batch_queue()) == 3  # no worker here: the tasks wait in the queue
    assert [o.status for o in B.read_batch(redis_client, keys, batch_id)] == [B.QUEUED] * 3
    # --no-wait, the old name, still detaches (with a word on stderr); --wait with --detach is refused.
    res = runner.invoke(batch_app, ["submit", str(ROOT / "examples" / "jobs.yaml"), "--no-wait",
                                    "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 0 and "entries queued" in res.stdout and "--detach" in res.stderr, res.output
    assert redis_client.llen(keys.batch_queue()) == 6
    res = runner.invoke(batch_app, ["submit", str(ROOT / "examples" / "jobs.yaml"), "--wait", "--detach",
                                    "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 2 and "--detach" in res.stderr, res.output
    assert redis_client.llen(keys.batch_queue()) == 6  # refused before anything was enqueued
    redis_client.delete(keys.batch_queue())
    res = runner.invoke(batch_app, ["status", "nope", "--redis-url", redis_url, "--prefix", prefix])
    assert res.exit_code == 1 and "no batch" in res.output


def test_scheduler_errors_map_to_outcomes(redis_client: redis.Redis, keys: Keys, monkeypatch) -> None:  # noqa: ANN001
    """INTERNAL and friends are recorded as error without a retry; the mapping does not need a server."""

    class Boom(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return "boom"

    class Stub:
        code = grpc.StatusCode.INTERNAL

        def SubmitJob(self, *a: object, **k: object) -> None:  # noqa: N802
            raise Boom(self.code)

    from contextlib import contextmanager

    @contextmanager
    def fake_stub(address: str | None = None):  # noqa: ANN202
        yield Stub()

    monkeypatch.setattr(worker_app, "scheduler_stub", fake_stub)
    out = worker_app.process_entry("b", 0, _good("x"), scheduler="nowhere", client=redis_client, keys=keys)
    assert out.status == B.ERROR and "INTERNAL" in out.error
    Stub.code = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(worker_app.SchedulerUnreachable):
        worker_app.process_entry("b", 1, _good("y"), scheduler="nowhere", client=redis_client, keys=keys,
                                 final_attempt=False)
    assert B.get_outcome(redis_client, keys, "b", 1).status == B.RETRYING  # type: ignore[union-attr]


def test_an_entry_setting_a_reserved_env_name_is_invalid_before_the_scheduler_is_asked(
    redis_client: redis.Redis, keys: Keys,
) -> None:
    out = worker_app.process_entry("b", 0, _good("gpu-thief", env={"CUDA_VISIBLE_DEVICES": "0,1"}),
                                   scheduler="127.0.0.1:1", client=redis_client, keys=keys)
    assert out.status == B.INVALID and out.error.startswith("env: CUDA_VISIBLE_DEVICES: set by Frenzy"), out
    assert out.attempts == 1


def _spawn_worker(scheduler: str, redis_url: str, prefix: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, REDIS_URL=redis_url, FRENZY_PREFIX=prefix, FRENZY_BATCH_VISIBILITY_TIMEOUT_S="2",
               PYTHONUNBUFFERED="1")
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "worker", "--scheduler", scheduler,
                                 "--concurrency", "1", "--loglevel", "INFO"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def test_worker_killed_mid_task_loses_nothing_and_duplicates_nothing(
    servers: Servers, redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys, tmp_path: Path,
    settings_restored: None,
) -> None:
    """A real `frenzy worker` process is SIGKILLed while its task waits on the scheduler; the unacked
    task comes back to a second worker, which submits it: one job, recorded once."""
    # A scheduler address that accepts TCP and never answers: the first worker's SubmitJob hangs.
    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(8)
    hole = f"127.0.0.1:{black_hole.getsockname()[1]}"
    worker_app.configure(redis_url=redis_url, prefix=prefix)
    batch_id = B.new_batch_id()
    entries = [_good("survivor")]
    B.init_batch(redis_client, keys, batch_id, entries)
    first = _spawn_worker(hole, redis_url, prefix, tmp_path / "worker-1.log")
    second = None
    try:
        worker_app.enqueue(batch_id, 0, entries[0])
        deadline = time.monotonic() + 30
        while b"frenzy.submit_job" not in (tmp_path / "worker-1.log").read_bytes():  # received it
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "worker-1.log").read_text()
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        assert B.get_outcome(redis_client, keys, batch_id, 0).status == B.QUEUED  # type: ignore[union-attr]

        second = _spawn_worker(servers.scheduler_addr, redis_url, prefix, tmp_path / "worker-2.log")
        out = _wait_batch(redis_client, keys, batch_id, 1, timeout_s=60)
        assert out[0].status == B.SUBMITTED and out[0].job_id, out
        time.sleep(3)  # past another visibility timeout: the acked task must not come back
        assert len(_jobs(servers)) == 1
        assert B.get_outcome(redis_client, keys, batch_id, 0) == out[0]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        black_hole.close()


def test_an_entry_s_priority_reaches_its_job_and_a_bad_one_fails_alone(
    worker: None, servers: Servers, redis_client: redis.Redis, keys: Keys,
) -> None:
    # (the worker here calls with the test's admin token; a user token's cap is the scheduler's
    # rule, tested in tests/e2e/test_priority_e2e.py and tests/integration/sdk/test_client.py)
    entries = [_good("sweep", priority=-10), _good("urgent", priority="5"), _good("wild", priority=500)]
    batch_id = B.new_batch_id()
    B.init_batch(redis_client, keys, batch_id, entries)
    for i, entry in enumerate(entries):
        worker_app.enqueue(batch_id, i, entry)
    by_name = {o.name: o for o in _wait_batch(redis_client, keys, batch_id, len(entries))}
    assert by_name["wild"].status == B.INVALID and "priority: Input should be less than or equal to 100" in (
        by_name["wild"].error or "")
    jobs = {j.spec.name: j for j in _jobs(servers)}
    assert jobs["sweep"].spec.priority == -10 and jobs["urgent"].spec.priority == 5
    assert by_name["sweep"].job_id == jobs["sweep"].id


@pytest.fixture
def agents_and_worker(redis_url: str, prefix: str, redis_client: redis.Redis, keys: Keys, tmp_path: Path,
                      settings_restored: None) -> Iterator[Servers]:
    """The servers, a Celery worker and real agents (fake GPUs) that run what is placed: the
    nodes of examples/cluster.yaml that the example batch uses (4 A100s, 2 L4s)."""
    cluster = Cluster(redis_url, redis_client, keys, tmp_path)
    try:
        cluster.start("a100-0", "A100-80GB:4")
        cluster.start("l4-0", "L4:2")
        with running_servers(redis_url, prefix) as s:
            settings = worker_app.configure(redis_url=redis_url, scheduler=s.scheduler_addr, prefix=prefix)
            with start_worker(worker_app.app, pool="threads", concurrency=2, perform_ping_check=False,
                              queues=[settings.queue], loglevel="WARNING", shutdown_timeout=10):
                yield s
    finally:
        cluster.close()


def test_cli_wait_follows_the_jobs_to_their_end(
    agents_and_worker: Servers, redis_url: str, prefix: str, tmp_path: Path,
) -> None:
    """`frenzy batch submit FILE --wait`: the submissions, then every job to its end; exit 0 only when
    all SUCCEEDED. The README's `frenzy batch submit examples/jobs.yaml --wait` is the first case."""
    if shutil.which("python") is None:  # the example's commands say `python`, as a user's PATH has it
        pytest.skip("no `python` on PATH for the example batch's commands")
    servers = agents_and_worker
    runner = CliRunner()
    common = ["--redis-url", redis_url, "--prefix", prefix, "--scheduler", servers.scheduler_addr, "--timeout", "60"]
    res = runner.invoke(batch_app, ["submit", str(ROOT / "examples" / "jobs.yaml"), "--wait", "--json", *common])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)  # one document: the outcomes and how each job ended
    assert {e["name"]: (e["status"], e["job_state"]) for e in report["entries"]} == {
        "gpt2-small": (B.SUBMITTED, "SUCCEEDED"), "qwen-tiny": (B.SUBMITTED, "SUCCEEDED"),
        "gpt2-medium-l4": (B.SUBMITTED, "SUCCEEDED")}
    for job in _jobs(servers):  # they really ran, and ended before the command did
        assert job.state == types_pb2.JOB_STATE_SUCCEEDED, job

    # A job that fails makes the whole --wait fail; a bad entry still fails alone.
    batch = tmp_path / "mixed.yaml"
    batch.write_text(json.dumps({"jobs": [
        _good("fine", command=[sys.executable, "-c", "print('fine')"], max_gpus=1),
        _good("crashes", command=[sys.executable, "-c", "import sys; sys.exit(3)"], max_gpus=1),
        _good("invalid", global_batch=-4)]}))
    res = runner.invoke(batch_app, ["submit", str(batch), "--wait", *common])
    assert res.exit_code == 1, res.output
    rows = {line.split("│")[2].strip(): line for line in res.stdout.splitlines() if line.count("│") == 6}
    assert "SUCCEEDED" in rows["fine"] and "FAILED" in rows["crashes"] and "exit code 3" in rows["crashes"], \
        res.stdout
    assert "invalid" in res.stdout and "1 FAILED, 1 SUCCEEDED" in res.stdout, res.stdout
    assert res.stdout.index("RUNNING") < res.stdout.index("2 jobs:"), res.stdout  # the states as they came
