"""issue 14 items 2 and 3: forged, replayed and expired control messages run nothing and end nothing.

Before: nothing on the launch or events streams was signed. An ``XADD`` into
``launch:<node>`` copied from a real entry with ``gpu_indices: []`` (or with another
job id and ``fence: 0``) ran its command, since the fence check had no GPU to look at;
a launch read again ran again once its job had ended; and an ``exited`` event added by
hand marked a running job SUCCEEDED and freed its GPUs while its process ran on.

Now every launch and cancel carries an HMAC-SHA256 with its node's key, a nonce and an
expiry (``frenzy.state.signing``); agents refuse anything else before any other check,
count it (``refused_launches`` on the node hash) and run nothing; the scheduler drops
events not signed with the key of the node they name. Real parts throughout: Redis,
agents running job processes, and (for events and rotation) the scheduler and predictor.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from faults import scheduler_support
from faults.scheduler_support import Agents, marking_command, runs
from integration.agent import conftest as agent_fixtures
from integration.agent.agent_cluster import NODE, Cluster, wait_for
from typer.testing import CliRunner

from frenzy.cli.main import app
from frenzy.state import node_keys
from frenzy.state.job_states import JobState
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, LaunchMessage, encode, sealed
from frenzy.state.store import StateStore
from support.servers import running_servers
from support.state import make_plan, make_spec

cluster = agent_fixtures.cluster  # agents on the test Redis; the test plays the scheduler
make_agents = scheduler_support.make_agents


def _refused(cluster: Cluster, node: str = NODE) -> int:
    return int(cluster.client.hget(cluster.keys.node(node), "refused_launches") or 0)


def _ran_once_then(cluster: Cluster, marker: Path, job_id: str) -> LaunchMessage:
    """A real, signed launch of a job that appends to ``marker``; waits until it has run and ended."""
    msg = cluster.launch(job_id, marking_command(marker, job_id), indices=[0], gpu_uuids=[""])
    assert cluster.wait_event(job_id, EventKind.EXITED).exit_code == 0
    assert runs(marker) == [job_id]
    return msg


def _real_entry(cluster: Cluster, job_id: str) -> dict:
    """The JSON of the launch entry the test "scheduler" sent for ``job_id``, as an attacker reads it."""
    for _id, fields in cluster.client.xrange(cluster.keys.launch_stream(NODE)):
        data = json.loads(fields["data"])
        if data.get("job_id") == job_id:
            return data
    raise AssertionError(f"no launch of {job_id}")


def _settled(cluster: Cluster, refused_before: int, count: int) -> None:
    wait_for(lambda: cluster.pending() == 0 and _refused(cluster) >= refused_before + count, 10,
             f"{count} forged entries read, refused and acknowledged")


@pytest.mark.parametrize("change", [{"gpu_indices": [], "gpu_uuids": []},
                                    {"job_id": "job-forged0001", "fence": 0, "gpu_indices": []},
                                    {"command": [sys.executable, "-c", "print('owned')"]}],
                         ids=["no-gpus", "other-job-fence-0", "other-command"])
def test_a_copied_launch_with_fields_changed_runs_nothing(cluster: Cluster, tmp_path: Path, change: dict) -> None:
    """Item 2: a real entry copied with ``gpu_indices: []`` (or ``job_id``/``fence: 0``) ran its command."""
    cluster.start()
    marker = tmp_path / "runs"
    _ran_once_then(cluster, marker, "job-real00001")
    forged = {**_real_entry(cluster, "job-real00001"), **change}
    before = _refused(cluster)
    cluster.send({"data": json.dumps(forged)})
    _settled(cluster, before, 1)
    assert runs(marker) == ["job-real00001"]
    assert {e.job_id for e in cluster.events()} == {"job-real00001"}  # not even a LAUNCH_FAILED to act on


def test_a_launch_signed_with_another_nodes_key_runs_nothing(cluster: Cluster, tmp_path: Path) -> None:
    """Item 2: a node's key signs only its own launches (an agent holding n2's key cannot drive n1)."""
    cluster.start()
    marker = tmp_path / "runs"
    other = cluster.node_key("n2")
    before = _refused(cluster)
    cluster.launch("job-forged0002", marking_command(marker, "forged"), indices=[0], gpu_uuids=[""])
    cluster.send(LaunchMessage(**{**_real_entry(cluster, "job-forged0002"), "job_id": "job-forged0003",
                                  "nonce": "", "sig": "", "expires_at": 0}), key=other)
    wait_for(lambda: runs(marker) == ["forged"], 10, "the real launch to run")
    _settled(cluster, before, 1)
    assert runs(marker) == ["forged"]
    assert cluster.events("job-forged0003") == []


def test_a_replayed_signed_launch_runs_nothing_the_second_time(cluster: Cluster, tmp_path: Path) -> None:
    """Item 2: the same signed entry added again (its job ended, its GPUs still reserved) ran again."""
    cluster.start()
    marker = tmp_path / "runs"
    _ran_once_then(cluster, marker, "job-replay0001")
    copy = next(f for _id, f in cluster.client.xrange(cluster.keys.launch_stream(NODE)))
    before = _refused(cluster)
    cluster.send(dict(copy))
    _settled(cluster, before, 1)
    assert runs(marker) == ["job-replay0001"]
    assert [e.kind for e in cluster.events("job-replay0001")] == [EventKind.RUNNING, EventKind.EXITED]


def test_an_expired_launch_runs_nothing(cluster: Cluster, tmp_path: Path) -> None:
    """Item 2: a launch signed with the right key but sealed to expire in the past (or kept and sent late)."""
    cluster.start()
    marker = tmp_path / "runs"
    msg = cluster.launch("job-late00001", marking_command(marker, "late"), indices=[0], gpu_uuids=[""],
                         reserve=True)
    wait_for(lambda: runs(marker) == ["late"], 10, "the real launch to run")
    late = sealed(msg.model_copy(update={"attempt": 2}), cluster.node_key(), now=0.0, ttl_s=120)
    cluster.reserve("job-late00001", 1, [0])
    before = _refused(cluster)
    cluster.client.xadd(cluster.keys.launch_stream(NODE), encode(late))
    _settled(cluster, before, 1)
    assert runs(marker) == ["late"]
    # The scheduler's own seal, expired: answered (issue 37), never run -- a LAUNCH_FAILED the scheduler
    # drops unless that attempt is the job's live one on this node (agent_events).
    late_events = [e for e in cluster.events("job-late00001") if e.attempt != 1]
    assert [(e.kind, e.node, e.retryable) for e in late_events] == [(EventKind.LAUNCH_FAILED, NODE, True)]
    assert "seal expired" in late_events[0].message


def test_a_forged_exited_event_does_not_end_a_running_job(
        redis_url: str, redis_client: redis.Redis, prefix: str, tmp_path: Path,
        make_agents: Callable[[str, Keys], Agents], caplog: pytest.LogCaptureFixture) -> None:
    """Item 3: an ``exited`` event XADDed by hand marked a running job SUCCEEDED and freed its GPUs."""
    keys = Keys(prefix)
    make_agents(redis_url, keys).start("n1")
    node_keys.create(redis_client, keys, "n2")
    store = StateStore(redis_client, keys)
    spec = make_spec("victim")
    spec.command[:] = [sys.executable, "-c", "import time; time.sleep(60)"]
    job_id, _ = store.submit(spec, [make_plan("A100-80GB")], "gpt2-124m", 1)
    with running_servers(redis_url, prefix):
        job = wait_for(lambda: (j := store.get(job_id)) and j.state == JobState.RUNNING and j, 10, "job running")
        forged = dict(kind=EventKind.EXITED, job_id=job_id, attempt=job.attempt, node="n1", fence=job.fence,
                      exit_code=0)
        redis_client.xadd(keys.events_stream(), encode(AgentEvent(**forged)))  # unsigned
        signed_elsewhere = sealed(AgentEvent(**forged), node_keys.read(redis_client, keys, "n2").current)
        redis_client.xadd(keys.events_stream(), encode(signed_elsewhere))  # another node's key
        # A genuine event of n1, altered (the stream keeps none once acknowledged: issue 34).
        real = encode(sealed(AgentEvent(**{**forged, "kind": EventKind.RUNNING}),
                             node_keys.read(redis_client, keys, "n1").current))
        redis_client.xadd(keys.events_stream(), {"data": real["data"].replace('"running"', '"exited"')})
        wait_for(lambda: caplog.text.count("refusing event") >= 3, 10, "three forged events refused")
        job = store.get(job_id)
        assert job is not None and job.state == JobState.RUNNING, job.history
        assert redis_client.hget(keys.gpu("n1", 0), "owner") == job_id
        assert "unsigned" in caplog.text and "bad signature" in caplog.text
        # The real agent's events are still believed: a cancel ends it.
        store.request_cancel(job, "test over")
        wait_for(lambda: (j := store.get(job_id)) and j.state == JobState.CANCELLED, 15, "job cancelled")


def test_launches_keep_working_after_a_rotation(
        redis_url: str, redis_client: redis.Redis, prefix: str, tmp_path: Path,
        make_agents: Callable[[str, Keys], Agents]) -> None:
    """Rotation (`frenzy node key rotate`): nothing in flight is lost, no restart needed."""
    keys = Keys(prefix)
    make_agents(redis_url, keys).start("n1")
    before = node_keys.read(redis_client, keys, "n1")
    result = CliRunner().invoke(app, ["node", "key", "rotate", "n1", "--redis-url", redis_url, "--prefix", prefix])
    assert result.exit_code == 0, result.output
    after = node_keys.read(redis_client, keys, "n1")
    assert before is not None and after is not None
    assert after.previous == before.current and after.current != before.current
    shown = CliRunner().invoke(app, ["node", "key", "show", "n1", "--redis-url", redis_url, "--prefix", prefix])
    assert shown.exit_code == 0 and after.current.hex() not in shown.output and "previous key kept: yes" in shown.output
    store = StateStore(redis_client, keys)
    marker = tmp_path / "runs"
    with running_servers(redis_url, prefix):
        for tag in ("one", "two"):
            spec = make_spec(tag)
            spec.command[:] = marking_command(marker, tag)
            job_id, _ = store.submit(spec, [make_plan("A100-80GB")], "gpt2-124m", 1)
            wait_for(lambda job_id=job_id: (j := store.get(job_id)) and j.state == JobState.SUCCEEDED, 15,
                     f"job {tag} succeeded")
    assert runs(marker) == ["one", "two"]
    assert int(redis_client.hget(keys.node("n1"), "refused_launches") or 0) == 0
