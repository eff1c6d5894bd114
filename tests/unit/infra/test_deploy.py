"""deploy/: the Grafana dashboard imports (the fields Grafana's import needs, a datasource variable) and
every panel's PromQL names only series the services register; the scrape config reads the targets file
`python -m deploy.targets` writes from the launcher's state."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from deploy.targets import targets

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
DASHBOARD = json.loads((DEPLOY / "grafana" / "cachemesh.json").read_text())
# Every module that registers series: the runtime's, each service's, the streams app's.
SERIES_MODULES = (
    "services.runtime.metrics",
    "services.tiers.metrics",
    "services.tiers.service",
    "services.heat.service",
    "services.warmup.service",
    "services.invalidation.service",
    "services.gateway.proxy",
    "services.gateway.tier_cache",
    "services.bridge.forward",
    "streams.metrics",
)
NAME = re.compile(r"\bcachemesh_[a-zA-Z0-9_]+")


def registered_names() -> set[str]:
    for module in SERIES_MODULES:
        importlib.import_module(module)
    return {n for n in REGISTRY._names_to_collectors if n.startswith("cachemesh_")}


def graph_panels() -> list[dict[str, object]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def test_the_dashboard_has_what_grafana_import_needs() -> None:
    for field in ("title", "uid", "schemaVersion", "panels", "templating", "time"):
        assert field in DASHBOARD, field
    assert isinstance(DASHBOARD["schemaVersion"], int) and DASHBOARD["schemaVersion"] >= 30
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", DASHBOARD["uid"])
    (variable,) = [v for v in DASHBOARD["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in graph_panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()  # type: ignore[attr-defined]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]  # type: ignore[attr-defined]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_query_names_only_registered_series() -> None:
    known = registered_names()
    used: set[str] = set()
    for panel in graph_panels():
        for target in panel["targets"]:  # type: ignore[attr-defined]
            names = set(NAME.findall(target["expr"]))
            assert names, target["expr"]
            assert names <= known, (panel["title"], sorted(names - known))
            used |= names
    # The questions the issue asks: lookups by tier and match, hit rate, lookup and L3 latency, queues.
    for series in (
        "cachemesh_tiers_lookup_results_total",
        "cachemesh_tiers_lookups_total",
        "cachemesh_tiers_lookup_ms_bucket",
        "cachemesh_tiers_l3_ms_bucket",
        "cachemesh_tiers_queue_depth",
        "cachemesh_consumer_lag",
        "cachemesh_events_consumed_total",
        "cachemesh_events_published_total",
    ):
        assert series in used, series


def test_the_scrape_config_reads_the_targets_the_script_writes() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["file_sd_configs"]
    assert sd["files"] == ["targets/cachemesh.json"]  # relative to the config file's folder


@pytest.mark.parametrize("namespace", [None, "ns1"])
def test_targets_name_each_services_metrics_port(namespace: str | None) -> None:
    state = {
        "namespace": namespace,
        "services": [
            {"name": "tiers", "health_url": "http://127.0.0.1:40001/healthz", "log": "x"},
            {"name": "heat", "health_url": "http://127.0.0.1:40002/healthz", "log": "y"},
        ],
    }
    assert targets(state) == [
        {"targets": ["127.0.0.1:40001"], "labels": {"service": "tiers", "namespace": namespace or ""}},
        {"targets": ["127.0.0.1:40002"], "labels": {"service": "heat", "namespace": namespace or ""}},
    ]
