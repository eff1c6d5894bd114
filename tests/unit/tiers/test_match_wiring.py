"""The match decision inside the tier node, on fake ports: the guards on lookups by text (real MiniLM
embeddings of the password prompts of issue 13), the best candidate across tiers, semantic invalidation
that spares a neighbour asking the opposite question (on the writing node and on receiving ones),
per-entry feedback, and the learned decision behind a δ."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from policies.recency.lru import LRU
from schemas.events import CacheInvalidated, HeatScored
from schemas.ids import new_event_id
from services.runtime.breaker import LatencyBreaker
from services.tiers.entry import EntryMeta, encode_text
from services.tiers.l1.cache import L1Cache
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.store import L2Store
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import Outbox
from services.tiers.node.tiered import Query, TieredCache
from services.tiers.settings import TiersSettings
from tests.unit.tiers.fakes import Clock, MemoryL3, at_cosine, unit
from tests.unit.tiers.minilm import DIM, NOT_RESET, PARAPHRASE, RESET, REWORDED, embed

RNG = np.random.default_rng(13)
ORIGINAL, NEGATED = "faq:pw-reset", "faq:pw-not-reset"


@dataclass
class Rig:
    cache: TieredCache
    l3: MemoryL3
    clock: Clock


def make(node: str = "a", matcher: Matcher | None = None) -> Rig:
    clock = Clock()
    l3 = MemoryL3(clock=clock)
    cache = TieredCache(
        l1=L1Cache(dim=DIM, capacity_bytes=1 << 20, max_entries=64, policy=LRU(1 << 20), clock=clock),
        l2=L2Store(BlockPool(8, xp=np, clock=clock), dim=DIM),
        l3=l3,
        outbox=Outbox(clock=clock),
        breaker=LatencyBreaker(clock=clock),
        node_id=node,
        wall_ms=clock,
        perf_ns=clock.ns,
        matcher=matcher,
    )
    return Rig(cache, l3, clock)


def asked(key: str, text: str) -> EntryMeta:
    """An entry written by text: its embedding and its prompt."""
    return EntryMeta(key=key, kind="prompt", model="m", embedding=embed(text), prompt_text=text)


async def put(rig: Rig, key: str, text: str) -> tuple[str, ...]:
    result = await rig.cache.put(asked(key, text), encode_text(f"answer to {text}", model="m"))
    return result.invalidated_local


def evict_locally(rig: Rig, key: str) -> None:
    rig.cache.on_heat(HeatScored(key=key, score=0.0, decision="evict", model_version=1))


async def test_the_negation_trap_is_a_miss_by_text_and_a_paraphrase_a_hit() -> None:
    rig = make()
    await put(rig, ORIGINAL, RESET)
    trap = await rig.cache.get(embedding=embed(NOT_RESET), text=NOT_RESET)
    assert not trap.hit  # 0.928 >= 0.92, but the negation guard vetoes it
    assert trap.miss_rule == "guard:negation" and trap.similarity is not None and trap.similarity > 0.92
    para = await rig.cache.get(embedding=embed(PARAPHRASE), text=PARAPHRASE)
    assert (para.hit, para.tier, para.match) == (True, "l1", "semantic")
    assert para.entry is not None and para.entry.key == ORIGINAL
    # By embedding alone there is no text to guard: the threshold decides (documented).
    blind = await rig.cache.get(embedding=embed(NOT_RESET))
    assert blind.entry is not None and blind.entry.key == ORIGINAL


async def test_the_negated_write_spares_the_original_and_a_paraphrase_replaces_it() -> None:
    rig = make()
    await put(rig, ORIGINAL, RESET)
    assert await put(rig, NEGATED, NOT_RESET) == ()  # was ("faq:pw-reset",): issue 14
    assert ORIGINAL in rig.cache.l1 and NEGATED in rig.cache.l1
    event = [e for e in rig.cache.outbox.take_due() if isinstance(e, CacheInvalidated)][-1]
    assert (event.key, event.prompt_text) == (NEGATED, NOT_RESET)
    # A true paraphrase makes the original stale; the negated neighbour (0.924) stays.
    assert await put(rig, "faq:pw-reset-2", PARAPHRASE) == (ORIGINAL,)
    assert ORIGINAL not in rig.cache.l1 and NEGATED in rig.cache.l1
    assert rig.cache.stats()["invalidated_entries"] == 1


async def test_after_both_puts_the_original_question_gets_the_original_answer_from_l3() -> None:
    rig = make()
    await put(rig, ORIGINAL, RESET)
    await put(rig, NEGATED, NOT_RESET)
    evict_locally(rig, ORIGINAL)  # L1 and L2 now hold only the negated entry
    for text in (RESET, None):  # by text (the guard vetoes L1's) and by embedding alone (L3's is better)
        got = await rig.cache.get(embedding=embed(RESET), text=text)
        assert got.entry is not None and (got.entry.key, got.tier) == (ORIGINAL, "l3")
        assert got.similarity is not None and got.similarity > 0.999
        evict_locally(rig, ORIGINAL)  # the hit was promoted; take it out again for the next round
    reworded = await rig.cache.get(embedding=embed(REWORDED), text=REWORDED)
    assert reworded.entry is not None and reworded.entry.key == ORIGINAL


async def test_a_receiving_node_drops_only_neighbours_that_ask_the_same_question() -> None:
    rig = make(node="b")
    await put(rig, ORIGINAL, RESET)

    def written(key: str, text: str, prompt: str | None) -> CacheInvalidated:
        emb = embed(text).astype(float).tolist()
        return CacheInvalidated(
            key=key, embedding=emb, similarity_threshold=0.92, origin_node_id="a", prompt_text=prompt
        )

    assert rig.cache.on_invalidated(written(NEGATED, NOT_RESET, NOT_RESET)) == []
    assert ORIGINAL in rig.cache.l1
    assert rig.cache.on_invalidated(written("p", PARAPHRASE, PARAPHRASE)) == [ORIGINAL]
    await put(rig, ORIGINAL, RESET)
    # A write without its prompt (by embedding): the threshold alone, as before.
    assert rig.cache.on_invalidated(written(NEGATED, NOT_RESET, None)) == [ORIGINAL]


async def test_the_best_candidate_across_tiers_wins_and_is_promoted() -> None:
    rig = make()
    base = unit(RNG, DIM)
    for key, cos in (("strong", 0.99), ("weak", 0.93)):
        m = EntryMeta(key=key, kind="prompt", model="m", embedding=at_cosine(RNG, base, cos))
        await rig.cache.put(m, encode_text(key, model="m"), invalidate_threshold=1.0)
    evict_locally(rig, "strong")
    got = await rig.cache.get(embedding=base)
    assert got.entry is not None and (got.entry.key, got.tier) == ("strong", "l3")
    assert "strong" in rig.cache.l1  # promoted: the next lookup is answered from memory
    (again,) = await rig.cache.get_many([Query(embedding=base)])
    assert again.entry is not None and (again.entry.key, again.tier) == ("strong", "l1")


async def test_feedback_that_an_entry_was_wrong_stops_it_serving_at_that_similarity() -> None:
    rig = make()
    base = unit(RNG, DIM)
    m = EntryMeta(key="k", kind="prompt", model="m", embedding=base)
    await rig.cache.put(m, encode_text("v", model="m"))
    near = at_cosine(RNG, base, 0.95)
    served = await rig.cache.get(embedding=near)
    assert served.hit and served.similarity is not None
    rig.cache.matcher.feedback(m, served.similarity, correct=False)  # a user says: wrong answer
    assert not (await rig.cache.get(embedding=near)).hit
    assert (await rig.cache.get(embedding=at_cosine(RNG, base, 0.97))).hit
    assert rig.cache.matcher.threshold(m) > 0.95
    await rig.cache.put(m, encode_text("new answer", model="m"))  # a rewrite forgets the labels
    assert (await rig.cache.get(embedding=near)).hit


async def test_a_delta_switches_on_the_learned_decision() -> None:
    rig = make(matcher=Matcher(delta=0.02, default_similarity_tolerance=0.92, seed=1))
    base = unit(RNG, DIM)
    await rig.cache.put(
        EntryMeta(key="k", kind="prompt", model="m", embedding=base), encode_text("v", model="m")
    )
    # Cold: nothing is served by similarity, not even at 0.99; every candidate is explored (a miss asks
    # the model anyway).
    results = [await rig.cache.get(embedding=at_cosine(RNG, base, 0.99)) for _ in range(20)]
    assert not any(r.hit for r in results)
    assert {r.explore_key for r in results} == {"k"}
    # Explorations' labels (right above 0.9, wrong below 0.8) warm the pool: then it serves at 0.98.
    other = EntryMeta(key="o", kind="prompt", model="m", embedding=unit(RNG, DIM))
    for i in range(300):
        rig.cache.matcher.feedback(other, 0.9 + 0.099 * (i % 100) / 100, correct=True, explored=True)
        rig.cache.matcher.feedback(other, 0.6 + 0.2 * (i % 100) / 100, correct=False, explored=True)
    assert (await rig.cache.get(embedding=at_cosine(RNG, base, 0.98))).hit


def test_the_node_ships_the_learned_decision_at_two_percent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (TiersSettings().match_rule, TiersSettings().match_delta) == ("learned", 0.02)
    monkeypatch.setenv("CACHEMESH_TIERS_MATCH_DELTA", "0.05")
    assert TiersSettings().match_delta == 0.05
    monkeypatch.setenv("CACHEMESH_TIERS_MATCH_RULE", "fixed")
    assert TiersSettings().match_rule == "fixed"
    monkeypatch.setenv("CACHEMESH_TIERS_MATCH_RULE", "sometimes")
    with pytest.raises(ValueError, match="match_rule"):
        TiersSettings()


async def test_a_write_invalidates_neighbours_of_its_own_model_only() -> None:
    # Lookups never match across models (or the gateway's tenants, which are part of the model):
    # neither may a write's semantic invalidation, on the writing node or on a receiving one.
    rig = make(node="b")
    other = EntryMeta(key="other:pw", kind="prompt", model="m2", embedding=embed(RESET), prompt_text=RESET)
    await rig.cache.put(other, encode_text("m2's answer", model="m2"))
    assert await put(rig, "p", PARAPHRASE) == ()
    assert "other:pw" in rig.cache.l1
    emb = embed(PARAPHRASE).astype(float).tolist()
    event = CacheInvalidated(
        key="q",
        model="m",
        embedding=emb,
        similarity_threshold=0.92,
        origin_node_id="a",
        prompt_text=PARAPHRASE,
    )
    assert "other:pw" not in rig.cache.on_invalidated(event)
    event = event.model_copy(update={"model": "m2", "event_id": new_event_id()})  # another event
    assert "other:pw" in rig.cache.on_invalidated(event)


async def test_a_warm_node_verifies_a_share_of_would_be_hits_and_labels_them() -> None:
    matcher = Matcher(delta=0.02, default_similarity_tolerance=0.92, seed=3, verify_rate=0.25)
    rig = make(matcher=matcher)
    base = unit(RNG, DIM)
    await rig.cache.put(
        EntryMeta(key="k", kind="prompt", model="m", embedding=base), encode_text("v", model="m")
    )
    other = EntryMeta(key="o", kind="prompt", model="m", embedding=unit(RNG, DIM))
    for i in range(300):
        matcher.feedback(other, 0.9 + 0.099 * (i % 100) / 100, correct=True, explored=True)
        matcher.feedback(other, 0.6 + 0.2 * (i % 100) / 100, correct=False, explored=True)
    results = [await rig.cache.get(embedding=at_cosine(RNG, base, 0.98)) for _ in range(80)]
    verified = [r for r in results if not r.hit]
    # About a quarter are asked of the model instead, named as verifications; the rest are served.
    assert 8 <= len(verified) <= 35 and all(r.explore_key == "k" for r in verified)
    assert {r.miss_rule for r in verified} == {"verify"}
    learner = matcher.decision.learner
    labelled = len(learner.pool_sims)
    for r in verified:
        assert r.similarity is not None
        matcher.feedback(
            EntryMeta(key="k", kind="prompt", model="m", embedding=base), r.similarity, True, explored=True
        )
    assert learner.pool_verified[labelled:] == [True] * len(verified)
    # A node on the fixed rule never verifies.
    fixed = make(matcher=Matcher(default_similarity_tolerance=0.92, verify_rate=0.25))
    await fixed.cache.put(
        EntryMeta(key="k", kind="prompt", model="m", embedding=base), encode_text("v", model="m")
    )
    assert all([(await fixed.cache.get(embedding=at_cosine(RNG, base, 0.98))).hit for _ in range(20)])


async def test_under_the_learned_decision_a_write_drops_only_what_the_node_would_serve_in_its_place() -> None:
    # A cold learned node serves no paraphrase, so a write of one (a filled miss: another question to
    # the node) keeps its neighbours; once warm it drops those at or above its serving threshold.
    matcher = Matcher(delta=0.02, default_similarity_tolerance=0.92, seed=1)
    rig = make(matcher=matcher)
    await put(rig, "q", RESET)
    assert matcher.write_threshold(asked("p", PARAPHRASE)) == pytest.approx(0.995)
    assert await put(rig, "p", PARAPHRASE) == ()
    other = EntryMeta(key="o", kind="prompt", model="m", embedding=unit(RNG, DIM))
    for i in range(300):
        matcher.feedback(other, 0.9 + 0.099 * (i % 100) / 100, correct=True, explored=True)
        matcher.feedback(other, 0.6 + 0.2 * (i % 100) / 100, correct=False, explored=True)
    serve_from = matcher.decision.learner.thresholds(None)[0]
    assert matcher.write_threshold(asked("p", PARAPHRASE)) == pytest.approx(max(0.92, serve_from))
    # The fixed rule keeps the entry's own tolerance.
    assert Matcher(default_similarity_tolerance=0.92).write_threshold(asked("p", PARAPHRASE)) == 0.92


def test_a_writer_s_own_tolerance_still_says_which_neighbours_a_write_takes() -> None:
    matcher = Matcher(delta=0.02, default_similarity_tolerance=0.92)
    own = EntryMeta(key="p", kind="prompt", model="m", embedding=embed(PARAPHRASE), similarity_tolerance=0.9)
    assert matcher.write_threshold(own) == 0.9
