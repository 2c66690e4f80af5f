"""Whether a launch may run on this node, decided without I/O from facts gathered beforehand.

The agent gathers ``LaunchFacts`` (its node name and GPUs, whether the rendezvous
port is taken on the host, who holds the launch's GPUs in Redis, where the
job's working directory really is and where working directories may be) and
``check_launch`` judges the launch against them. A job's env may not set what
Frenzy sets (``jobenv.RESERVED``), and its working directory must resolve
under one of the agent's ``--workdir-root`` directories. A refusal says why, and whether
the scheduler may retry the job elsewhere (the host's fault) or not (the launch
itself is wrong). ``report_unusable`` decides which entries the agent cannot even read
as a launch (a seal that does not verify, a launch it cannot parse) it still answers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from frenzy.agent import jobenv
from frenzy.state.messages import LaunchMessage, is_safe_name
from frenzy.state.signing import Refusal


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
    # Seconds since the last heartbeat Redis took, and after how many this launch's job would be
    # stopped here (``fencing.fence_deadline_s``; None: never): a node that would fence the job at
    # once does not start it.
    silent_s: float = 0.0
    fence_after_s: float | None = None


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
    if facts.fence_after_s is not None and facts.silent_s >= facts.fence_after_s:
        return LaunchVerdict(f"node {node} has had no heartbeat reach Redis for {facts.silent_s:.1f}s and stops its "
                             f"jobs after {facts.fence_after_s:.1f}s (it may be declared dead): not starting one here",
                             retryable=True)
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
            # Retryable: for a job that moved on the scheduler drops the refusal as stale; for its live
            # attempt (the GPUs rewritten around the scripts) it requeues rather than fails the job.
            return LaunchVerdict(f"stale launch: GPU {i} is held by {held.owner or 'nobody'!r} with fence "
                                 f"{held.fence}, but this launch is for job {msg.job_id!r} with fence {msg.fence}",
                                 retryable=True)
    return LaunchVerdict(None)


@dataclass(frozen=True)
class RefusalReport:
    """What the agent tells the scheduler about a launch-stream entry it will not act on, as its own
    node (the event is sealed with this node's key and names this node, never the entry's)."""

    job_id: str
    attempt: int
    fence: int | None
    message: str
    retryable: bool = True


def report_unusable(obj: Mapping[str, Any], refusal: Refusal | None, problem: str, node: str,
                    running: Iterable[tuple[str, int]] = ()) -> RefusalReport | None:
    """Whether to report a launch-stream entry the agent refuses before judging it as a launch, and what.

    ``refusal``: its seal's verdict (None: the seal is good and ``problem`` says why the entry cannot be
    read as a launch). Only an entry the scheduler sealed for this node is reported: one that is
    unsigned, forged or signed with another key was not written by the scheduler, and answering it
    would let whoever wrote it fail or requeue any job by naming it; a replay is a copy of an entry
    already handled. An *expired* one is the scheduler's (its seal verifies): written too late (the
    scheduler's clock behind Redis's, or an old entry written again). A replayed copy of an old launch
    can name a live attempt, so nothing is reported for an attempt running here, and the scheduler
    drops a refusal from a node that already reported that attempt started (``agent_events``).
    Only launches are answered (a cancel that cannot be read stops nothing: the job's own exit or its
    node's loss ends it)."""
    if refusal not in (None, Refusal.EXPIRED) or obj.get("kind") != "launch":
        return None
    job_id, attempt, fence = obj.get("job_id"), obj.get("attempt"), obj.get("fence")
    if not isinstance(job_id, str) or not is_safe_name(job_id):
        return None
    if type(attempt) is not int or attempt < 1:  # (bool is an int; not an attempt)
        return None
    if (job_id, attempt) in set(running):
        return None
    if type(fence) is not int or fence < 0:
        fence = None
    if refusal == Refusal.EXPIRED:
        message = (f"node {node} refused the launch: its seal expired before Redis took it (expires_at "
                   f"{obj.get('expires_at')}): the scheduler's clock may be behind Redis's by more than the "
                   "launch's lifetime, or an old launch was written again")
    else:
        message = (f"node {node}'s agent cannot read the launch ({problem}): is it older than the scheduler? "
                   "Upgrade the agent")
    return RefusalReport(job_id, attempt, fence, message[:1024])


def under(path: str, root: str) -> bool:
    """``path`` is ``root`` or inside it (both absolute and already resolved)."""
    return os.path.commonpath([path, root]) == root
