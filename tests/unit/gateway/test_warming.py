"""Warming an engine for a conversation's next turn (services/gateway/warming.py, and its use in
engines.py): which command is answered with which prefill, where, and how each warm is judged."""

from __future__ import annotations

import json
from typing import Any

import httpx

from services.gateway.engines import Engine, Engines, _pool_blocks
from services.gateway.routing import Instance
from services.gateway.upstream import Upstream
from services.gateway.warming import EngineWarmer, Gaps, Turnover
from services.runtime.breaker import FailureBreaker

IDS = list(range(100, 170))  # 70 tokens: 2 full blocks of 32 and 6 more
KEYS = ["kv:a", "kv:b"]


def held_of(table: dict[str, int]) -> Any:
    return lambda keys, instance: table.get(instance, 0)


def ready(
    w: EngineWarmer, now: int, idle: dict[str, bool], held: dict[str, int], life: float | None = None
) -> list[Any]:
    return w.ready(now, idle=idle, held=held_of(held), survive_ms=lambda name: life)


def test_a_command_is_answered_with_the_conversations_latest_prompt_on_its_instance() -> None:
    w = EngineWarmer(block_size=32)
    w.routed("c1", "i0", "m", IDS[:40], KEYS[:1])
    w.routed("c1", "i1", "m", IDS, KEYS)  # its latest turn went to i1
    w.on_command("c1", now_ms=0)
    [warm] = ready(w, 0, {"i0": True, "i1": True}, {"i0": 0, "i1": 1})
    assert warm.instance == "i1" and warm.model == "m"
    assert list(warm.ids) == IDS and warm.held_blocks == 1
    assert w.counts.sent == 1 and w.counts.prefill_tokens == 70 - 32
    assert ready(w, 0, {"i0": True, "i1": True}, {}) == []  # answered once


def test_no_warm_for_an_unknown_conversation_or_one_held_whole_and_a_busy_instance_is_waited_for() -> None:
    w = EngineWarmer(block_size=32, retry_ms=100, max_wait_ms=1_000)
    w.on_command("nobody", now_ms=0)
    w.routed("c1", "i0", "m", IDS, KEYS)
    w.on_command("c1", now_ms=0)
    assert ready(w, 0, {"i0": True}, {"i0": 2}) == []  # it holds all of it
    w.routed("short", "i0", "m", IDS[:10], [])
    w.on_command("short", now_ms=0)
    assert ready(w, 0, {"i0": True}, {"i0": 0}) == []
    w.on_command("c1", now_ms=0)
    assert ready(w, 0, {"i0": False}, {"i0": 0}) == []  # busy: looked at again later
    assert ready(w, 50, {"i0": True}, {"i0": 0}) == []  # not yet
    assert len(ready(w, 100, {"i0": True}, {"i0": 0})) == 1  # idle at the retry: sent
    w.on_command("c1", now_ms=200)
    for t in range(200, 1_300, 100):
        assert ready(w, t, {"i0": False}, {"i0": 0}) == []
    c = w.counts
    assert (c.commands, c.unknown, c.busy, c.already_held, c.sent) == (5, 1, 1, 2, 1)
    assert w.armed() == 0  # given up after max_wait_ms


def test_a_warm_waits_until_it_would_survive_to_the_turn_and_the_turn_can_overtake_it() -> None:
    w = EngineWarmer(block_size=32, survive_fraction=0.5)
    w.routed("c1", "i0", "m", IDS, KEYS)
    w.on_command("c1", now_ms=0, due_ms=10_000)  # the turn in 10 s; a warm lives 4 s there
    assert ready(w, 0, {"i0": True}, {"i0": 0}, life=4_000) == []
    assert w.counts.deferred == 1
    assert ready(w, 7_999, {"i0": True}, {"i0": 0}, life=4_000) == []
    [warm] = ready(w, 8_000, {"i0": True}, {"i0": 0}, life=4_000)  # 2 s before the turn
    assert warm.sent_at_ms == 8_000
    w.on_command("c1", now_ms=20_000, due_ms=30_000)
    assert ready(w, 20_000, {"i0": True}, {"i0": 0}, life=4_000) == []
    w.routed("c1", "i0", "m", IDS, KEYS)  # the turn came first
    assert w.counts.overtaken == 1 and w.armed() == 0
    # An instance that stores nothing keeps what it is given: no reason to wait.
    w.on_command("c1", now_ms=40_000, due_ms=90_000)
    assert len(ready(w, 40_000, {"i0": True}, {"i0": 0}, life=float("inf"))) == 1


def test_turnover_is_the_pool_over_the_rate_blocks_are_sent() -> None:
    t = Turnover(window_ms=10_000)
    assert t.survive_ms(96) is None
    t.sample(0, 0)
    t.sample(1_000, 48)  # 48 blocks a second
    assert t.survive_ms(96) == 2_000 and t.survive_ms(None) is None
    for s in range(2, 30):
        t.sample(s * 1_000, 48)  # then nothing sent: the old rate ages out of the window
    assert t.survive_ms(96) == 10_000  # a lull: at least the window, not forever


def test_the_chance_a_turn_comes_within_a_warms_life_is_read_off_the_gaps() -> None:
    g = Gaps(maxlen=4, min_gaps=4, min_alive=2)
    for gap in (1_000, 2_000, 3_000, 10_000):
        assert not g.known
        g.add(gap)
    assert g.known
    assert g.chance(0, 1_500) == 1 / 4  # of 4 turns to come, one within 1.5 s
    assert g.chance(1_500, 2_000) == 2 / 3  # 1.5 s passed: 3 to come, 2 of them by 3.5 s
    assert g.chance(5_000, 5_000) == 0.0  # one gap seen was longer: that says nothing
    assert g.first_time(0, 2_000, 0.6) == 1_000  # from 1 s on, 2 of the 3 left fall within 2 s
    assert g.first_time(0, 500, 0.9) is None
    g.add(4_000)  # the oldest (1 s) leaves the window
    assert g.chance(0, 1_500) == 0.0


def test_a_warm_goes_when_its_turn_is_likely_within_its_life_and_not_at_all_when_never() -> None:
    w = EngineWarmer(block_size=32, min_precision=0.6, gaps=Gaps(min_gaps=4, min_alive=2))
    for gap in (1_000, 2_000, 3_000, 10_000):
        w.gaps.add(gap)
    w.routed("c1", "i0", "m", IDS, KEYS, now_ms=50_000)
    w.on_command("c1", now_ms=50_000)
    assert ready(w, 50_000, {"i0": True}, {"i0": 0}, life=2_000) == []  # 1/4 now: wait
    assert w.counts.deferred == 1
    [warm] = ready(w, 51_000, {"i0": True}, {"i0": 0}, life=2_000)  # 2 of the 3 to come: go
    assert warm.chance == 2 / 3
    w.judge("c1", "i0", still_held=True, now_ms=52_500)
    assert w.counts.as_dict()["predicted_precision"] == 2 / 3
    w.routed("c1", "i0", "m", IDS, KEYS, now_ms=61_234)  # gaps now 1, 2, 3, 10, 11.2 s
    w.on_command("c1", now_ms=61_234)
    assert ready(w, 61_234, {"i0": True}, {"i0": 0}, life=300) == []  # lives too short for any gap
    assert w.counts.unlikely == 1 and w.armed() == 0


def test_a_warm_is_used_when_the_next_turn_finds_it_and_wasted_otherwise() -> None:
    w = EngineWarmer(block_size=32)
    for conv in ("c1", "c2", "c3"):
        w.routed(conv, "i0", "m", IDS, KEYS)
        w.on_command(conv, now_ms=0)
    assert len(ready(w, 0, {"i0": True}, {"i0": 0})) == 3
    assert w.judge("c1", "i0", still_held=True, now_ms=300) == "used"
    assert w.judge("c2", "i0", still_held=False, now_ms=300) == "wasted"  # evicted before the turn came
    assert w.judge("c3", "i1", still_held=True, now_ms=300) == "wasted"  # the turn went elsewhere
    assert w.judge("c1", "i0", still_held=True) is None  # judged once
    assert w.counts.precision() == 1 / 3 and w.counts.evicted == 1
    assert w.counts.as_dict()["lead_ms_mean"] == 300


def test_a_failed_prefill_is_not_judged_nor_counted_as_cost() -> None:
    w = EngineWarmer(block_size=32)
    w.routed("c1", "i0", "m", IDS, KEYS)
    w.on_command("c1", now_ms=0)
    [warm] = ready(w, 0, {"i0": True}, {"i0": 0})
    w.failed(warm)
    assert w.pending("c1") is None and w.counts.failed == 1
    assert w.counts.sent == 0 and w.counts.prefill_tokens == 0


def test_the_pool_is_read_from_vllm_metrics() -> None:
    text = 'vllm:cache_config_info{block_size="32",num_gpu_blocks="96",prefix_caching="True"} 1.0\n'
    assert _pool_blocks(text) == 96 and _pool_blocks("vllm:num_requests_waiting 0.0") is None


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
    [warm] = engines.warm_for("c1")
    assert warm.instance == where.name
    assert await engines.send_warm(warm)
    assert bodies == [{"model": "m", "prompt": IDS, "max_tokens": 1, "temperature": 0}]
    assert where.state.in_flight == 0 and where.state.pending_blocks == 0
    for key in route.keys:  # the engine reports the warmed blocks stored
        where.state.stored(key)
    await engines.route({"prompt": [*IDS, 1, 2, 3]}, "m", "c1", set())
    assert engines.warmer.counts.used == 1
    assert engines.stats()["warms"]["precision"] == 1.0


def test_a_warm_is_of_use_only_to_a_turn_that_comes_once_its_prefill_is_done() -> None:
    g = Gaps(maxlen=4, min_gaps=4, min_alive=2)
    for gap in (1_000, 2_000, 3_000, 10_000):
        g.add(gap)
    assert g.chance(0, 2_500) == 2 / 4
    assert g.chance(0, 2_500, after_ms=1_500) == 1 / 4  # the 1 s turn comes while it prefills
    assert g.chance(0, 1_000, after_ms=1_000) == 0.0  # a prefill as long as the life: never of use
    assert g.first_time(0, 2_500, 0.6, after_ms=500) == 1_000  # then 2 of the 3 left in (1.5, 3.5] s


def test_the_instances_ftl_fit_times_a_warm_and_prices_what_a_used_one_saved() -> None:
    w = EngineWarmer(block_size=32, min_precision=0.6, gaps=Gaps(min_gaps=4, min_alive=2))
    for gap in (1_000, 2_000, 3_000, 10_000):
        w.gaps.add(gap)
    w.routed("c1", "i0", "m", IDS, KEYS, now_ms=0)
    w.on_command("c1", now_ms=0)
    fit = {"i0": (100.0, 800.0)}  # FTL = 100 + m * 800 ms; the warm computes half (m = 0.5): 500 ms
    go = w.ready(0, idle={"i0": True}, held=held_of({"i0": 1}), survive_ms=lambda n: 2_000, ftl=fit.get)
    assert go == [] and w.counts.deferred == 1  # within 2 s, 1 s comes before it is done: wait
    assert (
        w.ready(999, idle={"i0": True}, held=held_of({"i0": 1}), survive_ms=lambda n: 2_000, ftl=fit.get)
        == []
    )
    [warm] = w.ready(
        1_000, idle={"i0": True}, held=held_of({"i0": 1}), survive_ms=lambda n: 2_000, ftl=fit.get
    )
    assert warm.prefill_ms == 500.0 and warm.saves_ms == 400.0
    w.judge("c1", "i0", still_held=True, now_ms=2_000)
    assert w.counts.as_dict()["ttft_saved_ms"] == 400.0
    # Without a turn time or gaps known, the command's turn time: no later than the prefill before it.
    w2 = EngineWarmer(block_size=32, survive_fraction=0.01)
    w2.routed("c2", "i0", "m", IDS, KEYS)
    w2.on_command("c2", now_ms=0, due_ms=10_000)
    assert w2.ready(9_000, idle={"i0": True}, held=held_of({}), survive_ms=lambda n: 4_000, ftl=fit.get) == []
    assert (
        len(w2.ready(9_100, idle={"i0": True}, held=held_of({}), survive_ms=lambda n: 4_000, ftl=fit.get))
        == 1
    )


async def test_first_token_times_fit_each_instances_ftl_from_what_it_reported_cached() -> None:
    async def completes(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": 70, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 32}}
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})

    engines = Engines(
        [engine("i0", completes), engine("i1", completes)], tokens=None, model="m", block_size=32
    )
    engines.tokens = type("Ids", (), {"of": staticmethod(lambda body: body["prompt"])})()
    route = await engines.route({"prompt": IDS}, "m", "c1", set())
    assert route.engine.ftl_params() is None
    for cached, ms in ((0, 900.0), (32, 500.0), (64, 140.0), (0, 900.0), (64, 140.0)):
        assert engines.timed(route, ms, cached) == 1 - cached / 70
    base, delta = route.engine.ftl_params() or (0.0, 0.0)
    assert abs(base + delta - 900) < 25 and abs(base + (6 / 70) * delta - 140) < 25
    assert engines.timed(route, 300.0, None) == 1.0  # nothing predicted held: all of it computed
    assert (
        engines.stats()["instances"][[e.name for e in engines.engines].index(route.engine.name)][
            "ftl_delta_ms"
        ]
        is not None
    )
    # A warm is timed too: one token, so its time is its prefill's.
    n = route.engine.ftl.n
    [warm] = engines.warm_for("c1")
    assert await engines.send_warm(warm)
    assert route.engine.ftl.n > n * 0.99 + 0.5
