"""Shared by the agent integration tests: start agents in threads on a real Redis and play the scheduler.

Each test runs ``Agent.run`` in a thread with fake GPUs and short timings, and
waits on Redis with deadlines (never an unbounded loop).
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import redis

from frenzy.agent import launcher
from frenzy.agent.daemon import Agent
from frenzy.agent.gpus import FakeBackend, GpuBackend
from frenzy.state import node_keys
from frenzy.state.keys import AGENT_GROUP, Keys
from frenzy.state.messages import (
    AgentEvent,
    CancelMessage,
    EventKind,
    LaunchMessage,
    LayoutEnv,
    encode,
    event_from,
    payload,
    sealed,
)
from support.waiting import wait_for  # noqa: F401 - re-exported for the tests

NODE = "n1"
SPEC = "A100-80GB:2,L4:1"
FAST = dict(heartbeat_s=0.2, ttl_s=2.0, block_s=0.05, cancel_grace_s=3.0)
SLEEPER = [sys.executable, "-c", "import time; print('sleeping', flush=True); time.sleep(60)"]


@dataclass
class Running:
    agent: Agent
    stop: threading.Event
    thread: threading.Thread

    def halt(self, timeout: float = 10.0) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "agent did not stop in time"


class Cluster:
    """One test's Redis view plus helpers to start agents and talk to them like the scheduler."""

    def __init__(self, url: str, client: redis.Redis, keys: Keys, tmp: Path) -> None:
        self.url, self.client, self.keys, self.log_dir = url, client, keys, tmp / "logs"
        self.agents: list[Running] = []

    def start(self, node: str = NODE, spec: str = SPEC, wait: bool = True, backend: GpuBackend | None = None,
              **overrides) -> Running:
        opts = {**FAST, **overrides}
        self.node_key(node)
        agent = Agent(self.url, node, backend or FakeBackend(spec, node), keys=self.keys, log_dir=self.log_dir,
                      **opts)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        running = Running(agent, stop, thread)
        self.agents.append(running)
        if wait:
            wait_for(agent.ready.is_set, what="agent ready")
        return running

    # scheduler side
    def reserve(self, job_id: str, fence: int, indices: list[int], node: str = NODE) -> None:
        for i in indices:
            self.client.hset(self.keys.gpu(node, i), mapping={"owner": job_id, "fence": str(fence)})

    def node_key(self, node: str = NODE) -> bytes:
        """``node``'s current signing key, made first if it has none (as `frenzy node key create`)."""
        node_keys.create(self.client, self.keys, node)
        ring = node_keys.read(self.client, self.keys, node)
        assert ring is not None
        return ring.current

    def send(self, msg: LaunchMessage | CancelMessage | dict, node: str = NODE, key: bytes | None = None) -> str:
        """XADD ``msg`` to ``node``'s launch stream, signed as the scheduler signs it (with ``key``,
        default the node's own); a dict is sent as the entry's fields, untouched."""
        if isinstance(msg, dict):
            fields = msg
        else:
            fields = encode(sealed(msg, key if key is not None else self.node_key(node)))
        return self.client.xadd(self.keys.launch_stream(node), fields)

    def launch(self, job_id: str, command: list[str], indices: list[int] | None = None, fence: int = 1,
               reserve: bool = True, at: str = NODE, **fields) -> LaunchMessage:
        """Reserve ``indices`` of node ``at`` and send its agent a launch (addressed to ``fields['node']``,
        default ``at``)."""
        indices = [0, 1] if indices is None else indices
        msg = LaunchMessage(
            job_id=job_id, attempt=fields.pop("attempt", 1), fence=fence, node=fields.pop("node", at),
            node_rank=fields.pop("node_rank", 0), nnodes=fields.pop("nnodes", 1), nproc_per_node=len(indices),
            gpu_indices=indices, gpu_uuids=fields.pop("gpu_uuids", [f"GPU-fake-{NODE}-{i}" for i in indices]),
            master_addr="127.0.0.1", master_port=fields.pop("master_port", 29500),
            rdzv_id=f"{job_id}-1", command=command,
            layout=fields.pop("layout", None) or LayoutEnv(gpu_type="A100-80GB", tp=2, pp=1, dp=1, zero_stage=0,
                                                           micro_batch=1, grad_accum=1),
            **fields,
        )
        if reserve:
            self.reserve(job_id, fence, indices, node=at)
        self.send(msg, node=at)
        return msg

    def events(self, job_id: str | None = None) -> list[AgentEvent]:
        out = [event_from(payload(f)) for _id, f in self.client.xrange(self.keys.events_stream())]
        return [e for e in out if job_id is None or e.job_id == job_id]

    def wait_event(self, job_id: str, kind: EventKind, timeout: float = 10.0) -> AgentEvent:
        def find() -> AgentEvent | None:
            return next((e for e in self.events(job_id) if e.kind == kind), None)

        return wait_for(find, timeout, f"{kind} event of {job_id}")  # type: ignore[return-value]

    def close(self) -> None:
        """Stop every agent this cluster started and kill whatever their jobs left: no job may
        outlive its test."""
        for running in self.agents:
            running.stop.set()
        for running in self.agents:
            running.thread.join(10)
        for e in self.events():
            if e.kind == EventKind.RUNNING and e.pid:
                launcher.signal_group(e.pid, signal.SIGKILL)
                launcher.kill_launch(f"{self.keys.prefix}/{e.node}/{e.job_id}/{e.attempt}", signal.SIGKILL)

    def pending(self, node: str = NODE) -> int:
        return int(self.client.xpending(self.keys.launch_stream(node), AGENT_GROUP)["pending"])
