"""Job priorities end to end: real scheduler, predictor and agent (separate processes, one fake L4
GPU), jobs that are real processes.

* with the one GPU busy, a job submitted with `frenzy submit --priority 10` after a priority-0 job
  starts first once the GPU frees; `frenzy jobs` and `frenzy job` show the priority;
* a user (submit-role) token asking priority 100 is refused with PERMISSION_DENIED and a "To fix:",
  and nothing is queued; lowering is allowed; the stack's admin token may ask 100.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis
from e2e.test_agents_e2e import DONE, Stack, make_stack  # noqa: F401 (the fixture)

from frenzy.auth.roles import Role
from frenzy.auth.tokens import TokenStore
from frenzy.rpc.auth import with_token
from frenzy.rpc.jobspec import parse_entry
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ONE_L4 = {"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 1, "name_prefix": "l4"}]}
JOB = {"model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "max_gpus": 1}
PLACED = (types_pb2.JOB_STATE_RESERVED, types_pb2.JOB_STATE_LAUNCHING, types_pb2.JOB_STATE_RUNNING)


def _cli(s: Stack, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FRENZY_CREDENTIALS": str(s.stack.credentials_file), "COLUMNS": "250"}
    if token is not None:
        env["FRENZY_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "frenzy.cli.main", args[0], "--scheduler", s.stack.scheduler_addr,
                           *args[1:]], capture_output=True, text=True, timeout=120, env=env)


def _placed_at(job: types_pb2.Job) -> float:
    """When the job first left the queue (its first RESERVED / LAUNCHING entry)."""
    return min(h.at for h in job.history if h.state in PLACED)


def test_a_priority_10_job_submitted_later_starts_before_a_priority_0_job(
        make_stack: Callable[..., Stack], tmp_path: Path) -> None:  # noqa: F811
    s = make_stack(ONE_L4)
    gate = tmp_path / "go"
    blocker = s.submit([sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(gate)!r}): "
                        "time.sleep(0.05)"], **JOB)
    s.wait_state(blocker, (types_pb2.JOB_STATE_RUNNING,), timeout=60)
    low = s.submit([sys.executable, "-c", "print('low')"], name="low", **JOB)
    out = _cli(s, "submit", "--model", JOB["model"], "--seq-len", "512", "--global-batch", "8", "--max-gpus", "1",
               "--name", "high", "--priority", "10", "--no-code", "--", sys.executable, "-c", "print('high')")
    assert out.returncode == 0, out.stderr
    high = out.stdout.split("submitted ", 1)[1].split(":", 1)[0].split()[0]
    # both wait for the one GPU; the listing shows each one's priority
    assert s.job(low).state == s.job(high).state == types_pb2.JOB_STATE_PENDING
    listing = _cli(s, "jobs")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[1]: line for line in listing.stdout.splitlines() if "job-" in line}
    assert "PRIO" in listing.stdout and " 10 " in rows[high] and " 0 " in rows[low], listing.stdout
    shown = _cli(s, "job", high)
    assert "priority 10" in shown.stdout, shown.stdout

    gate.write_text("")
    done_high, done_low = s.wait_state(high, DONE, timeout=90), s.wait_state(low, DONE, timeout=90)
    assert done_high.state == done_low.state == types_pb2.JOB_STATE_SUCCEEDED, (done_high, done_low)
    assert _placed_at(done_high) < _placed_at(done_low), (done_high.history, done_low.history)
    assert done_high.spec.priority == 10 and done_low.spec.priority == 0


def test_a_user_token_cannot_raise_priority_but_may_lower_it(make_stack: Callable[..., Stack],  # noqa: F811
                                                              redis_url: str, prefix: str) -> None:
    s = make_stack(ONE_L4)
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        user_token, _ = TokenStore(client, Keys(prefix)).create("mallory", Role.SUBMIT, note="priority test")
    channel = grpc.insecure_channel(s.stack.scheduler_addr)
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(with_token(channel, user_token))

        def submit(priority: int) -> types_pb2.Job:
            spec = parse_entry({**JOB, "command": ["true"], "priority": priority}).to_proto()
            return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job

        for asked in (100, 1):
            with pytest.raises(grpc.RpcError) as err:
                submit(asked)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert f"spec.priority: {asked} is above 0" in (err.value.details() or "")
            assert "To fix:" in (err.value.details() or "")
        listed = stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs
        assert list(listed) == []  # nothing was queued for the refusals
        lowered = submit(-20)
        assert lowered.spec.priority == -20 and lowered.user == "mallory"
    finally:
        channel.close()
    # the CLI says the same and exits non-zero; the admin token of the stack may ask 100
    refused = _cli(s, "submit", "--model", JOB["model"], "--seq-len", "512", "--global-batch", "8", "--priority",
                   "100", "--no-code", "--", "true", token=user_token)
    assert refused.returncode != 0 and "PERMISSION_DENIED" in refused.stdout + refused.stderr
    assert "To fix:" in refused.stdout + refused.stderr
    admin = s.submit(["true"], priority=100, **JOB)
    assert s.job(admin).spec.priority == 100
    wait_for(lambda: s.job(admin).state in DONE, 60, f"{admin} to end")
