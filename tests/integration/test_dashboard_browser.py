"""The dashboard in a real headless Chromium, offline, on real Kafka and Postgres: a tier node and the
heat service run in-process and take lookups; window, drift, warmup and invalidation records are
published as the streams, warmup and invalidation services would. The page must load with no network
beyond loopback and its charts and tables fill with that live data; a screenshot is kept in tmp_path."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from schemas.events import (
    DriftClustered,
    InvalidationRecorded,
    WarmupDecided,
    WarmupMeasured,
    WindowComputed,
)
from services.dashboard.service import DashboardService
from services.dashboard.settings import DashboardSettings
from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.runtime.publisher import EventPublisher
from services.tiers.edge.client import AsyncTiersClient
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, serving, until

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Every host name but loopback fails to resolve: the page may only use what the dashboard serves.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


async def _chromium(*args: str) -> str:
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        *OFFLINE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}"
    return out.decode()


@contextlib.asynccontextmanager
async def _traffic(api_url: str, publisher: EventPublisher, namespace: str) -> AsyncIterator[list[int]]:
    """Lookups (hits on L1, misses) against the node and the records of the other services, until the
    block exits; yields the number of rounds done."""
    rounds = [0]

    async def drive() -> None:
        async with AsyncTiersClient(api_url) as client:
            for i in range(20):
                await client.put(f"{namespace}k{i}", f"answer {i}", model="m")
            while True:
                n = rounds[0]
                for i in range(20):
                    await client.lookup(f"{namespace}k{i}" if i % 4 else f"{namespace}missing{n}-{i}")
                now = int(time.time() * 1000)
                events = [
                    WindowComputed(
                        shard="s0",
                        window="tumbling_1s",
                        window_start_ms=now - 1000,
                        window_end_ms=now,
                        requests=100 + n,
                        qps=100.0 + 5 * (n % 7),
                        entropy_bits=2.5 + 0.1 * (n % 5),
                        hit_rate=0.75,
                    ),
                    DriftClustered(
                        cluster_id=f"c{n % 3}",
                        pattern=("pulse", "migrating", "stable")[n % 3],
                        window_end_ms=now,
                        keys=[f"{namespace}k1", f"{namespace}k2"],
                        size=2,
                        duration_ms=1000,
                        variance=0.01,
                        service_spread=0.5,
                        shard="s0",
                    ),
                    WarmupDecided(
                        source="drift",
                        action="warm",
                        reason="qps and entropy in band",
                        keys=[f"{namespace}k1"],
                    ),
                    WarmupMeasured(shard="s0", t_warm_ms=now - 300, t_peak_ms=now, delta_t_ms=300 + n),
                    InvalidationRecorded(
                        root=f"{namespace}k3",
                        cause="invalidated",
                        roots=[f"{namespace}k3"],
                        source_event_id=f"e{n}",
                        keys=[f"{namespace}k3"],
                        dependants=1 + n % 4,
                        depth=1,
                    ),
                ]
                for event in events:
                    await publisher.publish(event)
                rounds[0] += 1
                await asyncio.sleep(0.05)

    task = asyncio.create_task(drive())
    try:
        yield rounds
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make setup installs it)")
@pytest.mark.timeout(240)
async def test_dashboard_fills_with_live_data_in_headless_chromium(
    kafka, namespace, topics_on, pg_settings, node_settings, tmp_path: Path
) -> None:
    await topics_on(kafka)
    kafka_s = kafka_settings_for(kafka, namespace)
    publisher = EventPublisher(kafka_s)
    await publisher.start()
    heat = HeatSettings(
        kafka=kafka_s,
        postgres=pg_settings,
        group_id=f"heat-{namespace}",
        model_name=f"heat-{namespace}",
        rescore_interval_ms=50,
    )
    try:
        async with running(node_settings("dash")) as node, serving(HeatService(heat)):
            dash = DashboardService(
                DashboardSettings(kafka=kafka_s, tiers_urls=[node.api_url], poll_interval_ms=200, http_port=0)
            )
            async with serving(dash), _traffic(node.api_url, publisher, namespace):
                board = dash.board
                await until(
                    lambda: (
                        len(board.hit_rate) >= 3
                        and len(board.traffic) >= 3
                        and len(board.warmup_delta) >= 3
                        and len(board.invalidations) >= 3
                        and board.totals["heat_decisions"] > 0
                    ),
                    timeout_s=60,
                    step_s=0.05,
                )
                assert max(v or 0 for v in board.hit_rate.values["l1"]) > 0, "L1 hits reach the chart"
                base = f"http://127.0.0.1:{dash.metrics_server.port}/dashboard/"  # type: ignore[union-attr]
                async with httpx.AsyncClient() as http:
                    html = (await http.get(base)).text
                    assert not re.search(r'(src|href)="(https?:)?//', html), (
                        "the page must not load remote assets"
                    )
                    assert (await http.get(base + "static/uPlot.iife.min.js")).status_code == 200
                # Virtual time lets the page poll a few times before the DOM is dumped.
                dom = await _chromium("--virtual-time-budget=4000", "--dump-dom", base)
                shot = tmp_path / "dashboard.png"
                await _chromium(
                    "--virtual-time-budget=4000", "--window-size=1400,1600", f"--screenshot={shot}", base
                )
                # The node's /docs renders offline too: swagger-ui from the package draws the operations.
                docs_dom = await _chromium("--virtual-time-budget=4000", "--dump-dom", f"{node.api_url}/docs")
    finally:
        await publisher.stop()

    assert "opblock" in docs_dom and "/v1/lookup" in docs_dom, "swagger-ui did not render /docs"

    polls = int(re.search(r'id="status" data-polls="(\d+)"', dom).group(1))  # type: ignore[union-attr]
    assert polls >= 1, "the page never reached its snapshot endpoint"
    for chart in ("hit_rate", "traffic", "warmup_delta", "invalidations"):
        points = int(re.search(rf'id="chart-{chart}" data-points="(\d+)"', dom).group(1))  # type: ignore[union-attr]
        assert points >= 3, f"chart {chart} has {points} points"
    for name in ("nodes", "drift", "heat", "warmups"):
        rows = int(re.search(rf'id="table-{name}" data-rows="(\d+)"', dom).group(1))  # type: ignore[union-attr]
        assert rows >= 1, f"table {name} is empty"
    # uPlot drew its canvases and legends.
    assert dom.count("<canvas") >= 4 and "u-legend" in dom
    assert "normal (no peers to skip)" in dom, "a lone node says why it never goes local-only"
    # Panels that are empty here say what will fill them; the filled ones hide their hint.
    for name in ("instances", "routes"):
        hint = re.search(rf'id="hint-{name}" data-empty="(\d)">([^<]*)<', dom)
        assert hint is not None and hint.group(1) == "1" and "gateway" in hint.group(2), name
    for name in ("hit_rate", "nodes", "heat"):
        assert f'id="hint-{name}" data-empty="0"' in dom, f"{name} is filled but still shows its hint"
    assert shot.exists() and shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")
