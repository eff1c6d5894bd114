"""`partition_hash` (murmur2 in C) places a record where the producer's `DefaultPartitioner` (aiokafka's
murmur2 in Python) does for `send`, for any key and partition count: `publish`, `publish_many` and the heat
service's ownership check all pick partitions by it."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner, murmur2

from services.runtime.publisher import partition_hash


def test_the_partition_hash_places_a_key_where_the_default_partitioner_does() -> None:
    default = DefaultPartitioner()
    rng = random.Random(7)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(2000)]
    keys += [f"model:demo:v1:key-{i}".encode() for i in range(100)]
    keys += [str(2**63 - i).encode() for i in range(100)]  # block hashes
    for key in keys:
        assert partition_hash(key) == murmur2(key) & 0x7FFFFFFF
        for count in (1, 3, 6, 12):
            partitions = list(range(count))
            assert partitions[partition_hash(key) % count] == default(key, partitions, partitions)
