"""The same window statistics and drift clusters computed offline, in one pass over a list of events:
the reference the stream is checked against (tests) and a way to inspect a trace without Kafka.

It shares the maths (`windows`, `drift`) with the stream but none of its plumbing: no partitions,
watermarks, hand-off or tables. A window exists when it holds at least one access.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.events import CacheAccessed, DriftClustered, WindowComputed
from streams.drift import DriftParams, advance_runs, cluster_window
from streams.merge import drift_clustered, window_keys, with_runs
from streams.windows import (
    HOPPING_10S,
    PANE_MS,
    SPIKE_RTT_MS,
    TUMBLING_1S,
    Group,
    PaneAggregate,
    group_order,
    groups_for,
    merge_all,
    pane_start,
    tracks_drift,
    window_computed,
)


def panes_by_group(
    events: Iterable[CacheAccessed], spike_rtt_ms: float = SPIKE_RTT_MS
) -> dict[Group, dict[int, PaneAggregate]]:
    panes: dict[Group, dict[int, PaneAggregate]] = {}
    for event in events:
        start = pane_start(event.occurred_at_ms)
        for group in groups_for(event):
            by_start = panes.setdefault(group, {})
            agg = by_start.get(start)
            if agg is None:
                agg = by_start[start] = PaneAggregate.for_group(group)
            agg.add(event, spike_rtt_ms)
    return panes


def _hopping_ends(starts: Iterable[int]) -> list[int]:
    return sorted({s + k * PANE_MS for s in starts for k in range(1, HOPPING_10S.size_ms // PANE_MS + 1)})


def offline_windows(
    events: Iterable[CacheAccessed], spike_rtt_ms: float = SPIKE_RTT_MS
) -> list[WindowComputed]:
    out: list[WindowComputed] = []
    for group, panes in sorted(panes_by_group(events, spike_rtt_ms).items(), key=lambda i: group_order(i[0])):
        for start in sorted(panes):
            out.append(window_computed(TUMBLING_1S, group, start, panes[start]))
        for end in _hopping_ends(panes):
            hop = merge_all((panes[s] for s in HOPPING_10S.panes(end) if s in panes), activity=False)
            out.append(window_computed(HOPPING_10S, group, end - HOPPING_10S.size_ms, hop))
    return out


def offline_drift(
    events: Iterable[CacheAccessed], params: DriftParams | None = None, spike_rtt_ms: float = SPIKE_RTT_MS
) -> list[DriftClustered]:
    params = params or DriftParams()
    out: list[DriftClustered] = []
    for group, panes in sorted(panes_by_group(events, spike_rtt_ms).items(), key=lambda i: group_order(i[0])):
        if not tracks_drift(group):
            continue
        runs: dict[str, int] = {}
        previous_end: int | None = None
        for end in _hopping_ends(panes):
            if previous_end is not None and end != previous_end + PANE_MS:
                runs = {}
            previous_end = end
            window = [panes.get(s) for s in HOPPING_10S.panes(end)]
            keys, first = window_keys(window)
            runs, _, _ = advance_runs(runs, first)
            keys = with_runs(keys, runs)
            for index, cluster in enumerate(cluster_window(keys, end, params)):
                out.append(drift_clustered(group[0], end, index, cluster))
    return out


_EXACT_FIELDS = (
    "shard",
    "model",
    "window",
    "window_start_ms",
    "window_end_ms",
    "requests",
    "hits",
    "distinct_keys",
    "penetrated",
    "latency_spikes",
    "qps",
    "entropy_bits",
    "hit_rate",
    "hit_rate_by_tier",
    "penetration_by_layer",
    "miss_latency_ms_p50",
    "miss_latency_ms_p95",
)


def compare_windows(got: Iterable[WindowComputed], want: Iterable[WindowComputed]) -> list[str]:
    """Differences between streamed and offline windows, matched by event id (repeats of one window
    must be identical). Counts and everything derived from them must be equal; only the added
    latencies, sums of floats taken in another order, may differ in the last bits."""
    problems: list[str] = []
    got_by_id: dict[str, WindowComputed] = {}
    for w in got:
        if w.event_id in got_by_id and got_by_id[w.event_id] != w:
            problems.append(f"window {w.event_id} emitted twice with different content")
        got_by_id[w.event_id] = w
    want_by_id = {w.event_id: w for w in want}
    missing = sorted(set(want_by_id) - set(got_by_id))
    extra = sorted(set(got_by_id) - set(want_by_id))
    for event_id in missing[:5]:
        w = want_by_id[event_id]
        problems.append(f"missing {w.window} {w.shard}/{w.model} [{w.window_start_ms}, {w.window_end_ms})")
    for event_id in extra[:5]:
        w = got_by_id[event_id]
        problems.append(f"unexpected {w.window} {w.shard}/{w.model} [{w.window_start_ms}, {w.window_end_ms})")
    if len(missing) > 5 or len(extra) > 5:
        problems.append(f"{len(missing)} missing and {len(extra)} unexpected windows in all")
    for event_id in sorted(set(want_by_id) & set(got_by_id)):
        a, b = got_by_id[event_id], want_by_id[event_id]
        where = f"{b.window} {b.shard}/{b.model} @{b.window_start_ms}"
        for name in _EXACT_FIELDS:
            if getattr(a, name) != getattr(b, name):
                problems.append(f"{where}: {name} {getattr(a, name)!r} != {getattr(b, name)!r}")
        if set(a.added_latency_ms_by_layer) != set(b.added_latency_ms_by_layer) or any(
            abs(a.added_latency_ms_by_layer[k] - v) > 1e-6 * max(1.0, abs(v))
            for k, v in b.added_latency_ms_by_layer.items()
        ):
            problems.append(f"{where}: added latency differs")
    return problems
