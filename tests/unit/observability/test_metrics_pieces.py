"""The metrics pieces that need no server: the event-lag arithmetic on stream ids, the scrape
config `frenzy up` writes, the agent's gauges from its GPUs, and the API's route labels (a
template, never a client's path)."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frenzy.agent.gpus import GpuInfo
from frenzy.agent.metrics import AgentMetrics
from frenzy.api.app import create_app
from frenzy.api.metrics import ApiMetrics
from frenzy.devstack.stack import prometheus_config
from frenzy.metrics_http import serve_metrics
from frenzy.scheduler.metrics import SchedulerMetrics, event_lag_seconds

GiB = 1024**3


def samples(registry) -> dict:  # noqa: ANN001
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_event_lag_reads_the_stream_id_time() -> None:
    assert event_lag_seconds("1700000000000-0", 1700000000.250) == pytest.approx(0.25)
    assert event_lag_seconds("1700000000500-7", 1700000000.0) == 0.0  # clock skew: never negative
    assert event_lag_seconds("*", 1.0) is None and event_lag_seconds("abc-1", 1.0) is None
    m = SchedulerMetrics()
    m.observe_event_lag("1700000000000-3", now=1700000000.040)
    m.observe_event_lag("not-an-id", now=1700000000.040)
    got = samples(m.registry)
    assert got[("frenzy_agent_event_lag_seconds_count", ())] == 1
    assert got[("frenzy_agent_event_lag_seconds_bucket", (("le", "0.05"),))] == 1
    assert got[("frenzy_agent_event_lag_seconds_bucket", (("le", "0.025"),))] == 0


def test_scrape_config_has_one_job_per_kind_of_service() -> None:
    config = prometheus_config({"scheduler": 9001, "predictor": 9002, "agent-a100-0": 9003, "agent-l4-1": 9004,
                                "api": 9005, "worker": 9006})
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert jobs == {"frenzy-agent": ["127.0.0.1:9003", "127.0.0.1:9004"], "frenzy-api": ["127.0.0.1:9005"],
                    "frenzy-predictor": ["127.0.0.1:9002"], "frenzy-scheduler": ["127.0.0.1:9001"],
                    "frenzy-worker": ["127.0.0.1:9006"]}
    assert config["global"]["scrape_interval"] == "5s"


def test_agent_gauges_follow_its_gpus() -> None:
    gpus = [GpuInfo(0, "u0", "fake", "L4", 24 * GiB, 20 * GiB, True, utilization=37),
            GpuInfo(1, "u1", "fake", None, 24 * GiB, 24 * GiB, False, utilization=-1)]
    running = [2]
    m = AgentMetrics("l4-0")
    m.watch(lambda: gpus, lambda: running[0])
    m.launch("started")
    got = samples(m.registry)
    key0 = (("index", "0"), ("node", "l4-0"), ("type", "L4"))
    key1 = (("index", "1"), ("node", "l4-0"), ("type", "unknown"))
    assert got[("frenzy_agent_gpu_memory_used_bytes", key0)] == 4 * GiB
    assert got[("frenzy_agent_gpu_memory_free_bytes", key0)] == 20 * GiB
    assert got[("frenzy_agent_gpu_utilization_ratio", key0)] == pytest.approx(0.37)
    assert ("frenzy_agent_gpu_utilization_ratio", key1) not in got  # unknown: absent, not 0
    assert got[("frenzy_agent_gpu_healthy", key1)] == 0
    assert got[("frenzy_agent_jobs_running", (("node", "l4-0"),))] == 2
    assert got[("frenzy_agent_launches_total", (("node", "l4-0"), ("outcome", "started")))] == 1
    assert got[("frenzy_agent_launches_total", (("node", "l4-0"), ("outcome", "refused")))] == 0
    gpus[0] = GpuInfo(0, "u0", "fake", "L4", 24 * GiB, 24 * GiB, True)
    running[0] = 0
    got = samples(m.registry)
    assert got[("frenzy_agent_gpu_memory_used_bytes", key0)] == 0
    assert got[("frenzy_agent_jobs_running", (("node", "l4-0"),))] == 0


def test_api_labels_routes_by_template() -> None:
    metrics = ApiMetrics()
    client = TestClient(create_app("127.0.0.1:1", metrics=metrics), base_url="http://127.0.0.1")
    assert client.get("/api/jobs/job-secret-123").status_code == 401  # no token
    assert client.get("/no/such/path/job-xyz").status_code == 404
    assert client.get("/api/jobs", headers={"Host": "evil.example"}).status_code == 421  # refused by the guard
    assert client.request("BREW", "/api/jobs").status_code in (405, 400)
    got = samples(metrics.registry)
    assert got[("frenzy_api_requests_total", (("method", "GET"), ("route", "/api/jobs/{job_id}"),
                                               ("status", "401")))] == 1
    assert got[("frenzy_api_requests_total", (("method", "GET"), ("route", "unmatched"), ("status", "404")))] == 1
    assert got[("frenzy_api_requests_total", (("method", "GET"), ("route", "/api/jobs"), ("status", "421")))] == 1
    assert any(dict(labels).get("method") == "other" for (_, labels) in got)
    assert not any("secret" in v or "xyz" in v for (_, labels) in got for _, v in labels)


def test_serve_metrics_on_a_free_loopback_port() -> None:
    m = ApiMetrics()
    m.requests.labels("/x", "GET", "200").inc()
    server = serve_metrics(m.registry, "127.0.0.1:0", "test")
    try:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        body = httpx.get(server.url, timeout=5).text
        assert 'frenzy_api_requests_total{method="GET",route="/x",status="200"} 1.0' in body
    finally:
        server.stop()
