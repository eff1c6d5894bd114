"""The dashboard's board: per-interval hit rates from cumulative node counters, events into series and
rows, bounded history."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events import (
    DriftClustered,
    HeatScored,
    InvalidationRecorded,
    TierModeChanged,
    WarmupDecided,
    WarmupMeasured,
    WindowComputed,
    heat_batch,
)
from services.dashboard.board import Board, Series
from services.dashboard.settings import DashboardSettings


def _stats(node: str, lookups: int, **hits: int) -> dict[str, object]:
    return {
        "node_id": node,
        "lookups": lookups,
        "hits_by_tier": {k.replace("_", ":"): v for k, v in hits.items()},
        "mode": "normal",
        "l3": {"breaker": {"state": "closed"}, "pending_writes": 0},
    }


def test_hit_rate_is_per_interval_and_summed_over_nodes_and_match_kinds() -> None:
    board = Board()
    board.observe_stats([_stats("a", 10, l1_exact=5), _stats("b", 10, l3_exact=5)], now_ms=1_000)
    board.observe_stats(
        [_stats("a", 20, l1_exact=5, l1_semantic=5), _stats("b", 20, l3_exact=5)], now_ms=2_000
    )
    series = board.hit_rate.as_dict()
    assert series["t"] == [1.0, 2.0]
    assert series["all"] == [0.5, 0.25]
    assert series["l1"] == [0.25, 0.25]
    assert series["l3"] == [0.25, 0.0]
    assert [n["breaker"] for n in board.snapshot(2_000)["nodes"]] == ["closed", "closed"]


def test_a_node_that_cannot_go_local_only_says_why_beside_its_mode() -> None:
    board = Board()
    lone = {**_stats("a", 10), "local_only": {"enabled": False, "off_because": "no peers to skip"}}
    watched = {**_stats("b", 10), "local_only": {"enabled": True, "off_because": None}}
    board.observe_stats([lone, watched], now_ms=1_000)
    modes = {n["node_id"]: n["mode"] for n in board.snapshot(1_000)["nodes"]}
    assert modes == {"a": "normal (no peers to skip)", "b": "normal"}


def test_a_restarted_node_counts_from_zero_and_an_idle_interval_adds_no_point() -> None:
    board = Board()
    board.observe_stats([_stats("a", 100, l1_exact=50)], now_ms=1_000)
    board.observe_stats([_stats("a", 100, l1_exact=50)], now_ms=2_000)  # idle: no lookups
    board.observe_stats([_stats("a", 4, l2_exact_remote=4)], now_ms=3_000)  # restarted
    assert board.hit_rate.as_dict()["all"] == [0.5, 1.0]
    assert board.hit_rate.as_dict()["l2"] == [0.0, 1.0]


def test_events_become_series_and_rows() -> None:
    board = Board(max_rows=2)
    board.observe(
        WindowComputed(
            shard="s",
            window="tumbling_1s",
            window_start_ms=0,
            window_end_ms=1_000,
            requests=5,
            qps=5.0,
            entropy_bits=1.5,
            hit_rate=0.5,
        )
    )
    board.observe(
        WindowComputed(
            shard="s",
            window="hopping_10s",
            window_start_ms=0,
            window_end_ms=10_000,
            requests=5,
            qps=0.5,
            entropy_bits=1.5,
            hit_rate=0.5,
        )
    )
    for i in range(3):
        board.observe(
            DriftClustered(
                cluster_id=f"c{i}",
                pattern="pulse",
                window_end_ms=i,
                keys=["k"],
                size=1,
                duration_ms=1,
                variance=0.0,
                service_spread=0.0,
            )
        )
        board.observe(HeatScored(key=f"k{i}", score=0.5, decision="keep"))
    board.observe(WarmupDecided(source="drift", action="warm", reason="band", keys=["k"]))
    board.observe(WarmupMeasured(shard="s", t_warm_ms=0, t_peak_ms=250, delta_t_ms=250))
    board.observe(
        InvalidationRecorded(
            root="r",
            cause="invalidated",
            roots=["r"],
            source_event_id="e",
            keys=["a", "b"],
            dependants=2,
            depth=1,
        )
    )
    board.observe(
        TierModeChanged(
            node_id="n",
            mode="local_only",
            previous_mode="normal",
            reason="hit rate low",
            hits=1,
            lookups=10,
            hit_rate=0.1,
            window_ms=1000,
            enter_below=0.85,
            exit_at=0.9,
            in_previous_ms=5,
        )
    )
    snap = board.snapshot(5_000)
    assert snap["series"]["traffic"]["qps"] == [5.0]  # the hopping window repeats the tumbling one
    assert [r["cluster_id"] for r in snap["drift"]] == ["c2", "c1"]  # bounded, newest first
    assert [r["key"] for r in snap["heat"]] == ["k2", "k1"]
    assert snap["warmups"][0]["action"] == "warm"
    assert snap["series"]["warmup_delta"]["delta_t_ms"] == [250]
    assert snap["series"]["invalidations"]["dependants"] == [2]
    assert snap["mode_changes"][0]["mode"] == "local_only"
    assert snap["totals"]["invalidated_keys"] == 2 and snap["totals"]["heat_decisions"] == 3


def test_a_heat_batch_shows_as_its_decisions() -> None:
    board = Board(max_rows=3)
    board.observe(HeatScored(key="k0", score=0.5, decision="keep"))
    board.observe(
        heat_batch([HeatScored(key=f"k{i}", score=0.1 * i, decision="keep_alive") for i in range(1, 4)])
    )
    snap = board.snapshot(5_000)
    assert [r["key"] for r in snap["heat"]] == ["k3", "k2", "k1"]  # newest first, bounded
    assert snap["heat"][0]["decision"] == "keep_alive" and snap["totals"]["heat_decisions"] == 4


def test_series_are_bounded() -> None:
    series = Series(("y",), max_points=3)
    for i in range(5):
        series.add(float(i), y=i)
    assert series.as_dict() == {"columns": ["y"], "t": [2.0, 3.0, 4.0], "y": [2, 3, 4]}


@pytest.mark.parametrize(
    ("raw", "urls"),
    [("http://a:1/, http://b:2", ["http://a:1", "http://b:2"]), ("", [])],
)
def test_tiers_urls_are_a_comma_separated_list(
    monkeypatch: pytest.MonkeyPatch, raw: str, urls: list[str]
) -> None:
    monkeypatch.setenv("CACHEMESH_DASHBOARD_TIERS_URLS", raw)
    assert DashboardSettings().tiers_urls == urls


def test_windows_of_several_shards_make_one_point_per_window_end_in_time_order() -> None:
    board = Board()
    for shard, end, qps, bits in (("a", 2_000, 10.0, 2.0), ("b", 1_000, 4.0, 1.0), ("a", 1_000, 6.0, 3.0)):
        board.observe(
            WindowComputed(
                shard=shard,
                window="tumbling_1s",
                window_start_ms=end - 1000,
                window_end_ms=end,
                requests=1,
                qps=qps,
                entropy_bits=bits,
                hit_rate=0.0,
            )
        )
    traffic = board.snapshot(3_000)["series"]["traffic"]
    assert traffic["t"] == [1.0, 2.0]
    assert traffic["qps"] == [10.0, 10.0]
    assert traffic["entropy_bits"] == [2.0, 2.0]


def test_routing_rows_come_from_every_gateways_report_newest_first() -> None:
    board = Board(max_rows=3)

    def report(node: str, at: list[int]) -> dict[str, Any]:
        routing = {
            "instances": [{"name": "a", "healthy": True}, {"name": "b", "healthy": False}],
            "recent": [
                {"at_ms": t, "instance": "a", "reason": "prefix", "predicted_blocks": 4, "realised_blocks": 4}
                for t in at
            ],
            "warms": {"sent": 3, "used": 2, "wasted": 1, "ttft_saved_ms": 150.4},
        }
        return {"node_id": node, "gateway": {"routing": routing}}

    board.observe_routing([report("gw1", [5, 1]), report("gw2", [4, 3]), {"node_id": "broken"}])
    snap = board.snapshot(10)
    assert [(r["gateway"], r["at_ms"]) for r in snap["routes"]] == [("gw1", 5), ("gw2", 4), ("gw2", 3)]
    assert [(r["gateway"], r["name"], r["healthy"]) for r in snap["instances"]] == [
        ("gw1", "a", True), ("gw1", "b", False), ("gw2", "a", True), ("gw2", "b", False),
    ]  # fmt: skip
    assert snap["totals"]["engine_warms_sent"] == 6 and snap["totals"]["engine_warms_used"] == 4
    assert snap["totals"]["engine_warms_ttft_saved_ms"] == 300  # first-token time the used warms saved
    assert "engine_warms_sent" not in Board().snapshot(0)["totals"]  # no gateway: no warm totals
