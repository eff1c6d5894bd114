"""The gateway's lifecycle: opens the Kafka publisher (context.lifecycle.v1), the HTTP clients of the
tier node and the upstream, and the OpenAI-compatible API; runs the loop that ends idle conversations."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any, ClassVar

import httpx

from schemas.events import Event, KvBlockStored, WarmupRequested
from services.gateway.api import create_app
from services.gateway.engines import Engine, Engines, PromptTokens
from services.gateway.health import Peer, Reach, verdict
from services.gateway.proxy import Proxy
from services.gateway.routing import Instance, Weights
from services.gateway.settings import GatewaySettings
from services.gateway.tier_cache import TierCache
from services.gateway.upstream import Upstream
from services.gateway.warming import Warm
from services.runtime.breaker import FailureBreaker, FailureStats
from services.runtime.http import InLoopServer, serve_in_loop
from services.runtime.kafka import Delivery
from services.runtime.publisher import EventPublisher
from services.runtime.service import Loop, Service

log = logging.getLogger(__name__)


async def _reachable(
    http: httpx.AsyncClient, path: str, headers: dict[str, str], timeout_s: float
) -> tuple[bool, str | None]:
    """Does it answer at all (any status below 500: a 401 is an answer)?"""
    try:
        response = await http.get(path, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if response.status_code >= 500:
        return False, f"HTTP {response.status_code}"
    return True, None


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _breaker_dict(stats: FailureStats) -> dict[str, Any]:
    return {
        "state": stats.state,
        "opened": stats.opened,
        "rejected": stats.rejected,
        "failures": stats.failures,
        "reason": stats.reason,
    }


class GatewayService(Service):
    name: ClassVar[str] = "gateway"
    settings: GatewaySettings

    def __init__(self, settings: GatewaySettings | None = None) -> None:
        super().__init__(settings or GatewaySettings())
        self.proxy: Proxy | None = None
        self.engines: Engines | None = None
        self._poll_http: httpx.AsyncClient | None = None
        self._tiers_http: httpx.AsyncClient | None = None
        self._tiers_reach = Reach()
        self.publisher: EventPublisher | None = None
        self.api_port: int | None = None
        self._api: InLoopServer | None = None
        self._warms: set[asyncio.Task[bool]] = set()

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.api_port}"

    def endpoints(self) -> dict[str, str]:
        return {"gateway (OpenAI base_url)": f"{self.api_url}/v1"} if self.api_port else {}

    async def open(self, stack: AsyncExitStack) -> None:
        s = self.settings
        self.publisher = await self.open_publisher(stack)
        tiers_headers = (
            {"authorization": f"Bearer {s.tiers_token.get_secret_value()}"} if s.tiers_token else {}
        )
        tiers_http = httpx.AsyncClient(
            base_url=s.tiers_url,
            headers=tiers_headers,
            timeout=httpx.Timeout(s.store_timeout_ms / 1000),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )
        stack.push_async_callback(tiers_http.aclose)
        self._tiers_http = tiers_http
        cache = TierCache(
            tiers_http,
            FailureBreaker(
                consecutive=s.cache_breaker_consecutive,
                window=max(10, s.cache_breaker_consecutive),
                min_calls=max(10, s.cache_breaker_consecutive),
                failure_ratio=1.0,
                cooldown_ms=s.cache_breaker_cooldown_ms,
                clock=monotonic_ms,
            ),
            lookup_timeout_s=s.lookup_timeout_ms / 1000,
            store_timeout_s=s.store_timeout_ms / 1000,
            similarity_tolerance=s.similarity_tolerance,
            invalidate_threshold=s.invalidate_threshold,
        )
        self.engines = Engines(
            [self._engine(stack, name, url, engine_id) for name, url, engine_id in self._upstreams()],
            tokens=PromptTokens(s.routing_tokenizer_dir) if s.routing_tokenizer_dir else None,
            model=s.routing_model,
            block_size=s.routing_block_size,
            tiers_prefix=cache.prefix,
            weights=Weights(s.routing_tier_value, s.routing_load_cost, s.routing_affinity_slack),
            warm_min_precision=s.routing_warm_min_precision,
        )
        if len(self.engines.engines) > 1:
            # Every gateway hears every engine's blocks (and the warmup commands): a group of its own.
            topics = [KvBlockStored.topic] + ([WarmupRequested.topic] if s.routing_warm else [])
            await self.open_consumer(
                stack,
                topics,
                f"gateway-kv-{s.node_id}",
                self._on_kv_event,
                self.publisher,
            )
            self._poll_http = httpx.AsyncClient()
            stack.push_async_callback(self._poll_http.aclose)
        self.proxy = Proxy(s, cache, self.engines, self._publish, clock_ms=monotonic_ms)
        # Registered after the clients, so it runs before they close: answers in flight get stored.
        stack.push_async_callback(self.proxy.drain)
        stack.push_async_callback(self._cancel_warms)
        await self._probe_once()  # the first health report already knows (at most probe_timeout_ms)
        await self._start_api(stack)

    def _upstreams(self) -> list[tuple[str, str, str]]:
        s = self.settings
        if not s.upstreams:
            return [("upstream", s.upstream_url, "upstream")]
        names = [u.name for u in s.upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream names must be unique, got {names}")
        return [(u.name, u.url, u.engine_id or u.name) for u in s.upstreams]

    def _engine(self, stack: AsyncExitStack, name: str, url: str, engine_id: str) -> Engine:
        s = self.settings
        http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            timeout=httpx.Timeout(s.upstream_timeout_ms / 1000, connect=s.upstream_connect_timeout_ms / 1000),
            limits=httpx.Limits(
                max_connections=s.upstream_max_connections,
                max_keepalive_connections=s.upstream_max_connections,
            ),
        )
        stack.push_async_callback(http.aclose)
        upstream = Upstream(
            http,
            FailureBreaker(
                failure_ratio=s.breaker_failure_ratio,
                consecutive=s.breaker_consecutive,
                window=s.breaker_window,
                min_calls=s.breaker_min_calls,
                cooldown_ms=s.breaker_cooldown_ms,
                clock=monotonic_ms,
            ),
            timeout_s=s.upstream_timeout_ms / 1000,
            api_key=s.upstream_api_key.get_secret_value() if s.upstream_api_key else None,
            pass_authorization=s.api_token is None,
        )
        root = url.rstrip("/").removesuffix("/v1")
        return Engine(name, engine_id, upstream, Instance(name), f"{root}/metrics")

    async def _on_kv_event(self, delivery: Delivery) -> None:
        if self.engines is None:
            return
        event = delivery.event
        if isinstance(event, WarmupRequested):
            if event.trace_id is not None:
                self._send_warms(self.engines.warm_for(event.trace_id, event.deadline_ms))
            return
        self.engines.on_kv_event(event)

    def _send_warms(self, warms: list[Warm]) -> None:
        assert self.engines is not None
        for warm in warms:  # in the background: the consumer goes on hearing KV events
            task = asyncio.create_task(self.engines.send_warm(warm))
            self._warms.add(task)
            task.add_done_callback(self._warms.discard)

    async def _warms_waiting(self) -> None:
        """Commands that wait for their turn to be near, or for their instance to be idle."""
        while True:
            await asyncio.sleep(self.engines.warmer.retry_ms / 1000 if self.engines else 0.1)
            if self.engines is not None:
                self._send_warms(self.engines.warms_ready())

    async def _cancel_warms(self) -> None:
        for task in list(self._warms):
            task.cancel()
        if self._warms:
            await asyncio.wait(set(self._warms), timeout=5)

    async def _poll_queues(self) -> None:
        while True:
            if self.engines is not None and self._poll_http is not None and len(self.engines.engines) > 1:
                await self.engines.poll_queues(self._poll_http)
            await asyncio.sleep(self.settings.queue_poll_ms / 1000)

    async def _publish(self, event: Event, wait: bool) -> None:
        assert self.publisher is not None
        await self.publisher.publish(event, wait=wait)

    async def _start_api(self, stack: AsyncExitStack) -> None:
        assert self.proxy is not None
        s = self.settings
        app = create_app(self.proxy, s, self.stats, self.status)
        self._api = await serve_in_loop(app, s.api_host, s.api_port, "gateway API")
        self.api_port = self._api.port
        stack.push_async_callback(self._stop_api)
        upstreams = [u.url for u in s.upstreams] or [s.upstream_url]
        log.info("gateway API listening", extra={"url": self.api_url, "upstreams": upstreams})

    async def _stop_api(self) -> None:
        server, self._api = self._api, None
        if server is not None:
            await server.stop()

    def loops(self) -> Sequence[Loop]:
        return (
            self._end_idle_conversations,
            self._api_ticks,
            self._poll_queues,
            self._warms_waiting,
            self._probe,
        )

    async def _probe(self) -> None:
        """Each upstream and the tier node, every probe_interval_ms, for the health report."""
        while True:
            await asyncio.sleep(self.settings.probe_interval_ms / 1000)
            await self._probe_once()

    async def _probe_once(self) -> None:
        if self.engines is None or self._tiers_http is None:
            return
        timeout = self.settings.probe_timeout_ms / 1000
        probes = [
            _reachable(e.upstream.http, "/models", e.upstream.headers({}), timeout)
            for e in self.engines.engines
        ]
        found = await asyncio.gather(_reachable(self._tiers_http, "/healthz", {}, timeout), *probes)
        now = monotonic_ms()
        self._tiers_reach.record(*found[0], now)
        for engine, (ok, error) in zip(self.engines.engines, found[1:], strict=True):
            engine.reach.record(ok, error, now)

    def status(self) -> dict[str, Any]:
        """What a client gets now: `healthy`, or `degraded` with one reason per thing it does not get."""
        if self.proxy is None or self.engines is None:
            return {"status": "healthy", "degraded": []}
        upstreams = [
            Peer(e.name, e.upstream.breaker.state, e.upstream.breaker.reason, e.reach)
            for e in self.engines.engines
        ]
        cache = self.proxy.cache.breaker
        tiers = Peer("tiers", cache.state, cache.reason, self._tiers_reach)
        status, reasons = verdict(upstreams, tiers, monotonic_ms())
        return {"status": status, "degraded": reasons}

    async def _end_idle_conversations(self) -> None:
        assert self.proxy is not None
        while True:
            await asyncio.sleep(self.settings.idle_sweep_interval_ms / 1000)
            try:
                ended = await self.proxy.end_idle()
            except Exception as exc:  # the broker is away: the next sweep ends the next idle ones
                log.warning("ending idle conversations failed", extra={"error": repr(exc)})
                continue
            if ended:
                log.info("idle conversations ended", extra={"conversations": len(ended)})

    async def _api_ticks(self) -> None:
        if self._api is not None:
            await self._api.tick()

    def stats(self) -> dict[str, Any]:
        proxy = self.proxy
        if proxy is None:
            return {}
        return {
            "api": {
                "url": self.api_url if self.api_port else None,
                "auth": self.settings.api_token is not None,
            },
            "upstream": {
                "url": self.settings.upstream_url if not self.settings.upstreams else None,
                "calls": sum(e.upstream.calls for e in proxy.engines.engines),
                "breaker": _breaker_dict(proxy.upstream.breaker.stats()),
            },
            "routing": proxy.engines.stats(),
            "cache": {
                "url": self.settings.tiers_url,
                "breaker": _breaker_dict(proxy.cache.breaker.stats()),
                "pending_stores": proxy.pending_stores,
                **proxy.cache.counts,
            },
            "requests": dict(proxy.counts),
            "conversations": {
                "tracked": len(proxy.conversations),
                "forgotten": proxy.conversations.forgotten,
            },
        }

    async def checks(self) -> dict[str, Any]:
        # The upstream's and the cache's state are reported, not judged: a gateway whose model server is
        # down still answers hits and says why it cannot answer the rest.
        return {
            "api_serving": self._api is not None and self._api.started,
            **self.status(),
            "gateway": self.stats(),
        }
