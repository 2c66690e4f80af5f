"""The job state machine.

    PENDING ----------------> LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
       ^    (place_jobs.lua)      |           |
       +--------------------------+-----------+     requeue: the job's next attempt
    every state but a terminal one -> CANCELLED | FAILED | SUCCEEDED (the last only by a late
                                      success of the attempt a requeue ended)

PENDING jobs wait in the FIFO queue; LAUNCHING means the GPUs are held and the
launch commands are on the nodes' streams (one atomic script: the job's history
still records the reservation as a RESERVED entry before the LAUNCHING one);
RUNNING once an agent reports its process started. RESERVED, GPUs held and no
launch sent, is what the two-step path of earlier versions (reserve_gpus.lua,
then dispatch_job.lua) left between its scripts: no script enters it now. A job
an older scheduler left RESERVED is requeued when its node dies, or freed by a
cancel.

The transitions themselves happen inside Lua scripts (services/state/lua) so
the check and the write are one atomic step; this module is the single place
that names the states and which moves are legal. The scripts do not spell the names:
frenzy.state.scripts renders JobState, TERMINAL, ACTIVE and ALLOWED into them
at load (``JOB_STATE.running``, ``TERMINAL[state]``, ``ACTIVE[state]``,
``may_move(from, to)``), and every script writes a job's state through
``set_state``, which refuses a move ``ALLOWED`` does not list.
tests/integration/scheduler/test_state_machine.py drives every script that
writes a state from every state and fails on a move outside ``ALLOWED``.
"""

from __future__ import annotations

from enum import StrEnum

from frenzy.v1 import types_pb2


class JobState(StrEnum):
    PENDING = "PENDING"
    RESERVED = "RESERVED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    def to_proto(self) -> int:
        return int(types_pb2.JobState.Value(f"JOB_STATE_{self.value}"))

    @classmethod
    def from_proto(cls, value: int) -> JobState:
        name = types_pb2.JobState.Name(value)
        if name == "JOB_STATE_UNSPECIFIED":
            raise ValueError("job state is unspecified")
        return cls(name.removeprefix("JOB_STATE_"))


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# The states in which a job holds GPUs for a live attempt.
ACTIVE = frozenset({JobState.RESERVED, JobState.LAUNCHING, JobState.RUNNING})

ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({
        JobState.LAUNCHING,  # place_jobs.lua: reserved and launched in one step
        JobState.CANCELLED, JobState.FAILED,
        # finish_from_earlier_attempt.lua: the attempt a requeue ended was not lost after all (its
        # node was cut off, declared dead, and its copy ran to the end) and every node of it exited
        # 0, clean, under its fence, while the next attempt waits in the queue. The job has its
        # result: running it again would spend GPUs on work that is done and may overwrite outputs.
        JobState.SUCCEEDED,
    }),
    JobState.RESERVED: frozenset({JobState.PENDING, *TERMINAL}),  # (left by an older scheduler)
    # -> PENDING: requeue_job.lua, the next attempt (its nodes were lost, an agent refused the
    # launch, it ran out of memory, or HAS stopped it for shorter jobs)
    JobState.LAUNCHING: frozenset({JobState.RUNNING, JobState.PENDING, *TERMINAL}),
    JobState.RUNNING: frozenset({JobState.PENDING, *TERMINAL}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def sources_of(target: JobState) -> list[JobState]:
    """Every state from which ``target`` may be entered (for the transition script)."""
    return [s for s, dests in ALLOWED.items() if target in dests]
