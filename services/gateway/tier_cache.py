"""The tier node as the gateway's cache (over its HTTP API, `services/tiers/edge/api.py`): one lookup
per request (exact key first, then the prompt's embedding through the node's match decision), bounded
by a timeout and a breaker so the cache never holds a miss up; writes of answers; feedback."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from cachemesh_client import AsyncTiersClient, TiersError
from prometheus_client import Histogram

from services.gateway.answers import decode_answer, encode_answer
from services.runtime.breaker import FailureBreaker
from services.runtime.metrics import child

log = logging.getLogger(__name__)

Outcome = Literal["hit", "miss", "timeout", "error", "skipped"]

LOOKUP_MS = Histogram(
    "cachemesh_gateway_lookup_ms",
    "The gateway's lookups in the tier node, by outcome (ms)",
    ["outcome"],
    buckets=(0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0),
)


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    key: str
    match: str  # exact | semantic
    similarity: float | None
    tier: str | None
    answer: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LookupResult:
    outcome: Outcome
    latency_ms: float
    hit: CachedAnswer | None = None
    explore_key: str | None = None
    explore_answer: dict[str, Any] | None = None  # that entry's stored answer, to compare with the model's
    miss_rule: str | None = None  # why the node served none: the rule that refused its best candidate
    best_similarity: float | None = None  # that candidate's


@dataclass(frozen=True, slots=True)
class Entry:
    """What a stored answer carries besides its value: the descriptor's fields."""

    key: str
    namespace: str
    prompt: str | None
    trace_id: str | None
    ttl_hint_ms: int
    tags: Mapping[str, str]
    # A miss the node wants explored: (its candidate's key, its stored answer), to compare with the
    # model's answer once it came.
    explored: tuple[str, Mapping[str, Any]] | None = None


class TierCache:
    """The gateway's side of the tier API, on the light client (`cachemesh_client`) over the gateway's
    own httpx client (its base URL, token and pool)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        breaker: FailureBreaker,
        *,
        lookup_timeout_s: float,
        store_timeout_s: float,
        similarity_tolerance: float | None = None,
        invalidate_threshold: float | None = None,
    ) -> None:
        self.http = http  # its owner closes it
        self.client = AsyncTiersClient(str(http.base_url), http=http)
        self.breaker = breaker
        self.lookup_timeout_s = lookup_timeout_s
        self.store_timeout_s = store_timeout_s
        self.similarity_tolerance = similarity_tolerance
        self.invalidate_threshold = invalidate_threshold
        self.counts: dict[str, int] = {"stored": 0, "store_errors": 0}

    async def lookup(self, key: str, text: str | None, namespace: str, trace_id: str | None) -> LookupResult:
        started = time.perf_counter()

        def result(outcome: Outcome, **kw: Any) -> LookupResult:
            ms = (time.perf_counter() - started) * 1000
            child(LOOKUP_MS, outcome).observe(ms)
            return LookupResult(outcome, ms, **kw)

        if not self.breaker.allow():
            return result("skipped")
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                found = await self.client.lookup(key, model=namespace, text=text, trace_id=trace_id)
        except TimeoutError:
            self.breaker.record(False)
            return result("timeout")
        except TiersError as exc:
            # 5xx: the node is unwell; 4xx: it refused this request (too long a text): not its health.
            self.breaker.record(exc.status < 500)
            log.warning("cache lookup refused", extra={"status": exc.status, "body": str(exc.detail)[:200]})
            return result("error")
        except httpx.HTTPError as exc:
            self.breaker.record(False)
            log.warning("cache lookup failed; forwarding: %r", exc)
            return result("error")
        self.breaker.record(True)
        explore = found.explore_key
        if not found.hit:
            return result(
                "miss",
                explore_key=explore,
                explore_answer=_answer(found.explore_value) if explore else None,
                miss_rule=found.miss_rule,
                best_similarity=found.similarity,
            )
        answer = _answer(found.value)
        if answer is None:
            return result("miss", explore_key=explore)
        hit = CachedAnswer(
            key=str(found.key),
            match=found.match or "exact",
            similarity=found.similarity,
            tier=found.tier,
            answer=answer,
        )
        return result("hit", hit=hit)

    async def prefix(self, keys: list[str]) -> int:
        """How many leading KV blocks of `keys` the tier node holds (what a connector could load)."""
        if not self.breaker.allow():
            return 0
        async with asyncio.timeout(self.lookup_timeout_s):
            return (await self.client.prefix(keys)).prefix_blocks

    async def store(self, entry: Entry, answer: Mapping[str, Any]) -> bool:
        semantic = entry.prompt is not None
        try:
            async with asyncio.timeout(self.store_timeout_s):
                await self.client.put(
                    entry.key,
                    encode_answer(answer),
                    model=entry.namespace,
                    kind="prompt",
                    ttl_hint_ms=entry.ttl_hint_ms,
                    semantic_tags=dict(entry.tags),
                    embed_text=entry.prompt,
                    similarity_tolerance=self.similarity_tolerance if semantic else None,
                    invalidate_threshold=self.invalidate_threshold if semantic else None,
                    trace_id=entry.trace_id,
                )
        except TiersError as exc:
            self.counts["store_errors"] += 1
            log.warning(
                "the tier node refused an answer",
                extra={"key": entry.key, "status": exc.status, "body": str(exc.detail)[:200]},
            )
            return False
        except (TimeoutError, httpx.HTTPError) as exc:
            self.counts["store_errors"] += 1
            log.warning("storing answer %s failed: %r", entry.key, exc)
            return False
        self.counts["stored"] += 1
        return True

    async def feedback(
        self, key: str, text: str, correct: bool, *, explored: bool = False
    ) -> tuple[int, Any]:
        """The tier node's feedback route; its status and body, as they are."""
        try:
            return 200, await self.client.feedback(key, text, correct=correct, explored=explored)
        except TiersError as exc:
            return exc.status, {"detail": exc.detail}

    async def delete(self, key: str) -> bool:
        try:
            return await self.client.delete(key)
        except TiersError:
            return False


def _answer(value: object) -> dict[str, Any] | None:
    """A stored answer (text values only; anything else is not the gateway's)."""
    return decode_answer(value) if isinstance(value, str) else None
