"""issue 14 D5: a node declared dead while cut off must stop the jobs it ran, which the scheduler
has moved elsewhere — a job never runs in two places (two copies would write the same
checkpoints).

The requeue also puts a signed cancel on the dead node's launch stream, but that message
expires (120 s) and the stream is capped, so a node that is away long enough never reads it.
Before: such an agent came back, heartbeated (clearing the dead mark) and its attempt-1 process
ran on beside attempt 2. Here the agent is frozen with SIGSTOP (its job runs on, in a session of
its own), declared dead, the job moves to the other node, the cancel is lost from its stream
(as trimming or expiry would lose it); on SIGCONT its next heartbeat learns it was declared dead
and it stops the old copy."""

from __future__ import annotations

import signal
import sys
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

stack = scheduler_support.frozen_node_stack  # the fixture


def test_a_node_declared_dead_stops_its_moved_jobs_when_it_comes_back(stack: LocalStack, tmp_path: Path) -> None:
    marker = tmp_path / "copies"
    code = ("import os, time, pathlib; a = os.environ['FRENZY_ATTEMPT']; "
            f"pathlib.Path({str(marker)!r} + '-' + a).write_text(str(os.getpid())); "
            "time.sleep(120 if a == '1' else 4)")
    spec = parse_entry({"name": "d5", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8, "micro_batch": 4,
                        "command": [sys.executable, "-c", code]}).to_proto()
    with grpc.insecure_channel(stack.scheduler_addr) as raw:
        stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, stack.token))
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id

        def job() -> types_pb2.Job:
            return stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5)

        first = wait_for(lambda: (j := job()).state == types_pb2.JOB_STATE_RUNNING and marker.with_name(
            marker.name + "-1").exists() and j, 30, "attempt 1 running")
        (victim,) = [a.node for a in first.placement]
        first_pid = int(marker.with_name(marker.name + "-1").read_text())
        agent = stack.agent(victim)
        assert agent is not None
        agent.proc.send_signal(signal.SIGSTOP)  # cut off: no heartbeat, its job runs on
        try:
            wait_for(lambda: job().attempt == 2 and marker.with_name(marker.name + "-2").exists(), 30,
                     "the job moved to the other node as attempt 2")
            assert alive(first_pid), "attempt 1 kept running while its agent was frozen (as a cut-off node's would)"
            admin = redis.Redis.from_url(stack.redis_url)
            admin.xtrim(Keys(stack.prefix).launch_stream(victim), maxlen=0)  # the cancel never arrives
            admin.close()
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: not alive(first_pid), 15, "the returning agent to stop attempt 1")
        done = wait_for(lambda: (j := job()).state in (types_pb2.JOB_STATE_SUCCEEDED, types_pb2.JOB_STATE_FAILED)
                        and j, 30, "attempt 2 to finish")
        assert done.state == types_pb2.JOB_STATE_SUCCEEDED and done.attempt == 2, done
