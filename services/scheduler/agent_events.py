"""What one agent event means for its job, decided without I/O.

``SchedulerLoop.handle_event`` reads the job the event names, asks ``interpret``
what the event means, and carries that out through the store. An event is
current when it comes from the job's live attempt, on one of its nodes, under its
reservation's fence (agents of an older version send none); anything else is
stale: the process it talks about belongs to an older attempt or an ended job, so
at most what that reservation still holds on the node can be freed — except a clean
exit 0 of the attempt the last requeue ended (its node was cut off and declared dead,
its copy ran to the end): that work is done, so it may finish the job (``LateSuccess``)
rather than have the next attempt run the whole training again.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy.agent.exit_cause import FENCED, LAUNCH_FAILED, OOM
from frenzy.state.job_states import ACTIVE, TERMINAL, JobState
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.records import JobRecord


@dataclass(frozen=True)
class UnknownJob:
    """The event names a job Redis does not have: nothing to do."""


@dataclass(frozen=True)
class Stale:
    """An event of an older attempt or an ended job. ``release_fence``: free the GPUs that
    reservation still holds on the event's node (its process is gone); None: nothing to free."""

    release_fence: int | None


@dataclass(frozen=True)
class LateSuccess:
    """A node of the attempt the last requeue ended (``attempt``, under ``fence``) exited 0 on its
    own (not told to stop) while the job is on the next attempt: count it; once every node of that
    attempt has, the job ends SUCCEEDED and the next attempt is stopped. Its GPUs on the node are
    freed as for a stale exit."""

    attempt: int
    fence: int


@dataclass(frozen=True)
class Started:
    """The node's process runs: remember its pid and log; ``to_running`` is the history
    reason of the LAUNCHING -> RUNNING step, None when the job runs already."""

    fields: dict[str, str]
    to_running: str | None


@dataclass(frozen=True)
class LaunchRefused:
    """The agent could not launch, or stopped the job, for a reason of its host (it could not launch
    it, or lost Redis and fenced itself): a retry elsewhere may work, requeue."""

    lost: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Exited:
    """The node's part of the attempt ended (or never started): count its exit. ``stop_others``:
    when the exit is counted and the job goes on, stop its other nodes (a rank failed).
    ``cause``, ``tail``, ``peak`` (``peak_measured``): what the agent recognised, the last output
    lines, the highest memory per GPU it saw; ``oom``: the attempt ran out of GPU memory (and
    nothing else ended it first): re-plan (``oom_policy``) instead of counting the exit."""

    code: int
    reason: str
    told_to_stop: bool
    stop_others: bool
    cause: str = ""
    tail: tuple[str, ...] = ()
    peak: int = 0
    peak_measured: bool = False
    oom: bool = False


EventMeaning = UnknownJob | Stale | LateSuccess | Started | LaunchRefused | Exited


def is_current(event: AgentEvent, job: JobRecord) -> bool:
    """The event comes from the job's live attempt, on one of its nodes, under its fence."""
    return (event.attempt == job.attempt and job.state in ACTIVE
            and event.node in {n for n, _ in job.placement}
            and (event.fence is None or event.fence == job.fence))


def is_late_success(event: AgentEvent, job: JobRecord) -> bool:
    """A clean exit 0 of the attempt just before the job's current one, under the fence and on a
    node the last requeue recorded for it, while the job has not ended. A cancelled exit (the agent
    stopped the copy: it had not finished) or an attempt further back never is."""
    return (event.kind == EventKind.EXITED and event.exit_code == 0 and not event.cancelled
            and event.fence is not None and job.state not in TERMINAL
            and event.attempt == job.attempt - 1 == job.previous_attempt
            and event.fence == job.previous_fence and event.node in job.previous_nodes)


def interpret(event: AgentEvent, job: JobRecord | None) -> EventMeaning:
    """What ``event`` means for ``job`` (as read when the event is handled)."""
    if job is None:
        return UnknownJob()
    if not is_current(event, job):
        if is_late_success(event, job):
            assert event.fence is not None
            return LateSuccess(event.attempt, event.fence)
        # A RUNNING of an old attempt says nothing has ended; without a fence we cannot
        # tell which reservation's GPUs would be freed.
        ended = event.kind != EventKind.RUNNING and event.fence is not None
        return Stale(event.fence if ended else None)
    if event.kind == EventKind.RUNNING:
        fields = {}
        if event.log_path:
            fields[f"log:{event.node}"] = event.log_path
        if event.pid:
            fields[f"pid:{event.node}"] = str(event.pid)
        to_running = (f"process started on {event.node} (pid {event.pid})"
                      if job.state == JobState.LAUNCHING else None)
        return Started(fields, to_running)
    if event.kind == EventKind.LAUNCH_FAILED and (event.node in job.pids or event.node in job.exit_codes):
        # This node already reported the attempt started (or ended) here: a refusal now is a late or
        # replayed copy (an old launch written again), never a reason to requeue or fail the job.
        return Stale(None)
    if event.kind == EventKind.LAUNCH_FAILED and event.retryable:
        return LaunchRefused((event.node,), f"launch failed on {event.node}: {event.message}")
    if event.kind == EventKind.EXITED and event.cause == FENCED:
        # Its agent lost Redis long enough to expect this node declared dead and stopped the job
        # itself (frenzy.agent.fencing); the node was not, or not yet: run it again elsewhere.
        return LaunchRefused((event.node,), f"{event.node} lost contact with Redis and stopped the job (fenced)")
    cause = event.cause
    if event.kind == EventKind.LAUNCH_FAILED:
        # The command never ran. It is counted as exit 127 (the shell's "command not found"), but
        # the cause keeps the agent's words ("command not found: 'x'", "working directory ... does
        # not exist"): they become the job's reason, not the made-up exit code.
        code, reason = 127, f"launch failed on {event.node}: {event.message}"
        cause = cause or (f"{LAUNCH_FAILED}: {event.message}" if event.message else LAUNCH_FAILED)
    else:
        code = event.exit_code if event.exit_code is not None else -1
        reason = f"{event.node} exited with code {code}" + (" (cancelled)" if event.cancelled else "")
        if cause and cause not in ("cancelled", f"exit code {code}"):
            reason += f": {'out of memory' if cause == OOM else cause}"
        if event.exit_code is None and event.message:
            reason += f": {event.message}"
    failed = code != 0 and not event.cancelled
    # An out-of-memory exit is re-planned only while it is the attempt's first failure and no
    # cancel or stop is under way: then it is what ended the attempt.
    oom = (failed and cause == OOM and event.kind == EventKind.EXITED and not job.failed_node
           and not job.cancel_requested and not job.stop_requested and job.plan is not None)
    # One rank failed: the others are stopped so the job ends instead of hanging.
    return Exited(code, reason, told_to_stop=event.cancelled, stop_others=failed, cause=cause,
                  tail=tuple(event.tail), peak=event.peak_bytes_per_gpu, peak_measured=event.peak_measured, oom=oom)
