"""The request path of the gateway: normalise, decide what the cache may do (policy), look up (bounded),
answer a hit itself (JSON or SSE), forward a miss to the upstream and relay its answer (streamed chunk
by chunk), store a good answer in the background, and follow conversations (context.lifecycle.v1)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import httpx
from prometheus_client import Counter, Histogram
from starlette.responses import JSONResponse, Response, StreamingResponse

from schemas.events import (
    MAX_ACCESS_BATCH,
    MAX_KEY_CHARS,
    CacheAccessed,
    ConversationEnded,
    ConversationStarted,
    Event,
    access_batch,
)
from services.gateway.answers import answer_text, answers_agree, as_served, error_body, response_id
from services.gateway.conversations import Conversations, Served, ServedAnswers
from services.gateway.engines import Engines
from services.gateway.engines import Route as EngineRoute
from services.gateway.policy import CachePolicy, Directives
from services.gateway.requests import (
    BadRequest,
    Normalised,
    Route,
    check_tenant,
    normalise_chat,
    normalise_completion,
    parse_body,
)
from services.gateway.settings import GatewaySettings
from services.gateway.sse import DONE, SseParser, assemble, replay
from services.gateway.tier_cache import CachedAnswer, Entry, LookupResult, TierCache
from services.gateway.upstream import UpstreamUnavailable

log = logging.getLogger(__name__)

EVENTS = Counter(
    "cachemesh_gateway_requests_total",
    "Gateway outcomes: hit, miss, bypass, lookup_<timeout|error|skipped>, hedged, upstream_errors, ...",
    ["outcome"],
)
REQUEST_MS = Histogram(
    "cachemesh_gateway_request_ms",
    "Completions, request read to response started (a stream's first byte), by route (ms)",
    ["route"],
    buckets=(1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0),
)

Publish = Callable[[Event, bool], Awaitable[None]]
CONVERSATION_HEADER = "x-cachemesh-conversation-id"
TENANT_HEADER = "x-cachemesh-tenant"
_PATHS: dict[Route, str] = {"chat": "/chat/completions", "completion": "/completions"}
# Failures that mean the engine never took the request: another may.
_RETRYABLE = {"upstream_unreachable", "upstream_breaker_open"}


def problem(status: int, message: str, *, kind: str, code: str | None = None, **headers: str) -> Response:
    return JSONResponse(error_body(message, kind=kind, code=code), status_code=status, headers=headers)


def _relayed(response: httpx.Response, headers: dict[str, str]) -> Response:
    """The upstream's answer as it came (status, body, type), with the gateway's headers."""
    media = response.headers.get("content-type", "application/json")
    return Response(response.content, status_code=response.status_code, media_type=media, headers=headers)


class Outgoing(NamedTuple):
    """One request on its way to an engine: the engine's path, the body, the caller's headers, the
    headers the answer will carry, and the entry to store the answer under (None: not stored)."""

    path: str
    raw: bytes
    incoming: Mapping[str, str]
    out: dict[str, str]
    entry: Entry | None


class Proxy:
    def __init__(
        self,
        settings: GatewaySettings,
        cache: TierCache,
        engines: Engines,
        publish: Publish,
        *,
        clock_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.engines = engines
        self.upstream = engines.first.upstream  # /v1/models asks the first
        self.publish = publish
        self.policy = CachePolicy(settings.sampling_policy, settings.cache_tools)
        self.conversations = Conversations(
            idle_ms=settings.conversation_idle_ms, max_tracked=settings.max_conversations, clock=clock_ms
        )
        self.served = ServedAnswers(settings.max_feedback_refs)
        self.counts: dict[str, int] = {
            "hit": 0, "miss": 0, "bypass": 0, "lookup_timeout": 0, "lookup_error": 0,
            "upstream_errors": 0, "stores_skipped": 0, "publish_errors": 0, "hedged": 0,
            "hedge_won_by_upstream": 0, "rerouted": 0, "explore_agreed": 0, "explore_disagreed": 0,
            "explore_errors": 0,
        }  # fmt: skip
        self._stores: set[asyncio.Task[Any]] = set()
        self._emits: set[asyncio.Task[None]] = set()

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        EVENTS.labels(name).inc()

    # --- completions ----------------------------------------------------------------------------

    async def complete(self, route: Route, raw: bytes, headers: Mapping[str, str]) -> Response:
        try:
            body = parse_body(raw)
            tenant = check_tenant(headers.get(TENANT_HEADER))
            req = (
                normalise_chat(body, tenant, self.settings.max_messages)
                if route == "chat"
                else normalise_completion(body, tenant)
            )
            trace_id = self._conversation(headers.get(CONVERSATION_HEADER), req.model)
        except BadRequest as exc:
            return problem(exc.status, str(exc), kind="invalid_request_error")
        plan = self.policy.plan(req, Directives.from_headers(headers))
        out = {"x-cachemesh-cache": plan.label, "x-cachemesh-key": req.key}
        if plan.reason is not None:
            out["x-cachemesh-bypass-reason"] = plan.reason
        prompt = req.prompt if req.prompt and len(req.prompt) <= self.settings.max_semantic_chars else None
        entry = None
        if plan.store:
            tags = {"source": "gateway", "route": route, "model": req.model}
            if req.tenant:
                tags["tenant"] = req.tenant
            entry = Entry(req.key, req.namespace, prompt, trace_id, self.settings.ttl_hint_ms, tags)

        def forward() -> Awaitable[Response]:
            return self._routed(body, req, route, raw, headers, out, entry, trace_id)

        try:
            if not plan.lookup:
                self._count(plan.label)
                return await forward()
            hedge_ms = self.settings.hedge_after_ms
            if hedge_ms is None:
                found = await self.cache.lookup(req.key, prompt, req.namespace, trace_id)
            else:
                lookup = asyncio.create_task(self.cache.lookup(req.key, prompt, req.namespace, trace_id))
                await asyncio.wait({lookup}, timeout=hedge_ms / 1000)
                if not lookup.done():
                    return await self._hedged(req, lookup, asyncio.ensure_future(forward()), prompt, out)
                found = lookup.result()
            if found.hit is not None:
                self._count("hit")
                return self._serve(req, found.hit, prompt)
            self._note_miss(found, out)
            if entry is not None and found.explore_key and found.explore_answer is not None:
                if self.settings.label_explorations:  # `forward` stores with it: the answers are compared
                    entry = replace(entry, explored=(found.explore_key, found.explore_answer))
            return await forward()
        except UpstreamUnavailable as exc:
            self._count("upstream_errors")
            if exc.retry_after_s is not None:
                out["retry-after"] = str(exc.retry_after_s)
            return problem(exc.status, str(exc), kind="upstream_error", code=exc.code, **out)

    def _note_miss(self, found: LookupResult, out: dict[str, str]) -> None:
        self._count("miss")
        out["x-cachemesh-lookup-ms"] = f"{found.latency_ms:.2f}"
        if found.miss_rule is not None:  # why the node served nothing: its rule, its nearest candidate
            near = (
                "" if found.best_similarity is None else f"; similarity {min(found.best_similarity, 1.0):.4f}"
            )
            out["x-cachemesh-miss"] = f"{found.miss_rule}{near}"
        if found.outcome != "miss":
            out["x-cachemesh-lookup"] = found.outcome
            self._count(f"lookup_{found.outcome}")

    async def _hedged(
        self,
        req: Normalised,
        lookup: asyncio.Task[LookupResult],
        upstream: asyncio.Future[Response],
        prompt: str | None,
        out: dict[str, str],
    ) -> Response:
        """The lookup is slow: the upstream is asked too, and the first answer wins. A hit cancels the
        upstream call (which has not answered yet); an upstream answer cancels the lookup."""
        self._count("hedged")
        # Set before the forward has run: its response takes the headers when the upstream answers.
        out["x-cachemesh-lookup"] = "hedged"
        racing: set[asyncio.Future[Any]] = {lookup, upstream}
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        # Both done: an upstream answer already open (a stream holds a connection) is the one served.
        if lookup.done() and (not upstream.done() or lookup.result().hit is None):
            found = lookup.result()
            if found.hit is not None:
                upstream.cancel()
                await asyncio.gather(upstream, return_exceptions=True)
                self._count("hit")
                return self._serve(req, found.hit, prompt)
            self._note_miss(found, out)
            return await upstream
        if upstream.exception() is not None:
            # The upstream failed (breaker open, refused): the cache may still have the answer.
            found = await lookup
            if found.hit is not None:
                self._count("hit")
                return self._serve(req, found.hit, prompt)
            self._note_miss(found, out)
            return upstream.result()  # raises the upstream's failure
        if not lookup.done():
            lookup.cancel()
            await asyncio.gather(lookup, return_exceptions=True)
        self._count("miss")
        self._count("hedge_won_by_upstream")
        return upstream.result()

    def _serve(self, req: Normalised, hit: CachedAnswer, prompt: str | None) -> Response:
        rid, created = response_id(req.route), int(time.time())
        self.served.add(rid, Served(hit.key, prompt, hit.match))
        headers = {
            "x-cachemesh-cache": "hit",
            "x-cachemesh-key": hit.key,
            "x-cachemesh-match": hit.match,
            "x-cachemesh-similarity": f"{1.0 if hit.similarity is None else hit.similarity:.4f}",
        }
        if hit.tier is not None:
            headers["x-cachemesh-tier"] = hit.tier
        if req.stream:
            frames = replay(
                hit.answer,
                response_id=rid,
                created=created,
                chunk_chars=self.settings.stream_chunk_chars,
                include_usage=req.include_usage,
            )
            return StreamingResponse(_iterate(frames), media_type="text/event-stream", headers=headers)
        return JSONResponse(as_served(hit.answer, rid=rid, created=created), headers=headers)

    async def _routed(
        self,
        body: Mapping[str, Any],
        req: Normalised,
        route: Route,
        raw: bytes,
        incoming: Mapping[str, str],
        out: dict[str, str],
        entry: Entry | None,
        conversation: str | None,
    ) -> Response:
        """To the engine the router picks; one that cannot be reached (or whose breaker is open) before
        it answered anything is left out and the next best is tried."""
        tried: set[str] = set()
        while True:
            try:
                chosen = await self.engines.route(body, req.model, conversation, tried)
            except LookupError:
                raise UpstreamUnavailable(
                    502, "no upstream could take the request", code="no_upstream"
                ) from None
            if conversation is not None and chosen.keys and self.settings.routing_warm:
                chosen.follow = (conversation, req.model)  # its blocks go out once it answered
            out["x-cachemesh-instance"] = chosen.engine.name
            if chosen.choice is not None:
                out["x-cachemesh-route"] = chosen.choice.reason
                out["x-cachemesh-route-predicted-blocks"] = str(chosen.choice.predicted_blocks)
            try:
                call = Outgoing(_PATHS[route], raw, incoming, out, entry)
                if req.stream:
                    return await self._relay_stream(chosen, call)
                return await self._forward(chosen, call)
            except UpstreamUnavailable as exc:
                tried.add(chosen.engine.name)
                if exc.code not in _RETRYABLE or len(tried) >= len(self.engines.engines):
                    raise
                self._count("rerouted")
                log.warning(
                    "upstream failed before answering; trying another",
                    extra={"instance": chosen.engine.name, "error": str(exc)},
                )

    async def _forward(self, chosen: EngineRoute, call: Outgoing) -> Response:
        path, raw, incoming, out, entry = call
        upstream = chosen.engine.upstream
        chosen.started()
        started = time.perf_counter()
        try:
            response = await upstream.request("POST", path, upstream.headers(incoming), raw)
        finally:
            chosen.ended()
        took_ms = (time.perf_counter() - started) * 1000
        if response.status_code >= 400:
            self._count("upstream_errors")
            return _relayed(response, out)
        answer = None
        if len(response.content) <= self.settings.max_answer_bytes:
            try:
                answer = response.json()
            except ValueError:
                answer = None
        if isinstance(answer, dict):
            cached = self.engines.realised(chosen, answer, self.engines.block_size)
            # Whole answers: the time is the first token's only when it was the one token.
            one = int((answer.get("usage") or {}).get("completion_tokens") or 2) <= 1
            self._answered(chosen, took_ms if one else None, cached)
            if entry is not None and self.policy.storable(answer):
                self._store_later(entry, answer)
        return _relayed(response, out)

    async def _relay_stream(self, chosen: EngineRoute, call: Outgoing) -> Response:
        path, raw, incoming, out, entry = call
        upstream = chosen.engine.upstream
        chosen.started()
        try:
            response = await upstream.open_stream(path, upstream.headers(incoming), raw)
        except BaseException:
            chosen.ended()
            raise
        if response.status_code != 200:
            chosen.ended()
            self._count("upstream_errors")
            return _relayed(response, out)
        out["cache-control"] = "no-cache"
        return StreamingResponse(
            self._relay(response, entry, chosen), media_type="text/event-stream", headers=out
        )

    async def _relay(
        self, response: httpx.Response, entry: Entry | None, chosen: EngineRoute
    ) -> AsyncIterator[bytes]:
        """The upstream's bytes as they come; parsed on the side, and the whole answer stored once the
        stream ended with [DONE] (a stream cut short is relayed but never stored)."""
        parser, chunks, size, done, failed = SseParser(self.settings.max_answer_bytes), [], 0, False, False
        started, first_ms, usage = time.perf_counter(), None, None
        try:
            async for piece in response.aiter_raw():
                if first_ms is None:
                    first_ms = (time.perf_counter() - started) * 1000
                yield piece
                if entry is None:
                    if chosen.ids and b'"usage"' in piece:  # only its usage is wanted, for the FTL fit
                        usage = _usage_in(piece) or usage
                    continue
                size += len(piece)
                for data in parser.feed(piece):
                    if data == DONE:
                        done = True
                        continue
                    try:
                        chunks.append(json.loads(data))
                    except ValueError:
                        entry = None  # not the OpenAI stream format: relay only
                        break
                if size > self.settings.max_answer_bytes or parser.overflowed:
                    entry = None
        except httpx.HTTPError as exc:
            failed = True
            self._count("upstream_errors")
            log.warning("upstream stream broke off", extra={"error": repr(exc)})
        finally:
            await response.aclose()
            chosen.ended()
            # A caller that went away is no fault of the upstream's.
            chosen.engine.upstream.stream_done(not failed)
        answer = assemble(chunks) if entry is not None and done and not failed else None
        if answer is not None:
            usage = answer.get("usage") or usage
        if first_ms is not None and not failed:
            cached = self.engines.realised(chosen, {"usage": usage} if usage else {}, self.engines.block_size)
            self._answered(chosen, first_ms, cached)
        if entry is not None and answer is not None and self.policy.storable(answer):
            self._store_later(entry, answer)

    def _store_later(self, entry: Entry, answer: dict[str, Any]) -> None:
        if len(self._stores) >= self.settings.max_pending_stores:
            self._count("stores_skipped")
            return
        task = asyncio.create_task(self.cache.store(entry, answer))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)
        if entry.explored is not None:
            label = asyncio.create_task(self._label_exploration(entry, answer))
            self._stores.add(label)
            label.add_done_callback(self._stores.discard)

    async def _label_exploration(self, entry: Entry, answer: Mapping[str, Any]) -> None:
        """Whether the model's answer agrees with the explored candidate's, as a label for the node."""
        assert entry.explored is not None
        key, stored = entry.explored
        fresh, cached = answer_text(answer), answer_text(stored)
        if fresh is None or cached is None or entry.prompt is None:
            return
        agree = answers_agree(fresh, cached)
        try:
            status, _ = await self.cache.feedback(key, entry.prompt, agree, explored=True)
        except httpx.HTTPError as exc:
            log.warning("an exploration's label was not delivered: %r", exc)
            status = 599
        outcome = "explore_agreed" if agree else "explore_disagreed"
        self._count(outcome if status < 400 else "explore_errors")

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Let the writes and events in flight finish (bounded), then cancel the rest."""
        pending = self._stores | self._emits
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    @property
    def pending_stores(self) -> int:
        return len(self._stores)

    # --- models ---------------------------------------------------------------------------------

    async def models(self, headers: Mapping[str, str]) -> Response:
        try:
            response = await self.upstream.request("GET", "/models", self.upstream.headers(headers))
        except UpstreamUnavailable as exc:
            return problem(exc.status, str(exc), kind="upstream_error", code=exc.code)
        return _relayed(response, {})

    # --- conversations and feedback -------------------------------------------------------------

    def _conversation(self, conversation_id: str | None, model: str) -> str | None:
        if conversation_id is None:
            return None
        conversation_id = _check_conversation(conversation_id)
        if self.conversations.touch(conversation_id):
            self._emit(ConversationStarted(trace_id=conversation_id, model=model))
        return conversation_id

    def _answered(self, chosen: EngineRoute, ttft_ms: float | None, cached_tokens: int | None) -> None:
        """An instance answered: its first-token time (None: not known) goes to its FTL fit, and the
        prompt's blocks out to the warmup service when the conversation is followed."""
        if ttft_ms is not None:
            self.engines.timed(chosen, ttft_ms, cached_tokens)
        if chosen.follow is not None:
            conversation, model = chosen.follow
            self._emit_blocks(conversation, model, chosen, ttft_ms, cached_tokens)

    def _emit_blocks(
        self,
        conversation: str,
        model: str,
        chosen: EngineRoute,
        ttft_ms: float | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """The prompt's KV blocks as read by this conversation, for the warmup service to follow: a hit
        where the engine said it had them cached (else where the instance or the tiers were predicted
        to), each with the request's first-token time when it was measured (0: not known)."""
        size = self.engines.block_size
        if cached_tokens is not None:
            have = cached_tokens // size
        else:
            have = chosen.choice.predicted_blocks if chosen.choice is not None else 0
        keys = chosen.keys[-MAX_ACCESS_BATCH:]
        first = len(chosen.keys) - len(keys)
        now = int(time.time() * 1000)
        self._emit(
            access_batch(
                [
                    CacheAccessed(
                        key=key, hit=first + i < have, kind="kv_block", model=self.engines.model or model,
                        token_count=size, trace_id=conversation, occurred_at_ms=now,
                        latency_ms=round(ttft_ms or 0.0, 3),
                    )
                    for i, key in enumerate(keys)
                ]
            )
        )  # fmt: skip

    def _emit(self, event: Event) -> None:
        """Out on Kafka without holding the request: the producer batches it."""

        async def send() -> None:
            try:
                await self.publish(event, False)
            except Exception as exc:  # statistics of a conversation: never fail a request for it
                self._count("publish_errors")
                log.warning("lifecycle event not published", extra={"error": repr(exc)})

        task = asyncio.create_task(send())
        self._emits.add(task)
        task.add_done_callback(self._emits.discard)

    async def end_conversation(self, conversation_id: str) -> Response:
        try:
            conversation_id = _check_conversation(conversation_id)
        except BadRequest as exc:
            return problem(400, str(exc), kind="invalid_request_error")
        tracked = self.conversations.end(conversation_id)
        await self._emitted()
        try:
            # Acknowledged before the answer: once the caller hears "ended", the end is on Kafka.
            await self.publish(ConversationEnded(trace_id=conversation_id), True)
        except Exception as exc:
            self._count("publish_errors")
            return problem(503, f"could not publish the conversation's end: {exc!r}", kind="server_error")
        return JSONResponse({"conversation_id": conversation_id, "ended": True, "tracked": tracked}, 202)

    async def _emitted(self, timeout_s: float = 2.0) -> None:
        """Let the starts still being sent go first: one conversation's events share a partition, and
        an end ahead of its start would leave the conversation open for whoever reads them."""
        if self._emits:
            await asyncio.wait(set(self._emits), timeout=timeout_s)

    async def end_idle(self) -> list[str]:
        ended = self.conversations.idle()
        if ended:
            await self._emitted()
        for conversation_id in ended:
            await self.publish(ConversationEnded(trace_id=conversation_id), False)
        return ended

    async def feedback(self, body: Any) -> Response:
        """ "That answer was wrong" (or right): by the response id a hit gave, or by key and request
        text. The tier node's match decision learns from it; a wrong exact hit (or `evict: true`) also
        removes the entry, since the stored answer itself is what was wrong."""
        if not isinstance(body, dict):
            return problem(400, "the body must be a JSON object", kind="invalid_request_error")
        correct = body.get("correct", False)
        if not isinstance(correct, bool):
            return problem(400, "correct must be true or false", kind="invalid_request_error")
        for name, kind in (("response_id", str), ("key", str), ("text", str), ("evict", bool)):
            if body.get(name) is not None and not isinstance(body[name], kind):
                what = "a string" if kind is str else "true or false"
                return problem(400, f"{name} must be {what}", kind="invalid_request_error")
        served = self.served.get(body["response_id"]) if body.get("response_id") else None
        if body.get("response_id") and served is None:
            return problem(404, "no answer served from the cache under that response_id", kind="not_found")
        key = body.get("key") or (served.key if served else None)
        text = body.get("text") or (served.prompt if served else None)
        if not isinstance(key, str) or not key:
            return problem(400, "give response_id, or key (and text)", kind="invalid_request_error")
        evict = body.get("evict")
        if evict is None:
            evict = not correct and (served is None or served.match == "exact")
        out: dict[str, Any] = {"key": key, "correct": correct, "evicted": False, "tier_feedback": None}
        try:
            if isinstance(text, str) and text:
                status, data = await self.cache.feedback(key, text, correct)
                if status >= 400 and not (status in (404, 422) and evict):
                    return JSONResponse({"error": {"message": str(data), "type": "cache_error"}}, status)
                out["tier_feedback"] = data if status < 400 else None
            if evict:
                out["evicted"] = await self.cache.delete(key)
        except httpx.HTTPError as exc:
            return problem(503, f"the tier node is unreachable: {exc!r}", kind="cache_error")
        return JSONResponse(out)


def _usage_in(piece: bytes) -> dict[str, Any] | None:
    """The usage a stream's piece carries in one of its whole `data:` lines, if any (best effort: a line
    cut between two pieces is not read)."""
    for line in piece.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                usage = json.loads(line[6:]).get("usage")
            except ValueError:
                continue
            if isinstance(usage, dict):
                return usage
    return None


def _check_conversation(value: str) -> str:
    value = value.strip()
    if not value or len(value) > MAX_KEY_CHARS or not value.isprintable():
        raise BadRequest(f"{CONVERSATION_HEADER} must be 1-{MAX_KEY_CHARS} printable characters")
    return value


async def _iterate(frames: Any) -> AsyncIterator[bytes]:
    for piece in frames:
        yield piece
