"""What a tick's placements become: the launch each node of a job gets, rendered without I/O.

HAS decides which job goes on which GPUs (``has.schedule``); this module turns one such
``Placement`` into the ``LaunchMessage`` per node that the agents run, from what the queue read
already holds (the job's spec and stored plans) and what the cluster read holds (node
addresses, GPU uuids). The fence and the rendezvous port are inputs: the loop takes them before
the one ``place_jobs.lua`` call that reserves and launches the batch, because the messages are
signed before they are written (``frenzy.state.store.StateStore.place``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from frenzy.state.messages import LaunchMessage, LayoutEnv
from frenzy.v1 import types_pb2


@dataclass(frozen=True)
class Rendezvous:
    """Where a job's ranks meet: its first node's address and the port reserved there."""

    addr: str
    port: int


def layout_env(plan: types_pb2.Plan) -> LayoutEnv:
    """The parallel layout a launch carries (the agent exports it as FRENZY_* variables)."""
    lay = plan.layout
    return LayoutEnv(gpu_type=plan.gpu_type, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage,
                     micro_batch=lay.micro_batch, grad_accum=lay.grad_accum, recompute=lay.recompute or "none",
                     peak_bytes_per_gpu=max(0, int(plan.peak_bytes_per_gpu)))


def plan_from_stored(stored: Mapping[str, Any]) -> types_pb2.Plan:
    """A plan as the job hash stores it (``MessageToDict``), back as the message."""
    return json_format.ParseDict(stored, types_pb2.Plan(), ignore_unknown_fields=True)


def render_launches(job_id: str, attempt: int, fence: int, spec: types_pb2.JobSpec, plan: types_pb2.Plan,
                    nodes: Sequence[tuple[str, Sequence[int]]], meet: Rendezvous,
                    uuids: Mapping[str, Sequence[str]], user: str = "",
                    node_dead_after_s: float = 0.0) -> list[LaunchMessage]:
    """One unsigned launch per node of the placement, node rank in placement order.

    ``uuids``: each node's GPU uuids for the indices it gives (the agent checks them, so a GPU
    that took another's index is not used by mistake). ``user``: the job's submitter, which an
    agent with a user map turns into the Unix account the job runs as (signed with the rest).
    ``node_dead_after_s``: how long this scheduler waits for a silent node before it runs the node's
    jobs elsewhere; an agent cut off from Redis stops its copy before then."""
    layout = layout_env(plan)
    return [LaunchMessage(
        job_id=job_id, attempt=attempt, fence=fence, node=node, node_rank=rank, nnodes=len(nodes),
        nproc_per_node=len(idxs), gpu_indices=list(idxs), gpu_uuids=list(uuids.get(node, ())),
        master_addr=meet.addr, master_port=meet.port, rdzv_id=f"{job_id}-{attempt}", command=list(spec.command),
        env=dict(spec.env), workdir=spec.workdir or None, code_sha256=spec.code_sha256 or None, layout=layout,
        user=user, node_dead_after_s=node_dead_after_s,
    ) for rank, (node, idxs) in enumerate(nodes)]
