"""The SDK's exceptions: one per kind of failure, each with the text the CLI prints for it.

A gRPC status becomes the ``FrenzyError`` subclass of its kind (``from_rpc``); the message is
``"<STATUS>: <the scheduler's words>"`` plus the same "To fix:" hint `frenzy` gives
(``describe``, which the CLI's error output uses too), so a script and a terminal read alike.
"""

from __future__ import annotations

import grpc

UNAVAILABLE_HINT = "\nTo fix: start the stack (`frenzy up`) or point --scheduler / FRENZY_SCHEDULER at it."


def describe(code: grpc.StatusCode, details: str | None) -> str:
    """What the CLI prints for a failed call: the status, the server's details, a hint where we know one."""
    hint = UNAVAILABLE_HINT if code == grpc.StatusCode.UNAVAILABLE else ""
    return f"{code.name}: {details or ''}{hint}"


class FrenzyError(Exception):
    """Any failure the SDK reports. ``code``: the gRPC status name ("" when the client itself found it)."""

    code: str = ""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class InvalidSpec(FrenzyError, ValueError):
    """Bad input: the message names the field (CLI exit code 2)."""

    code = "INVALID_ARGUMENT"


class CannotSchedule(FrenzyError):
    """The cluster cannot do it: no GPU type holds the job, the job already ended, ... (CLI exit code 3)."""

    code = "FAILED_PRECONDITION"


class JobNotFound(FrenzyError, LookupError):
    """No such job (CLI exit code 4)."""

    code = "NOT_FOUND"


class NotAuthenticated(FrenzyError):
    """No token, or one the scheduler does not know."""

    code = "UNAUTHENTICATED"


class PermissionDenied(FrenzyError):
    """The token's role may not do this, or the job is another user's."""

    code = "PERMISSION_DENIED"


class QuotaExceeded(FrenzyError):
    """A per-user limit (queued jobs, GPUs, submission rate, open streams)."""

    code = "RESOURCE_EXHAUSTED"


class SchedulerUnavailable(FrenzyError, ConnectionError):
    """The scheduler (or its state store) cannot be reached."""

    code = "UNAVAILABLE"


class CodeError(FrenzyError, ValueError):
    """The code directory cannot be packed (too big, empty, unreadable); the message names what and how to fix."""


class WaitTimeout(FrenzyError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out before the job ended."""

    code = "DEADLINE_EXCEEDED"


_BY_STATUS: dict[grpc.StatusCode, type[FrenzyError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSpec,
    grpc.StatusCode.FAILED_PRECONDITION: CannotSchedule,
    grpc.StatusCode.NOT_FOUND: JobNotFound,
    grpc.StatusCode.UNAUTHENTICATED: NotAuthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.UNAVAILABLE: SchedulerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: WaitTimeout,
}


def from_rpc(exc: grpc.RpcError) -> FrenzyError:
    """The SDK exception for a failed gRPC call (sync or asyncio)."""
    code = exc.code()  # type: ignore[attr-defined]
    details = exc.details()  # type: ignore[attr-defined]
    kind = _BY_STATUS.get(code, FrenzyError)
    return kind(describe(code, details), code.name)
