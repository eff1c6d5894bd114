"""The gateway's verdict on itself: healthy only when every upstream and the tier node answer and no
breaker is open; otherwise degraded, one reason per thing a client does not get."""

from __future__ import annotations

from services.gateway.health import Peer, Reach, verdict


def reach(ok: bool | None, since_ms: int = 0, error: str | None = None) -> Reach:
    r = Reach()
    if ok is not None:
        r.record(ok, error, since_ms)
    return r


def test_all_answering_is_healthy_and_not_yet_probed_is_not_a_failure() -> None:
    ups = [Peer("a", "closed", None, reach(True)), Peer("b", "closed", None, reach(None))]
    assert verdict(ups, Peer("tiers", "closed", None, reach(True)), 5_000) == ("healthy", [])


def test_one_upstream_down_is_degraded_and_says_which_and_since_when() -> None:
    ups = [
        Peer("a", "closed", None, reach(False, since_ms=1_000, error="ConnectError")),
        Peer("b", "closed", None, reach(True)),
    ]
    status, reasons = verdict(ups, Peer("tiers", "closed", None, reach(True)), 13_000)
    assert status == "degraded"
    assert reasons == ["upstream a unreachable for 12 s (ConnectError)"]


def test_every_upstream_out_means_only_hits_and_an_open_cache_breaker_means_no_cache() -> None:
    ups = [
        Peer("a", "open", "3 failures in a row", reach(True)),
        Peer("b", "half_open", "probe failed", reach(True)),
    ]
    tiers = Peer("tiers", "open", "5 failures in a row", reach(True))
    status, reasons = verdict(ups, tiers, 0)
    assert status == "degraded"
    assert reasons == [
        "upstream a breaker open (3 failures in a row)",
        "upstream b breaker half-open, probing (probe failed)",
        "no upstream answers: only cache hits are served",
        "tier node breaker open (5 failures in a row): every request goes upstream, nothing is cached",
    ]


def test_reach_keeps_the_time_of_the_last_change() -> None:
    r = Reach()
    r.record(False, "refused", 100)
    r.record(False, "refused again", 200)
    assert (r.ok, r.error, r.since_ms) == (False, "refused again", 100)
    r.record(True, None, 300)
    assert (r.ok, r.error, r.since_ms) == (True, None, 300)
