"""The node agent's Prometheus metrics (``frenzy agent --metrics-address``).

Counters the daemon bumps as things happen: launches by outcome, launch-stream entries refused
for their seal (by reason), events sent to the scheduler by kind. Gauges built when Prometheus
scrapes, from what the agent already holds (``AgentCollector``): each GPU's memory (total, used,
free) and utilisation as its last heartbeat refreshed them, and the jobs running here. Labels
are the node, the GPU index and type, an outcome or a kind: never a job id or a user.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frenzy.agent.gpus import GpuInfo
from frenzy.state.messages import EventKind
from frenzy.state.signing import Refusal

# started: the process runs; already_running: a repeated launch of a job running here;
# refused: check_launch said no (GPUs held, fence, port, workdir); failed: the process could
# not start; error: the agent failed (a bug; the traceback is in its log).
LAUNCH_OUTCOMES = ("started", "already_running", "refused", "failed", "error")


def refusal_label(refusal: Refusal) -> str:
    return refusal.name.lower()


class AgentMetrics:
    """One agent's counters, in a registry of its own; ``watch`` adds the gauges."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        r = self.registry
        self.launches = Counter("frenzy_agent_launches", "Launch messages handled by this node's agent, by outcome.",
                                ["node", "outcome"], registry=r)
        self.refused = Counter("frenzy_agent_refused_entries", "Launch-stream entries refused before any other "
                               "check for their seal (unsigned, forged, expired, replayed, no key).",
                               ["node", "reason"], registry=r)
        self.events = Counter("frenzy_agent_events_sent", "Events this agent sent the scheduler, by kind.",
                              ["node", "kind"], registry=r)
        for outcome in LAUNCH_OUTCOMES:
            self.launches.labels(node, outcome)
        for refusal in Refusal:
            self.refused.labels(node, refusal_label(refusal))
        for kind in EventKind:
            self.events.labels(node, kind.value)

    def launch(self, outcome: str) -> None:
        self.launches.labels(self.node, outcome).inc()

    def watch(self, gpus: Callable[[], Sequence[GpuInfo]], running: Callable[[], int]) -> None:
        """Add the gauges, read from ``gpus()`` and ``running()`` at each scrape."""
        self.registry.register(AgentCollector(self.node, gpus, running))


class AgentCollector(Collector):
    """GPU and job gauges of one node, built at scrape time."""

    def __init__(self, node: str, gpus: Callable[[], Sequence[GpuInfo]], running: Callable[[], int]) -> None:
        self.node = node
        self.gpus = gpus
        self.running = running

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "index", "type"]
        total = GaugeMetricFamily("frenzy_agent_gpu_memory_total_bytes", "GPU memory in all.", labels=labels)
        used = GaugeMetricFamily("frenzy_agent_gpu_memory_used_bytes", "GPU memory in use (total - free), as "
                                 "the last heartbeat read it (NVML; on fake GPUs the running jobs' predicted "
                                 "peak).", labels=labels)
        free = GaugeMetricFamily("frenzy_agent_gpu_memory_free_bytes", "GPU memory free, as the last heartbeat "
                                 "read it.", labels=labels)
        util = GaugeMetricFamily("frenzy_agent_gpu_utilization_ratio", "Share of the last sample period a kernel "
                                 "ran (NVML utilization.gpu / 100); absent when unknown.", labels=labels)
        healthy = GaugeMetricFamily("frenzy_agent_gpu_healthy", "1 when the GPU answers NVML and has no "
                                    "pending fault.", labels=labels)
        for g in self.gpus():
            key = [self.node, str(g.index), g.gpu_type or "unknown"]
            total.add_metric(key, float(g.memory_total))
            free.add_metric(key, float(g.memory_free))
            used.add_metric(key, float(max(0, g.memory_total - g.memory_free)))
            healthy.add_metric(key, float(g.healthy))
            if g.utilization >= 0:
                util.add_metric(key, g.utilization / 100.0)
        jobs = GaugeMetricFamily("frenzy_agent_jobs_running", "Job attempts running on this node (started or "
                                 "adopted by this agent, not yet reported ended).", labels=["node"])
        jobs.add_metric([self.node], float(self.running()))
        yield from (total, used, free, util, healthy, jobs)
