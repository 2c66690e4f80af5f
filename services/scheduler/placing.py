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
from fractions import Fraction
from typing import Any

from google.protobuf import json_format

from frenzy.state.messages import LaunchMessage, LayoutEnv
from frenzy.train import contract
from frenzy.train.contract import RankContract
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


def rank_contracts(plan: types_pb2.Plan, parts: Sequence[int]) -> list[RankContract]:
    """The launch contract of one node's ranks of a mixed plan, in local-rank order: ``parts`` is
    the plan part (``has.PlanPart``: a stage's GPUs of one type, the plan's stages' shares in order)
    each GPU runs. A rank's share of the global batch is its local batch over the global batch the
    plan's ranks add up to (a data-parallel rank is a TP group: its GPUs share their batch)."""
    flat = [(st, share) for st in plan.stages for share in st.shares]
    # the global batch: the first stage's data-parallel ranks' local batches (every stage's agree)
    first = plan.stages[0]
    batch = sum((s.gpus // first.tp) * s.micro_batch * s.grad_accum for s in first.shares)
    out = []
    for k in parts:
        st, share = flat[k]
        out.append(RankContract(stage=st.index, first_layer=st.first_layer, last_layer=st.last_layer,
                                local_micro_batch=share.micro_batch, local_grad_accum=share.grad_accum,
                                loss_scale=Fraction(share.micro_batch * share.grad_accum, batch)))  # fmt: skip
    return out


def node_layout(plan: types_pb2.Plan, parts: Sequence[int]) -> LayoutEnv:
    """``layout_env`` for one node of a mixed plan: its ranks' contract (``contract.render``) and the
    most any of its ranks is predicted to hold."""
    flat = [share for st in plan.stages for share in st.shares]
    return layout_env(plan).model_copy(update={
        "contract": contract.render(rank_contracts(plan, parts)),
        "peak_bytes_per_gpu": max(int(flat[k].peak_bytes) for k in parts),
    })  # fmt: skip


def plan_from_stored(stored: Mapping[str, Any]) -> types_pb2.Plan:
    """A plan as the job hash stores it (``MessageToDict``), back as the message."""
    return json_format.ParseDict(stored, types_pb2.Plan(), ignore_unknown_fields=True)


def render_launches(job_id: str, attempt: int, fence: int, spec: types_pb2.JobSpec, plan: types_pb2.Plan,
                    nodes: Sequence[tuple[str, Sequence[int]]], meet: Rendezvous,
                    uuids: Mapping[str, Sequence[str]], user: str = "",
                    node_dead_after_s: float = 0.0, parts: Sequence[Sequence[int]] = ()) -> list[LaunchMessage]:
    """One unsigned launch per node of the placement, node rank in placement order.

    ``uuids``: each node's GPU uuids for the indices it gives (the agent checks them, so a GPU
    that took another's index is not used by mistake). ``user``: the job's submitter, which an
    agent with a user map turns into the Unix account the job runs as (signed with the rest).
    ``node_dead_after_s``: how long this scheduler waits for a silent node before it runs the node's
    jobs elsewhere; an agent cut off from Redis stops its copy before then. ``parts``: a mixed plan's
    placement's (``has.Placement.parts``), per node the plan part each GPU runs; each node's layout
    then carries its ranks' launch contract (docs/mixed-plans.md)."""
    layouts = [node_layout(plan, p) for p in parts] if plan.stages else [layout_env(plan)] * len(nodes)
    if len(layouts) != len(nodes):
        raise ValueError(f"a mixed plan's placement names the parts of {len(layouts)} nodes, not {len(nodes)}")
    return [LaunchMessage(
        job_id=job_id, attempt=attempt, fence=fence, node=node, node_rank=rank, nnodes=len(nodes),
        nproc_per_node=len(idxs), gpu_indices=list(idxs), gpu_uuids=list(uuids.get(node, ())),
        master_addr=meet.addr, master_port=meet.port, rdzv_id=f"{job_id}-{attempt}", command=list(spec.command),
        env=dict(spec.env), workdir=spec.workdir or None, code_sha256=spec.code_sha256 or None,
        layout=layouts[rank], user=user, node_dead_after_s=node_dead_after_s,
    ) for rank, (node, idxs) in enumerate(nodes)]
