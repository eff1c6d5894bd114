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
from urllib.parse import quote

import httpx
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
        self.http = http
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
        body: dict[str, Any] = {"key": key, "model": namespace, "include_value": True}
        if text is not None:
            body["text"] = text
        if trace_id is not None:
            body["trace_id"] = trace_id
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                response = await self.http.post("/v1/lookup", json=body, timeout=self.lookup_timeout_s)
        except TimeoutError:
            self.breaker.record(False)
            return result("timeout")
        except httpx.HTTPError as exc:
            self.breaker.record(False)
            log.warning("cache lookup failed; forwarding: %r", exc)
            return result("error")
        if response.status_code != 200:
            # 5xx: the node is unwell; 4xx: it refused this request (too long a text): not its health.
            self.breaker.record(response.status_code < 500)
            log.warning(
                "cache lookup refused", extra={"status": response.status_code, "body": response.text[:200]}
            )
            return result("error")
        self.breaker.record(True)
        data = response.json()
        explore = data.get("explore_key")
        if not data.get("hit"):
            rule, near = data.get("miss_rule"), data.get("similarity")
            return result(
                "miss",
                explore_key=explore,
                explore_answer=_stored(data.get("explore_value")) if explore else None,
                miss_rule=str(rule) if rule is not None else None,
                best_similarity=float(near) if isinstance(near, int | float) else None,
            )
        answer = decode_answer((data.get("value") or {}).get("text"))
        if answer is None:
            return result("miss", explore_key=explore)
        hit = CachedAnswer(
            key=str(data["key"]),
            match=str(data.get("match") or "exact"),
            similarity=data.get("similarity"),
            tier=data.get("tier"),
            answer=answer,
        )
        return result("hit", hit=hit)

    async def prefix(self, keys: list[str]) -> int:
        """How many leading KV blocks of `keys` the tier node holds (what a connector could load)."""
        if not self.breaker.allow():
            return 0
        async with asyncio.timeout(self.lookup_timeout_s):
            response = await self.http.post("/v1/prefix", json={"keys": keys}, timeout=self.lookup_timeout_s)
        response.raise_for_status()
        return int(response.json()["prefix_blocks"])

    async def store(self, entry: Entry, answer: Mapping[str, Any]) -> bool:
        body: dict[str, Any] = {
            "value": {"text": encode_answer(answer)},
            "model": entry.namespace,
            "kind": "prompt",
            "ttl_hint_ms": entry.ttl_hint_ms,
            "semantic_tags": dict(entry.tags),
        }
        if entry.prompt is not None:
            body["embed_text"] = entry.prompt
            if self.similarity_tolerance is not None:
                body["similarity_tolerance"] = self.similarity_tolerance
            if self.invalidate_threshold is not None:
                body["invalidate_threshold"] = self.invalidate_threshold
        if entry.trace_id is not None:
            body["trace_id"] = entry.trace_id
        try:
            async with asyncio.timeout(self.store_timeout_s):
                response = await self.http.put(
                    "/v1/entries/" + quote(entry.key, safe=""), json=body, timeout=self.store_timeout_s
                )
        except (TimeoutError, httpx.HTTPError) as exc:
            self.counts["store_errors"] += 1
            log.warning("storing answer %s failed: %r", entry.key, exc)
            return False
        if response.status_code not in (200, 201):
            self.counts["store_errors"] += 1
            log.warning(
                "the tier node refused an answer",
                extra={"key": entry.key, "status": response.status_code, "body": response.text[:200]},
            )
            return False
        self.counts["stored"] += 1
        return True

    async def feedback(
        self, key: str, text: str, correct: bool, *, explored: bool = False
    ) -> tuple[int, Any]:
        """The tier node's feedback route; its status and body, as they are."""
        body = {"key": key, "text": text, "correct": correct, "explored": explored}
        response = await self.http.post("/v1/feedback", json=body)
        return response.status_code, _body(response)

    async def delete(self, key: str) -> bool:
        response = await self.http.delete("/v1/entries/" + quote(key, safe=""))
        return response.status_code == 200 and bool(_body(response).get("deleted"))


def _stored(value: Any) -> dict[str, Any] | None:
    return decode_answer(value.get("text")) if isinstance(value, dict) else None


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text}
