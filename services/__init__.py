"""Frenzy's services: the ``frenzy`` package (predictor, scheduler, agent, api, worker, CLI).

gRPC's fork handlers can deadlock a ``fork()`` made while its threads are running: the
process hangs inside ``fork`` in gRPC's pre-fork handler (grpc/grpc#17986, #37259; seen here
in an end-to-end test, ``subprocess.Popen`` with a ``preexec_fn`` in a process holding gRPC
channels). Every fork Frenzy makes is followed by ``exec`` (``subprocess``), which is the case
gRPC documents ``GRPC_ENABLE_FORK_SUPPORT=false`` for (its doc/fork_support.md), so it is set
here, before any Frenzy module imports grpc; an explicit setting by the user wins.

The SDK is re-exported here (``from frenzy import Client``), loaded on first use so that
importing a service module does not pull it in.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

_SDK_NAMES = ("Client", "AsyncClient", "Job", "Plan", "Layout", "Attempt", "Transition", "Prediction", "FrenzyError",
              "InvalidSpec", "CannotSchedule", "JobNotFound", "NotAuthenticated", "PermissionDenied", "QuotaExceeded",
              "SchedulerUnavailable", "CodeError", "WaitTimeout")


def __getattr__(name: str) -> object:
    if name == "__version__":  # pyproject's, from the installed metadata; read when asked (100 ms)
        from importlib import metadata

        try:
            return metadata.version("frenzy")
        except metadata.PackageNotFoundError:  # a source tree on sys.path without an install
            return "0+unknown"
    if name in _SDK_NAMES:
        from frenzy import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'frenzy' has no attribute {name!r}")
