"""A launch that fails before the command runs keeps its reason (issue 20): the job's last history
entry, its attempt's cause and what `--wait` prints say "command not found: 'x'", not "exit code
127". Against a real Redis; the agent is played by its events (tests/integration/agent checks the
agent's LAUNCH_FAILED message itself)."""

from __future__ import annotations

import pytest
import redis

from frenzy.cli.render import failure_lines
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind
from support.placed import run_on
from support.state import GiB, add_node, make_plan, make_spec

NOT_FOUND = "command not found: 'nosuch' (not on the job's PATH: /usr/bin:/bin)"


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    add_node(redis_client, keys, "a", "A100-80GB", 2)
    return SchedulerLoop(redis_client, keys, dead_after_s=5.0, max_attempts=3, master_ports=(30100, 30103))


def test_a_launch_failure_keeps_the_agents_reason(loop: SchedulerLoop) -> None:
    plan = make_plan("A100-80GB", peak=20 * GiB)
    job_id, _ = loop.store.submit(make_spec("nf"), [plan], "gpt2-124m", 1, max_attempts=3)
    job = run_on(loop, job_id, plan, running=False)
    loop.handle_event(AgentEvent(kind=EventKind.LAUNCH_FAILED, job_id=job.id, attempt=job.attempt, node="a",
                                 fence=job.fence, message=NOT_FOUND))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert job.history[-1]["reason"] == f"node a (node rank 0) could not start the job: {NOT_FOUND}"
    (attempt,) = job.attempts
    assert attempt["cause"] == f"launch failed: {NOT_FOUND}" and attempt["outcome"] == "failed"
    lines = failure_lines(job.to_proto())
    assert lines[0] == f"[red]failed:[/] node a (node rank 0) could not start the job: {NOT_FOUND}"
    assert "(attempt 1, never started)" in lines[1] and "127" not in "".join(lines)


def test_a_failed_exit_names_its_recognised_cause(loop: SchedulerLoop) -> None:
    plan = make_plan("A100-80GB", peak=20 * GiB)
    job_id, _ = loop.store.submit(make_spec("sig"), [plan], "gpt2-124m", 1, max_attempts=3)
    job = run_on(loop, job_id, plan)
    loop.handle_event(AgentEvent(kind=EventKind.EXITED, job_id=job.id, attempt=job.attempt, node="a",
                                 fence=job.fence, exit_code=-9, cause="signal 9 (SIGKILL)"))
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert job.history[-1]["reason"] == "node a (node rank 0) failed with exit code -9: signal 9 (SIGKILL)"
