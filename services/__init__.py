"""Frenzy's services: the ``frenzy`` package (predictor, scheduler, agent, api, worker, CLI).

gRPC's fork handlers can deadlock a ``fork()`` made while its threads are running: the
process hangs inside ``fork`` in gRPC's pre-fork handler (grpc/grpc#17986, #37259; seen here
in an end-to-end test, ``subprocess.Popen`` with a ``preexec_fn`` in a process holding gRPC
channels). Every fork Frenzy makes is followed by ``exec`` (``subprocess``), which is the case
gRPC documents ``GRPC_ENABLE_FORK_SUPPORT=false`` for (its doc/fork_support.md), so it is set
here, before any Frenzy module imports grpc; an explicit setting by the user wins.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
