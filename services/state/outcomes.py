"""What a state-changing script did, as typed values (like kueue's entry statuses): the store
returns these, never a ``(bool, str)`` pair whose meaning each caller has to remember. Pure; the
store decodes each script's reply with the ``of`` constructors here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from frenzy.state.job_states import JobState


def _state(raw: Any) -> JobState | None:
    """A script's state field: None where the job does not exist ("missing", or a nil read)."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return JobState(text) if text in JobState._value2member_map_ else None


@dataclass(frozen=True, slots=True)
class Moved:
    """A transition, requeue or cancel request: ``done`` when the script acted, and the job's state
    after it (None: no such job) -- for a transition that was done, the state it moved to; for a
    requeue, PENDING (its next attempt) or FAILED (at its limit); for a cancel request, the state
    the job is stopping from; when not done, the state that refused it."""

    done: bool
    state: JobState | None

    @classmethod
    def of(cls, reply: Any) -> Moved:
        """From a reply ``{done, state now}`` (``requeue_job.lua``, ``request_cancel.lua``)."""
        return cls(int(reply[0]) == 1, _state(reply[1]))

    @classmethod
    def to(cls, target: JobState) -> Callable[[Any], Moved]:
        """The reader of ``transition_job.lua``'s ``{moved, state found}``: a move that was made
        leaves the job in ``target``."""
        return lambda reply: cls(True, target) if int(reply[0]) == 1 else cls(False, _state(reply[1]))


class ExitStatus(StrEnum):
    """What ``record_exit.lua`` did with one node's exit."""

    IGNORED = "ignored"  # not the job's current attempt, the node counted already, or the job ended
    RECORDED = "recorded"  # counted; other nodes of the attempt are still running
    FINISHED = "finished"  # the last node: the job ended (``ExitCounted.state``)


class LateStatus(StrEnum):
    """What ``finish_from_earlier_attempt.lua`` did with a late exit 0 of a requeued attempt."""

    IGNORED = "ignored"  # not that attempt's fence or node, or the job ended
    RECORDED = "recorded"  # counted; other nodes of that attempt have not reported theirs
    RETRY = "retry"  # the job moved on since the caller read it: read it again
    FINISHED = "finished"  # every node of it succeeded: the job is SUCCEEDED


@dataclass(frozen=True, slots=True)
class ExitCounted:
    """``record_exit.lua``'s answer: what it did and the job's state after it (None: no such job)."""

    status: ExitStatus
    state: JobState | None

    @classmethod
    def of(cls, reply: Any) -> ExitCounted:
        return cls(ExitStatus(str(reply[0])), _state(reply[1]))


@dataclass(frozen=True, slots=True)
class LateCounted:
    """``finish_from_earlier_attempt.lua``'s answer: what it did and the job's state after it."""

    status: LateStatus
    state: JobState | None

    @classmethod
    def of(cls, reply: Any) -> LateCounted:
        return cls(LateStatus(str(reply[0])), _state(reply[1]))


@dataclass(frozen=True, slots=True)
class PlaceOutcome:
    """One job of a ``place_jobs.lua`` batch: reserved and launched, or why not (nothing written)."""

    placed: bool
    why: str = ""
