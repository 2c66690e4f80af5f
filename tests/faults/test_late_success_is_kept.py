"""issue 14 D2: a job that ran is never run again. A node cut off long enough is declared dead
and its job requeued; if the cut-off copy finishes with exit 0 meanwhile, its agent reports that
when it is back, and the job must end SUCCEEDED with that result — the next attempt is stopped,
not run through the whole training again.

Before: the late exit 0 was dropped as stale (an attempt the scheduler had moved past) and
attempt 2 ran to the end. Here the agent is frozen with SIGSTOP (its job runs on, in a session of
its own, and ends with 0), the node is declared dead and the job moves to the other node as
attempt 2; on SIGCONT the agent reports attempt 1's exit. Each copy leaves a marker when it
starts and when it has done its work, so a second complete run shows."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import grpc
import redis
from faults import scheduler_support

from frenzy.devstack.stack import LocalStack
from frenzy.rpc.auth import with_token
from frenzy.rpc.jobspec import parse_entry
from frenzy.state.keys import Keys
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from support.processes import alive
from support.waiting import wait_for

TERMINAL = (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED)


stack = scheduler_support.frozen_node_stack  # the fixture


def test_a_late_exit_0_of_a_requeued_job_is_its_result_and_the_next_attempt_stops(
        stack: LocalStack, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    # Attempt 1 ends on its own a few seconds in (while its agent is frozen); attempt 2 would take
    # much longer, so finishing it would show as a second complete run.
    code = ("import os, time, pathlib; a = os.environ['FRENZY_ATTEMPT']; "
            f"d = pathlib.Path({str(runs)!r}); (d / ('started-' + a)).write_text(str(os.getpid())); "
            "time.sleep(3 if a == '1' else 30); (d / ('done-' + a)).write_text('')")
    spec = parse_entry({"name": "d2", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "micro_batch": 4,
                        "command": [sys.executable, "-c", code]}).to_proto()
    with grpc.insecure_channel(stack.scheduler_addr) as raw:
        stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, stack.token))
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id

        def job() -> types_pb2.Job:
            return stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)

        first = wait_for(lambda: (j := job()).state == types_pb2.JOB_STATE_RUNNING and (runs / "started-1").exists()
                         and j, 30, "attempt 1 running")
        (victim,) = [a.node for a in first.placement]
        agent = stack.agent(victim)
        assert agent is not None
        agent.proc.send_signal(signal.SIGSTOP)  # cut off: no heartbeat, its job runs on
        try:
            # (its processes gone too: done-1 is written a moment before the command exits, and its
            # shim exits after it; the agent, thawed in that moment, would rightly stop a copy it
            # finds still running)
            first_pid = int((runs / "started-1").read_text())
            shim_pid = int(Path(f"/proc/{first_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            wait_for(lambda: job().attempt == 2 and (runs / "done-1").exists() and not alive(first_pid)
                     and not alive(shim_pid), 30, "the job requeued as attempt 2 while attempt 1 ran to its end")
            assert not (runs / "done-2").exists()
            # The requeue's cancel for attempt 1 never reaches the cut-off node (it expires, the
            # stream is trimmed): the agent reports the exit as it saw it.
            admin = redis.Redis.from_url(stack.redis_url)
            admin.xtrim(Keys(stack.prefix).launch_stream(victim), maxlen=0)
            admin.close()
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        done = wait_for(lambda: (j := job()).state in TERMINAL and j, 30, "the job to end")
        assert done.state == types_pb2.JOB_STATE_SUCCEEDED, done
        assert "attempt 1 succeeded late" in done.history[-1].reason, done.history[-1]
        # Attempt 2 (if it had started) is stopped, never run to the end.
        time.sleep(2.0)  # a launch of attempt 2 still in its node's stream is read, then its cancel
        if (runs / "started-2").exists():
            second = int((runs / "started-2").read_text())
            wait_for(lambda: not alive(second), 15, "attempt 2 to be stopped")
        assert not (runs / "done-2").exists(), "attempt 2 ran the whole job again"
        assert job().state == types_pb2.JOB_STATE_SUCCEEDED
