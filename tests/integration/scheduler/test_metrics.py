"""The scheduler's Prometheus /metrics, scraped over HTTP from a real scheduler on loopback.

A real predictor and scheduler (bearer tokens on every gRPC call), a node written into Redis as
its agent registers it (with its signing key), the agent's events signed as the agent signs
them; the endpoint is read with httpx and parsed with prometheus-client's own parser."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from frenzy.auth.roles import Role
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.auth import with_token
from frenzy.rpc.server import stop_server
from frenzy.scheduler.service import SchedulerServer
from frenzy.state.keys import Keys
from frenzy.state.messages import AgentEvent, EventKind, encode
from frenzy.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from support.state import add_node, make_spec, send_event


class Running:
    def __init__(self, server: SchedulerServer, stub: scheduler_pb2_grpc.SchedulerStub) -> None:
        self.server = server
        self.stub = stub
        assert server.metrics is not None
        self.url = f"http://127.0.0.1:{server.metrics.port}/metrics"


@pytest.fixture
def running(redis_url: str, prefix: str) -> Iterator[Running]:
    pserver, pport, phealth = serve_predictor("127.0.0.1:0")
    # The reaper refreshes the node gauges: every half second (a quarter of dead_after_s), not every
    # 5 s (test speed). The nodes' leases last 60 s (add_node): none dies meanwhile.
    sched = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix, tick_s=0.05,
                            metrics_address="127.0.0.1:0", dead_after_s=2.0)
    token, _ = sched.tokens.create("metrics-test", Role.ADMIN)
    channel = with_token(grpc.insecure_channel(f"127.0.0.1:{sched.port}"), token)
    try:
        yield Running(sched, scheduler_pb2_grpc.SchedulerStub(channel))
    finally:
        channel.close()
        sched.stop()
        stop_server(pserver, phealth, grace_s=0.5)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample: (name, sorted labels) -> value."""
    resp = httpx.get(url, timeout=5)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def wait_scrape(url: str, ok: callable, timeout_s: float = 15.0) -> dict:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        if ok(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never matched; last scrape: {sorted(samples.items())[:80]}")
        time.sleep(0.1)


def one_gpu_spec() -> types_pb2.JobSpec:
    spec = make_spec("metrics")
    spec.limits.max_gpus = 1
    return spec


def test_metrics_follow_a_job_from_queue_to_running(running: Running, redis_client: redis.Redis,
                                                    keys: Keys) -> None:
    assert running.server.metrics is not None and running.server.metrics.host == "127.0.0.1"
    add_node(redis_client, keys, "n0", "A100-80GB", 2)
    gpu = {"node": "n0", "type": "A100-80GB"}
    # The node as the reaper reads it, with an empty queue (ticks read no cluster then).
    before = wait_scrape(running.url, lambda s: value(s, "frenzy_node_alive", node="n0") == 1.0)
    for index in ("0", "1"):
        assert value(before, "frenzy_gpu_owned", index=index, **gpu) == 0.0
        assert value(before, "frenzy_gpu_healthy", index=index, **gpu) == 1.0
        assert value(before, "frenzy_gpu_memory_total_bytes", index=index, **gpu) == 80 * 1024**3
        assert value(before, "frenzy_gpu_memory_free_bytes", index=index, **gpu) == 80 * 1024**3
    assert value(before, "frenzy_node_draining", node="n0") == 0.0
    assert value(before, "frenzy_placements_total") == 0.0
    assert value(before, "frenzy_queue_length") == 0.0
    assert value(before, "frenzy_jobs", state="RUNNING") == 0.0
    assert value(before, "frenzy_job_submit_to_running_seconds_count") == 0.0
    assert value(before, "frenzy_scheduler_tick_seconds_count") > 0
    assert value(before, "frenzy_agent_events_total", outcome="refused") == 0.0
    assert value(before, "frenzy_reaper_actions_total", action="declared_dead") == 0.0

    job = running.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=one_gpu_spec()), timeout=30).job
    placed = wait_scrape(running.url, lambda s: value(s, "frenzy_placements_total") == 1.0)
    assert value(placed, "frenzy_reservation_conflicts_total") == 0.0
    # The GPU gauges come from the last read of the cluster: a tick's (made before its placements)
    # or the reaper's, every few seconds; the new owner shows within one reaper round.
    placed = wait_scrape(running.url, lambda s: sum(value(s, "frenzy_gpu_owned", index=i, **gpu) or 0
                                                    for i in ("0", "1")) == 1.0)
    owned = [value(placed, "frenzy_gpu_owned", index=i, **gpu) for i in ("0", "1")]
    index = str(owned.index(1.0))
    assert value(placed, "frenzy_cluster_snapshot_age_seconds") < 10

    got = running.stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.id), timeout=5)
    assert got.state == types_pb2.JOB_STATE_LAUNCHING
    fence = int(redis_client.hget(keys.job(job.id), "fence"))
    send_event(redis_client, keys, AgentEvent(kind=EventKind.RUNNING, job_id=job.id, attempt=1, node="n0",
                                              fence=fence, pid=4242))
    ran = wait_scrape(running.url, lambda s: value(s, "frenzy_job_submit_to_running_seconds_count") == 1.0)
    assert value(ran, "frenzy_agent_events_total", outcome="handled") >= 1.0
    assert 0 < value(ran, "frenzy_job_submit_to_running_seconds_sum") < 30
    # The jobs holding GPUs as the reaper reads them (every few seconds).
    ran = wait_scrape(running.url, lambda s: value(s, "frenzy_jobs", state="RUNNING") == 1.0)
    assert value(ran, "frenzy_gpu_owned", index=index, **gpu) == 1.0
    assert value(ran, "frenzy_queue_length") == 0.0 and value(ran, "frenzy_jobs", state="PENDING") == 0.0


def test_an_unsigned_event_is_counted_as_refused(running: Running, redis_client: redis.Redis, keys: Keys) -> None:
    add_node(redis_client, keys, "n0", "A100-80GB", 1)
    forged = AgentEvent(kind=EventKind.EXITED, job_id="job-000000000000", attempt=1, node="n0", exit_code=0)
    redis_client.xadd(keys.events_stream(), encode(forged))  # not sealed with n0's key
    samples = wait_scrape(running.url, lambda s: value(s, "frenzy_agent_events_total", outcome="refused") == 1.0)
    assert value(samples, "frenzy_agent_events_total", outcome="handled") == 0.0

