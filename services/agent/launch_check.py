"""Whether a launch may run on this node, decided without I/O from facts gathered beforehand.

The agent gathers ``LaunchFacts`` (its node name and GPUs, whether the rendezvous
port is taken on the host, who holds the launch's GPUs in Redis, where the
job's working directory really is and where working directories may be) and
``check_launch`` judges the launch against them. A job's env may not set what
Frenzy sets (``jobenv.RESERVED``), and its working directory must resolve
under one of the agent's ``--workdir-root`` directories. A refusal says why, and whether
the scheduler may retry the job elsewhere (the host's fault) or not (the launch
itself is wrong or stale).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from frenzy.agent import jobenv
from frenzy.state.messages import LaunchMessage


@dataclass(frozen=True)
class GpuHolder:
    """Who holds one GPU in Redis: the job id and the fence of its reservation (None when unset)."""

    owner: str | None
    fence: str | None


@dataclass(frozen=True)
class LaunchFacts:
    node: str  # this agent's node
    gpu_uuids: Mapping[int, str]  # this node's GPUs: index -> UUID ("" when unknown)
    port_busy: bool  # the launch's rendezvous port is bound on this host (only asked of the master)
    holders: Mapping[int, GpuHolder] | None  # the launch's GPUs as Redis has them; None: not verified
    workdir: str | None = None  # the launch's working directory, symlinks resolved; None: none given
    workdir_roots: tuple[str, ...] = ()  # resolved directories a working directory must lie in


@dataclass(frozen=True)
class LaunchVerdict:
    problem: str | None  # why the launch must not run here; None: it may
    retryable: bool = False  # a retry on other nodes could work

    @property
    def ok(self) -> bool:
        return self.problem is None


def opens_rendezvous(msg: LaunchMessage) -> bool:
    """This node hosts the rendezvous of a multi-node launch, so its port must be free here."""
    return msg.node_rank == 0 and msg.nnodes > 1


def check_launch(msg: LaunchMessage, facts: LaunchFacts) -> LaunchVerdict:
    """Judge ``msg`` against ``facts``; the first problem found wins."""
    node = facts.node
    if msg.node != node:
        return LaunchVerdict(f"launch addressed to node {msg.node!r} arrived at node {node!r}")
    reserved = jobenv.reserved_in(msg.env)
    if reserved:
        return LaunchVerdict(f"the job's env sets {', '.join(reserved)}, which Frenzy sets for every job itself "
                             "(reserved: FRENZY_*, PET_*, " + ", ".join(sorted(jobenv.RESERVED)) + ")")
    bad = jobenv.bad_names_in(msg.env)
    if bad:
        return LaunchVerdict(f"the job's env has {', '.join(map(repr, bad))}, which no process environment can "
                             "hold (a name with '=' or NUL, or a value with NUL)")
    if facts.workdir is not None and not any(under(facts.workdir, root) for root in facts.workdir_roots):
        roots = ", ".join(facts.workdir_roots) or "none"
        return LaunchVerdict(f"working directory {msg.workdir!r} (resolved: {facts.workdir}) is outside the "
                             f"directories jobs may run in on node {node} ({roots}); the node's operator can "
                             "allow more with the agent's --workdir-root")
    have = facts.gpu_uuids
    missing = [i for i in msg.gpu_indices if i not in have]
    if missing:
        return LaunchVerdict(f"GPU index(es) {missing} do not exist on node {node} (it has {sorted(have)})")
    # Indices can shift (a GPU removed, a reboot); the UUID is the GPU the scheduler reserved.
    for i, want in zip(msg.gpu_indices, msg.gpu_uuids, strict=False):
        if want and have[i] and want != have[i]:
            return LaunchVerdict(f"GPU {i} on node {node} is {have[i]}, but the launch expects {want}")
    if opens_rendezvous(msg) and facts.port_busy:
        # Frenzy never gives one port to two live jobs of a node, so this is a
        # foreign process; torchrun would fail with a less helpful message.
        return LaunchVerdict(f"rendezvous port {msg.master_port} on node {node} is in use by a process Frenzy did "
                             "not start (choose a scheduler --master-ports range that other services do not use)",
                             retryable=True)
    if facts.holders is None:
        return LaunchVerdict(None)
    # The reservation wrote owner + fence on every GPU. If they differ, the GPUs
    # were released and given to someone else after this launch was sent (e.g.
    # it waited in the stream while the agent was down): running it would
    # double-book them.
    for i in msg.gpu_indices:
        held = facts.holders.get(i, GpuHolder(None, None))
        if held.owner != msg.job_id or held.fence != str(msg.fence):
            return LaunchVerdict(f"stale launch: GPU {i} is held by {held.owner or 'nobody'!r} with fence "
                                 f"{held.fence}, but this launch is for job {msg.job_id!r} with fence {msg.fence}")
    return LaunchVerdict(None)


def under(path: str, root: str) -> bool:
    """``path`` is ``root`` or inside it (both absolute and already resolved)."""
    return os.path.commonpath([path, root]) == root
