"""A ``JobRecord`` with only the fields a scheduler decision looks at, for tests without Redis."""

from __future__ import annotations

from frenzy.state.job_states import JobState
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2


def job_record(job_id: str, state: JobState = JobState.RUNNING, *, attempt: int = 1, fence: int = 7,
               placement: list[tuple[str, list[int]]] | None = None, master_node: str = "",
               master_port: int = 0) -> JobRecord:
    placement = placement if placement is not None else [("a", [0])]
    return JobRecord(
        id=job_id, state=state, seq=1, submitted_at=0.0, attempt=attempt, spec=types_pb2.JobSpec(), plans=[],
        model_name="m", parameter_count=0, plan=None, placement=placement, fence=fence, pending_reason="",
        cancel_requested=False, exit_codes={}, log_paths={}, master_node=master_node or placement[0][0],
        master_port=master_port,
    )
