"""Frenzy's Python SDK: ``Client`` (and ``AsyncClient``) over the scheduler's gRPC API. See docs/sdk.md."""

from frenzy.sdk.aio import AsyncClient
from frenzy.sdk.client import Client
from frenzy.sdk.errors import (
    CannotSchedule,
    CodeError,
    FrenzyError,
    InvalidSpec,
    JobNotFound,
    NotAuthenticated,
    PermissionDenied,
    QuotaExceeded,
    SchedulerUnavailable,
    WaitTimeout,
)
from frenzy.sdk.models import Attempt, Job, Layout, Plan, Prediction, Transition

__all__ = ["AsyncClient", "Attempt", "CannotSchedule", "Client", "CodeError", "FrenzyError", "InvalidSpec", "Job",
           "JobNotFound", "Layout", "NotAuthenticated", "PermissionDenied", "Plan", "Prediction", "QuotaExceeded",
           "SchedulerUnavailable", "Transition", "WaitTimeout"]
