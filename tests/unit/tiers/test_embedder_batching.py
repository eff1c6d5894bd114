"""The embedder's cache and micro-batching, with the model call replaced by a counting stand-in (the
model itself is exercised by the tests that load MiniLM)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.tiers.edge.embedder import DIM, Embedder


class CountingEmbedder(Embedder):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.calls: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def _encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(texts)
        await self.gate.wait()
        rows = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            rows[i, len(t) % DIM] = 1.0
        return rows


async def test_a_repeated_text_is_not_embedded_again() -> None:
    e = CountingEmbedder()
    first = await e.embed(["how do I reset my password?", "hello"])
    again = await e.embed(["hello", "how do I reset my password?", "hello"])
    assert e.calls == [["how do I reset my password?", "hello"]]
    assert np.array_equal(again[1], first[0]) and np.array_equal(again[0], again[2])
    assert e.health()["cached_texts"] == 2 and e.health()["encoded_texts"] == 2


async def test_concurrent_lookups_share_one_model_call() -> None:
    e = CountingEmbedder()
    e.gate.clear()
    first = asyncio.create_task(e.embed(["a"]))
    await asyncio.sleep(0)  # the first batch is encoding: the next ones wait for the batch after it
    rest = [asyncio.create_task(e.embed([f"q{i}", "shared"])) for i in range(20)]
    await asyncio.sleep(0)
    e.gate.set()
    results = await asyncio.gather(first, *rest)
    assert e.calls[0] == ["a"]
    assert len(e.calls) == 2 and sorted(e.calls[1]) == sorted([*(f"q{i}" for i in range(20)), "shared"])
    assert all(r.shape == (2, DIM) for r in results[1:])


async def test_the_cache_is_bounded_and_a_failure_reaches_every_waiter() -> None:
    e = CountingEmbedder(cache_entries=3)
    for t in ("a", "bb", "ccc", "dddd"):
        await e.embed([t])
    assert e.health()["cached_texts"] == 3
    await e.embed(["a"])
    assert e.calls[-1] == ["a"], "the oldest text was forgotten"

    class Broken(CountingEmbedder):
        async def _encode(self, texts: list[str]) -> np.ndarray:
            raise RuntimeError("model down")

    b = Broken()
    outcomes = await asyncio.gather(b.embed(["x"]), b.embed(["y"]), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    with pytest.raises(RuntimeError):
        await b.embed(["z"])


async def test_a_backlog_is_encoded_oldest_first_a_bounded_batch_at_a_time() -> None:
    e = CountingEmbedder(max_call_texts=8)
    e.gate.clear()
    first = asyncio.create_task(e.embed(["first"]))
    await asyncio.sleep(0)
    backlog = [asyncio.create_task(e.embed([f"q{i}"])) for i in range(20)]
    await asyncio.sleep(0)
    e.gate.set()
    await asyncio.gather(first, *backlog)
    assert e.calls[0] == ["first"]
    assert [len(c) for c in e.calls[1:]] == [8, 8, 4]
    assert [t for c in e.calls[1:] for t in c] == [f"q{i}" for i in range(20)]


async def test_lanes_encode_that_many_batches_at_once_and_no_more() -> None:
    e = CountingEmbedder(max_call_texts=2, lanes=2)
    e.gate.clear()
    waiting = [asyncio.create_task(e.embed([f"q{i}"])) for i in range(7)]
    for _ in range(5):
        await asyncio.sleep(0)
    # Two lanes, two calls in flight; each took the oldest texts then waiting.
    assert e.calls == [["q0", "q1"], ["q2", "q3"]]
    e.gate.set()
    results = await asyncio.gather(*waiting)
    assert sorted(t for c in e.calls for t in c) == [f"q{i}" for i in range(7)]
    assert all(len(c) <= 2 for c in e.calls)
    assert [r[0].argmax() for r in results] == [len(f"q{i}") % DIM for i in range(7)]
    # Every lane ends once nothing waits, and a later text starts a lane again.
    for _ in range(3):
        await asyncio.sleep(0)
    assert not any(not lane.done() for lane in e._draining)
    await e.embed(["later"])
    assert e.calls[-1] == ["later"]


async def test_one_lane_keeps_one_call_at_a_time() -> None:
    e = CountingEmbedder(max_call_texts=2)
    e.gate.clear()
    waiting = [asyncio.create_task(e.embed([f"q{i}"])) for i in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert e.calls == [["q0", "q1"]]
    e.gate.set()
    await asyncio.gather(*waiting)
    assert e.calls == [["q0", "q1"], ["q2", "q3"], ["q4"]]


def test_lanes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lanes"):
        Embedder(lanes=0)
