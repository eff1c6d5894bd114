"""Warming an engine for a conversation's next turn (services/gateway/warming.py, and its use in
engines.py): which command is answered with which prefill, where, and how each warm is judged."""

from __future__ import annotations

import json
from typing import Any

import httpx

from services.gateway.breaker import FailureBreaker
from services.gateway.engines import Engine, Engines
from services.gateway.routing import Instance
from services.gateway.upstream import Upstream
from services.gateway.warming import EngineWarmer

IDS = list(range(100, 170))  # 70 tokens: 2 full blocks of 32 and 6 more
KEYS = ["kv:a", "kv:b"]


def test_a_command_is_answered_with_the_conversations_latest_prompt_on_its_instance() -> None:
    w = EngineWarmer(block_size=32)
    w.routed("c1", "i0", "m", IDS[:40], KEYS[:1])
    w.routed("c1", "i1", "m", IDS, KEYS)  # its latest turn went to i1
    warm = w.on_command("c1", idle={"i0": True, "i1": True}, held={"i0": 0, "i1": 1})
    assert warm is not None and warm.instance == "i1" and warm.model == "m"
    assert list(warm.ids) == IDS and warm.held_blocks == 1
    assert w.counts.sent == 1 and w.counts.prefill_tokens == 70 - 32


def test_no_warm_for_an_unknown_conversation_a_busy_instance_or_one_holding_it_all() -> None:
    w = EngineWarmer(block_size=32)
    assert w.on_command("nobody", idle={"i0": True}, held={}) is None
    w.routed("c1", "i0", "m", IDS, KEYS)
    assert w.on_command("c1", idle={"i0": False}, held={"i0": 0}) is None
    assert w.on_command("c1", idle={"i0": True}, held={"i0": 2}) is None
    w.routed("short", "i0", "m", IDS[:10], [])
    assert w.on_command("short", idle={"i0": True}, held={"i0": 0}) is None
    c = w.counts
    assert (c.commands, c.unknown, c.busy, c.already_held, c.sent) == (4, 1, 1, 2, 0)


def test_a_warm_is_used_when_the_next_turn_finds_it_and_wasted_otherwise() -> None:
    w = EngineWarmer(block_size=32)
    for conv in ("c1", "c2", "c3"):
        w.routed(conv, "i0", "m", IDS, KEYS)
        assert w.on_command(conv, idle={"i0": True}, held={"i0": 0}) is not None
    assert w.judge("c1", "i0", still_held=True) == "used"
    assert w.judge("c2", "i0", still_held=False) == "wasted"  # evicted before the turn came
    assert w.judge("c3", "i1", still_held=True) == "wasted"  # the turn went elsewhere
    assert w.judge("c1", "i0", still_held=True) is None  # judged once
    assert w.counts.precision() == 1 / 3


def test_a_failed_prefill_is_not_judged_nor_counted_as_cost() -> None:
    w = EngineWarmer(block_size=32)
    w.routed("c1", "i0", "m", IDS, KEYS)
    warm = w.on_command("c1", idle={"i0": True}, held={"i0": 0})
    assert warm is not None
    w.failed(warm)
    assert w.pending("c1") is None and w.counts.failed == 1
    assert w.counts.sent == 0 and w.counts.prefill_tokens == 0


def engine(name: str, handler: Any) -> Engine:
    upstream = Upstream(
        httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url=f"http://{name}/v1"),
        FailureBreaker(consecutive=1, window=10, min_calls=10, cooldown_ms=60_000, clock=lambda: 0),
        timeout_s=5,
    )
    return Engine(name, name, upstream, Instance(name), f"http://{name}/metrics")


async def test_engines_follow_the_conversation_send_the_prefill_and_judge_it() -> None:
    bodies: list[dict[str, Any]] = []

    async def completes(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    engines = Engines(
        [engine("i0", completes), engine("i1", completes)], tokens=None, model="m", block_size=32
    )
    # A routed request of conversation c1 (tokens given as a prompt of ids: no tokenizer needed).
    engines.tokens = type("Ids", (), {"of": staticmethod(lambda body: body["prompt"])})()
    route = await engines.route({"prompt": IDS}, "m", "c1", set())
    where = route.engine
    warm = engines.warm_for("c1")
    assert warm is not None and warm.instance == where.name
    assert await engines.send_warm(warm)
    assert bodies == [{"model": "m", "prompt": IDS, "max_tokens": 1, "temperature": 0}]
    assert where.state.in_flight == 0 and where.state.pending_blocks == 0
    for key in route.keys:  # the engine reports the warmed blocks stored
        where.state.stored(key)
    await engines.route({"prompt": [*IDS, 1, 2, 3]}, "m", "c1", set())
    assert engines.warmer.counts.used == 1
    assert engines.stats()["warms"]["precision"] == 1.0
