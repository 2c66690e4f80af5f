"""Real predictor and scheduler gRPC servers on loopback, in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.server import stop_server
from frenzy.scheduler.service import SchedulerServer
from frenzy.v1 import scheduler_pb2_grpc


@dataclass
class Servers:
    scheduler: SchedulerServer
    scheduler_addr: str
    predictor_addr: str
    stub: scheduler_pb2_grpc.SchedulerStub


@contextmanager
def running_servers(redis_url: str, prefix: str, tick_s: float = 0.05) -> Iterator[Servers]:
    pserver, pport, phealth = serve_predictor("127.0.0.1:0")
    paddr = f"127.0.0.1:{pport}"
    sched = SchedulerServer(redis_url, paddr, "127.0.0.1:0", prefix=prefix, tick_s=tick_s)
    saddr = f"127.0.0.1:{sched.port}"
    channel = grpc.insecure_channel(saddr)
    try:
        yield Servers(sched, saddr, paddr, scheduler_pb2_grpc.SchedulerStub(channel))
    finally:
        channel.close()
        sched.stop()
        stop_server(pserver, phealth, grace_s=0.5)
