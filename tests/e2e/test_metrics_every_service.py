"""Every service's Prometheus /metrics, scraped over HTTP from the real stack (LocalStack: the
predictor, scheduler, one fake-GPU agent, the Celery worker and the API as separate processes,
each with ``--metrics-address`` on a loopback port of its own).

One job goes the batch way (``frenzy batch submit`` -> worker -> scheduler -> predictor ->
agent) and the API answers two requests; then each service's own counters must have moved:
the worker's entries, the predictor's requests, the scheduler's placements and prediction-cache
misses, the agent's launches and events, the API's requests by route template and status.
The scrape config ``frenzy up`` writes must list all five endpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from frenzy.devstack.stack import LocalStack
from has.cluster_spec import parse_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

CLUSTER = {"nodes": [{"gpu": "L4", "count": 1, "gpus_per_node": 2, "name_prefix": "l4"}]}
NODE = "l4-0"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def stack(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[LocalStack]:
    s = LocalStack.create(parse_cluster(CLUSTER), run_dir=str(tmp_path / "run"), redis_url=redis_url,
                          prefix=prefix, with_worker=True, with_api=True, heartbeat_s=0.5, ttl_s=3)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def scrape(url: str) -> Samples:
    resp = httpx.get(url, timeout=5)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain"), resp.text[:200]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_scrape(url: str, ok: Callable[[Samples], bool], timeout_s: float = 60.0) -> Samples:
    """Scrape until ``ok``: an endpoint starts with its process, a moment after the process does."""
    deadline = time.monotonic() + timeout_s
    last: Samples | str = "no answer"
    while time.monotonic() < deadline:
        try:
            last = scrape(url)
            if ok(last):
                return last
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.2)
    shown = sorted(last.items())[:60] if isinstance(last, dict) else last
    raise AssertionError(f"{url} never matched; last: {shown}")


def test_every_service_serves_metrics_that_move(stack: LocalStack, tmp_path: Path) -> None:
    urls = {name: stack.metrics_url(name) for name in ("scheduler", "predictor", f"agent-{NODE}", "api", "worker")}
    before = {name: wait_scrape(url, lambda s: True) for name, url in urls.items()}  # once it answers
    # Each endpoint is its own service's: a metric only that one has is there before any work.
    assert ("frenzy_scheduler_tick_seconds_count", ()) in before["scheduler"]
    assert ("frenzy_predictor_requests_total", (("outcome", "ok"),)) in before["predictor"]
    assert ("frenzy_agent_gpu_memory_total_bytes", (("index", "0"), ("node", NODE), ("type", "L4"))) \
        in before[f"agent-{NODE}"]
    assert ("frenzy_agent_jobs_running", (("node", NODE),)) in before[f"agent-{NODE}"]
    assert ("frenzy_worker_entries_total", (("outcome", "submitted"),)) in before["worker"]
    assert not any(name.startswith("frenzy_predictor") for name, _ in before["scheduler"])

    # The batch way: frenzy batch submit -> the worker -> SubmitJob -> Predict -> placed -> the agent.
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [{"name": "metrics", "model": "gpt2-124m", "seq_len": 512,
                                              "global_batch": 8, "micro_batch": 4, "max_gpus": 1,
                                              "command": f"{sys.executable} -c \"print('hi')\""}]}))
    env = {k: v for k, v in os.environ.items() if k not in ("FRENZY_TOKEN", "REDIS_URL")}
    done = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "batch", "submit", str(jobs), "--json",
                           "--timeout", "90", "--redis-url", stack.redis_url, "--prefix", stack.prefix],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["counts"] == {"submitted": 1}, outcome

    # The API: one good read (with the stack's token) and one refused (no token).
    api = f"http://127.0.0.1:{stack.api_port}"
    assert httpx.get(f"{api}/api/jobs", headers={"Authorization": f"Bearer {stack.token}"}, timeout=10) \
        .status_code == 200
    assert httpx.get(f"{api}/api/jobs/{outcome['entries'][0]['job_id']}", timeout=10).status_code == 401

    worker = wait_scrape(urls["worker"], lambda s: value(s, "frenzy_worker_entries_total", outcome="submitted") >= 1)
    assert value(worker, "frenzy_worker_submit_seconds_count") >= 1

    predictor = wait_scrape(urls["predictor"], lambda s: value(s, "frenzy_predictor_requests_total", outcome="ok")
                            > value(before["predictor"], "frenzy_predictor_requests_total", outcome="ok"))
    assert value(predictor, "frenzy_predictor_latency_seconds_count") >= 1

    agent = wait_scrape(urls[f"agent-{NODE}"], lambda s: (
        value(s, "frenzy_agent_launches_total", node=NODE, outcome="started") >= 1
        and value(s, "frenzy_agent_events_sent_total", node=NODE, kind="exited") >= 1))
    assert value(agent, "frenzy_agent_events_sent_total", node=NODE, kind="running") >= 1
    assert value(agent, "frenzy_agent_jobs_running", node=NODE) == 0  # it ended
    assert value(agent, "frenzy_agent_gpu_memory_free_bytes", node=NODE, index="0", type="L4") > 0

    scheduler = wait_scrape(urls["scheduler"], lambda s: (
        value(s, "frenzy_placements_total") >= 1
        and value(s, "frenzy_agent_events_total", outcome="handled") >= 2))
    assert value(scheduler, "frenzy_prediction_cache_misses_total") >= 1
    assert value(scheduler, "frenzy_job_submit_to_running_seconds_count") >= 1

    api_samples = wait_scrape(urls["api"], lambda s: (
        value(s, "frenzy_api_requests_total", route="/api/jobs", method="GET", status="200") >= 1
        and value(s, "frenzy_api_requests_total", route="/api/jobs/{job_id}", method="GET", status="401") >= 1))
    # A route is its template: no job id in any label.
    job_id = outcome["entries"][0]["job_id"]
    assert not any(job_id in v for _, labels in api_samples for _, v in labels)
    assert value(api_samples, "frenzy_api_request_seconds_count", route="/api/jobs") >= 1

    # The scrape config `frenzy up` leaves in the run directory lists every endpoint.
    config = yaml.safe_load(stack.prometheus_file.read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in config["scrape_configs"]}
    assert targets == {"frenzy-agent": [f"127.0.0.1:{stack.metrics_ports[f'agent-{NODE}']}"],
                       "frenzy-api": [f"127.0.0.1:{stack.metrics_ports['api']}"],
                       "frenzy-predictor": [f"127.0.0.1:{stack.metrics_ports['predictor']}"],
                       "frenzy-scheduler": [f"127.0.0.1:{stack.metrics_ports['scheduler']}"],
                       "frenzy-worker": [f"127.0.0.1:{stack.metrics_ports['worker']}"]}
