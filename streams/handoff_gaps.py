"""Reads a range of one hand-off partition again, with a consumer of its own: the records faust's
consumer skipped, which stage 2 applies before the record that revealed the gap (`Merge.missed`).

faust-streaming can drop records it has fetched: right after a rebalance's changelog recovery its
set of active partitions is empty for a moment, aiokafka takes an empty set for "every partition"
and hands back (and moves past) records of the paused stream partitions, and faust discards them.
Its seek to the committed offsets repairs that only where an offset has been committed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from services.runtime import clients

_POLL_MS = 500


async def read_handoff(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    max_fetch_bytes: int,
    timeout_s: float = 60.0,
) -> list[tuple[int, dict[str, Any]]]:
    """(offset, value) of the records at [start, end) of `topic`/`partition`, in offset order; from
    the start of the log where retention has removed `start`."""
    records = await read_range(
        bootstrap, topic, partition, start, end, max_fetch_bytes=max_fetch_bytes, timeout_s=timeout_s
    )
    return [(r.offset, json.loads(r.value)) for r in records]


async def read_range(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    max_fetch_bytes: int,
    timeout_s: float = 60.0,
) -> list[ConsumerRecord[bytes, bytes]]:
    """The records at [start, end) of `topic`/`partition` as aiokafka gives them, in offset order
    (stage 1 reads the source records faust's consumer skipped with it)."""
    consumer = clients.reader(
        bootstrap,
        "cachemesh-streams-handoff-gaps",
        auto_offset_reset="earliest",
        fetch_max_bytes=max_fetch_bytes,
        max_partition_fetch_bytes=max_fetch_bytes,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        out: list[ConsumerRecord[bytes, bytes]] = []
        async with asyncio.timeout(timeout_s):
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=_POLL_MS)
                out.extend(r for r in batch.get(tp, []) if r.offset < end)
        return out
    finally:
        await consumer.stop()
