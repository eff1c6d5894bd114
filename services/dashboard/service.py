"""The dashboard service: tails the records topics (windows, drift, heat, warmup, invalidation, tier
status; in no consumer group, see tail.py) into a `Board`, samples every tier node's `/v1/stats` and
every gateway's health report (its routing over engine instances), and serves one page that draws them
(`/dashboard/`, its JSON at `/dashboard/api/snapshot`) on `http_port`
(8790) and on its metrics port. Works offline: the chart library (uPlot) is a file in `static/`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from schemas.events import (
    DriftClustered,
    HeatScored,
    InvalidationRecorded,
    TierModeChanged,
    WarmupDecided,
    WindowComputed,
)
from services.dashboard.board import Board
from services.dashboard.settings import DashboardSettings
from services.dashboard.tail import RecordsTail
from services.runtime.metrics import MetricsServer
from services.runtime.service import Loop, Service

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
# One topic per record family; WarmupDecided shares warmup.records.v1 with Measured and Applied.
TOPICS = sorted(
    {
        WindowComputed.topic,
        DriftClustered.topic,
        HeatScored.topic,
        WarmupDecided.topic,
        InvalidationRecorded.topic,
        TierModeChanged.topic,
    }
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class DashboardService(Service):
    name = "dashboard"

    def __init__(self, settings: DashboardSettings) -> None:
        super().__init__(settings)
        self.dashboard_settings = settings
        self.board = Board(settings.max_points, settings.max_rows)
        self.samples = 0
        self.tiers_seen: list[str] = []
        self._session: aiohttp.ClientSession | None = None
        # health URL of a launcher-started tiers service -> its API base URL
        self._api_of: dict[str, str] = {}
        self.page_server: MetricsServer | None = None
        self.tail: RecordsTail | None = None

    async def open(self, stack: AsyncExitStack) -> None:
        s = self.dashboard_settings
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=s.request_timeout_s))
        stack.push_async_callback(self._session.close)
        # No consumer group, from the log end: the page shows what happens from now on, and a run
        # leaves nothing behind on the broker.
        tail = RecordsTail(s.kafka, TOPICS, self.board.observe, client_id=f"{self.name}-{s.node_id}")
        await tail.start()
        stack.push_async_callback(tail.stop)
        self.tail = tail
        if s.http_port is not None:
            page = MetricsServer(s.http_host, s.http_port, self.health, self.routes())
            await page.start()
            stack.push_async_callback(page.stop)
            self.page_server = page

    def loops(self) -> list[Loop]:
        loops: list[Loop] = [self._sample_loop]
        if self.tail is not None:
            loops.append(self.tail.run)
        return loops

    def routes(self) -> Sequence[web.AbstractRouteDef]:
        return [
            web.get("/", self._index_redirect),
            web.get("/dashboard", self._index_redirect),
            web.get("/dashboard/", self._index),
            web.get("/dashboard/api/snapshot", self._snapshot),
            web.static("/dashboard/static", STATIC_DIR),
        ]

    def endpoints(self) -> dict[str, str]:
        page = self.page_server
        return (
            {"dashboard": f"http://{self.dashboard_settings.http_host}:{page.port}/dashboard/"}
            if page
            else {}
        )

    async def checks(self) -> dict[str, Any]:
        page = self.page_server
        url = f"http://{self.dashboard_settings.http_host}:{page.port}/dashboard/" if page else None
        tail = self.tail.health() if self.tail is not None else {"running": False}
        return {
            "url": url,
            "samples": self.samples,
            "tiers": self.tiers_seen,
            "totals": dict(self.board.totals),
            "records": tail,
            "reading": bool(tail["running"]),
        }

    async def _sample_loop(self) -> None:
        interval = self.dashboard_settings.poll_interval_ms / 1000
        while True:
            started = time.monotonic()
            await self.sample_once()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def sample_once(self) -> None:
        urls = self.dashboard_settings.tiers_urls or await self._discover_tiers()
        stats = await asyncio.gather(*(self._get_json(f"{u}/v1/stats") for u in urls))
        found = [s for s in stats if isinstance(s, dict)]
        self.tiers_seen = [u for u, s in zip(urls, stats, strict=True) if isinstance(s, dict)]
        self.board.observe_stats(found, _now_ms())
        gateways = self.dashboard_settings.gateway_health_urls or self._discover("gateway")
        reports = await asyncio.gather(*(self._get_json(u) for u in gateways))
        self.board.observe_routing([r for r in reports if isinstance(r, dict)])
        self.samples += 1

    def _discover(self, name: str) -> list[str]:
        """The health URLs of the services called `name` in the launcher's state file."""
        try:
            state = json.loads(self.dashboard_settings.state_file.read_text())
        except (OSError, ValueError):
            return []
        return [
            str(svc["health_url"])
            for svc in state.get("services") or []
            if svc.get("name") == name and svc.get("health_url")
        ]

    async def _discover_tiers(self) -> list[str]:
        """The tiers services the launcher started, by their API (re-read each time: the file is
        written after every service has started, and rewritten by the next `cachemesh up`)."""
        urls = []
        for health_url in self._discover("tiers"):
            if health_url not in self._api_of:
                health = await self._get_json(health_url)
                api = (health or {}).get("api") or {}
                if not api.get("url"):
                    continue
                self._api_of[health_url] = str(api["url"]).rstrip("/")
            urls.append(self._api_of[health_url])
        return urls

    async def _get_json(self, url: str) -> Any:
        assert self._session is not None
        try:
            async with self._session.get(url) as response:
                # /healthz answers 503 with the same report while unhealthy; the API URL is still in it.
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _index_redirect(self, _: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/dashboard/")

    async def _index(self, _: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html")

    async def _snapshot(self, _: web.Request) -> web.Response:
        body = self.board.snapshot(_now_ms())
        body["tiers"] = self.tiers_seen
        return web.Response(
            text=json.dumps(body, default=str),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )
