"""For scheduler tests that play the agents: place a job's current attempt on node ``a`` and report
its events as that node's agent would (the loop handles them directly, no stream)."""

from __future__ import annotations

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.store import JobRecord
from frenzy.v1 import types_pb2
from has import Placement, PlanOption


def event(job: JobRecord, kind: EventKind, **kw: object) -> AgentEvent:
    """An event of ``job``'s current attempt from node ``a``, under its fence."""
    return AgentEvent(kind=kind, job_id=job.id, attempt=job.attempt, node="a", fence=job.fence, **kw)  # type: ignore[arg-type]


def run_on(loop: SchedulerLoop, job_id: str, chosen: types_pb2.Plan, running: bool = True) -> JobRecord:
    """Place the job's current attempt on node a's first ``chosen.num_gpus`` GPUs and dispatch it;
    ``running``: and report it RUNNING (False: it stays LAUNCHING)."""
    store = loop.store
    gpus = tuple(range(chosen.num_gpus))
    placement = Placement(job_id=job_id, plan_index=0, nodes=(("a", gpus),),
                          plan=PlanOption(gpu_type=chosen.gpu_type, tp=1, pp=1, dp=chosen.num_gpus,
                                          bytes_per_gpu=chosen.peak_bytes_per_gpu))
    ok, fence = store.reserve(placement, chosen, loop.master_ports)
    assert ok, fence
    job = store.get(job_id)
    assert job is not None
    assert store.dispatch(job_id, int(fence), loop.launch_messages(job, int(fence)))[0]
    if running:
        loop.handle_event(event(job, EventKind.RUNNING, pid=100))
    job = store.get(job_id)
    assert job is not None and job.state == (JobState.RUNNING if running else JobState.LAUNCHING)
    return job
