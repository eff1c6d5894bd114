"""Prometheus metrics shared by the runtime, and the small HTTP endpoint every service exposes:
`/metrics` (Prometheus text) and `/healthz` (JSON, 200 when healthy, 503 otherwise)."""

from __future__ import annotations

import abc
import bisect
import functools
import json
import math
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar, overload

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

EVENTS_PUBLISHED = Counter("cachemesh_events_published_total", "Events acknowledged by the broker", ["topic"])
PUBLISH_FAILURES = Counter("cachemesh_publish_failures_total", "Events the broker did not take", ["topic"])


class FastCounter:
    """One label set of a `FastCounters`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class FastHistogramChild:
    """One label set of a `FastHistogram`: counts per bucket (not cumulative) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # The first bound >= value: Prometheus buckets are "less than or equal".
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value


_Child = TypeVar("_Child", FastCounter, FastHistogramChild)


class _Fast(Collector, Generic[_Child]):
    """A metric for per-event paths: plain numbers per label set, turned into samples when scraped.
    prometheus_client's own `inc` and `observe` take a lock and check the metric on every call:
    about 1 us of a consumer's ~10 us per record. The services update them from their event loop's
    thread only; a scrape from another thread reads numbers at most one update old."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        new_child: Callable[[], _Child],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        self._new_child: Callable[[], _Child] = new_child
        self._children: dict[tuple[str, ...], _Child] = {}
        registry.register(self)

    def labels(self, *labelvalues: str) -> _Child:
        child = self._children.get(labelvalues)
        if child is None:
            child = self._children[labelvalues] = self._new_child()
        return child

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    @abc.abstractmethod
    def _family(self) -> Metric:
        """The metric family, without samples."""


class FastCounters(_Fast[FastCounter]):
    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry = REGISTRY
    ) -> None:
        super().__init__(name, documentation, labelnames, FastCounter, registry)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for labelvalues, child in list(self._children.items()):
            family.add_metric(list(labelvalues), child.value)
        return [family]


class FastHistogram(_Fast[FastHistogramChild]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        bounds = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
        self._bounds = bounds
        super().__init__(
            name,
            documentation,
            labelnames,
            functools.partial(FastHistogramChild, bounds),
            registry,
        )

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        bounds = [*(str(b) for b in self._bounds), "+Inf"]
        for labelvalues, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric(list(labelvalues), buckets, total)
        return [family]


EVENTS_CONSUMED = FastCounters(
    "cachemesh_events_consumed", "Records read, by outcome", ["topic", "group", "outcome"]
)
EVENTS_DEAD_LETTERED = Counter(
    "cachemesh_events_dead_lettered_total", "Records sent to a DLQ, by reason kind", ["topic", "kind"]
)
HANDLER_SECONDS = FastHistogram(
    "cachemesh_handler_seconds",
    "Time to apply one event",
    ["topic", "group"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
DB_RETRIES = Counter("cachemesh_db_retries_total", "Database calls retried after a lost connection")


class Lagging(Protocol):
    """What the lag collector reads of a consumer (`kafka.EventConsumer`)."""

    group_id: str

    def lag(self) -> dict[str, int]: ...


class ConsumerLag(Collector):
    """`cachemesh_consumer_lag`: records in the broker a group has not applied yet (the log end as of
    the last fetch minus the next offset to apply), summed per topic: every consuming service's queue
    depth, read from the consumers when scraped."""

    def __init__(self) -> None:
        self._consumers: weakref.WeakSet[Lagging] = weakref.WeakSet()

    def add(self, consumer: Lagging) -> None:
        self._consumers.add(consumer)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        lag: dict[tuple[str, str], int] = {}
        for consumer in list(self._consumers):
            for topic, behind in consumer.lag().items():
                key = (topic, consumer.group_id)
                lag[key] = lag.get(key, 0) + behind
        family = self._family()
        for (topic, group), value in sorted(lag.items()):
            family.add_metric([topic, group], value)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "cachemesh_consumer_lag", "Records not applied yet, by topic and group", labels=["topic", "group"]
        )


CONSUMERS = ConsumerLag()
REGISTRY.register(CONSUMERS)

_M = TypeVar("_M", Counter, Histogram)


@overload
def child(metric: FastCounters, *labels: str) -> FastCounter: ...
@overload
def child(metric: FastHistogram, *labels: str) -> FastHistogramChild: ...
@overload
def child(metric: _M, *labels: str) -> _M: ...
@functools.cache
def child(metric: Counter | Histogram | FastCounters | FastHistogram, *labels: str) -> object:
    """`metric.labels(*labels)`, looked up once: prometheus_client checks and locks on every call,
    which costs more than the increment on a per-event path. Nothing here removes label sets."""
    return metric.labels(*labels)


HealthCheck = Callable[[], Awaitable[dict[str, object]]]


class MetricsServer:
    """Serves /metrics and /healthz on `host:port` (port 0 picks a free one; see `.port`), and any
    pages a service adds (`routes`)."""

    def __init__(
        self, host: str, port: int, health: HealthCheck, routes: Sequence[web.AbstractRouteDef] = ()
    ) -> None:
        self._host = host
        self._port = port
        self._health = health
        self._routes = list(routes)
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.add_routes(self._routes)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        if server is not None and server.sockets:  # type: ignore[attr-defined]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        report = await self._health()
        status = 200 if report.get("healthy") else 503
        return web.Response(
            text=json.dumps(report, default=str), status=status, content_type="application/json"
        )
