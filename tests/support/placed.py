"""For scheduler tests that play the agents: place a job's current attempt on node ``a`` and report
its events as that node's agent would (the loop handles them directly, no stream)."""

from __future__ import annotations

from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state.job_states import JobState
from frenzy.state.messages import AgentEvent, EventKind
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2
from has import Placement, PlanOption


def event(job: JobRecord, kind: EventKind, **kw: object) -> AgentEvent:
    """An event of ``job``'s current attempt from node ``a``, under its fence."""
    return AgentEvent(kind=kind, job_id=job.id, attempt=job.attempt, node="a", fence=job.fence, **kw)  # type: ignore[arg-type]


def place(loop: SchedulerLoop, job_id: str, nodes: list[tuple[str, list[int]]], plan_index: int = 0,
          read_queue: bool = True) -> tuple[bool, str]:
    """Place the job's current attempt on ``nodes`` (node, GPU indices) with its stored plan
    ``plan_index``, as a tick places what HAS chose: ``place_jobs.lua`` takes the GPUs and a port
    and publishes the signed launches in one step. ``read_queue``: read the queue first (a launch
    is rendered from what the last queue read saw; False: as the caller last read it, the job
    may have moved on since). -> (placed, why not)"""
    store = loop.store
    if read_queue:
        store.queue()
    job = store.get(job_id)
    assert job is not None
    plan = job.plans[plan_index]
    option = PlanOption(gpu_type=plan.gpu_type, tp=plan.layout.tp, pp=plan.layout.pp, dp=plan.layout.dp,
                        bytes_per_gpu=plan.peak_bytes_per_gpu,
                        runtime_s=plan.completion_s if plan.completion_s > 0 else None)
    placement = Placement(job_id=job_id, plan_index=plan_index, plan=option,
                          nodes=tuple((node, tuple(gpus)) for node, gpus in nodes))
    [(_, ok, why)] = loop._place([placement])  # noqa: SLF001 - the tick's own path, for a chosen placement
    return ok, why


def run_on(loop: SchedulerLoop, job_id: str, chosen: types_pb2.Plan, running: bool = True) -> JobRecord:
    """Place the job's current attempt on node a's first ``chosen.num_gpus`` GPUs with ``chosen`` (one of
    its stored plans); ``running``: and report it RUNNING (False: it stays LAUNCHING)."""
    job = loop.store.get(job_id)
    assert job is not None
    ok, why = place(loop, job_id, [("a", list(range(chosen.num_gpus)))], list(job.plans).index(chosen))
    assert ok, why
    job = loop.store.get(job_id)
    assert job is not None
    if running:
        loop.handle_event(event(job, EventKind.RUNNING, pid=100))
    job = loop.store.get(job_id)
    assert job is not None and job.state == (JobState.RUNNING if running else JobState.LAUNCHING)
    return job
