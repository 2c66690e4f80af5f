"""The files an operator points Prometheus and Grafana at: every metric the Grafana dashboard
queries is one a service defines, and docker/prometheus.yml scrapes exactly the compose services
that serve /metrics, on the port each listens on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "docker" / "grafana" / "frenzy-dashboard.json"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def defined_metric_names() -> set[str]:
    """Names passed to a prometheus-client constructor or a *MetricFamily in services/."""
    names = set()
    for path in (ROOT / "services").rglob("*.py"):
        names.update(re.findall(r'(?:Counter|Histogram|Gauge|MetricFamily)\(\s*"(frenzy_[a-z0-9_]+)"',
                                path.read_text(encoding="utf-8")))
    return names


def base_name(series: str) -> str:
    for suffix in SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_every_dashboard_query_uses_defined_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    defined = defined_metric_names()
    assert {"frenzy_placements", "frenzy_agent_launches", "frenzy_api_requests"} <= defined  # the scan works
    used = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used.update(re.findall(r"frenzy_[a-z0-9_]+", target["expr"]))
    missing = sorted(s for s in used if base_name(s) not in defined and s not in defined)
    assert not missing, f"the dashboard queries metrics no service defines: {missing}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_compose_scrape_config_matches_the_services() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    serving = {}
    for name, svc in compose.items():
        argv = [str(a) for a in svc.get("command") or []]
        if "--metrics-address" in argv:
            address = argv[argv.index("--metrics-address") + 1]
            serving[name] = address.rsplit(":", 1)[1]
            assert address.startswith("0.0.0.0:"), f"{name}: in a container, listen where Prometheus reaches it"
            assert serving[name] in [str(p) for p in svc.get("expose", [])], f"{name}: expose its metrics port"
            assert not any(serving[name] in str(p) for p in svc.get("ports", [])), f"{name}: metrics not published"
    assert {"scheduler", "predictor", "worker", "api", "agent-a", "agent-b"} <= set(serving)
    config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:{port}" for name, port in serving.items()}
