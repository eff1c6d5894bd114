"""The Kafka edge of every service: a publisher and a consumer on aiokafka that speak `schemas`.

Publisher: encodes events, bounds their size, opens a producer span and carries W3C `traceparent`
in the record headers. Consumer: decodes, drops duplicates by `event_id`, runs the handler inside a
consumer span, commits offsets only after the handler is done (at-least-once), retries transient
failures (a database restart) without moving on, and dead-letters whatever cannot be decoded or
applied to `<topic>.dlq.v1` with the reason in headers and the original bytes untouched.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from schemas.events import Event
from schemas.topics import dlq_name, qualified
from schemas.wire import (
    DecodeError,
    FailureKind,
    dead_letter_headers,
    decode,
    encode,
)
from services.runtime import metrics, tracing
from services.runtime.settings import KafkaSettings

log = logging.getLogger(__name__)

# Room for the record's key, headers and batch framing on top of the payload bound.
_RECORD_OVERHEAD_BYTES = 16 * 1024
# The producer's own request limit stays generous: `publish` bounds events itself, and a dead-letter
# record must fit whatever the broker accepted in the first place.
_MAX_REQUEST_BYTES = 16 * 1024 * 1024


class EventTooLarge(ValueError):
    pass


class TransientError(Exception):
    """Raise from a handler to say "try again later, do not dead-letter"."""


# Failures that say nothing about the event itself: retry until they clear.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    KafkaError,
)


class EventPublisher:
    def __init__(self, settings: KafkaSettings, client_id: str | None = None) -> None:
        self._settings = settings
        self._client_id = client_id or settings.client_id
        self._producer: AIOKafkaProducer | None = None
        self._pending: set[asyncio.Future[object]] = set()

    async def start(self) -> None:
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.bootstrap,
            client_id=self._client_id,
            acks="all",
            linger_ms=self._settings.linger_ms,
            request_timeout_ms=self._settings.request_timeout_ms,
            max_request_size=_MAX_REQUEST_BYTES,
        )
        await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await producer.stop()

    def topic_for(self, event: Event) -> str:
        return qualified(event.topic, self._settings.topic_namespace)

    async def publish(
        self,
        event: Event,
        *,
        topic: str | None = None,
        key: str | None = None,
        wait: bool = True,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Send `event` (to its catalogue topic unless `topic` is given, already qualified).

        `wait=True` returns once the broker acknowledged it; `wait=False` returns as soon as it is
        queued in the producer's batch, for request paths that must never wait on Kafka; a failed
        background send is logged and counted.
        """
        payload = encode(event)
        if len(payload) > self._settings.max_event_bytes:
            raise EventTooLarge(
                f"{event.type} is {len(payload)} bytes, over the {self._settings.max_event_bytes}-byte limit"  # type: ignore[attr-defined]
            )
        name = topic or self.topic_for(event)
        record_key = (key if key is not None else event.kafka_key()).encode()
        with tracing.producer_span(name):
            record_headers = tracing.inject_headers(
                [("event_type", str(event.type).encode()), *(headers or ())]  # type: ignore[attr-defined]
            )
            future = await self._send(name, record_key, payload, record_headers)
        if wait:
            await self._await_ack(name, future)
        else:
            self._pending.add(future)
            future.add_done_callback(functools.partial(self._on_background_ack, name))

    async def publish_raw(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        """Send bytes as they are (dead-letter records); waits for the acknowledgement."""
        future = await self._send(topic, key, value, headers)
        await self._await_ack(topic, future)

    async def _send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[object]:
        if self._producer is None:
            raise RuntimeError("publisher is not started")
        fut: asyncio.Future[object] = await self._producer.send(topic, value=value, key=key, headers=headers)
        return fut

    async def _await_ack(self, topic: str, future: asyncio.Future[object]) -> None:
        try:
            await future
        except Exception:
            metrics.PUBLISH_FAILURES.labels(topic).inc()
            raise
        metrics.EVENTS_PUBLISHED.labels(topic).inc()

    def _on_background_ack(self, topic: str, future: asyncio.Future[object]) -> None:
        self._pending.discard(future)
        if future.cancelled() or future.exception() is not None:
            metrics.PUBLISH_FAILURES.labels(topic).inc()
            log.error(
                "background publish failed",
                extra={
                    "topic": topic,
                    "error": repr(future.exception() if not future.cancelled() else "cancelled"),
                },
            )
        else:
            metrics.EVENTS_PUBLISHED.labels(topic).inc()


@dataclass(frozen=True, slots=True)
class Delivery:
    """One decoded event as the handler sees it."""

    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    trace_id: str | None = None


Handler = Callable[[Delivery], Awaitable[None]]


@dataclass
class _Dedupe:
    """The last `capacity` event ids seen, oldest forgotten first."""

    capacity: int
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def seen(self, event_id: str) -> bool:
        if event_id in self._seen:
            self._seen.move_to_end(event_id)
            return True
        return False

    def remember(self, event_id: str) -> None:
        if self.capacity == 0:
            return
        self._seen[event_id] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)


class EventConsumer:
    """Consumes `topics` (catalogue names, qualified with the namespace) in `group_id`."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[str],
        group_id: str,
        handler: Handler,
        dead_letters: EventPublisher,
        *,
        auto_offset_reset: str = "earliest",
        transient_errors: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
        max_backoff_s: float = 5.0,
    ) -> None:
        self._settings = settings
        self.topics = [qualified(t, settings.topic_namespace) for t in topics]
        self.group_id = group_id
        self._handler = handler
        self._dlq = dead_letters
        self._auto_offset_reset = auto_offset_reset
        self._transient = transient_errors
        self._max_backoff_s = max_backoff_s
        self._dedupe = _Dedupe(settings.dedupe_window)
        self._consumer: AIOKafkaConsumer | None = None
        # Next offset to commit per partition: everything below it has been applied.
        self._done: dict[TopicPartition, int] = {}
        self._stopping = False
        self.last_poll_monotonic: float | None = None
        self.processed = 0

    async def start(self) -> None:
        if self._consumer is not None:
            return
        consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self._settings.bootstrap,
            client_id=self._settings.client_id,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self._auto_offset_reset,
            max_poll_records=self._settings.max_poll_records,
            session_timeout_ms=self._settings.session_timeout_ms,
            heartbeat_interval_ms=self._settings.heartbeat_interval_ms,
            request_timeout_ms=self._settings.request_timeout_ms,
            fetch_max_wait_ms=self._settings.fetch_max_wait_ms,
            max_partition_fetch_bytes=max(
                1024 * 1024, self._settings.max_event_bytes + _RECORD_OVERHEAD_BYTES
            ),
        )
        await consumer.start()
        self._consumer = consumer
        self._stopping = False

    async def stop(self) -> None:
        self._stopping = True
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await self._commit(consumer)
        finally:
            await consumer.stop()

    def health(self) -> dict[str, object]:
        assignment = sorted(str(tp) for tp in self._consumer.assignment()) if self._consumer else []
        return {
            "group": self.group_id,
            "running": self._consumer is not None,
            "assigned": assignment,
            "processed": self.processed,
        }

    async def run(self) -> None:
        """Poll, apply, commit; until `stop()` or cancellation."""
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        consumer = self._consumer
        while not self._stopping:
            batches = await consumer.getmany(
                timeout_ms=self._settings.poll_timeout_ms, max_records=self._settings.max_poll_records
            )
            self.last_poll_monotonic = time.monotonic()
            for tp, records in batches.items():
                for record in records:
                    await self._process(record)
                    self._done[tp] = record.offset + 1
            await self._commit(consumer)

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        if not self._done:
            return
        offsets, self._done = self._done, {}
        assigned = consumer.assignment()
        offsets = {tp: off for tp, off in offsets.items() if tp in assigned}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # A rebalance took the partitions; the new owner re-reads from the last commit and the
            # duplicates are dropped downstream by event_id.
            log.warning("offset commit failed; records will be redelivered", extra={"error": str(exc)})

    async def _process(self, record: ConsumerRecord[bytes, bytes]) -> None:
        headers = tuple(record.headers or ())
        try:
            event = decode(record.value, self._settings.max_event_bytes)
        except DecodeError as exc:
            await self._dead_letter(record, exc.kind, exc.reason)
            metrics.EVENTS_CONSUMED.labels(record.topic, self.group_id, "dead_lettered").inc()
            return
        if self._dedupe.seen(event.event_id):
            metrics.EVENTS_CONSUMED.labels(record.topic, self.group_id, "duplicate").inc()
            return
        with tracing.consumer_span(record.topic, headers):
            delivery = Delivery(
                event=event,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                key=record.key,
                headers=headers,
                timestamp_ms=record.timestamp,
                trace_id=tracing.current_trace_id(),
            )
            outcome = await self._apply(delivery, record)
        self._dedupe.remember(event.event_id)
        self.processed += 1
        metrics.EVENTS_CONSUMED.labels(record.topic, self.group_id, outcome).inc()

    async def _apply(self, delivery: Delivery, record: ConsumerRecord[bytes, bytes]) -> str:
        attempts = 0
        backoff = 0.05
        while True:
            started = time.perf_counter()
            try:
                await self._handler(delivery)
            except self._transient as exc:
                if self._stopping:
                    raise
                log.warning(
                    "transient failure; retrying",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(exc)},
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            except Exception as exc:
                attempts += 1
                if attempts < self._settings.handler_max_attempts:
                    continue
                log.exception("handler failed; dead-lettering", extra={"topic": record.topic})
                await self._dead_letter(record, "handler_failed", f"{type(exc).__name__}: {exc}")
                return "dead_lettered"
            metrics.HANDLER_SECONDS.labels(record.topic, self.group_id).observe(time.perf_counter() - started)
            return "applied"

    async def _dead_letter(
        self, record: ConsumerRecord[bytes, bytes], kind: FailureKind, reason: str
    ) -> None:
        headers = dead_letter_headers(
            record.headers,
            kind=kind,
            reason=reason,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            group=self.group_id,
            failed_at_ms=time.time_ns() // 1_000_000,
        )
        log.warning(
            "dead-lettered a record",
            extra={"topic": record.topic, "offset": record.offset, "kind": kind, "reason": reason[:200]},
        )
        metrics.EVENTS_DEAD_LETTERED.labels(record.topic, kind).inc()
        # Waits for the acknowledgement: the source offset is committed only once the DLQ holds it.
        backoff = 0.1
        while True:
            try:
                await self._dlq.publish_raw(dlq_name(record.topic), record.key, record.value, headers)
                return
            except (KafkaError, OSError) as exc:
                if self._stopping:
                    raise
                log.warning("dead-letter publish failed; retrying", extra={"error": repr(exc)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
