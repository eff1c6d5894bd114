"""Screened text lookups (services/tiers/node/refine.py) inside the tier node, on fake ports, with planted
vectors: the cheap vector decides only away from the threshold; near it the precise vector re-scores every
candidate, in L1 and in L3, one at a time and in batches; a failed precise call leaves the cheap verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from policies.recency.lru import LRU
from schemas.events import HeatScored
from services.runtime.breaker import LatencyBreaker
from services.tiers.entry import Entry, EntryMeta, encode_text
from services.tiers.l1.cache import L1Cache
from services.tiers.node.outbox import Outbox
from services.tiers.node.plan import PLAN, Offer
from services.tiers.node.refine import Refiner, rescore, unsettled
from services.tiers.node.tiered import Query, TieredCache
from tests.unit.tiers.fakes import Clock, MemoryL3, at_cosine, unit

DIM = 32
RNG = np.random.default_rng(29)


@dataclass
class Precise:
    """The precise model: a planted vector per text; records what it was asked."""

    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    asked: list[list[str]] = field(default_factory=list)
    broken: bool = False

    async def __call__(self, texts: list[str]) -> np.ndarray:
        self.asked.append(list(texts))
        if self.broken:
            raise RuntimeError("model gone")
        return np.stack([self.vectors[t] for t in texts])


def make(precise: Precise, band: float = 0.04) -> tuple[TieredCache, Clock]:
    clock = Clock()
    cache = TieredCache(
        l1=L1Cache(dim=DIM, capacity_bytes=1 << 20, max_entries=64, policy=LRU(1 << 20), clock=clock),
        l2=None,
        l3=MemoryL3(clock=clock),
        outbox=Outbox(clock=clock),
        breaker=LatencyBreaker(clock=clock),
        node_id="a",
        wall_ms=clock,
        perf_ns=clock.ns,
    )
    cache.placement.refiner = Refiner(precise, band)
    return cache, clock


async def put(cache: TieredCache, key: str, vec: np.ndarray) -> None:
    meta = EntryMeta(key=key, kind="prompt", model="m", embedding=vec, prompt_text=f"prompt of {key}")
    await cache.put(meta, encode_text(f"answer of {key}", model="m"))


def planted(base: np.ndarray, cheap: float, precise: float, text: str, model: Precise) -> np.ndarray:
    """The cheap vector of `text` at `cheap` from `base`; the precise one at `precise`, kept in `model`."""
    model.vectors[text] = at_cosine(RNG, base, precise)
    return at_cosine(RNG, base, cheap)


def test_unsettled_means_a_candidate_within_the_band_of_its_threshold() -> None:
    assert unsettled([0.95], [0.92], 0.04)
    assert unsettled([0.50, 0.89], [0.92, 0.92], 0.04)
    assert not unsettled([0.97, 0.85], [0.92, 0.92], 0.04)
    assert not unsettled([], [], 0.04)
    assert not unsettled([0.93], [0.92], 0.0)


def test_rescore_uses_the_stored_embedding_and_keeps_offers_without_one() -> None:
    base = unit(RNG, DIM)
    query = at_cosine(RNG, base, 0.8)
    blob, step = encode_text("x", model="m"), PLAN[1]
    with_vec = Offer(Entry(EntryMeta("a", "prompt", "m", embedding=3.0 * base), blob), 0.99, step)
    without = Offer(Entry(EntryMeta("b", "prompt", "m"), blob), 0.97, step)
    a, b = rescore([with_vec, without], query)
    assert a.similarity == pytest.approx(0.8, abs=1e-5) and a.entry is with_vec.entry
    assert b.similarity == 0.97


def test_a_band_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="band"):
        Refiner(Precise(), band=1.5)


async def test_a_cheap_hit_the_precise_model_puts_below_the_threshold_is_a_miss() -> None:
    precise = Precise()
    cache, _ = make(precise)
    base = unit(RNG, DIM)
    await put(cache, "k", base)
    cheap = planted(base, 0.935, 0.90, "q", precise)
    got = await cache.get(embedding=cheap, text="q", screened=True)
    assert not got.hit and precise.asked == [["q"]]
    # Unscreened, the same vector is taken as it is: served, and the precise model is not asked.
    plain = await cache.get(embedding=cheap, text="q")
    assert plain.hit and plain.similarity == pytest.approx(0.935, abs=1e-5) and len(precise.asked) == 1
    refine = cache.stats()["refine"]
    assert (refine["screened"], refine["refined"], refine["failed"], refine["over_band"]) == (1, 1, 0, 0)
    assert refine["band"] == refine["configured_band"] == 0.04
    assert refine["max_shift"] == pytest.approx(0.035, abs=1e-4)


async def test_a_shift_past_the_band_is_counted_and_widens_the_band() -> None:
    precise = Precise()
    cache, _ = make(precise, band=0.02)
    base = unit(RNG, DIM)
    await put(cache, "k", base)
    far = at_cosine(RNG, base, 0.97)  # 0.05 above the threshold: outside the configured band
    assert (await cache.get(embedding=far, text="far", screened=True)).hit and precise.asked == []
    got = await cache.get(embedding=planted(base, 0.93, 0.88, "q", precise), text="q", screened=True)
    refine = cache.stats()["refine"]
    assert not got.hit and refine["over_band"] == 1 and refine["max_shift"] == pytest.approx(0.05, abs=1e-4)
    assert refine["band"] == pytest.approx(0.0625, abs=1e-4) and refine["configured_band"] == 0.02
    # Now the same 0.97 is within the band: re-scored.
    precise.vectors["far"] = far
    await cache.get(embedding=far, text="far", screened=True)
    assert precise.asked == [["q"], ["far"]]


def test_the_band_widens_only_up_to_its_bound() -> None:
    refiner = Refiner(Precise(), band=0.04, max_band=0.05)
    blob, step = encode_text("x", model="m"), PLAN[1]
    entry = Entry(EntryMeta("a", "prompt", "m", embedding=unit(RNG, DIM)), blob)
    refiner.observe([Offer(entry, 0.9, step)], [Offer(entry, 0.7, step)])
    assert refiner.band == 0.05 and refiner.over_band == 1
    with pytest.raises(ValueError, match="max_band"):
        Refiner(Precise(), band=0.04, max_band=0.03)


async def test_a_cheap_miss_just_below_the_floor_is_served_when_the_precise_model_agrees() -> None:
    precise = Precise()
    cache, _ = make(precise)
    base = unit(RNG, DIM)
    await put(cache, "k", base)
    cheap = planted(base, 0.90, 0.95, "q", precise)
    got = await cache.get(embedding=cheap, text="q", screened=True)
    assert got.hit and got.tier == "l1" and got.entry is not None and got.entry.key == "k"
    assert got.similarity == pytest.approx(0.95, abs=1e-5)
    # The same from L3 alone (evicted from L1), asking for 0.92: L3 too returns candidates down to the
    # band below the request's floor.
    cache.on_heat(HeatScored(key="k", score=0.0, decision="evict", model_version=1))
    again = await cache.get(
        embedding=planted(base, 0.90, 0.95, "again", precise), text="again", tolerance=0.92, screened=True
    )
    assert again.hit and again.tier == "l3" and again.similarity == pytest.approx(0.95, abs=1e-5)


async def test_far_from_the_threshold_the_cheap_vector_decides_alone() -> None:
    precise = Precise()
    cache, _ = make(precise)
    base = unit(RNG, DIM)
    await put(cache, "k", base)
    far_above = await cache.get(embedding=at_cosine(RNG, base, 0.975), text="a", screened=True)
    far_below = await cache.get(embedding=at_cosine(RNG, base, 0.70), text="b", screened=True)
    assert far_above.hit and not far_below.hit and precise.asked == []


async def test_a_batch_asks_the_precise_model_once_for_its_unsettled_texts() -> None:
    precise = Precise()
    cache, _ = make(precise)
    base = unit(RNG, DIM)
    await put(cache, "k", base)
    queries = [
        Query(embedding=planted(base, 0.93, 0.96, "up", precise), text="up", screened=True),
        Query(embedding=planted(base, 0.93, 0.85, "down", precise), text="down", screened=True),
        Query(embedding=at_cosine(RNG, base, 0.99), text="sure", screened=True),
        Query(key="k"),
    ]
    up, down, sure, exact = await cache.get_many(queries)
    assert precise.asked == [["up", "down"]]
    assert up.hit and not down.hit and sure.hit and exact.hit and exact.match == "exact"


async def test_when_the_precise_model_fails_the_cheap_verdict_stands_and_is_counted() -> None:
    precise = Precise(broken=True)
    cache, _ = make(precise)
    base = unit(RNG, DIM)
    await put(cache, "k", base)
    got = await cache.get(embedding=planted(base, 0.93, 0.5, "q", precise), text="q", screened=True)
    assert got.hit and cache.stats()["refine"]["failed"] == 1


def test_settings_refuse_a_band_bound_below_the_band() -> None:
    from pydantic import ValidationError

    from services.tiers.settings import TiersSettings

    assert (
        TiersSettings(embedder_screen_band=0.05, embedder_screen_band_max=0.05).embedder_screen_band_max
        == 0.05
    )
    with pytest.raises(ValidationError, match="embedder_screen_band_max"):
        TiersSettings(embedder_screen_band=0.05, embedder_screen_band_max=0.04)


def test_settings_refuse_a_screen_that_is_the_embedder_itself() -> None:
    from pydantic import ValidationError

    from services.tiers.settings import TiersSettings

    assert TiersSettings().embedder == "onnx-int8"
    assert TiersSettings(embedder="onnx", embedder_screen="onnx-int8").embedder_screen == "onnx-int8"
    with pytest.raises(ValidationError, match="cheaper model"):
        TiersSettings(embedder_screen="onnx-int8")  # the default embedder is int8 already
