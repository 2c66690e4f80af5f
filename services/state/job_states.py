"""The job state machine.

    PENDING -> RESERVED -> LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
       |          |            |
       +----------+------------+----> CANCELLED / FAILED

PENDING jobs wait in the FIFO queue; RESERVED means the GPUs are held (one
atomic script); LAUNCHING means the launch commands are on the nodes'
streams; RUNNING once an agent reports its process started. The transitions
themselves happen inside Lua scripts (services/state/lua) so the check and
the write are one atomic step; this module is the single place that names
the states and which moves are legal. The scripts do not spell the names:
frenzy.state.scripts renders JobState, TERMINAL and ACTIVE into them at load
(``JOB_STATE.running``, ``TERMINAL[state]``, ``ACTIVE[state]``).
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
    JobState.PENDING: frozenset({JobState.RESERVED, JobState.CANCELLED, JobState.FAILED}),
    JobState.RESERVED: frozenset({JobState.LAUNCHING, JobState.CANCELLED, JobState.FAILED, JobState.PENDING}),
    JobState.LAUNCHING: frozenset({JobState.RUNNING, *TERMINAL}),
    JobState.RUNNING: frozenset(TERMINAL),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def sources_of(target: JobState) -> list[JobState]:
    """Every state from which ``target`` may be entered (for the transition script)."""
    return [s for s, dests in ALLOWED.items() if target in dests]
