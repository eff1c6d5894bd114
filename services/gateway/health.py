"""What a client of the gateway gets right now, in a word and its reasons. `healthy`: every upstream
answers and the tier node's lookups flow. `degraded`: it answers, but not everything — an upstream is
unreachable or its breaker is not closed (its requests go to another instance, or fail with a 502/503
when there is none), no upstream answers at all (only cache hits are served), or the tier node is
unreachable or its breaker open (every request goes upstream and nothing is cached).

Pure: the service probes (GET /v1/models on each upstream, /healthz on the tier node) and records what
it found in a `Reach`; `verdict` reads the probes and the breakers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from services.runtime.breaker import BreakerState

Status = Literal["healthy", "degraded"]


@dataclass(slots=True)
class Reach:
    """The last probe of one peer: ok (None before the first), the error it gave, since when (ms)."""

    ok: bool | None = None
    error: str | None = None
    since_ms: int = 0

    def record(self, ok: bool, error: str | None, now_ms: int) -> None:
        if ok != self.ok:
            self.since_ms = now_ms
        self.ok = ok
        self.error = None if ok else error


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    breaker: BreakerState
    breaker_reason: str | None
    reach: Reach


def _why(peer: Peer, now_ms: int) -> str | None:
    if peer.reach.ok is False:
        return f"unreachable for {max(0, now_ms - peer.reach.since_ms) / 1000:.0f} s ({peer.reach.error})"
    if peer.breaker == "open":
        return f"breaker open ({peer.breaker_reason})"
    if peer.breaker == "half_open":
        return f"breaker half-open, probing ({peer.breaker_reason})"
    return None


def verdict(upstreams: Sequence[Peer], tiers: Peer, now_ms: int) -> tuple[Status, list[str]]:
    """The gateway's status and, when degraded, one reason per thing a client does not get."""
    reasons = [
        f"upstream{'' if u.name == 'upstream' else ' ' + u.name} {why}"  # one unnamed upstream: "upstream"
        for u in upstreams
        if (why := _why(u, now_ms)) is not None
    ]
    if upstreams and len(reasons) == len(upstreams):
        reasons.append("no upstream answers: only cache hits are served")
    if (why := _why(tiers, now_ms)) is not None:
        reasons.append(f"tier node {why}: every request goes upstream, nothing is cached")
    return ("degraded" if reasons else "healthy"), reasons
