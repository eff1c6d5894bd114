"""The per-event metrics expose exactly what prometheus_client's own Counter and Histogram would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from services.runtime.metrics import FastCounters, FastHistogram

BUCKETS = (0.0005, 0.001, 0.01, 0.5, 2.5)
LABELS = st.sampled_from([("a", "g"), ("b", "g"), ("a", "h")])


def _lines(registry: CollectorRegistry, prefix: str) -> list[str]:
    """The samples, without comments and `_created`, with the metric's prefix replaced by `m_`."""
    text = generate_latest(registry).decode()
    return sorted(
        line.replace(prefix, "m_", 1)
        for line in text.splitlines()
        if not line.startswith("#") and "_created" not in line
    )


@settings(max_examples=100, deadline=None)
@given(
    updates=st.lists(
        st.tuples(LABELS, st.floats(min_value=0, max_value=10, allow_nan=False) | st.sampled_from(BUCKETS)),
        max_size=30,
    )
)
def test_the_fast_metrics_expose_what_prometheus_clients_own_do(
    updates: list[tuple[tuple[str, str], float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counter = FastCounters("fast_total", "d", ["topic", "group"], registry=ours)
    histogram = FastHistogram("fast_seconds", "d", ["topic", "group"], BUCKETS, registry=ours)
    ref_counter = Counter("ref_total", "d", ["topic", "group"], registry=theirs)
    ref_histogram = Histogram("ref_seconds", "d", ["topic", "group"], buckets=BUCKETS, registry=theirs)
    for labels, value in updates:
        counter.labels(*labels).inc(value)
        histogram.labels(*labels).observe(value)
        ref_counter.labels(*labels).inc(value)
        ref_histogram.labels(*labels).observe(value)
    assert _lines(ours, "fast_") == _lines(theirs, "ref_")
