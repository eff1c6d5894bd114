"""Three-layer penetration (docs/design.md §2.3): keys, buckets, LRU-2, and per-layer rates."""

from __future__ import annotations

import pytest

from schemas.events import CacheAccessed
from streams.penetration import (
    LayerCounts,
    LruK,
    added_latency_by_layer,
    is_penetration,
    model_layer_key,
    penetration_by_layer,
    sequence_bucket,
    sequence_bucket_label,
)


def test_model_layer_key_has_the_seed_shape() -> None:
    key = model_layer_key("bert-base", "v2", "query")
    name, model, version, digest = key.split(":")
    assert (name, model, version, len(digest)) == ("model", "bert-base", "v2", 16)
    assert key == model_layer_key("bert-base", "v2", "query") != model_layer_key("bert-base", "v2", "Query")


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [
        (0, (0, 0)),
        (1, (1, 64)),
        (64, (1, 64)),
        (65, (65, 256)),
        (256, (65, 256)),
        (257, (257, 1024)),
        (1024, (257, 1024)),
        (1025, (1025, 4096)),
        (40_000, (16_385, 65_536)),
    ],
)
def test_sequence_buckets_grow_four_fold(tokens: int, bucket: tuple[int, int]) -> None:
    assert sequence_bucket(tokens) == bucket
    assert sequence_bucket_label(tokens) == f"{bucket[0]}-{bucket[1]}"


@pytest.mark.parametrize(
    ("layer", "hit", "penetrated"),
    [
        ("token", False, True),
        ("token", True, False),
        ("sequence", False, False),
        ("model", False, False),
        (None, False, False),
    ],
)
def test_only_a_token_layer_miss_is_a_penetration(layer: str | None, hit: bool, penetrated: bool) -> None:
    access = CacheAccessed(key="k", hit=hit, layer=layer)  # type: ignore[arg-type]
    assert is_penetration(access) is penetrated


def test_layer_rates_and_added_latency() -> None:
    layers = {"model": LayerCounts(), "token": LayerCounts(), "sequence": LayerCounts()}
    for hit, ms in [(True, 1.0), (True, 3.0), (False, 12.0), (False, 14.0)]:
        layers["model"].add(hit, ms)
    layers["token"].add(False, 400.0)
    assert penetration_by_layer(layers) == {"model": 0.5, "token": 1.0}
    # model: mean miss 13 - mean hit 2; token: no hits, the mean miss itself.
    assert added_latency_by_layer(layers) == {"model": 11.0, "token": 400.0}


def test_lru2_evicts_by_second_most_recent_access() -> None:
    cache = LruK(capacity=3, k=2)
    assert [cache.access(k) for k in "aab"] == [False, True, False]
    cache.access("c")
    cache.access("c")
    # a and c were seen twice, b once: b goes first, though a is older.
    assert cache.access("d") is False
    assert "b" not in cache and {"a", "c", "d"} <= {k for k in "acd" if k in cache}
    # Among twice-seen entries, the one whose second-last access is oldest goes.
    cache.access("d")
    cache.access("e")
    assert "a" not in cache and "c" in cache and "d" in cache
    assert len(cache) == 3


def test_lru2_rejects_nonsense_sizes() -> None:
    with pytest.raises(ValueError):
        LruK(0)
