"""The Kafka edge of every service: a publisher and a consumer on aiokafka that speak `schemas`.

Publisher: encodes events, bounds their size, opens a producer span and carries W3C `traceparent`
in the record headers. Consumer: decodes, drops duplicates by `event_id`, runs the handler inside a
consumer span, commits offsets only after the handler is done (at-least-once), retries transient
failures (a database restart) without moving on, and dead-letters whatever cannot be decoded or
applied to `<topic>.dlq.v1` with the reason in headers and the original bytes untouched. What to do
with each record is decided in `consume.py`; this carries it out. On a rebalance the consumer commits
what it applied on the revoked partitions before they go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg
from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.partitioner import murmur2

from schemas.events import Event
from schemas.topics import dlq_name, qualified
from schemas.wire import dead_letter_headers, encode
from services.runtime import metrics, tracing
from services.runtime.acks import Unacked
from services.runtime.consume import (
    Abandon,
    Applied,
    Apply,
    Attempts,
    DeadLetter,
    Dedupe,
    RetryPolicy,
    admit,
    after_attempt,
    backoff_s,
)
from services.runtime.settings import KafkaSettings

log = logging.getLogger(__name__)

# Room for the record's key, headers and batch framing on top of the payload bound.
_RECORD_OVERHEAD_BYTES = 16 * 1024
# The producer's own request limit stays generous: `publish` bounds events itself, and a dead-letter
# record must fit whatever the broker accepted in the first place.
_MAX_REQUEST_BYTES = 16 * 1024 * 1024
# `publish_many` places records as the producer's `DefaultPartitioner` does for `send`, so both agree.
# Keys whose murmur2 hash the publisher remembers (aiokafka's murmur2 is pure Python: 4.7 us a key, more
# than building the event; a tier node's access events repeat its hot keys). Cleared when full.
_KEY_HASHES_MAX = 65_536
# How long the publisher's copy of a topic's partition list holds before it asks the producer's
# metadata again (which aiokafka itself refreshes every `metadata_max_age_ms`, or on an error).
_PARTITIONS_TTL_S = 1.0


_APPLIED = Applied()


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
        self._unacked = Unacked(self._on_settled)
        self._key_hashes: dict[bytes, int] = {}
        # Per event class: its topic and its `event_type` header.
        self._routes: dict[type[Event], tuple[str, tuple[str, bytes]]] = {}
        # Per topic: (monotonic time until which it holds, its partitions), for `_partition`.
        self._partitions: dict[str, tuple[float, list[int]]] = {}

    async def start(self) -> None:
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.bootstrap,
            client_id=self._client_id,
            acks="all",
            linger_ms=self._settings.linger_ms,
            max_batch_size=self._settings.max_batch_bytes,
            request_timeout_ms=self._settings.request_timeout_ms,
            max_request_size=_MAX_REQUEST_BYTES,
        )
        await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        await self._unacked.drain()
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
        on_settled: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        """Send `event` (to its catalogue topic unless `topic` is given, already qualified).

        `wait=True` returns once the broker acknowledged it; `wait=False` returns as soon as it is
        queued in the producer's batch, for request paths that must never wait on Kafka; a failed
        background send is logged and counted, and `on_settled` is called with None once the broker
        acknowledged it, or with the error (the producer gave up: its request timeout).
        """
        name, record_key, payload, record_headers = self._record(event, topic, key, headers)
        # The partition is picked here, as the producer's default partitioner would, from the
        # hashes and partition lists kept below: its own pass re-hashes the key in pure Python and
        # builds two sets of the topic's partitions on every send.
        partitions = self._fresh_partitions(name) or await self._partitions_of(name)
        partition = partitions[self._key_hash(record_key) % len(partitions)]
        future: asyncio.Future[object] = await self._require_producer().send(
            name, value=payload, key=record_key, partition=partition, headers=record_headers
        )
        if wait:
            await self._await_ack(name, future)
            return
        self._unacked.add(name, 1, future)
        if on_settled is not None:
            future.add_done_callback(
                lambda f: on_settled(asyncio.CancelledError() if f.cancelled() else f.exception())
            )

    async def partitions_of(self, events: Sequence[Event]) -> list[int]:
        """The partition `publish` sends each event to: its key's, by the producer's default
        partitioner (for grouping events into per-partition batch records)."""
        return [await self._partition(self.topic_for(e), e.kafka_key().encode()) for e in events]

    async def partitions_of_keys(self, event_type: type[Event], keys: Sequence[str]) -> list[int]:
        """`partitions_of` for events of `event_type` keyed `keys`, without the events."""
        name = qualified(event_type.topic, self._settings.topic_namespace)
        partitions = await self._partitions_of(name)
        return [partitions[self._key_hash(key.encode()) % len(partitions)] for key in keys]

    async def _partition(self, name: str, key: bytes) -> int:
        """The default partitioner's choice for `key` on topic `name`."""
        partitions = await self._partitions_of(name)
        return partitions[self._key_hash(key) % len(partitions)]

    async def _partitions_of(self, name: str) -> list[int]:
        """Topic `name`'s partitions in the order the default partitioner indexes them, as the
        producer's metadata said at most `_PARTITIONS_TTL_S` ago (waiting for it if need be)."""
        partitions = self._fresh_partitions(name)
        if partitions is None:
            partitions = list(await self._require_producer().partitions_for(name))
            self._partitions[name] = (time.monotonic() + _PARTITIONS_TTL_S, partitions)
        return partitions

    def _fresh_partitions(self, name: str) -> list[int] | None:
        """Topic `name`'s partitions if the publisher's copy still holds, else None."""
        cached = self._partitions.get(name)
        return cached[1] if cached is not None and cached[0] > time.monotonic() else None

    def _key_hash(self, key: bytes) -> int:
        """The default partitioner's hash of `key` (murmur2, positive): its partition is this modulo the
        topic's partition count, as `DefaultPartitioner` picks it."""
        hashed = self._key_hashes.get(key)
        if hashed is None:
            if len(self._key_hashes) >= _KEY_HASHES_MAX:
                self._key_hashes.clear()
            hashed = self._key_hashes[key] = murmur2(key) & 0x7FFFFFFF
        return hashed

    async def publish_many(
        self, events: Sequence[Event], *, wait: bool = True, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        """Send `events` to their catalogue topics as `publish` would (the same keys, headers and
        partitions, so per-key order holds), filled straight into one producer batch per partition:
        for callers that have many events at once, at a fraction of the per-event cost.

        Nothing is sent if any event is over the size limit. `wait` as for `publish`; `headers` go on
        every record.
        """
        await self._send_grouped([self._record(event, None, None, headers) for event in events], wait)

    async def publish_encoded(
        self, event_type: type[Event], items: Sequence[tuple[str, bytes]], *, wait: bool = True
    ) -> None:
        """Send events of `event_type` its producer encoded itself, each `(key, JSON)`, as
        `publish_many` would send the events: for a hot path that writes many events' JSON at once
        instead of building a model per event. Trusted input: the payloads are not validated here (the
        producer's encoder is tested against the model; consumers validate as always)."""
        name = qualified(event_type.topic, self._settings.topic_namespace)
        limit = self._settings.max_event_bytes
        type_header = [("event_type", str(event_type.model_fields["type"].default).encode())]
        for _, payload in items:
            if len(payload) > limit:
                raise EventTooLarge(
                    f"{event_type.__name__} is {len(payload)} bytes, over the {limit}-byte limit"
                )
        records = [(name, k.encode(), v, tracing.publish_headers(name, type_header)) for k, v in items]
        await self._send_grouped(records, wait)

    async def _send_grouped(
        self, records: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]], wait: bool
    ) -> None:
        """Records `(topic, key, value, headers)` in one producer batch per partition."""
        producer = self._require_producer()
        by_partition: dict[tuple[str, int], list[tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {}
        for name, key, payload, record_headers in records:
            partition = await self._partition(name, key)
            by_partition.setdefault((name, partition), []).append((key, payload, record_headers))
        futures: list[tuple[str, int, asyncio.Future[object]]] = []
        for (name, partition), batch_records in by_partition.items():
            batch, count = producer.create_batch(), 0
            for key, payload, record_headers in batch_records:
                while batch.append(timestamp=None, key=key, value=payload, headers=record_headers) is None:
                    # Full: send it and go on in a fresh one (a record alone always fits).
                    futures.append((name, count, await producer.send_batch(batch, name, partition=partition)))
                    batch, count = producer.create_batch(), 0
                count += 1
            futures.append((name, count, await producer.send_batch(batch, name, partition=partition)))
        for name, count, future in futures:
            if wait:
                await self._await_ack(name, future, count)
            else:
                self._unacked.add(name, count, future)

    def _record(
        self, event: Event, topic: str | None, key: str | None, headers: list[tuple[str, bytes]] | None
    ) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
        """(topic, key, value, headers) of the record for `event`; the event is encoded as it is,
        not validated again (it was when it was built)."""
        payload = encode(event)
        if len(payload) > self._settings.max_event_bytes:
            raise EventTooLarge(
                f"{event.type} is {len(payload)} bytes, over the {self._settings.max_event_bytes}-byte limit"  # type: ignore[attr-defined]
            )
        route = self._routes.get(type(event))
        if route is None:
            event_type = str(event.type).encode()  # type: ignore[attr-defined]
            route = self._routes[type(event)] = (self.topic_for(event), ("event_type", event_type))
        name = topic or route[0]
        record_key = (key if key is not None else event.kafka_key()).encode()
        record_headers = tracing.publish_headers(name, [route[1], *headers] if headers else [route[1]])
        return name, record_key, payload, record_headers

    async def publish_raw(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        """Send bytes as they are (dead-letter records); waits for the acknowledgement."""
        future = await self._send(topic, key, value, headers)
        await self._await_ack(topic, future)

    def _require_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("publisher is not started")
        return self._producer

    async def _send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[object]:
        producer = self._require_producer()
        fut: asyncio.Future[object] = await producer.send(topic, value=value, key=key, headers=headers)
        return fut

    async def _await_ack(self, topic: str, future: asyncio.Future[object], count: int = 1) -> None:
        try:
            await future
        except Exception:
            metrics.child(metrics.PUBLISH_FAILURES, topic).inc(count)
            raise
        metrics.child(metrics.EVENTS_PUBLISHED, topic).inc(count)

    @staticmethod
    def _on_settled(topic: str, acked: int, failed: int, error: BaseException | None) -> None:
        if acked:
            metrics.child(metrics.EVENTS_PUBLISHED, topic).inc(acked)
        if failed:
            metrics.child(metrics.PUBLISH_FAILURES, topic).inc(failed)
            log.error(
                "background publish failed",
                extra={"topic": topic, "events": failed, "error": repr(error)},
            )


@dataclass(slots=True)
class Delivery:
    """One decoded event as the handler sees it. (Not frozen: a frozen dataclass's `__init__` sets
    each field through `object.__setattr__`, 1.1 against 0.4 us, and every record builds one.)"""

    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    trace_id: str | None = None


Handler = Callable[[Delivery], Awaitable[None]]


class _CommitOnRevoke(ConsumerRebalanceListener):
    """Hands the consumer's rebalance callbacks to it; aiokafka waits for them before re-joining."""

    def __init__(self, consumer: EventConsumer) -> None:
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._consumer._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._consumer._on_assigned(set(assigned))


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
        on_revoked: Callable[[set[TopicPartition]], None] | None = None,
        on_assigned: Callable[[set[TopicPartition]], None] | None = None,
    ) -> None:
        """`on_revoked` / `on_assigned`: a rebalance's two halves, for a handler that keeps state per
        key. `on_revoked` is told which partitions go, once the record in flight is applied and their
        offsets are committed; `on_assigned` what this member holds from then on. Kafka's (eager)
        rebalance revokes every partition and assigns some back, so what moved to another owner is
        revoked minus assigned."""
        self._settings = settings
        self.topics = [qualified(t, settings.topic_namespace) for t in topics]
        self.group_id = group_id
        self._handler = handler
        self._on_revoked_hook = on_revoked
        self._on_assigned_hook = on_assigned
        self._dlq = dead_letters
        self._auto_offset_reset = auto_offset_reset
        self._policy = RetryPolicy(
            settings.handler_max_attempts, transient_errors, max_backoff_s=max_backoff_s
        )
        # Transient errors are caught even where they are not `Exception`s; the policy tells them apart.
        self._catch: tuple[type[BaseException], ...] = (Exception, *transient_errors)
        self._dedupe = Dedupe(settings.dedupe_window)
        self._consumer: AIOKafkaConsumer | None = None
        # Next offset to commit per partition: everything below it has been applied.
        self._done: dict[TopicPartition, int] = {}
        # Held while one record is applied or offsets are committed, so that a revoke waits for the
        # record in flight and commits past it instead of leaving it to be applied twice.
        self._lock = asyncio.Lock()
        # Partitions revoked since the batch being processed was fetched: the rest of that batch on
        # them belongs to their next owner, who reads it again from the committed offset.
        self._revoked: set[TopicPartition] = set()
        # The commit of the last polled batch, left to run while the next one is fetched and applied:
        # a commit is a round trip to the coordinator, and waiting for it each poll bounded a
        # consumer to one max_poll_records batch per round trip.
        self._committing: asyncio.Task[None] | None = None
        self._stopping = False
        self.last_poll_monotonic: float | None = None
        self.processed = 0
        self.seen = 0  # records taken, whatever became of them (applied, duplicate, dead-lettered)
        # The next offset to apply, per partition (kept past commits): the lag the metrics report.
        self.applied: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        if self._consumer is not None:
            return
        consumer = AIOKafkaConsumer(
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
        consumer.subscribe(self.topics, listener=_CommitOnRevoke(self))
        await consumer.start()
        self._consumer = consumer
        self._stopping = False
        metrics.CONSUMERS.add(self)

    async def stop(self) -> None:
        self._stopping = True
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await self._commit_settled()
            async with self._lock:
                await self._commit(consumer)
        finally:
            await consumer.stop()

    async def wait_positioned(self) -> None:
        """Resolve the position of every assigned partition (with `latest`: the log end now), so an
        event published after this returns is read. For callers that must not miss what they send next
        (tests, probes); `run` does not need it."""
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        for tp in self._consumer.assignment():
            await self._consumer.position(tp)

    def partition_count(self, topic: str) -> int:
        """Partitions of `topic` (qualified) as this consumer's metadata knows them; 0 if unknown."""
        parts = self._consumer.partitions_for_topic(topic) if self._consumer is not None else None
        return len(parts) if parts else 0

    def health(self) -> dict[str, object]:
        assignment = sorted(str(tp) for tp in self._consumer.assignment()) if self._consumer else []
        return {
            "group": self.group_id,
            "running": self._consumer is not None,
            "assigned": assignment,
            "processed": self.processed,
            "seen": self.seen,
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
            # getmany hands out records of the current assignment only; from here on a revoke
            # fences the partitions it takes.
            self._revoked = set()
            self.last_poll_monotonic = time.monotonic()
            for tp, records in batches.items():
                for record in records:
                    async with self._lock:
                        if tp in self._revoked:
                            break
                        await self._process(record)
                        self._done[tp] = record.offset + 1
                if tp in self._done:
                    self.applied[tp] = self._done[tp]
            self._commit_in_background(consumer)

    def _commit_in_background(self, consumer: AIOKafkaConsumer) -> None:
        """Commit what was applied, without waiting; if the previous commit is still on its way,
        what was applied since waits for the next poll (it must not overtake that one)."""
        if self._committing is not None and not self._committing.done():
            return
        if not self._done:
            return
        self._committing = asyncio.create_task(self._commit(consumer), name=f"commit {self.group_id}")

    async def _commit_settled(self) -> None:
        """Wait for the commit in flight, if any, so that a later one cannot land before it (as
        long as a revoke may wait; aiokafka orders commits by its own lock in any case)."""
        task = self._committing
        if task is None or task.done():
            return
        try:
            async with asyncio.timeout(self._settings.session_timeout_ms / 2000):
                await asyncio.shield(task)
        except TimeoutError:
            log.warning("an offset commit is still on its way; going on without it")
        except Exception:
            log.exception("background offset commit failed")

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Before `revoked` go: wait for the record in flight, commit what was applied on them."""
        # The group waits for this member only so long (the rebalance timeout, which aiokafka sets to
        # the session timeout): a handler stuck past half of it is left running, and its record
        # goes uncommitted, to be applied again by the next owner and dropped there by event_id.
        held = True
        try:
            async with asyncio.timeout(self._settings.session_timeout_ms / 2000):
                await self._lock.acquire()
        except TimeoutError:
            held = False
            log.warning("a handler outlived the revoke; its record will be redelivered")
        try:
            self._revoked |= revoked
            await self._commit_settled()
            await self._commit_revoked(revoked)
            if self._on_revoked_hook is not None and revoked:
                self._on_revoked_hook(revoked)
        finally:
            if held:
                self._lock.release()

    async def _commit_revoked(self, revoked: set[TopicPartition]) -> None:
        offsets = {tp: self._done.pop(tp) for tp in revoked if tp in self._done}
        consumer = self._consumer
        if not offsets or consumer is None:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # This member was already out of the group: the next owner re-reads from the last
            # commit and the duplicates are dropped by event_id.
            log.warning("commit on revoke failed; records will be redelivered", extra={"error": str(exc)})
            return
        log.info("committed on revoke", extra={"offsets": {str(tp): off for tp, off in offsets.items()}})

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        # Nothing to load: the fetcher starts every assigned partition at its committed offset.
        log.info("partitions assigned", extra={"assigned": sorted(str(tp) for tp in assigned)})
        if self._on_assigned_hook is not None:
            self._on_assigned_hook(assigned)

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
        self.seen += 1
        admission = admit(record.value, self._settings.max_event_bytes, self._dedupe)
        if not isinstance(admission, Apply):
            if isinstance(admission, DeadLetter):
                await self._dead_letter(record, admission)
            metrics.child(metrics.EVENTS_CONSUMED, record.topic, self.group_id, admission.outcome).inc()
            return
        event = admission.event
        headers = tuple(record.headers or ())
        verdict: Applied | DeadLetter = _APPLIED
        with tracing.consumer_span(record.topic, headers) as span:
            delivery = Delivery(
                event=event,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                key=record.key,
                headers=headers,
                timestamp_ms=record.timestamp,
                trace_id=tracing.trace_id_of(span),
            )
            started = time.perf_counter()
            try:
                await self._handler(delivery)
            except self._catch as exc:
                verdict = await self._apply_again(delivery, record, exc)
            else:
                # The usual case, without the retry bookkeeping.
                metrics.child(metrics.HANDLER_SECONDS, record.topic, self.group_id).observe(
                    time.perf_counter() - started
                )
        self._dedupe.remember(event.event_id)
        self.processed += 1
        metrics.child(metrics.EVENTS_CONSUMED, record.topic, self.group_id, verdict.outcome).inc()

    async def _apply_again(
        self, delivery: Delivery, record: ConsumerRecord[bytes, bytes], first_error: BaseException
    ) -> Applied | DeadLetter:
        """The handler raised `first_error`: retry, dead-letter or give up, as the policy says."""
        attempts = Attempts()
        error: BaseException | None = first_error
        while True:
            verdict = after_attempt(error, attempts, self._policy, stopping=self._stopping)
            if isinstance(verdict, Applied):
                return verdict
            if isinstance(verdict, Abandon):
                raise verdict.error
            if isinstance(verdict, DeadLetter):
                log.error("handler failed; dead-lettering", extra={"topic": record.topic}, exc_info=error)
                await self._dead_letter(record, verdict)
                return verdict
            if verdict.transient:
                log.warning(
                    "transient failure; retrying",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(error)},
                )
                await asyncio.sleep(verdict.backoff_s)
            attempts = verdict.attempts
            started, error = time.perf_counter(), None
            try:
                await self._handler(delivery)
            except self._catch as exc:
                error = exc
            else:
                metrics.child(metrics.HANDLER_SECONDS, record.topic, self.group_id).observe(
                    time.perf_counter() - started
                )

    async def _dead_letter(self, record: ConsumerRecord[bytes, bytes], verdict: DeadLetter) -> None:
        kind, reason = verdict.kind, verdict.reason
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
        metrics.child(metrics.EVENTS_DEAD_LETTERED, record.topic, kind).inc()
        # Waits for the acknowledgement: the source offset is committed only once the DLQ holds it.
        attempt = 0
        while True:
            try:
                await self._dlq.publish_raw(dlq_name(record.topic), record.key, record.value, headers)
                return
            except (KafkaError, OSError) as exc:
                if self._stopping:
                    raise
                log.warning("dead-letter publish failed; retrying", extra={"error": repr(exc)})
                attempt += 1
                await asyncio.sleep(backoff_s(attempt, 0.1, self._policy.max_backoff_s))
