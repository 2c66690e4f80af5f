"""What an agent event means for its job (``agent_events.interpret``): no Redis."""

from __future__ import annotations

from dataclasses import replace

from unit.scheduler.job_records import job_record

from frenzy.scheduler.agent_events import (
    Exited,
    LateSuccess,
    LaunchRefused,
    Stale,
    Started,
    UnknownJob,
    interpret,
)
from frenzy.state.job_states import JobState
from frenzy.state.messages import AgentEvent, EventKind

JOB = job_record("j", JobState.RUNNING, attempt=2, fence=7, placement=[("a", [0]), ("b", [0])])


def event(kind: EventKind, **fields) -> AgentEvent:
    base = {"job_id": "j", "attempt": 2, "node": "a", "fence": 7}
    return AgentEvent(kind=kind, **{**base, **fields})


def test_an_event_for_a_job_redis_does_not_have_is_ignored() -> None:
    assert interpret(event(EventKind.EXITED, exit_code=0), None) == UnknownJob()


def test_an_exit_of_an_older_attempt_only_frees_that_reservation() -> None:
    assert interpret(event(EventKind.EXITED, attempt=1, fence=5, exit_code=1), JOB) == Stale(release_fence=5)


def test_stale_events_that_free_nothing() -> None:
    # an old attempt's RUNNING: nothing ended; an old agent's exit without a fence: which GPUs is unknown
    assert interpret(event(EventKind.RUNNING, attempt=1, fence=5), JOB) == Stale(None)
    assert interpret(event(EventKind.EXITED, attempt=1, fence=None, exit_code=0), JOB) == Stale(None)


def test_an_event_is_stale_from_another_fence_node_or_once_the_job_ended() -> None:
    assert interpret(event(EventKind.EXITED, fence=6, exit_code=0), JOB) == Stale(6)
    assert interpret(event(EventKind.EXITED, node="z", exit_code=0), JOB) == Stale(7)
    ended = job_record("j", JobState.CANCELLED, attempt=2, fence=7, placement=[("a", [0])])
    assert interpret(event(EventKind.EXITED, exit_code=0), ended) == Stale(7)


def test_running_records_pid_and_log_and_moves_a_launching_job_on() -> None:
    launching = job_record("j", JobState.LAUNCHING, attempt=2, fence=7, placement=[("a", [0])])
    assert interpret(event(EventKind.RUNNING, pid=42, log_path="/l"), launching) == Started(
        {"log:a": "/l", "pid:a": "42"}, "process started on a (pid 42)")
    # an event without a fence (an older agent) counts as current
    assert interpret(event(EventKind.RUNNING, fence=None), JOB) == Started({}, None)


def test_a_retryable_launch_failure_requeues_and_another_fails_the_node() -> None:
    assert interpret(event(EventKind.LAUNCH_FAILED, retryable=True, message="port taken"), JOB) == LaunchRefused(
        ("a",), "launch failed on a: port taken")
    # The cause keeps the agent's reason (it becomes the job's), not just "launch failed".
    assert interpret(event(EventKind.LAUNCH_FAILED, message="no such file"), JOB) == Exited(
        127, "launch failed on a: no such file", told_to_stop=False, stop_others=True,
        cause="launch failed: no such file")
    assert interpret(event(EventKind.LAUNCH_FAILED), JOB).cause == "launch failed"  # type: ignore[union-attr]


def test_a_launch_failure_from_a_node_that_already_reported_the_attempt_is_stale() -> None:
    # A refusal after the node's RUNNING (or exit) of the same attempt is a late or replayed copy.
    started = replace(JOB, pids={"a": 42})
    assert interpret(event(EventKind.LAUNCH_FAILED, retryable=True, message="expired"), started) == Stale(None)
    assert interpret(event(EventKind.LAUNCH_FAILED, message="x"), replace(JOB, exit_codes={"a": 0})) == Stale(None)
    # another node's RUNNING does not make this node's refusal stale
    assert isinstance(interpret(event(EventKind.LAUNCH_FAILED, retryable=True), replace(JOB, pids={"b": 1})),
                      LaunchRefused)


def test_exits() -> None:
    assert interpret(event(EventKind.EXITED, exit_code=0), JOB) == Exited(
        0, "a exited with code 0", told_to_stop=False, stop_others=False)
    assert interpret(event(EventKind.EXITED, exit_code=3), JOB) == Exited(
        3, "a exited with code 3", told_to_stop=False, stop_others=True)
    # told to stop: its code is not the job's failure, and the others are being stopped already
    assert interpret(event(EventKind.EXITED, exit_code=-15, cancelled=True), JOB) == Exited(
        -15, "a exited with code -15 (cancelled)", told_to_stop=True, stop_others=False)
    assert interpret(event(EventKind.EXITED, exit_code=None, message="left no status"), JOB) == Exited(
        -1, "a exited with code -1: left no status", told_to_stop=False, stop_others=True)


# ---- a late exit 0 of the attempt a requeue ended (issue 14, D2)

# Attempt 1 (fence 5, on nodes a and b) was requeued when a node was declared dead; attempt 2 runs.
REQUEUED = replace(JOB, previous_attempt=1, previous_fence=5, previous_nodes=("a", "b"))


def late(**fields) -> AgentEvent:
    return event(EventKind.EXITED, **{"attempt": 1, "fence": 5, "exit_code": 0, **fields})


def test_a_clean_exit_0_of_the_requeued_attempt_may_finish_the_job() -> None:
    assert interpret(late(), REQUEUED) == LateSuccess(attempt=1, fence=5)
    assert interpret(late(node="b"), REQUEUED) == LateSuccess(attempt=1, fence=5)
    # whatever the next attempt is doing: queued, reserved, launching
    for state in (JobState.PENDING, JobState.RESERVED, JobState.LAUNCHING):
        assert interpret(late(), replace(REQUEUED, state=state)) == LateSuccess(attempt=1, fence=5)


def test_a_late_exit_that_did_not_finish_the_work_stays_stale() -> None:
    # a failure, or a copy the agent stopped (declared dead: it had not finished), or no code
    assert interpret(late(exit_code=1), REQUEUED) == Stale(5)
    assert interpret(late(exit_code=0, cancelled=True), REQUEUED) == Stale(5)
    assert interpret(late(exit_code=-15, cancelled=True), REQUEUED) == Stale(5)
    assert interpret(late(exit_code=None), REQUEUED) == Stale(5)
    assert interpret(event(EventKind.LAUNCH_FAILED, attempt=1, fence=5), REQUEUED) == Stale(5)
    assert interpret(event(EventKind.RUNNING, attempt=1, fence=5), REQUEUED) == Stale(None)


def test_a_late_exit_of_another_attempt_fence_or_node_or_of_an_ended_job_stays_stale() -> None:
    assert interpret(late(fence=4), REQUEUED) == Stale(4)
    assert interpret(late(fence=None), REQUEUED) == Stale(None)  # an old agent: which reservation is unknown
    assert interpret(late(node="z"), REQUEUED) == Stale(5)
    # two steps back: the job is on attempt 3, the requeue recorded attempt 2
    third = replace(REQUEUED, attempt=3, previous_attempt=2, previous_fence=6)
    assert interpret(late(), third) == Stale(5)
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert interpret(late(), replace(REQUEUED, state=state)) == Stale(5)
    # no requeue recorded (a job from before this field): never
    assert interpret(late(), JOB) == Stale(5)


def test_a_fenced_exit_is_run_again_elsewhere_not_ended() -> None:
    # The agent lost Redis and stopped the job itself (frenzy.agent.fencing): a cause of the host,
    # not the user's cancel nor the job's failure.
    from frenzy.agent.exit_cause import FENCED

    meaning = interpret(event(EventKind.EXITED, exit_code=-15, cancelled=True, cause=FENCED), JOB)
    assert meaning == LaunchRefused(("a",), "a lost contact with Redis and stopped the job (fenced)")
