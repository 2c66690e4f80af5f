"""issue 34, item 3: the agent never opens a path a job controls unsafely.

A job owns its run directory (``$FRENZY_RUN_DIR``, where it may declare its peak memory in
``peak_bytes``), and a job that runs as the agent's own user can reach everything beside its log.
Measured before the fix: a job that made ``peak_bytes`` a FIFO blocked the (root) agent in
``open()`` for ever -- the job's exit was never reported, it stayed RUNNING holding its GPU, a
cancel did nothing, and a restarted agent blocked again while adopting it. A link there made the
root agent read a file of the job's choosing and report what it held.

Here, on a real agent (and, for cancel and the GPU, on a live stack): the FIFO, a link to a
secret, a link to a device and a huge file. Each test times the agent out where the old code
blocked for ever (checked by running these tests on the code before the fix: every FIFO test timed
out waiting for the EXITED event or for the restarted agent, and the link test read the secret).
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.agent import conftest as agent_fixtures
from integration.agent.agent_cluster import Cluster

from frenzy.state.messages import EventKind

cluster = agent_fixtures.cluster  # agents in threads on the test Redis, played to like the scheduler

PY = sys.executable
try:
    NOBODY: pwd.struct_passwd | None = pwd.getpwnam("nobody")
except KeyError:  # pragma: no cover - every Linux has it
    NOBODY = None
needs_root = pytest.mark.skipif(os.geteuid() != 0 or NOBODY is None,
                                reason="a job as another user than the agent needs root and 'nobody'")


@pytest.fixture
def open_log_dir(cluster: Cluster) -> Iterator[Path]:
    """A log directory a job of another account can reach (pytest's tmp_path lies under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="frenzy-sec-", dir="/tmp"))
    os.chmod(path, 0o711)
    cluster.log_dir = path / "logs"
    yield cluster.log_dir
    for running in cluster.agents:  # (before its directories go)
        running.stop.set()
        running.thread.join(10)
    shutil.rmtree(path, ignore_errors=True)


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


FIFO_THEN_EXIT = sh('rm -f "$FRENZY_RUN_DIR/peak_bytes" && mkfifo "$FRENZY_RUN_DIR/peak_bytes" && echo planted')


def test_a_fifo_for_peak_bytes_does_not_stop_the_exit_report(cluster: Cluster) -> None:
    """The job makes peak_bytes a FIFO and ends: its exit is reported at once (no declared peak), and
    the agent still runs the next launch."""
    cluster.start()
    cluster.launch("job-fifo1", FIFO_THEN_EXIT, indices=[0])
    exited = cluster.wait_event("job-fifo1", EventKind.EXITED, timeout=15)  # old code: never
    assert exited.exit_code == 0
    assert exited.peak_bytes_per_gpu == 0
    assert "planted" in Path(exited.log_path or "").read_text()
    cluster.launch("job-fifo1b", sh("echo next"), indices=[1], fence=2)
    assert cluster.wait_event("job-fifo1b", EventKind.EXITED, timeout=15).exit_code == 0


def test_a_fifo_for_peak_bytes_does_not_block_a_restarted_agent(cluster: Cluster) -> None:
    """The job plants the FIFO and ends while the agent is down: the restarted agent adopts it from its
    ledger, reports the exit and is ready (the old code blocked in open() before it was ready)."""
    first = cluster.start()
    cluster.launch("job-fifo2", sh('mkfifo "$FRENZY_RUN_DIR/peak_bytes"; sleep 1.5'), indices=[0])
    cluster.wait_event("job-fifo2", EventKind.RUNNING)
    first.halt()
    time.sleep(2.5)  # the job ends while no agent runs
    again = cluster.start(wait=False)
    deadline = time.monotonic() + 15
    while not again.agent.ready.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert again.agent.ready.is_set(), "the restarted agent blocked on the job's FIFO"
    exited = cluster.wait_event("job-fifo2", EventKind.EXITED, timeout=10)
    assert exited.peak_bytes_per_gpu == 0


def test_huge_and_device_files_are_read_capped_or_not_at_all(cluster: Cluster) -> None:
    """A 64 GiB sparse peak_bytes is read 64 bytes deep (the number at its start counts); a link to
    /dev/zero is not followed (no peak)."""
    cluster.start()
    cluster.launch("job-huge", sh('f="$FRENZY_RUN_DIR/peak_bytes"; printf "4096\\n" > "$f"; '
                                  'truncate -s 64G "$f"'), indices=[0])
    t0 = time.monotonic()
    exited = cluster.wait_event("job-huge", EventKind.EXITED, timeout=15)
    assert exited.peak_bytes_per_gpu == 4096
    assert time.monotonic() - t0 < 10
    cluster.launch("job-dev", sh('ln -s /dev/zero "$FRENZY_RUN_DIR/peak_bytes"'), indices=[1], fence=2)
    assert cluster.wait_event("job-dev", EventKind.EXITED, timeout=15).peak_bytes_per_gpu == 0


@needs_root
def test_a_link_to_a_secret_is_not_followed(cluster: Cluster, open_log_dir: Path, tmp_path: Path) -> None:
    """A job running as nobody links peak_bytes to a root-only file holding a number: the root agent
    reads no byte of it (the old code reported the secret as the job's peak)."""
    secret = open_log_dir.parent / "secret"
    secret.write_text("271828182845\n")
    os.chmod(secret, 0o600)
    cluster.start(run_as="nobody")
    cluster.launch("job-link", sh(f'cat {secret} 2>/dev/null && echo SECRET""READ; ln -s {secret} "$FRENZY_RUN_DIR/peak_bytes"'
                                  ' && echo linked'), indices=[0])
    exited = cluster.wait_event("job-link", EventKind.EXITED, timeout=15)
    text = Path(exited.log_path or "").read_text()
    assert "\nlinked\n" in text and "SECRETREAD" not in text, text
    assert exited.peak_bytes_per_gpu == 0  # old code: 271828182845


@needs_root
def test_a_linked_run_directory_is_not_followed(cluster: Cluster, open_log_dir: Path) -> None:
    """A run directory replaced by a link (possible for a job of the agent's own user, planted for a
    restart of its attempt) is replaced by a fresh private directory, not chowned or written through."""
    target = open_log_dir.parent / "elsewhere"
    target.mkdir()
    os.chmod(target, 0o755)
    run_dir = open_log_dir / "job-rundir" / "attempt-1" / "n1.run"
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to(target)
    cluster.start(run_as="nobody")
    cluster.launch("job-rundir", sh('echo "$FRENZY_RUN_DIR"; touch "$FRENZY_RUN_DIR/x" && echo wrote'), indices=[0])
    exited = cluster.wait_event("job-rundir", EventKind.EXITED, timeout=15)
    assert "wrote" in Path(exited.log_path or "").read_text()
    assert not run_dir.is_symlink() and run_dir.is_dir()
    assert target.stat().st_uid == 0 and not (target / "x").exists()  # the link's target was left alone


# ---------------------------------------------------------------- on a live stack: the job ends, cancel works

ONE_GPU_JOB = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "max_gpus": 1}


@pytest.fixture(scope="module")
def live(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """`frenzy up`'s stack (scheduler, predictor, one agent with 2 fake L4s) on the test Redis."""
    import grpc

    from frenzy.devstack.stack import LocalStack
    from frenzy.rpc.auth import with_token
    from frenzy.v1 import scheduler_pb2_grpc
    from has.cluster_spec import parse_cluster

    stack = LocalStack.create(parse_cluster({"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 2}]}),
                              run_dir=str(tmp_path_factory.mktemp("fifo-stack") / "run"), redis_url=redis_url,
                              prefix=f"fifo{os.getpid()}", with_worker=False, heartbeat_s=0.25, ttl_s=3.0,
                              cancel_grace_s=3.0)
    stack.start()
    channel = grpc.insecure_channel(stack.scheduler_addr)
    try:
        yield stack, scheduler_pb2_grpc.SchedulerStub(with_token(channel, stack.token))
    finally:
        channel.close()
        stack.stop()


def _submit(stub: object, command: list[str]) -> str:
    from frenzy.rpc.jobspec import parse_entry
    from frenzy.v1 import scheduler_pb2

    spec = parse_entry({"name": "fifo", **ONE_GPU_JOB, "command": command}).to_proto()
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id  # type: ignore[attr-defined]


def _wait_state(stub: object, job_id: str, states: set[str], timeout: float) -> object:
    from frenzy.v1 import scheduler_pb2, types_pb2

    deadline = time.monotonic() + timeout
    while True:
        job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)  # type: ignore[attr-defined]
        if types_pb2.JobState.Name(job.state) in states:
            return job
        assert time.monotonic() < deadline, f"{job_id} still {types_pb2.JobState.Name(job.state)} after {timeout} s"
        time.sleep(0.1)


def _held(stub: object) -> list[str]:
    from frenzy.v1 import scheduler_pb2

    nodes = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes  # type: ignore[attr-defined]
    return [f"{n.name}:{g.index}={g.owner}" for n in nodes for g in n.gpus if g.owner]


def test_on_a_live_stack_the_fifo_job_ends_and_frees_its_gpu(live: tuple) -> None:
    """The job plants the FIFO and exits 0: SUCCEEDED and its GPU free (before: RUNNING for ever)."""
    _stack, stub = live
    job_id = _submit(stub, FIFO_THEN_EXIT)
    from frenzy.v1 import types_pb2

    job = _wait_state(stub, job_id, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, timeout=30)
    assert job.state == types_pb2.JOB_STATE_SUCCEEDED, job  # type: ignore[attr-defined]
    assert _held(stub) == []


def test_on_a_live_stack_cancel_ends_a_fifo_job_and_frees_its_gpu(live: tuple) -> None:
    """The job plants the FIFO and keeps running; `frenzy cancel` ends it: CANCELLED, GPU free (before:
    the cancel killed the process but the agent, blocked on the FIFO, never reported it)."""
    from frenzy.v1 import scheduler_pb2

    _stack, stub = live
    job_id = _submit(stub, sh('mkfifo "$FRENZY_RUN_DIR/peak_bytes"; echo planted; exec sleep 120'))
    _wait_state(stub, job_id, {"JOB_STATE_RUNNING"}, timeout=30)
    assert _held(stub)
    stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="test"), timeout=5)
    _wait_state(stub, job_id, {"JOB_STATE_CANCELLED"}, timeout=20)
    deadline = time.monotonic() + 5
    while _held(stub) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _held(stub) == []
