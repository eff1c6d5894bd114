"""The match decision across two tier nodes on the real Kafka and Postgres, with the real all-MiniLM-L6-v2:
a negated write on node A does not drop node B's original through `cache.invalidate.v1` (the event
carries the written prompt, B runs the guards), a true paraphrase still does, and B answers each
question with its own entry."""

from __future__ import annotations

import uuid

import pytest

from services.tiers.edge.client import AsyncTiersClient
from tests.integration.nodes import InvalidationTap, running
from tests.integration.test_tiers_service import linked
from tests.unit.tiers.minilm import NOT_RESET, PARAPHRASE, RESET, REWORDED, embed

pytestmark = pytest.mark.integration


async def test_a_negated_write_on_a_spares_bs_original_and_a_paraphrase_replaces_it(
    kafka, namespace, topics_on, node_settings
) -> None:
    await topics_on(kafka)
    # The L3 breaker is not under test (a slow Postgres call on a loaded machine must not open it).
    # The fixed rule: a write takes neighbours from 0.92 where no guard fires (a cold learned node takes
    # near-exact repeats only: tests/unit/tiers/test_match_wiring.py).
    options = {"l3_breaker_p99_ms": 10_000.0, "embedder_preload": True, "match_rule": "fixed"}
    run = uuid.uuid4().hex[:12]  # a shared Postgres keeps earlier runs' entries: keys and model are new
    model = f"minilm-{run}"
    original, negated, paraphrase = (f"faq:{k}-{run}" for k in ("pw-reset", "pw-not-reset", "pw-reset-2"))
    async with (
        running(node_settings("a", **options)) as a,
        running(node_settings("b", **options)) as b,
        InvalidationTap(kafka.bootstrap, namespace) as tap,
    ):
        await linked(a, b)
        assert b.cache is not None
        async with (
            AsyncTiersClient(a.api_url, timeout_s=120) as ca,
            AsyncTiersClient(b.api_url, timeout_s=120) as cb,
        ):
            await cb.put(original, "Settings > Security > Reset password.", model=model, embed_text=RESET)
            assert original in b.cache.l1

            put = await ca.put(negated, "Then leave it as it is.", model=model, embed_text=NOT_RESET)
            assert put["invalidated_local"] == [] and put["persisted"]
            # Both deletes of A's write (the delayed second one too) have reached B: the original stays.
            marks = [await tap.landed(negated, attempt=n, origin=a) for n in (1, 2)]
            await tap.applied(b, *marks)
            assert original in b.cache.l1

            got = await cb.lookup(text=RESET, model=model)
            assert (got.hit, got.key, got.value) == (True, original, "Settings > Security > Reset password.")
            trap = await cb.lookup(text=NOT_RESET, model=model)
            assert (trap.hit, trap.key, trap.tier) == (True, negated, "l3")  # its own entry, not L1's 0.93

            replaced = await ca.put(paraphrase, "Security > Reset.", model=model, embed_text=PARAPHRASE)
            assert replaced["persisted"]
            await tap.applied(b, await tap.landed(paraphrase, origin=a))
            assert original not in b.cache.l1  # 0.99 and no guard fires: the same question
            assert negated in b.cache.l1  # promoted by the lookup above, and spared (the negation guard)


async def test_a_screened_node_decides_near_the_threshold_with_the_precise_similarity(
    kafka, namespace, topics_on, node_settings
) -> None:
    """`embedder_screen`: text lookups are embedded by int8 first; a candidate within the band of its
    threshold is re-scored with the fp32 vector (services/tiers/node/refine.py), one far from it is not."""
    await topics_on(kafka)
    options = {
        "l3_breaker_p99_ms": 10_000.0,
        "embedder_preload": True,
        "embedder": "onnx",  # the precise model is fp32 (the default, int8, has no cheaper screen)
        "embedder_screen": "onnx-int8",
        "match_rule": "fixed",  # a known threshold (0.92) to screen around
    }
    run = uuid.uuid4().hex[:12]
    model, key = f"minilm-{run}", f"faq:pw-reset-{run}"
    async with running(node_settings("a", **options)) as a:
        assert a.cache is not None and a.screen is not None
        await a.embedder.start_loading()
        await a.screen.start_loading()
        assert (a.embedder.backend, a.screen.backend) == ("onnx", "onnx-int8")
        async with AsyncTiersClient(a.api_url, timeout_s=120) as client:
            await client.put(key, "Settings > Security > Reset password.", model=model, embed_text=RESET)
            precise = float(embed(REWORDED) @ embed(RESET))  # fp32, as the entry was written: 0.970
            just_below = await client.lookup(text=REWORDED, model=model, tolerance=precise - 0.002)
            assert just_below.hit and just_below.key == key
            assert just_below.similarity == pytest.approx(precise, abs=1e-3)
            just_above = await client.lookup(text=REWORDED, model=model, tolerance=precise + 0.002)
            assert not just_above.hit
            assert a.cache.stats()["refine"]["refined"] == 2
            far = await client.lookup(text=PARAPHRASE, model=model)  # 0.99 against 0.92: settled
            assert far.hit and far.key == key
            refine = a.cache.stats()["refine"]
            assert (refine["screened"], refine["refined"], refine["failed"]) == (3, 2, 0)
