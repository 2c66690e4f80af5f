"""issue 34, item 1, under `frenzy up`: a stack started as root runs jobs as an unprivileged account.

Measured before: under `frenzy up` (agents without ``--run-as``) a job with a plain submit token read
every agent's and the scheduler's Redis URL from /proc/PID/environ, the Redis admin password from
the run directory and the admin token from the credentials file -- it ran as whoever started the
stack, root here. Now the stack (as root) gives its agents ``--run-as frenzy-job`` (made with useradd
when missing), the run directory is enterable but not listable, Redis' directory is the stack's
alone, and the start says plainly that this is a single-user stack. On the code before, the job ran
as root and every read below succeeded.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from frenzy.devstack.stack import JOB_ACCOUNT, LocalStack, _ensure_account

PROBE = r'''
import os, sys
run = sys.argv[1]
def try_(name, fn):
    try:
        print(f"{name}: GOT {str(fn())[:60]!r}")
    except OSError as exc:
        print(f"{name}: refused ({type(exc).__name__})")
try_("credentials", lambda: open(os.path.join(run, "credentials.json")).read())
try_("redis-dir", lambda: os.listdir(os.path.join(run, "redis")))
try_("redis-conf", lambda: open(os.path.join(run, "redis", "redis.conf")).read())
try_("run-dir", lambda: os.listdir(run))
for pid in sys.argv[2:]:
    try_(f"environ-{pid}", lambda: open(f"/proc/{pid}/environ", "rb").read())
print("uid", os.getuid())
'''


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[LocalStack, list[str]]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("the stack runs jobs as another account only when it runs as root (and can make one)")
    try:
        pwd.getpwnam(JOB_ACCOUNT)
        made = False
    except KeyError:
        made = True
    base = Path(tempfile.mkdtemp(prefix="frenzy-up-", dir="/tmp"))
    os.chmod(base, 0o755)
    from has.cluster_spec import parse_cluster

    said: list[str] = []
    # The account named outright: by default the stack takes it only when it can start the stack's
    # own Python, and on a machine whose venv sits on an interpreter under /root (0700) it cannot
    # (test_demo_as_root.py); the jobs here run /usr/bin/python3, which it can.
    assert _ensure_account(JOB_ACCOUNT) == JOB_ACCOUNT
    s = LocalStack.create(parse_cluster({"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 1}]}),
                          run_dir=str(base / "run"), redis_url=None, prefix=f"up{os.getpid()}", with_worker=False,
                          heartbeat_s=0.25, ttl_s=3.0, job_account=JOB_ACCOUNT)
    try:
        s.start(progress=said.append)
        yield s, said
    finally:
        s.stop()
        shutil.rmtree(base, ignore_errors=True)
        if made:
            subprocess.run(["userdel", JOB_ACCOUNT], capture_output=True, timeout=30)


def test_frenzy_up_as_root_says_single_user_and_runs_jobs_as_an_unprivileged_account(stack: tuple) -> None:
    s, said = stack
    assert said[0].startswith(f"single-user stack: every job runs as {JOB_ACCOUNT}"), said
    assert "--run-as" in s._agent_cmds[next(iter(s._agent_cmds))]


def test_a_job_under_frenzy_up_reads_no_credential(stack: tuple) -> None:
    import grpc

    from frenzy.rpc.auth import with_token
    from frenzy.rpc.jobspec import parse_entry
    from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

    s, _said = stack
    pids = [str(svc.proc.pid) for svc in s.services]  # the agents', the scheduler's, ... environments
    assert s.redis is not None
    channel = grpc.insecure_channel(s.scheduler_addr)
    stub = scheduler_pb2_grpc.SchedulerStub(with_token(channel, s.token))
    spec = parse_entry({"name": "probe", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "max_gpus": 1,
                        "command": ["/usr/bin/python3", "-c", PROBE, str(s.run_dir), *pids]}).to_proto()
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
    deadline = time.monotonic() + 60
    while (job := stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)).state not in (
            types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    text = "".join(c.text for c in stub.StreamLogs(scheduler_pb2.StreamLogsRequest(job_id=job_id), timeout=30))
    channel.close()
    assert job.state == types_pb2.JOB_STATE_SUCCEEDED, text
    assert f"uid {pwd.getpwnam(JOB_ACCOUNT).pw_uid}\n" in text, text
    lines = [line for line in text.splitlines() if re.match(r"(credentials|redis-dir|redis-conf|run-dir|environ-\d+): ",
                                                            line)]
    assert len(lines) == 4 + len(pids), text
    for line in lines:
        assert "refused" in line, text
