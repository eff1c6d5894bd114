"""`EventPublisher` places `publish_many`'s records with a remembered murmur2 per key: the same partition
as the producer's `DefaultPartitioner` picks for `send`, for any key and partition count, also after the
memory is cleared when full."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner

from services.runtime import publisher as publisher_module
from services.runtime.publisher import EventPublisher
from services.runtime.settings import KafkaSettings


def test_the_remembered_hash_places_a_key_where_the_default_partitioner_does(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(publisher_module, "_KEY_HASHES_MAX", 50)
    publisher = EventPublisher(KafkaSettings(bootstrap="127.0.0.1:1"))
    default = DefaultPartitioner()
    rng = random.Random(7)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(300)]
    keys += [f"model:demo:v1:key-{i}".encode() for i in range(100)]
    for _ in range(2):  # the second time from memory (and through clears: 400 keys, room for 50)
        for count in (1, 3, 6, 12):
            partitions = list(range(count))
            for key in keys:
                assert partitions[publisher._key_hash(key) % count] == default(key, partitions, partitions)
    assert len(publisher._key_hashes) <= 50
