"""The runtime's Kafka edge against real brokers: trace context survives the trip, bad records land
in the dead-letter topic with a reason while consumption goes on."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaConsumer
from opentelemetry import trace

from schemas.events import CacheAccessed, ConversationEnded
from schemas.topics import dlq_name, qualified
from schemas.wire import DLQ_KIND, DLQ_REASON, DLQ_SOURCE_OFFSET, encode
from services.runtime.kafka import Delivery, EventConsumer
from services.runtime.publisher import EventPublisher
from services.runtime.tracing import configure_tracing
from tests.integration.conftest import kafka_settings_for

pytestmark = pytest.mark.integration


async def _collect_until(consumer: EventConsumer, done: asyncio.Event, timeout_s: float = 30.0) -> None:
    task = asyncio.create_task(consumer.run())
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0) -> list:  # type: ignore[type-arg]
    reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await reader.start()
    records = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(records) < expected and loop.time() < deadline:
            batch = await reader.getmany(timeout_ms=500)
            for recs in batch.values():
                records.extend(recs)
    finally:
        await reader.stop()
    return records


async def test_event_round_trips_with_its_traceparent(any_broker, namespace, topics_on) -> None:
    await topics_on(any_broker)
    configure_tracing("test")
    settings = kafka_settings_for(any_broker, namespace)
    publisher = EventPublisher(settings)
    await publisher.start()
    received: list[Delivery] = []
    done = asyncio.Event()

    async def handler(delivery: Delivery) -> None:
        received.append(delivery)
        done.set()

    consumer = EventConsumer(settings, [CacheAccessed.topic], f"g-{namespace}", handler, publisher)
    await consumer.start()
    sent = CacheAccessed(key="model:m:v1:abc", hit=True, tier="l1", latency_ms=0.2, trace_id="conv-1")
    with trace.get_tracer("test").start_as_current_span("gateway request") as root:
        await publisher.publish(sent)
        root_trace_id = format(root.get_span_context().trace_id, "032x")
    try:
        await _collect_until(consumer, done)
    finally:
        await consumer.stop()
        await publisher.stop()

    assert len(received) == 1
    got = received[0]
    assert got.event == sent
    assert got.topic == qualified(CacheAccessed.topic, namespace)
    assert got.key == b"model:m:v1:abc"
    traceparent = dict(got.headers)["traceparent"].decode()
    assert traceparent.split("-")[1] == root_trace_id
    # The consumer's span continues the producer's trace.
    assert got.trace_id == root_trace_id


async def test_bad_records_are_dead_lettered_with_a_reason_and_consumption_goes_on(
    any_broker, namespace, topics_on
) -> None:
    await topics_on(any_broker)
    settings = kafka_settings_for(any_broker, namespace, max_event_bytes=4096)
    topic = qualified(ConversationEnded.topic, namespace)
    publisher = EventPublisher(settings)
    await publisher.start()

    good_before = ConversationEnded(trace_id="before")
    poison = ConversationEnded(trace_id="explodes")
    good_after = ConversationEnded(trace_id="after")
    unknown_version = json.dumps(
        {**json.loads(encode(good_before)), "schema_version": 7, "event_id": "v7"}
    ).encode()
    oversized = json.dumps({**json.loads(encode(good_before)), "event_id": "big", "pad": "x" * 6000}).encode()
    bad = [b"{this is not json", unknown_version, oversized]

    # One key, so one partition and a known order.
    await publisher.publish(good_before, key="k")
    for raw in bad:
        await publisher.publish_raw(topic, b"k", raw, [])
    await publisher.publish(poison, key="k")
    await publisher.publish(good_after, key="k")

    applied: list[str] = []
    done = asyncio.Event()

    async def handler(delivery: Delivery) -> None:
        event = delivery.event
        assert isinstance(event, ConversationEnded)
        if event.trace_id == "explodes":
            raise ValueError("cannot apply this one")
        applied.append(event.trace_id)
        if event.trace_id == "after":
            done.set()

    consumer = EventConsumer(settings, [ConversationEnded.topic], f"g-{namespace}", handler, publisher)
    await consumer.start()
    try:
        await _collect_until(consumer, done)
    finally:
        await consumer.stop()
        await publisher.stop()

    assert applied == ["before", "after"]
    dead = await _read_all(any_broker.bootstrap, dlq_name(topic), expected=4)
    assert len(dead) == 4
    kinds = [dict(r.headers)[DLQ_KIND].decode() for r in dead]
    assert kinds == ["malformed_json", "unsupported_schema_version", "oversized", "handler_failed"]
    # The original bytes travel untouched, with where they came from.
    assert [r.value for r in dead[:3]] == bad
    assert json.loads(dead[3].value)["trace_id"] == "explodes"
    reasons = [dict(r.headers)[DLQ_REASON].decode() for r in dead]
    assert "schema_version 7" in reasons[1]
    assert "4096-byte limit" in reasons[2]
    assert "cannot apply this one" in reasons[3]
    assert [int(dict(r.headers)[DLQ_SOURCE_OFFSET]) for r in dead] == [1, 2, 3, 4]
