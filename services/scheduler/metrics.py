"""The scheduler's Prometheus metrics: what it already knows, served on a port of its own.

Two kinds. Counters and histograms (``SchedulerMetrics``) are bumped by the loop as things
happen: placements, lost reservation races, preemptions, tick durations, submit-to-RUNNING
waits (each attempt that reaches RUNNING, counted from the job's submission), agent events by outcome (refused ones: unsigned, forged, replayed, expired), reaper
actions. Gauges are built only when Prometheus scrapes (``ClusterCollector``), from the
snapshots the loop keeps anyway: the ``ClusterView`` of its last tick that read the cluster (as
read before that tick's placements) and the node hashes of the reaper's last read (every few
seconds, so the gauges stay current while the queue is empty and ticks read nothing), whichever
is newer, and the queue's length. So a GPU's gauges lag by up to one reaper round (5 s by
default); ``frenzy_cluster_snapshot_age_seconds`` says how old they are.
Scraping sends no Redis command and adds nothing to a tick but a few attribute writes.

No job id or user appears in a label (a GPU's owner is 0/1): the endpoint has no
authentication, so ``serve_metrics`` (``frenzy.metrics_http``, shared by every service) listens on
loopback unless an address says otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frenzy.metrics_http import MetricsServer, parse_metrics_address, serve_metrics  # noqa: F401 (re-exported)
from frenzy.state.records import NodeRecord
from has import ClusterView

log = logging.getLogger(__name__)

# Job states the gauge always carries (0 when none), so a dashboard's series never vanish.
ACTIVE_STATES = ("PENDING", "RESERVED", "LAUNCHING", "RUNNING")
# Seconds; from a job placed on the next tick of an idle cluster to one that waited for GPUs.
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Seconds from an agent's XADD to the loop handling the event: ms when the loop keeps up, seconds
# when a tick or an outage holds the consumer back.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
EVENT_OUTCOMES = ("handled", "refused", "malformed", "failed")
REAP_ACTIONS = ("declared_dead", "requeued", "failed", "released")


class SchedulerMetrics:
    """The scheduler's counters and histograms, in a registry of their own (several schedulers in
    one process, as in tests, do not share series)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.placements = Counter("frenzy_placements", "Jobs reserved and launched by the placement loop.",
                                  registry=r)
        self.conflicts = Counter("frenzy_reservation_conflicts",
                                 "Placements whose reservation lost a race (the view was stale); retried next tick.",
                                 registry=r)
        self.preemptions = Counter("frenzy_preemptions", "Running jobs stopped for a much shorter one.", registry=r)
        self.deadline_missed = Counter("frenzy_deadline_missed",
                                       "Waiting jobs whose deadline could no longer be met (flagged once per attempt; "
                                       "they run late).", registry=r)
        self.tick_seconds = Histogram("frenzy_scheduler_tick_seconds",
                                      "Duration of one placement tick (read, decide, reserve, dispatch).",
                                      buckets=TICK_BUCKETS, registry=r)
        self.submit_to_running = Histogram("frenzy_job_submit_to_running_seconds",
                                           "From a job's submission to its first node reporting it running.",
                                           buckets=WAIT_BUCKETS, registry=r)
        self.events = Counter("frenzy_agent_events", "Agent events consumed, by outcome (refused: not signed "
                              "with the key of the node it names, expired or replayed).", ["outcome"], registry=r)
        self.event_lag = Histogram("frenzy_agent_event_lag_seconds",
                                   "From an agent event's entry in the events stream (the time in its entry id) to "
                                   "the scheduler handling it.", buckets=LAG_BUCKETS, registry=r)
        self.reaper = Counter("frenzy_reaper_actions", "What the reaper did: nodes declared dead, jobs requeued "
                              "or failed, GPUs and ports released, reservations rolled back.", ["action"], registry=r)
        for outcome in EVENT_OUTCOMES:
            self.events.labels(outcome)
        for action in REAP_ACTIONS:
            self.reaper.labels(action)

    def observe_event_lag(self, entry_id: str, now: float | None = None) -> None:
        """Record one event's lag (``event_lag_seconds``); an id that is not a stream id is skipped."""
        lag = event_lag_seconds(entry_id, time.time() if now is None else now)
        if lag is not None:
            self.event_lag.observe(lag)


@dataclass(frozen=True)
class GpuSample:
    index: int
    gpu_type: str
    memory_total: int
    memory_free: int
    owned: bool
    healthy: bool


@dataclass(frozen=True)
class NodeSample:
    name: str
    alive: bool
    draining: bool
    gpus: tuple[GpuSample, ...]
    refused_launches: int | None = None  # as the node's agent counts them (only in the reaper's read)


def nodes_from_view(view: ClusterView) -> list[NodeSample]:
    """The nodes as a tick's ``ClusterView`` holds them."""
    return [NodeSample(n.name, n.alive, n.draining,
                       tuple(GpuSample(g.index, g.gpu_type, g.memory_total, g.memory_free, g.owner is not None,
                                       g.healthy) for g in n.gpus))
            for n in view.nodes]


def nodes_from_records(nodes: Iterable[NodeRecord]) -> list[NodeSample]:
    """The nodes as the reaper read them (``StateStore.load_nodes``)."""
    return [NodeSample(n.name, n.alive, n.draining,
                       tuple(GpuSample(g.index, g.gpu_type, g.memory_total, g.memory_free, bool(g.owner), g.healthy)
                             for g in n.gpus if g.index >= 0),
                       n.refused_launches)
            for n in nodes if n.name]


@dataclass
class Snapshots:
    """What the loop last saw, for the collector (plain attribute writes on the loop's side)."""

    view: tuple[float, ClusterView] | None = None  # (time.time(), the last tick's view)
    nodes: tuple[float, list[NodeRecord]] | None = None  # (time.time(), the reaper's load_nodes())
    jobs: tuple[float, dict[str, int]] | None = None  # (time.time(), active jobs per state from the reaper)
    queue_length: int | None = None  # PENDING jobs at the last tick


class ClusterCollector(Collector):
    """Gauges of the cluster and the queue, built at scrape time from ``Snapshots``."""

    def __init__(self, snapshots: Snapshots, clock: callable = time.time) -> None:  # type: ignore[valid-type]
        self.snapshots = snapshots
        self.clock = clock

    def latest_nodes(self) -> tuple[float, list[NodeSample]] | None:
        """The newer of the tick's view and the reaper's read; refused launches from the reaper's."""
        view, rows = self.snapshots.view, self.snapshots.nodes
        from_rows = (rows[0], nodes_from_records(rows[1])) if rows is not None else None
        if view is None or (from_rows is not None and from_rows[0] >= view[0]):
            return from_rows
        nodes = nodes_from_view(view[1])
        refused = {n.name: n.refused_launches for n in from_rows[1]} if from_rows is not None else {}
        return view[0], [NodeSample(n.name, n.alive, n.draining, n.gpus, refused.get(n.name)) for n in nodes]

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        labels = ["node", "index", "type"]
        total = GaugeMetricFamily("frenzy_gpu_memory_total_bytes", "GPU memory in all.", labels=labels)
        free = GaugeMetricFamily("frenzy_gpu_memory_free_bytes", "GPU memory free, as the node's agent last "
                                 "reported it.", labels=labels)
        owned = GaugeMetricFamily("frenzy_gpu_owned", "1 when a job holds the GPU.", labels=labels)
        healthy = GaugeMetricFamily("frenzy_gpu_healthy", "1 when the agent reports the GPU healthy.", labels=labels)
        alive = GaugeMetricFamily("frenzy_node_alive", "1 while the node's heartbeat lease holds.", labels=["node"])
        draining = GaugeMetricFamily("frenzy_node_draining", "1 when the node takes no new work.", labels=["node"])
        refused = GaugeMetricFamily("frenzy_node_refused_launches", "Launch messages the node's agent refused "
                                    "(unsigned, forged, replayed or expired), as it counts them.", labels=["node"])
        age = GaugeMetricFamily("frenzy_cluster_snapshot_age_seconds", "How old the cluster data above is.")
        latest = self.latest_nodes()
        if latest is not None:
            at, nodes = latest
            age.add_metric([], max(0.0, now - at))
            for n in nodes:
                alive.add_metric([n.name], float(n.alive))
                draining.add_metric([n.name], float(n.draining))
                if n.refused_launches is not None:
                    refused.add_metric([n.name], float(n.refused_launches))
                for g in n.gpus:
                    key = [n.name, str(g.index), g.gpu_type]
                    total.add_metric(key, float(g.memory_total))
                    free.add_metric(key, float(g.memory_free))
                    owned.add_metric(key, float(g.owned))
                    healthy.add_metric(key, float(g.healthy))
        yield from (total, free, owned, healthy, alive, draining, refused, age)
        jobs = GaugeMetricFamily("frenzy_jobs", "Jobs by state: PENDING from the last tick's queue, the others from "
                                 "the reaper's last read of the jobs holding GPUs or ports.", labels=["state"])
        held = self.snapshots.jobs[1] if self.snapshots.jobs is not None else {}
        queued = self.snapshots.queue_length
        for state in ACTIVE_STATES:
            value = queued if state == "PENDING" else held.get(state, 0)
            if value is not None:
                jobs.add_metric([state], float(value))
        yield jobs
        queue = GaugeMetricFamily("frenzy_queue_length", "PENDING jobs at the last tick.")
        if queued is not None:
            queue.add_metric([], float(queued))
        yield queue


class PredictionCacheCollector(Collector):
    """The submit path's cache of predictor answers (``submit_pools.Predictions``): hits, misses and
    answers kept, read from its own counters at scrape time (the hit ratio is
    ``rate(hits) / (rate(hits) + rate(misses))``)."""

    def __init__(self, predictions: object) -> None:
        self.predictions = predictions  # a submit_pools.Predictions (not imported: it pulls in the store)

    def collect(self) -> Iterator[Metric]:
        p = self.predictions
        hits = CounterMetricFamily("frenzy_prediction_cache_hits", "Submissions answered from the scheduler's "
                                   "cache of predictor answers.")
        hits.add_metric([], float(p.hits))  # type: ignore[attr-defined]
        misses = CounterMetricFamily("frenzy_prediction_cache_misses", "Submissions that had to ask the predictor "
                                     "(nothing kept for the request, or kept too long).")
        misses.add_metric([], float(p.misses))  # type: ignore[attr-defined]
        kept = GaugeMetricFamily("frenzy_prediction_cache_entries", "Predictor answers the scheduler keeps now.")
        kept.add_metric([], float(len(p)))  # type: ignore[arg-type]
        yield from (hits, misses, kept)


def event_lag_seconds(entry_id: str, now: float) -> float | None:
    """Seconds from an agent event's entry in the events stream to ``now`` (``time.time()``): a
    stream entry id is ``<milliseconds since the epoch>-<sequence>`` as Redis stamped it on XADD
    (https://redis.io/docs/latest/develop/data-types/streams/#entry-ids). None for an id that is
    not one; never below 0 (the hosts' clocks may differ a little)."""
    ms, _, _seq = entry_id.partition("-")
    if not ms.isdigit():
        return None
    return max(0.0, now - int(ms) / 1000.0)
