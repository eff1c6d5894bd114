"""What every L3 store promises (the `L3Store` port), written once: subclass `SemanticL3Contract` (a store
that searches by embedding) or `ExactOnlyL3Contract` and give it a `store` fixture that yields an empty
store of dimension `DIM`. The in-memory fake runs it in
tests/unit/tiers/test_l3_contract.py, `PostgresL3Store` in tests/integration/test_l3_contract.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from schemas.events import CacheInvalidated
from schemas.wire import decode
from services.tiers.entry import Entry, EntryMeta, encode_text
from services.tiers.ports import L3Rejected, L3Store, StampTaken

DIM = 384
NOW = 1_700_000_000_000


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


def at_cosine(v: np.ndarray, cosine: float, seed: int = 99) -> np.ndarray:
    r = np.random.default_rng(seed).standard_normal(DIM)
    r -= (r @ v) * v
    r /= np.linalg.norm(r)
    return (cosine * v + np.sqrt(1 - cosine**2) * r).astype(np.float32)


def entry(key: str, text: str = "an answer", **meta: object) -> Entry:
    fields: dict[str, object] = {"kind": "prompt", "model": "m", "created_at_ms": NOW, "updated_at_ms": NOW}
    fields.update(meta)
    return Entry(EntryMeta(key=key, **fields), encode_text(text, model=str(fields["model"])))  # type: ignore[arg-type]


def invalidation(key: str, reason: str) -> CacheInvalidated:
    return CacheInvalidated(key=key, reason=reason, origin_node_id="n1", occurred_at_ms=NOW)  # type: ignore[arg-type]


class Sent:
    """A relay's `send` that keeps what it was given."""

    def __init__(self) -> None:
        self.items: list[tuple[str, bytes]] = []

    async def __call__(self, items: list[tuple[str, bytes]]) -> None:
        self.items.extend(items)

    def ids(self) -> list[str]:
        return [decode(payload).event_id for _, payload in self.items]

    def keys(self) -> list[str]:
        return [key for key, _ in self.items]


class L3StoreContract:
    """What every store promises, by key; `SemanticL3Contract` / `ExactOnlyL3Contract` add the search
    cases of stores with and without semantic search."""

    # --- by key -------------------------------------------------------------------------------

    async def test_put_then_get_gives_back_every_descriptor_field_and_the_value(self, store: L3Store) -> None:
        e = vec(1)
        written = entry(
            "q:1",
            "the answer",
            kind="embedding",
            model="llama",
            embedding=e,
            similarity_tolerance=0.85,
            ttl_hint_ms=60_000,
            trace_id="conv-1",
            context_dependency_ids=("doc-2", "doc-1"),
            semantic_tags={"lang": "en", "topic": "billing"},
            created_at_ms=NOW - 5,
            updated_at_ms=NOW,
            prompt_text="What is the capital of France?",
        )
        await store.put(written)
        got = await store.get("q:1", NOW)
        assert got is not None and got.blob == written.blob
        m = got.meta
        assert (m.key, m.kind, m.model, m.trace_id) == ("q:1", "embedding", "llama", "conv-1")
        assert m.similarity_tolerance == pytest.approx(0.85, abs=1e-6)
        assert (m.ttl_hint_ms, m.created_at_ms, m.updated_at_ms) == (60_000, NOW - 5, NOW)
        assert m.context_dependency_ids == ("doc-2", "doc-1")  # in the order written
        assert m.semantic_tags == {"lang": "en", "topic": "billing"}
        assert m.embedding is not None and m.embedding.dtype == np.float32
        np.testing.assert_allclose(m.embedding, e, rtol=1e-6)
        assert m.expires_at_ms == NOW + 60_000
        assert m.prompt_text == "What is the capital of France?"

    async def test_size_bytes_is_the_stored_value_length(self, store: L3Store) -> None:
        written = entry("q:1", "x" * 100, size_bytes=7)
        await store.put(written)
        got = await store.get("q:1", NOW)
        assert got is not None and got.meta.size_bytes == len(written.blob)

    async def test_optional_fields_come_back_empty(self, store: L3Store) -> None:
        await store.put(entry("q:1"))
        got = await store.get("q:1", NOW)
        assert got is not None
        m = got.meta
        assert (
            m.embedding is None and m.ttl_hint_ms is None and m.trace_id is None and m.expires_at_ms is None
        )
        assert m.context_dependency_ids == () and m.semantic_tags == {} and m.prompt_text is None
        assert m.similarity_tolerance == pytest.approx(0.92, abs=1e-6)

    async def test_unknown_keys_are_misses(self, store: L3Store) -> None:
        assert await store.get("nope", NOW) is None
        assert await store.get_many([], NOW) == {}
        assert await store.get_many(["nope"], NOW) == {}

    async def test_get_many_answers_the_keys_it_holds(self, store: L3Store) -> None:
        for k in ("a", "b", "c"):
            await store.put(entry(k, f"value {k}"))
        got = await store.get_many(["a", "c", "nope"], NOW)
        assert set(got) == {"a", "c"}
        assert got["c"].blob == encode_text("value c", model="m")

    async def test_a_put_replaces_value_descriptor_and_all_tags_but_keeps_created_at(
        self, store: L3Store
    ) -> None:
        await store.put(entry("q:1", "old", semantic_tags={"a": "1", "b": "2"}, trace_id="t1"))
        later = NOW + 1000
        await store.put(
            entry(
                "q:1",
                "new",
                semantic_tags={"b": "3"},
                context_dependency_ids=("d",),
                created_at_ms=later,
                updated_at_ms=later,
            )
        )
        got = await store.get("q:1", later)
        assert got is not None and got.blob == encode_text("new", model="m")
        assert got.meta.semantic_tags == {"b": "3"}
        assert got.meta.trace_id is None and got.meta.context_dependency_ids == ("d",)
        assert (got.meta.created_at_ms, got.meta.updated_at_ms) == (NOW, later)  # created when first written

    async def test_an_older_write_arriving_late_leaves_the_newer_one(self, store: L3Store) -> None:
        # Two nodes writing one key, or a write-behind flushed after a later write: newest wins.
        later = NOW + 1000
        await store.put(entry("q:1", "new", semantic_tags={"v": "new"}, updated_at_ms=later))
        await store.put(entry("q:1", "old", semantic_tags={"v": "old"}, updated_at_ms=NOW))
        got = await store.get("q:1", later)
        assert got is not None and got.blob == encode_text("new", model="m")
        assert got.meta.updated_at_ms == later and got.meta.semantic_tags == {"v": "new"}

    async def test_a_second_write_under_the_same_stamp_is_refused_and_leaves_nothing(
        self, store: L3Store
    ) -> None:
        # Two nodes' writes in one millisecond: no node could tell which is newer, so the second writer
        # is told to stamp again; its value and its invalidation are not written.
        await store.put(entry("q:1", "first"), announce=invalidation("q:1", "write"))
        with pytest.raises(StampTaken) as taken:
            await store.put(entry("q:1", "second"), announce=invalidation("q:1", "write"))
        assert taken.value.stamp_ms == NOW
        got = await store.get("q:1", NOW)
        assert got is not None and got.blob == encode_text("first", model="m")
        assert await store.relay_outbox(Sent(), older_than_ms=0) == 1

    async def test_delete_removes_the_entry_once(self, store: L3Store) -> None:
        await store.put(entry("q:1", semantic_tags={"a": "1"}))
        await store.put(entry("q:2"))
        assert await store.delete("q:1") is True
        assert await store.delete("q:1") is False
        assert await store.get("q:1", NOW) is None
        assert set(await store.get_many(["q:1", "q:2"], NOW)) == {"q:2"}
        await store.put(entry("q:1"))  # the key is free again, with no tags left behind
        got = await store.get("q:1", NOW)
        assert got is not None and got.meta.semantic_tags == {}

    # --- expiry -------------------------------------------------------------------------------

    async def test_an_entry_lives_until_updated_at_plus_ttl(self, store: L3Store) -> None:
        await store.put(entry("q:1", ttl_hint_ms=1000))
        expires = NOW + 1000
        assert await store.get("q:1", expires - 1) is not None
        assert await store.get("q:1", expires) is None
        assert await store.get_many(["q:1"], expires) == {}
        assert await store.get("q:1", expires - 1) is not None  # expired entries stay until swept

    async def test_delete_expired_sweeps_up_to_the_limit(self, store: L3Store) -> None:
        for i in range(5):
            await store.put(entry(f"old-{i}", ttl_hint_ms=10))
        await store.put(entry("forever"))
        await store.put(entry("later", ttl_hint_ms=10_000))
        assert await store.delete_expired(NOW + 10, limit=3) == 3
        assert await store.delete_expired(NOW + 10) == 2
        assert await store.delete_expired(NOW + 10) == 0
        assert set(await store.get_many(["forever", "later"], NOW + 10)) == {"forever", "later"}

    # --- conversations and dependencies -------------------------------------------------------

    async def test_delete_bound_to_takes_the_trace_and_its_dependants(self, store: L3Store) -> None:
        await store.put(entry("turn-1", trace_id="conv-1"))
        await store.put(entry("uses-conv", context_dependency_ids=("doc-9", "conv-1")))
        await store.put(entry("other", trace_id="conv-2", context_dependency_ids=("doc-9",)))
        await store.put(entry("free"))
        assert sorted(await store.delete_bound_to("conv-1")) == ["turn-1", "uses-conv"]
        assert set(await store.get_many(["turn-1", "uses-conv", "other", "free"], NOW)) == {"other", "free"}
        assert await store.delete_bound_to("conv-1") == []
        assert await store.delete_bound_to("doc-9") == ["other"]

    # --- refusals -----------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "bad",
        [
            pytest.param({"key": ""}, id="empty-key"),
            pytest.param({"key": "k" * 513}, id="key-over-512"),
            pytest.param({"kind": "bogus"}, id="unknown-kind"),
            pytest.param({"ttl_hint_ms": 0}, id="zero-ttl"),
            pytest.param({"ttl_hint_ms": -5}, id="negative-ttl"),
            pytest.param({"similarity_tolerance": 1.5}, id="tolerance-over-1"),
            pytest.param({"similarity_tolerance": -0.1}, id="negative-tolerance"),
            pytest.param({"semantic_tags": {"": "x"}}, id="empty-tag-name"),
            pytest.param({"semantic_tags": {"t" * 129: "x"}}, id="tag-name-over-128"),
            pytest.param({"key": "a\x00b"}, id="nul-in-key"),
            pytest.param({"model": "m\x00"}, id="nul-in-model"),
            pytest.param({"semantic_tags": {"lang": "e\x00n"}}, id="nul-in-tag-value"),
            pytest.param({"context_dependency_ids": ("d\x00",)}, id="nul-in-dependency"),
            pytest.param({"embedding": np.ones(DIM - 1, dtype=np.float32)}, id="wrong-dimension"),
        ],
    )
    async def test_bad_data_is_rejected_and_nothing_is_written(
        self, store: L3Store, bad: dict[str, object]
    ) -> None:
        good = entry("q:1", "kept", semantic_tags={"lang": "en"})
        await store.put(good)
        key = str(bad.get("key", "q:1"))
        written = entry("q:1", "replacement", updated_at_ms=NOW + 1)
        meta = replace(written.meta, **{**bad, "key": key})  # type: ignore[arg-type]
        with pytest.raises(L3Rejected):
            await store.put(Entry(meta, written.blob))
        got = await store.get("q:1", NOW)
        assert got is not None and got.blob == good.blob and got.meta.semantic_tags == {"lang": "en"}

    # --- the outbox ---------------------------------------------------------------------------

    async def test_a_write_and_a_delete_record_their_invalidations_for_the_relay(
        self, store: L3Store
    ) -> None:
        wrote, deleted = invalidation("q:1", "write"), invalidation("q:1", "delete")
        await store.put(entry("q:1"), announce=wrote)
        await store.delete("q:1", announce=deleted)
        sent = Sent()
        assert await store.relay_outbox(sent, older_than_ms=0) == 2
        assert sent.ids() == [wrote.event_id, deleted.event_id] and sent.keys() == ["q:1", "q:1"]
        assert await store.relay_outbox(sent, older_than_ms=0) == 0, "relayed once, then gone"

    async def test_a_refused_write_records_no_invalidation(self, store: L3Store) -> None:
        bad = entry("q:1", semantic_tags={"t" * 129: "x"})  # refused after the descriptor went in
        with pytest.raises(L3Rejected):
            await store.put(bad, announce=invalidation("q:1", "write"))
        assert await store.relay_outbox(Sent(), older_than_ms=0) == 0

    async def test_a_failed_send_leaves_the_invalidations_for_the_next_relay(self, store: L3Store) -> None:
        wrote = invalidation("q:1", "write")
        await store.put(entry("q:1"), announce=wrote)

        async def broker_away(items: list[tuple[str, bytes]]) -> None:
            raise ConnectionError("no broker")

        with pytest.raises(ConnectionError):
            await store.relay_outbox(broker_away, older_than_ms=0)
        sent = Sent()
        assert await store.relay_outbox(sent, older_than_ms=0) == 1 and sent.ids() == [wrote.event_id]

    async def test_the_relay_waits_out_the_grace_and_acknowledged_events_are_forgotten(
        self, store: L3Store
    ) -> None:
        first, second = invalidation("q:1", "write"), invalidation("q:2", "write")
        await store.put(entry("q:1"), announce=first)
        await store.put(entry("q:2"), announce=second)
        assert await store.relay_outbox(Sent(), older_than_ms=60_000) == 0, "younger than the grace"
        assert await store.outbox_sent([first.event_id, "never-recorded"]) == 1
        sent = Sent()
        assert await store.relay_outbox(sent, older_than_ms=0, limit=5) == 1 and sent.ids() == [
            second.event_id
        ]


class SemanticL3Contract(L3StoreContract):
    """The contract of a store that searches by embedding (pgvector; the fake with `semantic=True`)."""

    async def test_a_non_finite_embedding_is_rejected(self, store: L3Store) -> None:
        e = vec(1)
        e[3] = np.nan
        with pytest.raises(L3Rejected):
            await store.put(entry("q:1", embedding=e))
        assert await store.get("q:1", NOW) is None

    # --- neighbours: candidates for the caller's match decision -------------------------------

    async def test_the_first_neighbour_is_the_nearest_live_entry(self, store: L3Store) -> None:
        base = vec(1)
        await store.put(entry("near", embedding=at_cosine(base, 0.97, seed=1), similarity_tolerance=0.9))
        await store.put(entry("nearer", embedding=at_cosine(base, 0.99, seed=2), similarity_tolerance=0.9))
        await store.put(entry("far", embedding=vec(2), similarity_tolerance=0.0))
        await store.put(entry("no-embedding"))
        near = await store.neighbours(base, NOW, min_similarity=0.5)
        assert [m.entry.key for m in near] == ["nearer", "near"]
        assert near[0].similarity == pytest.approx(0.99, abs=1e-3)
        assert near[1].similarity == pytest.approx(0.97, abs=1e-3)
        assert near[0].entry.blob == encode_text("an answer", model="m")
        assert [m.entry.key for m in await store.neighbours(base, NOW, candidates=1)] == ["nearer"]

    async def test_neighbours_leave_the_entry_tolerance_to_the_caller_and_cut_at_min_similarity(
        self, store: L3Store
    ) -> None:
        base = vec(1)
        await store.put(entry("strict", embedding=at_cosine(base, 0.95), similarity_tolerance=0.97))
        near = await store.neighbours(base, NOW)  # 0.95 < its own 0.97: still a candidate
        assert [m.entry.key for m in near] == ["strict"]
        assert near[0].similarity == pytest.approx(0.95, abs=1e-3)
        assert near[0].entry.meta.similarity_tolerance == pytest.approx(0.97)
        await store.put(entry("lax", embedding=at_cosine(base, 0.93, seed=5), similarity_tolerance=0.9))
        both = await store.neighbours(base, NOW, min_similarity=0.9)
        assert [m.entry.key for m in both] == ["strict", "lax"]
        cut = await store.neighbours(base, NOW, min_similarity=0.94)  # the caller asks for more
        assert [m.entry.key for m in cut] == ["strict"]
        assert await store.neighbours(base, NOW, min_similarity=0.96) == []

    async def test_neighbours_filter_by_model_and_skip_expired(self, store: L3Store) -> None:
        base = vec(1)
        await store.put(entry("llama", model="llama", embedding=at_cosine(base, 0.98)))
        await store.put(entry("gone", model="qwen", embedding=base, ttl_hint_ms=100))
        qwen = await store.neighbours(base, NOW, model="qwen", min_similarity=0.5)
        assert [m.entry.key for m in qwen] == ["gone"]
        assert await store.neighbours(base, NOW + 100, model="qwen", min_similarity=0.5) == []
        only = await store.neighbours(base, NOW, model="llama", min_similarity=0.5)
        assert [m.entry.key for m in only] == ["llama"]
        assert await store.neighbours(base, NOW, model="mistral") == []
        assert [m.entry.key for m in await store.neighbours(base, NOW + 100)] == ["llama"]

    async def test_neighbours_after_delete_and_on_an_empty_store(self, store: L3Store) -> None:
        base = vec(1)
        assert await store.neighbours(base, NOW) == []
        await store.put(entry("q:1", embedding=base))
        assert [m.entry.key for m in await store.neighbours(base, NOW)] == ["q:1"]
        assert await store.delete("q:1")
        assert await store.neighbours(base, NOW) == []

    async def test_a_zero_query_matches_nothing(self, store: L3Store) -> None:
        await store.put(entry("q:1", embedding=vec(1), similarity_tolerance=0.0))
        assert await store.neighbours(np.zeros(DIM, dtype=np.float32), NOW) == []

    async def test_a_query_of_the_wrong_dimension_is_an_error(self, store: L3Store) -> None:
        await store.put(entry("q:1", embedding=vec(1)))
        with pytest.raises(ValueError):
            await store.neighbours(np.ones(DIM + 1, dtype=np.float32), NOW)

    async def test_neighbours_are_every_near_entry_best_first_whatever_its_tolerance(
        self, store: L3Store
    ) -> None:
        base = vec(1)
        await store.put(entry("strict", embedding=at_cosine(base, 0.95, 11), similarity_tolerance=0.99))
        await store.put(entry("lax", embedding=at_cosine(base, 0.9, 12), similarity_tolerance=0.5))
        await store.put(entry("far", embedding=vec(5)))
        await store.put(entry("other", model="llama", embedding=at_cosine(base, 0.97, 13)))
        near = await store.neighbours(base, NOW, model="m", min_similarity=0.8, candidates=4)
        assert [m.entry.key for m in near] == ["strict", "lax"]  # the decision applies tolerances
        assert near[0].similarity == pytest.approx(0.95, abs=1e-3)
        assert [m.entry.key for m in await store.neighbours(base, NOW, candidates=1)] == ["other"]
        assert await store.neighbours(base, NOW, model="m", min_similarity=0.96) == []

    # --- find_neighbours: the whole L3 leg of a lookup ----------------------------------------

    async def test_find_neighbours_prefers_the_exact_key_then_the_nearest_entries(
        self, store: L3Store
    ) -> None:
        base = vec(1)
        await store.put(entry("exact", embedding=vec(3)))
        await store.put(entry("para", embedding=at_cosine(base, 0.97)))
        exact, near = await store.find_neighbours("exact", base, NOW, min_similarity=0.5)
        assert exact is not None and exact.key == "exact" and near == []
        exact, near = await store.find_neighbours("never-written", base, NOW, min_similarity=0.5)
        assert exact is None and [m.entry.key for m in near] == ["para"]
        assert near[0].similarity == pytest.approx(0.97, abs=1e-3)
        assert await store.find_neighbours("never-written", vec(4), NOW, min_similarity=0.5) == (None, [])

    async def test_find_neighbours_with_a_model_skips_an_exact_key_of_another_model(
        self, store: L3Store
    ) -> None:
        base = vec(1)
        await store.put(entry("k", model="qwen", embedding=vec(3)))
        await store.put(entry("para", model="llama", embedding=at_cosine(base, 0.97)))
        exact, near = await store.find_neighbours("k", base, NOW, model="llama", min_similarity=0.5)
        assert exact is None and [m.entry.key for m in near] == ["para"]
        assert await store.find_neighbours("k", vec(4), NOW, model="llama", min_similarity=0.5) == (None, [])
        exact, near = await store.find_neighbours("k", base, NOW, model="qwen")
        assert exact is not None and exact.key == "k" and near == []

    async def test_find_neighbours_skips_an_expired_exact_key(self, store: L3Store) -> None:
        await store.put(entry("k", embedding=vec(3), ttl_hint_ms=10))
        assert await store.find_neighbours("k", vec(4), NOW + 10, min_similarity=0.5) == (None, [])
        exact, _ = await store.find_neighbours("k", vec(4), NOW + 9)
        assert exact is not None and exact.key == "k"

    async def test_find_neighbours_gives_the_exact_key_or_the_neighbours(self, store: L3Store) -> None:
        base = vec(1)
        await store.put(entry("k", embedding=vec(3), prompt_text="How do I reset my password?"))
        await store.put(entry("para", embedding=at_cosine(base, 0.97)))
        exact, near = await store.find_neighbours("k", base, NOW)
        assert exact is not None and exact.key == "k" and near == []
        assert exact.meta.prompt_text == "How do I reset my password?"
        exact, near = await store.find_neighbours("never-written", base, NOW, min_similarity=0.5)
        assert exact is None and [m.entry.key for m in near] == ["para"]
        exact, near = await store.find_neighbours("k", base, NOW, model="llama")
        assert exact is None and near == []


class ExactOnlyL3Contract(L3StoreContract):
    """The contract of a store without semantic search (Postgres without pgvector)."""

    async def test_without_semantic_search_only_exact_keys_answer(self, store: L3Store) -> None:
        await store.put(entry("k", embedding=vec(1)))
        assert await store.neighbours(vec(1), NOW) == []
        exact, near = await store.find_neighbours("k", vec(1), NOW)
        assert exact is not None and exact.key == "k" and near == []
        assert await store.find_neighbours("other", vec(1), NOW) == (None, [])
        assert await store.find_neighbours("k", vec(1), NOW, model="other") == (None, [])
