"""`cachemesh demo`'s traffic on real Kafka and Postgres: a tier node and the dashboard in-process,
named in a launcher state file as `cachemesh up` writes it; the demo finds both from it, replays
Mooncake KV events and asks paraphrased questions, and its summary counts what the node served."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infra.demo import DemoPlan, dashboard_url, run_demo
from infra.mesh_state import running_mesh
from services.dashboard.service import DashboardService
from services.dashboard.settings import DashboardSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, serving, until

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
async def test_demo_finds_the_mesh_and_drives_both_streams(
    kafka, namespace, topics_on, node_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await topics_on(kafka)
    monkeypatch.setenv("CACHEMESH_CACHE_DIR", str(tmp_path))
    async with running(node_settings("demo", embedder_preload=True)) as node:
        await until(lambda: node.embedder.health()["state"] == "ready", timeout_s=120, step_s=0.1)
        dash = DashboardService(
            DashboardSettings(
                kafka=kafka_settings_for(kafka, namespace),
                state_file=tmp_path / "run" / "state.json",
                http_port=0,
            )
        )
        async with serving(dash):
            (tmp_path / "run").mkdir(exist_ok=True)
            state = {
                "launcher_pid": os.getpid(),
                "broker": {"name": "kafka", "bootstrap": kafka.bootstrap},
                "postgres": {"dsn": None, "dsn_redacted": ""},
                "namespace": namespace,
                "services": [
                    {"name": "tiers", "health_url": f"http://127.0.0.1:{node.metrics_server.port}/healthz"},
                    {
                        "name": "dashboard",
                        "health_url": f"http://127.0.0.1:{dash.metrics_server.port}/healthz",
                    },
                ],
            }
            (tmp_path / "run" / "state.json").write_text(json.dumps(state))
            mesh = running_mesh()
            assert mesh is not None and dashboard_url(mesh).endswith("/dashboard/")  # type: ignore[union-attr]
            report = await run_demo(mesh, DemoPlan(seconds=6, trace_s=120, pairs=12, workers=4))
            # the dashboard found the node through the same state file
            await until(lambda: bool(dash.tiers_seen), timeout_s=30, step_s=0.1)

            # The blocks the trace computed are on the node, under the keys its events name.
            assert report.blocks_stored >= 100 and report.block_writes_failed == 0
            assert node.cache is not None and node.cache.counters.puts >= report.blocks_stored

    rows = dict(report.rows())
    assert report.kv_events > 500
    assert report.puts >= 1 and report.asked >= 2
    assert int(rows["lookups"]) == report.asked
    assert int(rows["hits"].split()[0]) >= 1, rows
    assert any(k.startswith("  hits l1:") for k in rows), rows
    assert "heat decisions (dashboard)" in rows
    assert report.took_s < 60
    summary = json.loads(json.dumps(report.summary()))  # what `cachemesh demo --json` prints
    assert summary["lookups"] == report.asked and summary["hits"] == int(rows["hits"].split()[0])
    for key in ("warmups_applied", "invalidations", "labels"):
        assert isinstance(summary[key], int) and summary[key] >= 0, key
    assert "drift_clusters" in summary and isinstance(summary["heat_decisions"], int)
