"""Real predictor and scheduler gRPC servers on loopback, in this process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from frenzy.auth.roles import Role
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.auth import with_token
from frenzy.rpc.server import stop_server
from frenzy.scheduler.service import SchedulerServer, UserQuotas
from frenzy.v1 import scheduler_pb2_grpc


@dataclass
class Servers:
    scheduler: SchedulerServer
    scheduler_addr: str
    predictor_addr: str
    stub: scheduler_pb2_grpc.SchedulerStub
    token: str  # an admin token the stub carries

    def stub_for(self, token: str | None) -> scheduler_pb2_grpc.SchedulerStub:
        """A stub calling with another token (or none)."""
        channel = with_token(grpc.insecure_channel(self.scheduler_addr), token)
        self._channels.append(channel)
        return scheduler_pb2_grpc.SchedulerStub(channel)

    _channels: list = field(default_factory=list)


@contextmanager
def running_servers(redis_url: str, prefix: str, tick_s: float = 0.05,
                    quotas: UserQuotas | None = None) -> Iterator[Servers]:
    pserver, pport, phealth = serve_predictor("127.0.0.1:0")
    paddr = f"127.0.0.1:{pport}"
    sched = SchedulerServer(redis_url, paddr, "127.0.0.1:0", prefix=prefix, tick_s=tick_s, quotas=quotas)
    saddr = f"127.0.0.1:{sched.port}"
    token, _ = sched.tokens.create("test-admin", Role.ADMIN)
    channel = with_token(grpc.insecure_channel(saddr), token)
    servers = Servers(sched, saddr, paddr, scheduler_pb2_grpc.SchedulerStub(channel), token)
    # In-process CLI calls (typer's CliRunner) find the token as a user's shell would.
    saved = os.environ.get("FRENZY_TOKEN")
    os.environ["FRENZY_TOKEN"] = token
    try:
        yield servers
    finally:
        if saved is None:
            os.environ.pop("FRENZY_TOKEN", None)
        else:
            os.environ["FRENZY_TOKEN"] = saved
        channel.close()
        for other in servers._channels:
            other.close()
        sched.stop()
        stop_server(pserver, phealth, grace_s=0.5)
