"""A launch the agent does not start is answered at once (issue 37): the job leaves LAUNCHING within a
couple of seconds, requeued (the host's fault) or FAILED (the job's) with the agent's reason -- not
left there until its node dies.

End to end on a real Redis: a real agent (fake GPUs) reads the launches the scheduler's own placement
path (``place_jobs.lua``) wrote and signed, and the scheduler loop consumes the agent's events. Each
case makes one refusal happen; what the scheduler seals is changed through ``StateStore.seal_for``
where the case is about the seal. What the scheduler did not seal (forged) or already had handled
(a replayed copy) is *not* answered: answering would act for whoever wrote it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from integration.agent.agent_cluster import NODE, SLEEPER, Cluster, wait_for

from frenzy.agent.spawning import SpawnerFailed
from frenzy.scheduler.loop import SchedulerLoop
from frenzy.state import signing
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import LaunchMessage, sealed
from frenzy.state.records import JobRecord
from frenzy.v1 import types_pb2
from support.placed import place
from support.state import GiB, make_plan, make_spec

ANSWER_WITHIN_S = 2.0  # the reaper would take the node's death (never, for a live node)


@pytest.fixture
def loop(redis_client: redis.Redis, keys: Keys) -> SchedulerLoop:
    # dead_after_s 5: the launches tell the agent so; with its 0.2 s heartbeat, 2 s lease and 3 s grace
    # it would stop a job after 2 s without a heartbeat (fencing.fence_deadline_s).
    return SchedulerLoop(redis_client, keys, dead_after_s=5.0, max_attempts=3, master_ports=(30200, 30203))


class _Raw:
    """What ``seal_for`` returns, for a launch the test writes as JSON of its own."""

    def __init__(self, text: str) -> None:
        self.text = text

    def model_dump_json(self) -> str:
        return self.text


def _submit_and_place(loop: SchedulerLoop, spec: types_pb2.JobSpec, user: str = "") -> str:
    job_id, _ = loop.store.submit(spec, [make_plan("A100-80GB", peak=10 * GiB)], "gpt2-124m", 1, max_attempts=3,
                                  user=user)
    ok, why = place(loop, job_id, [(NODE, [0])])
    assert ok, why
    return job_id


def _until_not_launching(loop: SchedulerLoop, job_id: str, timeout: float = 10.0) -> tuple[JobRecord, float]:
    """Drive the scheduler's event consumer until the job leaves LAUNCHING. -> (job, seconds it took)"""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        loop.drain_events(block_ms=50)
        job = loop.store.get(job_id)
        assert job is not None
        if job.state != JobState.LAUNCHING:
            return job, time.monotonic() - start
    raise AssertionError(f"job {job_id} still LAUNCHING after {timeout} s")


@dataclass
class Case:
    """One way an agent refuses a launch: how to make it happen, and what the job must become."""

    arrange: Callable[[Cluster, SchedulerLoop, pytest.MonkeyPatch, Path], tuple[types_pb2.JobSpec, str]]
    state: JobState
    reason: str  # in the job's last history entry
    agent_opts: dict = field(default_factory=dict)


def _plain(*_args: object) -> tuple[types_pb2.JobSpec, str]:
    spec = make_spec("refused")
    spec.command[:] = SLEEPER
    return spec, ""


def _expired(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    # The scheduler's clock far behind Redis's: its launches expire before Redis takes them.
    def seal(node: str, msg: LaunchMessage) -> LaunchMessage:
        return sealed(msg, cluster.node_key(node), now=time.time() - 10 * signing.LAUNCH_TTL_S)

    mp.setattr(loop.store, "seal_for", seal)
    return _plain()


def _unreadable(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    # A newer scheduler's launch, with a field this agent does not know: signed, but not readable here.
    def seal(node: str, msg: LaunchMessage) -> _Raw:
        obj = {**msg.model_dump(mode="json"), "placement_group": "rack-7"}
        return _Raw(json.dumps(signing.seal(obj, cluster.node_key(node), time.time(), signing.LAUNCH_TTL_S)))

    mp.setattr(loop.store, "seal_for", seal)
    return _plain()


def _stale_fence(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    # The GPU's owner and fence rewritten around the scripts before the agent checks them.
    agent = cluster.agents[-1].agent
    real = agent._gpu_holders  # noqa: SLF001

    def rewritten(indices: list[int]):
        cluster.client.hset(cluster.keys.gpu(NODE, 0), "fence", "999")
        return real(indices)

    mp.setattr(agent, "_gpu_holders", rewritten)
    return _plain()


def _cut_off(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    # Heartbeats time out (a lossy link) while the launch stream still reads: the node would stop the job
    # at once, so it does not start it. (The node's lease, renewed a moment ago, still lets it be placed.)
    agent = cluster.agents[-1].agent

    def hangs() -> None:
        raise redis.TimeoutError("Timeout reading from socket")

    mp.setattr(agent, "_heartbeat_once", hangs)
    agent._beat_ok_at = time.monotonic() - 10  # noqa: SLF001
    return _plain()


def _spawn_fails(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    agent = cluster.agents[-1].agent

    def fails(*_a: object, **_k: object) -> None:
        raise SpawnerFailed("the spawner failed while starting the job; it may be retried")

    mp.setattr(agent._spawner, "spawn", fails)  # noqa: SLF001
    return _plain()


def _agent_bug(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    agent = cluster.agents[-1].agent

    def breaks(_msg: LaunchMessage) -> None:
        raise KeyError("oops")

    mp.setattr(agent, "_user_for", breaks)
    return _plain()


def _unmapped_user(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    spec, _ = _plain()
    return spec, "mallory"


def _workdir_outside(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    spec, _ = _plain()
    spec.workdir = "/etc"
    return spec, ""


def _code_missing(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    spec, _ = _plain()
    spec.code_sha256 = "ab" * 32  # never uploaded (or expired)
    return spec, ""


def _not_found(cluster: Cluster, loop: SchedulerLoop, mp: pytest.MonkeyPatch, tmp: Path):
    spec, _ = _plain()
    spec.command[:] = ["no-such-command-here"]
    return spec, ""


def _user_map(tmp: Path) -> dict:
    path = tmp / "users"
    path.write_text("# nobody mapped\n")
    return {"user_map": str(path)}


CASES = {
    "expired seal": Case(_expired, JobState.PENDING, "its seal expired before Redis took it"),
    "unreadable launch": Case(_unreadable, JobState.PENDING, "cannot read the launch"),
    "fence mismatch": Case(_stale_fence, JobState.PENDING, "stale launch: GPU 0 is held by"),
    "cut off (self-fencing)": Case(_cut_off, JobState.PENDING, "has had no heartbeat reach Redis"),
    "spawn failure": Case(_spawn_fails, JobState.PENDING, "the spawner failed while starting the job"),
    "agent error": Case(_agent_bug, JobState.PENDING, "agent error on node n1: KeyError"),
    "user map refusal": Case(_unmapped_user, JobState.FAILED, "user 'mallory' has no Unix account on node n1"),
    "workdir refusal": Case(_workdir_outside, JobState.FAILED, "is outside the directories jobs may run in"),
    "code fetch failure": Case(_code_missing, JobState.FAILED, "the job's code could not be unpacked on node n1"),
    "command not found": Case(_not_found, JobState.FAILED, "command not found: 'no-such-command-here'"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_refused_launch_leaves_launching_at_once(name: str, cluster: Cluster, loop: SchedulerLoop,
                                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    case = CASES[name]
    if name == "user map refusal":
        if os.geteuid() != 0:
            pytest.skip("--user-map needs an agent running as root")
        case.agent_opts.update(_user_map(tmp_path))
    cluster.start(workdir_roots=[str(tmp_path)], **case.agent_opts)
    spec, user = case.arrange(cluster, loop, monkeypatch, tmp_path)
    job_id = _submit_and_place(loop, spec, user)
    job, took = _until_not_launching(loop, job_id)
    assert job.state == case.state, job.history[-1]
    assert case.reason in job.history[-1]["reason"], job.history[-1]
    assert took < ANSWER_WITHIN_S, f"{name}: left LAUNCHING after {took:.2f}s"
    if case.state == JobState.PENDING:
        assert job.attempt == 2 and not job.placement  # requeued, its GPU freed
    # the refused launch is acknowledged (with its event: the XACK may land just after the scheduler read it)
    wait_for(lambda: cluster.pending() == 0, 2.0, "the launch acknowledged")


def _node_refused(cluster: Cluster) -> int:
    return int(cluster.client.hget(cluster.keys.node(NODE), "refused_launches") or 0)


def test_a_forged_launch_is_not_answered(cluster: Cluster, loop: SchedulerLoop,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Signed with a key that is not the node's: whoever wrote it must not get the job requeued or failed
    through the agent, so the agent only logs and counts it."""
    cluster.start()
    monkeypatch.setattr(loop.store, "seal_for",
                        lambda node, msg: sealed(msg, secrets.token_bytes(32)))
    job_id = _submit_and_place(loop, _plain()[0])
    deadline = time.monotonic() + 5
    while _node_refused(cluster) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _node_refused(cluster) == 1
    wait_for(lambda: cluster.pending() == 0, 2.0, "the forged launch acknowledged")
    assert cluster.events(job_id) == []  # acknowledged, not answered
    loop.drain_events(block_ms=100)
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.LAUNCHING


def test_a_copy_of_a_running_launch_is_not_answered(cluster: Cluster, loop: SchedulerLoop,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's own launch written again -- at once (a replay) or after its seal expired -- names
    the attempt already running here: nothing is reported and the job runs on."""
    cluster.start()

    def short_lived(node: str, msg: LaunchMessage) -> LaunchMessage:  # expires ~1.5 s from now
        return sealed(msg, cluster.node_key(node), now=time.time() - signing.LAUNCH_TTL_S + 0.5)

    monkeypatch.setattr(loop.store, "seal_for", short_lived)
    job_id = _submit_and_place(loop, _plain()[0])
    job, _took = _until_not_launching(loop, job_id)
    assert job.state == JobState.RUNNING
    [(_entry, fields)] = cluster.client.xrange(cluster.keys.launch_stream(NODE))
    cluster.client.xadd(cluster.keys.launch_stream(NODE), fields)  # a replay: its nonce was seen
    expires_at = json.loads(fields["data"])["expires_at"]
    while time.time() <= expires_at + 0.05:
        time.sleep(0.05)
    cluster.client.xadd(cluster.keys.launch_stream(NODE), fields)  # written after its expiry
    deadline = time.monotonic() + 5
    while _node_refused(cluster) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _node_refused(cluster) == 2
    # (the RUNNING was consumed and trimmed away already: any event now would be an answer)
    wait_for(lambda: cluster.pending() == 0, 2.0, "the copies acknowledged")
    assert cluster.events(job_id) == []
    loop.drain_events(block_ms=100)
    job = loop.store.get(job_id)
    assert job is not None and job.state == JobState.RUNNING and job.attempt == 1  # (the fixture kills the sleeper)
