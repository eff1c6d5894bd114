"""A rebalance under the runtime consumer, on real Apache Kafka: a second consumer joins the group
mid-stream while the first holds a record in its handler. The revoke commits what was applied, the
record in flight included, and nothing is lost or applied twice."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas.events import CacheAccessed
from services.runtime.kafka import Delivery, EventConsumer
from services.runtime.publisher import EventPublisher
from tests.integration.conftest import kafka_settings_for

pytestmark = pytest.mark.integration

EVENTS = 600
# The first consumer's handler holds this application (1-based) until its partitions are being revoked.
GATED_AT = 31
# ...and then works slowly for a while, so that a consumer that kept applying the rest of a revoked
# batch would still be at it when the next owner starts on those partitions.
SLOW_AFTER_GATE, SLOW_APPLY_S = 10, 0.05


async def _committed(admin: AIOKafkaAdminClient, group: str) -> dict[int, int]:
    offsets = await admin.list_consumer_group_offsets(group)
    return {tp.partition: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}


class _WatchedConsumer(EventConsumer):
    """Records, at every revoke, what had been applied and what the group had committed once the
    consumer's own revoke handling was done."""

    def __init__(
        self, *args: object, admin: AIOKafkaAdminClient, applied_end: dict[int, int], **kw: object
    ) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._admin = admin
        self._applied_end = applied_end
        self.revoking = asyncio.Event()
        self.at_revoke: list[tuple[set[int], dict[int, int], dict[int, int]]] = []

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:  # the first join revokes nothing
            await super()._on_revoked(revoked)
            return
        self.revoking.set()
        await super()._on_revoked(revoked)
        applied = dict(self._applied_end)
        committed = await _committed(self._admin, self.group_id)
        self.at_revoke.append(({tp.partition for tp in revoked}, applied, committed))


async def _start_and_run(consumer: EventConsumer) -> None:
    await consumer.start()
    await consumer.run()


async def _until(condition: asyncio.Event, what: str, timeout_s: float = 30.0) -> None:
    try:
        await asyncio.wait_for(condition.wait(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_consumer_joining_mid_stream_loses_nothing_and_doubles_nothing(
    kafka, namespace, topics_on
) -> None:
    await topics_on(kafka)
    settings = kafka_settings_for(kafka, namespace, max_poll_records=20, heartbeat_interval_ms=250)
    group = f"g-{namespace}"
    events = [CacheAccessed(key=f"k{i}", hit=False, size_bytes=i) for i in range(EVENTS)]
    publisher = EventPublisher(settings)
    await publisher.start()
    for event in events:
        await publisher.publish(event, wait=False)
    await publisher.stop()  # flushes: every event is on the broker before anyone consumes
    await publisher.start()

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    applications: list[tuple[str, int, int, str]] = []  # consumer, partition, offset, event_id
    applied_end: dict[int, int] = {}  # partition -> offset after the last applied record
    effect: set[str] = set()  # what a sink deduplicating by event_id would hold
    gate_reached, release, all_applied = asyncio.Event(), asyncio.Event(), asyncio.Event()
    gated: list[tuple[int, int]] = []

    def handler_for(name: str):  # type: ignore[no-untyped-def]
        async def handler(delivery: Delivery) -> None:
            if name == "a" and len(applications) + 1 == GATED_AT and not gated:
                gated.append((delivery.partition, delivery.offset))
                gate_reached.set()
                await release.wait()
            elif name == "a" and gated and len(applications) < GATED_AT + SLOW_AFTER_GATE:
                await asyncio.sleep(SLOW_APPLY_S)
            applications.append((name, delivery.partition, delivery.offset, delivery.event.event_id))
            applied_end[delivery.partition] = delivery.offset + 1
            effect.add(delivery.event.event_id)
            if len(effect) == EVENTS:
                all_applied.set()

        return handler

    first = _WatchedConsumer(
        settings,
        [CacheAccessed.topic],
        group,
        handler_for("a"),
        publisher,
        admin=admin,
        applied_end=applied_end,
    )
    second = EventConsumer(settings, [CacheAccessed.topic], group, handler_for("b"), publisher)
    tasks: list[asyncio.Task[None]] = []
    try:
        await first.start()
        tasks.append(asyncio.create_task(first.run()))
        await _until(gate_reached, "the first consumer to hold a record in its handler")

        # Its start joins the group, which waits for the first consumer's revoke: run it aside.
        tasks.append(asyncio.create_task(_start_and_run(second)))
        # The revoke waits for the record in flight: let it finish only once the revoke has begun.
        await _until(first.revoking, "the second consumer's join to revoke the first one's partitions")
        release.set()
        await _until(all_applied, "every event to be applied", timeout_s=60.0)
    finally:
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await first.stop()
        await second.stop()
        await publisher.stop()
    try:
        final = await _committed(admin, group)
    finally:
        await admin.close()

    # Nothing lost, nothing applied twice.
    assert effect == {e.event_id for e in events}
    assert len(applications) == EVENTS
    by_partition: dict[int, list[int]] = defaultdict(list)
    for _, partition, offset, _ in applications:
        by_partition[partition].append(offset)
    for partition, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), f"partition {partition} applied out of order or twice"

    # Each revoke committed exactly where the applied records ended, the one in flight included.
    assert first.at_revoke, "the join never revoked the first consumer's partitions"
    revoked, applied, committed = first.at_revoke[0]
    gate_partition, gate_offset = gated[0]
    assert gate_partition in revoked
    assert committed[gate_partition] == gate_offset + 1
    for revoked, applied, committed in first.at_revoke:
        assert {p: committed.get(p) for p in revoked} == {p: applied.get(p) for p in revoked}

    # Both consumers worked, and the group's offsets end where the partitions do.
    assert {name for name, *_ in applications} == {"a", "b"}
    assert final == {p: len(offsets) for p, offsets in by_partition.items()}
