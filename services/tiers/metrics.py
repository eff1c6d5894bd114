"""The tier node's Prometheus series: lookups by tier and match kind, hit rate, queue depths and tier sizes,
read from the nodes' own counters when scraped, and the lookup (per API route) and L3 latency histograms,
whose only cost on the request path is one bucket increment."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from services.tiers.node.tiered import TieredCache

# An exact lookup answers in tens of microseconds, a semantic one in a millisecond or two, one from L3
# in several: the buckets span all three.
LOOKUP_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)
# The breaker opens at a p99 of 150 ms (docs/design.md §4.4): buckets either side of it.
L3_BUCKETS_MS = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 150.0, 250.0, 500.0, 1000.0, 2500.0)

# Lifetime counters of `Counters` (node/counters.py) exposed as they are: (series, attribute, help).
_COUNTERS = (
    ("cachemesh_tiers_lookups", "lookups", "Lookups answered by the node (hit or miss)"),
    ("cachemesh_tiers_degraded_lookups", "degraded_lookups", "Lookups served without L3 (breaker open)"),
    ("cachemesh_tiers_fenced", "fenced", "Copies found older than a write the node heard of: misses"),
    ("cachemesh_tiers_puts", "puts", "Entries written"),
    ("cachemesh_tiers_deletes", "deletes", "Entries deleted through the API"),
    (
        "cachemesh_tiers_invalidations_received",
        "invalidations_received",
        "cache.invalidate.v1 events applied",
    ),
    ("cachemesh_tiers_invalidated_entries", "invalidated_entries", "Entries dropped by invalidations"),
    ("cachemesh_tiers_commands", "commands", "Warmup, promotion and eviction commands carried out"),
    ("cachemesh_tiers_warmed", "warmed", "Entries loaded by warmup commands"),
    ("cachemesh_tiers_warm_already_held", "warm_already_held", "Keys warmup commands found in place"),
    ("cachemesh_tiers_l3_errors", "l3_errors", "L3 calls that failed or timed out"),
    ("cachemesh_tiers_remote_hits", "remote_hits", "Lookups answered from a peer's L2"),
)


class LatencyMs:
    """A histogram in milliseconds without prometheus_client's locks and label lookups: each node's
    event loop is the only writer of its own, and a scrape reads it between two of its steps."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: over every bound
        self.sum = 0.0

    def observe(self, ms: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (`le`)
        self.counts[bisect_left(self.bounds, ms)] += 1
        self.sum += ms

    def buckets(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
        return out


class TierSeries(Collector):
    """Every tier node of the process (`watch`ed while it runs); the histograms outlive a node, as a
    prometheus_client child does, so a node restarted under its id goes on counting in them."""

    def __init__(self) -> None:
        self._nodes: dict[str, TieredCache] = {}
        self._lookup: dict[tuple[str, str], LatencyMs] = {}
        self._l3: dict[tuple[str, str], LatencyMs] = {}

    def watch(self, node: str, cache: TieredCache) -> None:
        self._nodes[node] = cache
        ok, failed = self.l3(node, "ok"), self.l3(node, "error")
        cache.breaker.observe = lambda ms, success: (ok if success else failed).observe(ms)

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def route(self, node: str, route: str) -> LatencyMs:
        """The lookup latency histogram of `route` on `node` (bind it once, outside the request path)."""
        return self._lookup.setdefault((node, route), LatencyMs(LOOKUP_BUCKETS_MS))

    def l3(self, node: str, outcome: str) -> LatencyMs:
        return self._l3.setdefault((node, outcome), LatencyMs(L3_BUCKETS_MS))

    def describe(self) -> Iterable[Metric]:
        return list(self._families({}))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(dict(self._nodes)))

    def _families(self, nodes: dict[str, TieredCache]) -> Iterator[Metric]:
        results = CounterMetricFamily(
            "cachemesh_tiers_lookup_results",
            "Lookups by the tier that answered (l1, l2, peers, l3; none on a miss) and match kind",
            labels=["node", "tier", "match"],
        )
        hit_rate = GaugeMetricFamily(
            "cachemesh_tiers_hit_rate", "Hits / lookups since the node started", labels=["node"]
        )
        queues = GaugeMetricFamily(
            "cachemesh_tiers_queue_depth",
            "Queued work: access_events and invalidations (outbox to Kafka), l3_writes (write-behind)",
            labels=["node", "queue"],
        )
        dropped = CounterMetricFamily(
            "cachemesh_tiers_queue_dropped",
            "Events dropped from a full outbox queue",
            labels=["node", "queue"],
        )
        entries = GaugeMetricFamily(
            "cachemesh_tiers_entries", "Entries held, by tier", labels=["node", "tier"]
        )
        breaker = GaugeMetricFamily(
            "cachemesh_tiers_l3_breaker_open", "1 while the L3 breaker is open or half-open", labels=["node"]
        )
        counters = {attr: CounterMetricFamily(name, doc, labels=["node"]) for name, attr, doc in _COUNTERS}
        for node, cache in sorted(nodes.items()):
            c = cache.counters
            for where, count in sorted(c.hits.items()):
                tier, match, *remote = where.split(":")  # "l2:exact:remote": from a peer's L2
                results.add_metric([node, "peers" if remote else tier, match], count)
            results.add_metric([node, "none", "miss"], c.misses)
            hits = sum(c.hits.values())
            hit_rate.add_metric([node], hits / c.lookups if c.lookups else 0.0)
            for attr, family in counters.items():
                family.add_metric([node], getattr(c, attr))
            outbox = cache.outbox.stats()
            queues.add_metric([node, "access_events"], outbox.queued_access)
            queues.add_metric([node, "invalidations"], outbox.queued_invalidations)
            queues.add_metric([node, "l3_writes"], cache.pending_l3_writes)
            dropped.add_metric([node, "access_events"], outbox.dropped_access)
            dropped.add_metric([node, "invalidations"], outbox.dropped_invalidations)
            entries.add_metric([node, "l1"], len(cache.l1))
            if cache.l2 is not None:
                entries.add_metric([node, "l2"], len(cache.l2))
            breaker.add_metric([node], float(cache.breaker.state != "closed"))
        yield from (results, hit_rate, queues, dropped, entries, breaker, *counters.values())
        yield _histogram(
            "cachemesh_tiers_lookup_ms", "Lookup latency at the API, by route (ms)", "route", self._lookup
        )
        yield _histogram("cachemesh_tiers_l3_ms", "L3 call latency, by outcome (ms)", "outcome", self._l3)


def _histogram(
    name: str, doc: str, label: str, series: dict[tuple[str, str], LatencyMs]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["node", label])
    for (node, value), hist in sorted(series.items()):
        family.add_metric([node, value], hist.buckets(), hist.sum)
    return family


TIERS = TierSeries()
REGISTRY.register(TIERS)
