"""The scheduler's metrics without Redis: the gauges built from the loop's snapshots, the newer of
the tick's view and the reaper's read, and the metrics address."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from frenzy.scheduler.metrics import (
    ClusterCollector,
    SchedulerMetrics,
    Snapshots,
    nodes_from_records,
    parse_metrics_address,
)
from frenzy.state.records import decode_node
from has import ClusterView, GpuSlot, NodeView

GiB = 1024**3


def rows(owner: str = "", refused: str | None = "2") -> list:
    info = {"name": "n0", "draining": "1"}
    if refused is not None:
        info["refused_launches"] = refused
    gpus = [{"index": "0", "type": "L4", "memory_total": str(24 * GiB), "memory_free": str(20 * GiB),
             "owner": owner, "healthy": "1"},
            {"index": "1", "type": "L4", "memory_total": str(24 * GiB), "memory_free": "0", "owner": "",
             "healthy": "0"}]
    return [decode_node(info, True, gpus), decode_node({}, False, [])]  # a name without a hash (being removed): left out


def view(owner: str | None) -> ClusterView:
    return ClusterView([NodeView("n0", (GpuSlot("n0", 0, "L4", 24 * GiB, 20 * GiB, owner),
                                        GpuSlot("n0", 1, "L4", 24 * GiB, 0, None, healthy=False)), draining=True)])


def samples(snapshots: Snapshots, now: float = 100.0) -> dict:
    metrics = SchedulerMetrics()
    metrics.registry.register(ClusterCollector(snapshots, clock=lambda: now))
    out = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_nodes_from_records() -> None:
    (node,) = nodes_from_records(rows("job-1"))
    assert (node.name, node.alive, node.draining, node.refused_launches) == ("n0", True, True, 2)
    assert [(g.index, g.owned, g.healthy, g.memory_free) for g in node.gpus] == [(0, True, True, 20 * GiB),
                                                                                 (1, False, False, 0)]


def test_the_newer_snapshot_wins_and_refused_launches_come_from_the_reaper() -> None:
    gpu0 = ("frenzy_gpu_owned", (("index", "0"), ("node", "n0"), ("type", "L4")))
    snaps = Snapshots(view=(90.0, view("job-1")), nodes=(95.0, rows(owner="")))
    got = samples(snaps)
    assert got[gpu0] == 0.0 and got[("frenzy_cluster_snapshot_age_seconds", ())] == 5.0
    snaps.view = (99.0, view("job-1"))
    got = samples(snaps)
    assert got[gpu0] == 1.0 and got[("frenzy_cluster_snapshot_age_seconds", ())] == 1.0
    assert got[("frenzy_node_refused_launches", (("node", "n0"),))] == 2.0
    assert got[("frenzy_node_draining", (("node", "n0"),))] == 1.0
    assert got[("frenzy_gpu_healthy", (("index", "1"), ("node", "n0"), ("type", "L4")))] == 0.0
    assert got[("frenzy_gpu_memory_free_bytes", (("index", "0"), ("node", "n0"), ("type", "L4")))] == 20 * GiB


def test_jobs_by_state_and_queue() -> None:
    got = samples(Snapshots(jobs=(1.0, {"RUNNING": 3, "LAUNCHING": 1}), queue_length=7))
    jobs = {labels[0][1]: v for (name, labels), v in got.items() if name == "frenzy_jobs"}
    assert jobs == {"PENDING": 7, "RESERVED": 0, "LAUNCHING": 1, "RUNNING": 3}
    assert got[("frenzy_queue_length", ())] == 7
    assert not any(name.startswith("frenzy_gpu_") for name, _ in got)  # nothing read yet: no GPU series


def test_nothing_seen_yet_still_exposes_counters() -> None:
    metrics = SchedulerMetrics()
    metrics.registry.register(ClusterCollector(Snapshots()))
    text = generate_latest(metrics.registry).decode()
    assert "frenzy_placements_total 0.0" in text
    assert 'frenzy_agent_events_total{outcome="refused"} 0.0' in text
    assert "frenzy_queue_length" in text and "frenzy_jobs" in text


def test_metrics_address() -> None:
    assert parse_metrics_address("9464") == ("127.0.0.1", 9464)
    assert parse_metrics_address(":9464") == ("127.0.0.1", 9464)
    assert parse_metrics_address("0.0.0.0:9100") == ("0.0.0.0", 9100)
    assert parse_metrics_address("[::1]:9464") == ("::1", 9464)
    for bad in ("host:port", "127.0.0.1:70000", "x"):
        with pytest.raises(ValueError, match="metrics address"):
            parse_metrics_address(bad)
