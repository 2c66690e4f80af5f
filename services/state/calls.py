"""What passes between the state store and its callers: a script call and how its reply reads,
a submission before and after its write, and one job's placement ready for ``place_jobs.lua``.
Plain frozen records (``frenzy.state.store`` re-exports them), so the pure parts of the scheduler
(``placing.py``) build them without the store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.commands.core import Script

    from frenzy.state.records import JobRecord
    from frenzy.v1 import types_pb2


@dataclass(frozen=True)
class ScriptCall:
    """One Lua script's keys and arguments, and how its reply reads (``StateStore.run_calls``)."""

    script: Script
    keys: list[str]
    args: list[Any]
    read: Callable[[Any], Any]


@dataclass(frozen=True)
class Submission:
    """A job about to be written (``StateStore.prepare_submission``)."""

    job_id: str
    at: float
    spec: types_pb2.JobSpec
    plans: list[types_pb2.Plan]
    fields: dict[str, str]
    history: str
    user: str


@dataclass(frozen=True)
class Submitted:
    """What a submission wrote: the job's id, whether an earlier job had its idempotency key, and
    (when new) the record as written."""

    job_id: str
    duplicate: bool
    record: JobRecord | None
    # Refused by the queued-jobs quota: how many the user has queued (nothing was written).
    over_quota: int | None = None


@dataclass(frozen=True)
class PlacementOrder:
    """One job's placement, ready for ``place_jobs.lua``: the launches are signed (JSON), so the
    fence and the port they name are chosen before the call and only checked in it."""

    job_id: str
    attempt: int
    fence: int
    nodes: tuple[tuple[str, tuple[int, ...]], ...]
    need_bytes: int
    port: int
    master_addr: str
    gpu_type: str
    plan_json: str
    messages: tuple[str, ...]  # one signed launch per node, same order as ``nodes``
    est_end: float | None = None
