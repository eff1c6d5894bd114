"""The gateway's engine instances and the route to one: an `Upstream` per instance, each instance's KV
blocks as its KV events tell them (`kv.events.v1` from the bridge, by engine id), its load (requests in
flight from here, its queue from its `/metrics`), the prompt's block keys (the model's own tokenizer and
chat template, the content keys of cachemesh_client/kvkeys.py), what the tiers hold of them, and the
choice (routing.py), counted and explained. With one upstream there is nothing to choose.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from cachemesh_client.kvkeys import block_keys
from prometheus_client import Counter, Histogram

from schemas.events import Event, KvBlockRemoved, KvBlockStored
from services.gateway.health import Reach
from services.gateway.routing import DEFAULT_WEIGHTS, Choice, Instance, Weights, choose
from services.gateway.upstream import Upstream
from services.gateway.warming import EngineWarmer, Turnover, Warm
from services.warmup.ftl import FtlFit

log = logging.getLogger(__name__)

ROUTED = Counter(
    "cachemesh_gateway_routed_total", "Requests routed, by instance and reason", ["instance", "reason"]
)
PREDICTED = Histogram(
    "cachemesh_gateway_route_predicted_blocks",
    "Blocks of prompt the chosen instance was predicted not to compute (its prefix + the tiers')",
    buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
)
WARMS = Counter(
    "cachemesh_gateway_engine_warms_total",
    "Prefills sent for a conversation's next turn, and what became of them (used, wasted, failed)",
    ["instance", "outcome"],
)
REALISED = Histogram(
    "cachemesh_gateway_route_realised_blocks",
    "Blocks of prompt the engine reported cached (usage.prompt_tokens_details.cached_tokens)",
    buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
)


class PromptTokens:
    """A model's own tokenizer and chat template, from its directory (no hub): the token ids the engine
    will see, so the block keys are the engine's."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoTokenizer  # heavy: only when routing by prefix

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)

    def of(self, body: Mapping[str, Any]) -> list[int] | None:
        """The prompt's token ids, or None when it cannot say (the route then goes by load)."""
        try:
            if "messages" in body:
                messages = [{"role": m["role"], "content": _text(m.get("content"))} for m in body["messages"]]
                ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return list(prompt)
            if isinstance(prompt, str):
                return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        except Exception as exc:  # a template that refuses these messages: route by load
            log.debug("prompt not tokenized for routing", extra={"error": repr(exc)})
        return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


@dataclass
class Engine:
    name: str
    engine_id: str  # the `node_id` of its KV events
    upstream: Upstream
    state: Instance
    metrics_url: str
    pool_blocks: int | None = None  # its KV pool (vllm:cache_config_info), once its /metrics said
    turnover: Turnover = field(default_factory=Turnover)
    # FTL = base + m * delta (docs/design.md §2.1), fit to the first-token times measured here (recent
    # ones weigh more: a restart or another load changes them).
    ftl: FtlFit = field(default_factory=lambda: FtlFit(forget=0.99))
    reach: Reach = field(default_factory=Reach)  # its last health probe

    def survive_ms(self) -> float | None:
        return self.turnover.survive_ms(self.pool_blocks)

    def ftl_params(self) -> tuple[float, float] | None:
        """(base_ms, delta_ms) once about 5 answers with different miss rates were timed."""
        return self.ftl.params() if self.ftl.fitted and self.ftl.n >= 4.5 else None


@dataclass
class Route:
    engine: Engine
    choice: Choice | None
    keys: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    decision: dict[str, Any] | None = None  # its row in Engines.decisions
    follow: tuple[str, str] | None = None  # (conversation, model) whose blocks go out once it answered

    @property
    def compute_blocks(self) -> float:
        """Blocks of its prompt the engine will compute (at least one: the last is always computed)."""
        predicted = 0 if self.choice is None else self.choice.predicted_blocks
        return float(max(1, len(self.keys) - predicted))

    def started(self) -> None:
        self.engine.state.sent_blocks += max(1, len(self.keys))
        held = 0 if self.choice is None else self.choice.held_blocks
        self.engine.state.written_blocks += max(1, len(self.keys) - held)
        self.engine.state.in_flight += 1
        self.engine.state.pending_blocks += self.compute_blocks

    def ended(self) -> None:
        self.engine.state.in_flight -= 1
        self.engine.state.pending_blocks = max(0.0, self.engine.state.pending_blocks - self.compute_blocks)


class Engines:
    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        tokens: PromptTokens | None,
        model: str | None,
        block_size: int,
        tiers_prefix: Callable[[list[str]], Any] | None = None,
        weights: Weights = DEFAULT_WEIGHTS,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        warm_min_precision: float = 0.8,
    ) -> None:
        if not engines:
            raise ValueError("no upstream configured")
        self.engines = list(engines)
        self.by_engine_id = {e.engine_id: e for e in self.engines}
        self.tokens = tokens
        self.model = model
        self.block_size = block_size
        self.tiers_prefix = tiers_prefix
        self.weights = weights
        self.sticky: dict[str, str] = {}  # conversation -> instance it was last routed to
        self.counts: dict[str, int] = {}
        self.warmer = EngineWarmer(block_size=block_size, min_precision=warm_min_precision)
        # The latest choices, newest first, for the dashboard: where, why, predicted vs realised blocks.
        self.decisions: deque[dict[str, Any]] = deque(maxlen=50)
        self.clock_ms = clock_ms  # wall time: warmup's turn times are wall times

    @property
    def first(self) -> Engine:
        return self.engines[0]

    def by_name(self, name: str) -> Engine:
        return next(e for e in self.engines if e.name == name)

    # --- what the engines report ------------------------------------------------------------------

    def on_kv_event(self, event: Event) -> None:
        node = getattr(event, "node_id", None)
        engine = self.by_engine_id.get(node) if node is not None else None
        if engine is None:
            return
        if isinstance(event, KvBlockStored):
            engine.state.stored(event.block_hash)
        elif isinstance(event, KvBlockRemoved):  # an engine's reset or restart arrives as removals too
            engine.state.removed(event.block_hash)

    async def poll_queues(self, http: httpx.AsyncClient) -> None:
        """Each engine's queue (vllm:num_requests_waiting), its KV pool, and whether it answers at all;
        how fast it turns its pool over."""
        for engine in self.engines:
            engine.turnover.sample(self.clock_ms(), engine.state.sent_blocks)
            try:
                response = await http.get(engine.metrics_url, timeout=2.0)
                engine.state.waiting = int(_gauge(response.text, "vllm:num_requests_waiting"))
                engine.pool_blocks = _pool_blocks(response.text) or engine.pool_blocks
            except (httpx.HTTPError, ValueError):
                engine.state.waiting = 0

    # --- choosing ---------------------------------------------------------------------------------

    async def route(
        self, body: Mapping[str, Any], model: str, conversation: str | None, exclude: set[str]
    ) -> Route:
        """The engine for a request (never one in `exclude`, nor one whose breaker is open while another
        is not); with one engine, that one."""
        for engine in self.engines:
            engine.state.healthy = engine.name not in exclude and engine.upstream.breaker.available()
        candidates = [e for e in self.engines if e.state.healthy] or [
            e for e in self.engines if e.name not in exclude
        ]
        if not candidates:
            raise LookupError("every upstream failed this request")
        ids, keys = self._keys(body, model) if len(self.engines) > 1 else ([], [])
        if len(self.engines) == 1 or len(candidates) == 1:
            route = Route(candidates[0], None, keys, ids)
            if len(self.engines) > 1:
                self._decided(route, "only", conversation)
            self._follow(conversation, model, route)
            return route
        held = await self._tiers_held(keys) if keys else 0
        sticky = self.sticky.get(conversation) if conversation is not None else None
        choice = choose([e.state for e in candidates], keys, held, sticky=sticky, weights=self.weights)
        assert choice is not None
        engine = self.by_name(choice.instance)
        ROUTED.labels(engine.name, choice.reason).inc()
        PREDICTED.observe(choice.predicted_blocks)
        self.counts[choice.reason] = self.counts.get(choice.reason, 0) + 1
        route = Route(engine, choice, keys, ids)
        self._decided(route, choice.reason, conversation)
        self._follow(conversation, model, route)
        return route

    def _decided(self, route: Route, reason: str, conversation: str | None) -> None:
        route.decision = {
            "at_ms": self.clock_ms(),
            "instance": route.engine.name,
            "reason": reason,
            "conversation": conversation,
            "prompt_blocks": len(route.keys),
            "predicted_blocks": route.choice.predicted_blocks if route.choice is not None else None,
            "realised_blocks": None,  # the engine's cached_tokens, when its answer says
        }
        self.decisions.appendleft(route.decision)

    def _follow(self, conversation: str | None, model: str, route: Route) -> None:
        """Where the conversation went, with what prompt; a warm made for it is judged."""
        if conversation is None:
            return
        name = route.engine.name
        self.sticky[conversation] = name
        if len(self.sticky) > 100_000:
            self.sticky.pop(next(iter(self.sticky)))
        warm = self.warmer.pending(conversation)
        if warm is not None:
            blocks = self.by_name(warm.instance).state.blocks
            held = bool(warm.keys) and warm.keys[-1] in blocks
            outcome = self.warmer.judge(conversation, name, held, self.clock_ms())
            if outcome is not None:
                WARMS.labels(warm.instance, outcome).inc()
        if route.keys:
            self.warmer.routed(conversation, name, model, route.ids, route.keys, self.clock_ms())

    def _keys(self, body: Mapping[str, Any], model: str) -> tuple[list[int], list[str]]:
        if self.tokens is None:
            return [], []
        ids = self.tokens.of(body)
        if not ids:
            return [], []
        return ids, block_keys(ids, model=self.model or model, block_size=self.block_size)

    # --- warming for a conversation's next turn ---------------------------------------------------

    def warm_for(self, conversation: str, due_ms: int | None = None) -> list[Warm]:
        """A warmup command for `conversation`, its next turn expected at `due_ms` (wall ms): the
        prefills that are due now (warming.py); the caller sends them with `send_warm`, and asks
        `warms_ready` again for those that wait."""
        self.warmer.on_command(conversation, self.clock_ms(), due_ms)
        return self.warms_ready()

    def warms_ready(self) -> list[Warm]:
        if not self.warmer.armed():
            return []
        idle = {e.name: e.state.in_flight == 0 and e.state.waiting == 0 for e in self.engines}
        return self.warmer.ready(
            self.clock_ms(),
            idle=idle,
            held=lambda keys, name: self.by_name(name).state.prefix(keys),
            survive_ms=lambda name: self.by_name(name).survive_ms(),
            ftl=lambda name: self.by_name(name).ftl_params(),
        )

    async def send_warm(self, warm: Warm, timeout_s: float = 60.0) -> bool:
        """The prefill on its instance (`max_tokens: 1`), counted as load there while it runs."""
        engine = self.by_name(warm.instance)
        route = Route(engine, None, list(warm.keys), list(warm.ids))
        body = {"model": warm.model, "prompt": list(warm.ids), "max_tokens": 1, "temperature": 0}
        route.started()
        started = time.perf_counter()
        try:
            response = await engine.upstream.http.post(
                "/completions", json=body, headers=engine.upstream.headers({}), timeout=timeout_s
            )
            ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        finally:
            route.ended()
        if ok:  # one token: its time is the prefill's
            with contextlib.suppress(ValueError, AttributeError):
                self.timed(route, (time.perf_counter() - started) * 1000, _cached_tokens(response.json()))
            WARMS.labels(engine.name, "sent").inc()
        else:
            self.warmer.failed(warm)
            WARMS.labels(engine.name, "failed").inc()
        return ok

    async def _tiers_held(self, keys: list[str]) -> int:
        if self.tiers_prefix is None:
            return 0
        with contextlib.suppress(Exception):  # the tiers are advice here: without them, no tier blocks
            return int(await self.tiers_prefix(keys))
        return 0

    @staticmethod
    def realised(route: Route, answer: Mapping[str, Any], block_size: int) -> int | None:
        """What the engine says it had cached (tokens), beside what was predicted (vLLM with
        --enable-prompt-tokens-details reports it); None where it did not say."""
        cached = _cached_tokens(answer)
        if route.choice is not None and cached is not None:
            REALISED.observe(cached // block_size)
        if route.decision is not None and cached is not None:
            route.decision["realised_blocks"] = cached // block_size
        return cached

    def timed(self, route: Route, ttft_ms: float, cached_tokens: int | None) -> float | None:
        """A first-token time measured on `route`'s instance, for its FTL fit: m is the share of the
        prompt it computed (what it reported cached, else what was predicted). The m used, or None
        where the prompt's tokens are unknown."""
        if not route.ids or ttft_ms < 0:
            return None
        if cached_tokens is not None:
            m = 1.0 - min(cached_tokens, len(route.ids)) / len(route.ids)
        else:
            m = min(1.0, route.compute_blocks / max(1, len(route.keys)))
        route.engine.ftl.observe(m, ttft_ms)
        return m

    def stats(self) -> dict[str, Any]:
        return {
            "instances": [
                {
                    "name": e.name,
                    "engine_id": e.engine_id,
                    "healthy": e.upstream.breaker.available(),
                    "in_flight": e.state.in_flight,
                    "pending_blocks": e.state.pending_blocks,
                    "waiting": e.state.waiting,
                    "blocks": len(e.state.blocks),
                    "pool_blocks": e.pool_blocks,
                    "survive_ms": _finite(e.survive_ms()),
                    # Its first-token time, base + m * delta (m: the share of a prompt computed).
                    "ftl_base_ms": _ftl(e.ftl_params(), 0),
                    "ftl_delta_ms": _ftl(e.ftl_params(), 1),
                    "calls": e.upstream.calls,
                }
                for e in self.engines
            ],
            "reasons": dict(self.counts),
            "warms": self.warmer.counts.as_dict(),
            "recent": list(self.decisions),
        }


def _gauge(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in "{ "):
            total += float(line.rsplit(" ", 1)[1])
    return total


_POOL = re.compile(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', re.MULTILINE)


def _pool_blocks(text: str) -> int | None:
    """The engine's KV pool in blocks, from vllm:cache_config_info's labels."""
    match = _POOL.search(text)
    return int(match.group(1)) if match else None


def _cached_tokens(answer: Any) -> int | None:
    usage = answer.get("usage") if isinstance(answer, Mapping) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return cached if isinstance(cached, int) and cached >= 0 else None


def _ftl(params: tuple[float, float] | None, which: int) -> float | None:
    return None if params is None else round(params[which], 1)


def _finite(ms: float | None) -> float | None:
    return None if ms is None or ms == float("inf") else round(ms, 1)
