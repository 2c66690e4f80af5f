"""The reaper's decision (``decide_reap``) on plain snapshots: no Redis."""

from __future__ import annotations

from unit.scheduler.job_records import job_record

from frenzy.scheduler.reaping import (
    GpuRelease,
    HeldGpu,
    NodeLease,
    PortRelease,
    ReapSettings,
    ReapSnapshot,
    decide_reap,
)
from frenzy.state.job_states import JobState
from frenzy.state.records import decode_node

NOW = 1_000.0  # Redis time
SETTINGS = ReapSettings(dead_after_s=30.0, orphan_release_s=120.0)


def node(name: str, *, alive: bool = False, beat_age: float = 60.0, dead_at: str = "",
         gpus: tuple[HeldGpu, ...] = ()) -> NodeLease:
    return NodeLease(name, alive, repr(NOW - beat_age), dead_at, gpus)


def snapshot(*nodes: NodeLease, jobs=None, ports=None) -> ReapSnapshot:
    return ReapSnapshot(NOW, tuple(nodes), ports or {}, jobs or {})


def test_a_lease_gone_for_less_than_dead_after_is_not_reaped() -> None:
    job = job_record("j", placement=[("a", [0])])
    snap = snapshot(node("a", beat_age=29.0, gpus=(HeldGpu("j", "7"),)), jobs={"j": job})
    plan = decide_reap(snap, 0.0, {}, SETTINGS)
    assert plan.declare == () and dict(plan.dead) == {}
    assert plan.requeue == () and plan.gpus == ()


def test_a_node_with_its_lease_is_alive_however_old_its_heartbeat() -> None:
    plan = decide_reap(snapshot(node("a", alive=True, beat_age=10_000.0)), 0.0, {}, SETTINGS)
    assert plan.declare == () and dict(plan.dead) == {}


def test_a_dead_node_is_declared_and_its_job_requeued_once_naming_every_dead_node() -> None:
    job = job_record("j", placement=[("a", [0, 1]), ("b", [0]), ("c", [0])])
    snap = snapshot(
        node("a", beat_age=45.0, gpus=(HeldGpu("j", "7"), HeldGpu("j", "7"))),
        node("b", beat_age=31.0, dead_at="970", gpus=(HeldGpu("j", "7"),)),
        node("c", alive=True, beat_age=1.0, gpus=(HeldGpu("j", "7"),)),
        jobs={"j": job},
    )
    plan = decide_reap(snap, 0.0, {}, SETTINGS)
    # b was declared before: it is dead but not declared again
    assert [(d.node, d.heartbeat_at, d.age_s) for d in plan.declare] == [("a", repr(NOW - 45.0), 45.0)]
    assert dict(plan.dead) == {"a": 45.0, "b": 31.0}
    assert [(lost.job_id, lost.lost) for lost in plan.requeue] == [("j", ("a", "b"))]
    assert plan.requeue[0].why == "node a, b is dead (no heartbeat for 45 s)"
    # Its GPUs on the dead nodes go at once (one release per node and fence); those on the
    # live node wait for that node's agent to report the exit.
    assert plan.gpus == (GpuRelease("a", "j", 7, None), GpuRelease("b", "j", 7, None))
    assert set(plan.orphans) == {("gpu", "c", "j", "7")}


def test_a_node_that_came_back_is_treated_as_alive() -> None:
    job = job_record("j", placement=[("a", [0])])
    snap = snapshot(node("a", beat_age=45.0, gpus=(HeldGpu("j", "7"),)), jobs={"j": job})
    plan = decide_reap(snap, 0.0, {}, SETTINGS, came_back=frozenset({"a"}))
    assert plan.declare == () and dict(plan.dead) == {} and plan.requeue == () and plan.gpus == ()


def test_only_the_live_reservation_is_requeued() -> None:
    old = job_record("old", fence=9)  # requeued meanwhile: the GPU still names fence 7
    done = job_record("done", JobState.SUCCEEDED, fence=3)
    snap = snapshot(node("a", gpus=(HeldGpu("old", "7"), HeldGpu("done", "3"), HeldGpu("gone", "4"))),
                    jobs={"old": old, "done": done, "gone": None})
    plan = decide_reap(snap, 0.0, {}, SETTINGS)
    assert plan.requeue == ()
    assert plan.gpus == (GpuRelease("a", "old", 7, None), GpuRelease("a", "done", 3, None),
                         GpuRelease("a", "gone", 4, None))


def test_an_orphan_on_a_live_node_is_freed_only_after_orphan_release_s() -> None:
    done = job_record("done", JobState.FAILED, fence=3, placement=[("a", [0])])
    snap = snapshot(node("a", alive=True, gpus=(HeldGpu("done", "3"),)), jobs={"done": done})
    first = decide_reap(snap, 50.0, {}, SETTINGS)
    assert first.gpus == () and first.orphans == {("gpu", "a", "done", "3"): 50.0}
    early = decide_reap(snap, 169.0, first.orphans, SETTINGS)
    assert early.gpus == () and early.orphans == first.orphans
    due = decide_reap(snap, 170.0, early.orphans, SETTINGS)
    assert due.gpus == (GpuRelease("a", "done", 3, 120.0),) and due.orphans == {}


def test_an_orphan_that_resolved_itself_leaves_the_clock() -> None:
    snap = snapshot(node("a", alive=True))  # the exit came in: the GPU is free now
    plan = decide_reap(snap, 60.0, {("gpu", "a", "done", "3"): 50.0, ("port", "a", "x", "29500"): 1.0}, SETTINGS)
    assert plan.orphans == {} and plan.gpus == () and plan.ports == ()


def test_a_running_jobs_own_gpu_and_port_are_no_orphans() -> None:
    job = job_record("j", fence=7, placement=[("a", [0])], master_node="a", master_port=29500)
    snap = snapshot(node("a", alive=True, gpus=(HeldGpu("j", "7"), HeldGpu("", None))), jobs={"j": job},
                    ports={"a": {"29500": "j"}})
    plan = decide_reap(snap, 1e6, {}, SETTINGS)
    assert plan.gpus == () and plan.ports == () and plan.orphans == {}


def test_a_leaked_port_is_freed_after_orphan_release_s() -> None:
    job = job_record("j", master_node="a", master_port=29500)
    snap = snapshot(node("a", alive=True), jobs={"j": job, "old": None},
                    ports={"a": {"29501": "j", "29502": "old"}})
    first = decide_reap(snap, 0.0, {}, SETTINGS)
    assert first.ports == () and set(first.orphans) == {("port", "a", "j", "29501"), ("port", "a", "old", "29502")}
    due = decide_reap(snap, 120.0, first.orphans, SETTINGS)
    assert due.ports == (PortRelease("a", "29501", "j"), PortRelease("a", "29502", "old")) and due.orphans == {}


def test_a_requeued_jobs_port_and_gpus_on_live_nodes_start_their_orphan_clock() -> None:
    job = job_record("j", placement=[("a", [0]), ("b", [0])], master_node="b", master_port=29500)
    snap = snapshot(node("a", gpus=(HeldGpu("j", "7"),)), node("b", alive=True, gpus=(HeldGpu("j", "7"),)),
                    jobs={"j": job}, ports={"b": {"29500": "j"}})
    plan = decide_reap(snap, 5.0, {}, SETTINGS)
    assert [lost.job_id for lost in plan.requeue] == ["j"]
    assert plan.gpus == (GpuRelease("a", "j", 7, None),)
    assert plan.orphans == {("gpu", "b", "j", "7"): 5.0, ("port", "b", "j", "29500"): 5.0}


def test_node_lease_from_the_stored_hashes() -> None:
    lease = NodeLease.of(decode_node({"name": "a", "heartbeat_at": "12.5", "dead_at": "40"}, False,
                                     [{"owner": "j", "fence": "3"}, {"owner": "", "fence": "2"}, {"index": "2"}]))
    assert lease == NodeLease("a", False, "12.5", "40", (HeldGpu("j", "3"), HeldGpu("", "2"), HeldGpu("", None)))


# ---------------------------------------------------------------- after a Redis outage (issue 14, D2)

def test_after_an_outage_silence_counts_from_when_redis_was_back() -> None:
    job = job_record("j", placement=[("a", [0])])
    # The lease expired during a 60 s outage; Redis has been back for 10 s (count_from).
    snap = ReapSnapshot(NOW, (node("a", beat_age=70.0, gpus=(HeldGpu("j", "7"),)),), {}, {"j": job},
                        count_from=NOW - 10.0)
    plan = decide_reap(snap, 0.0, {}, SETTINGS)
    assert plan.declare == () and dict(plan.dead) == {} and plan.requeue == ()
    # Still silent a full dead_after_s after Redis came back: dead, its age the real one.
    later = ReapSnapshot(NOW, snap.nodes, {}, {"j": job}, count_from=NOW - 30.0)
    plan = decide_reap(later, 0.0, {}, SETTINGS)
    assert [(d.node, d.age_s) for d in plan.declare] == [("a", 70.0)]
    assert [lost.job_id for lost in plan.requeue] == ["j"]


def test_a_node_declared_dead_before_an_outage_stays_dead() -> None:
    job = job_record("j", placement=[("a", [0])])
    snap = ReapSnapshot(NOW, (node("a", beat_age=70.0, dead_at="950", gpus=(HeldGpu("j", "7"),)),), {},
                        {"j": job}, count_from=NOW - 1.0)
    plan = decide_reap(snap, 0.0, {}, SETTINGS)
    assert plan.declare == () and dict(plan.dead) == {"a": 70.0}
    assert plan.gpus == (GpuRelease("a", "j", 7, None),)


# ---------------------------------------------------------------- a job an older scheduler left RESERVED

def test_a_reserved_job_on_a_dead_node_is_requeued() -> None:
    """(RESERVED is what the two-step path of earlier versions left between its two scripts: such a
    job holds its GPUs like a launched one, and is requeued when its node dies.)"""
    job = job_record("j", JobState.RESERVED, fence=9)
    snap = snapshot(node("a", beat_age=60.0, gpus=(HeldGpu("j", "9"),)), jobs={"j": job})
    plan = decide_reap(snap, 5.0, {}, ReapSettings(30.0, 120.0))
    assert [lost.job_id for lost in plan.requeue] == ["j"]
