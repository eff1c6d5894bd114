"""The publishing half of the Kafka edge: encodes events, bounds their size, places records on
partitions as the producer's own partitioner would, and carries W3C `traceparent` in the headers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from aiokafka import AIOKafkaProducer
from murmurhash2 import murmurhash2

from schemas.events import Event
from schemas.topics import qualified
from schemas.wire import encode
from services.runtime import metrics, tracing
from services.runtime.acks import Unacked
from services.runtime.settings import KafkaSettings

log = logging.getLogger(__name__)
_E = TypeVar("_E")

# Room for the record's key, headers and batch framing on top of the payload bound.
RECORD_OVERHEAD_BYTES = 16 * 1024
# The producer's own request limit stays generous: `publish` bounds events itself, and a dead-letter
# record must fit whatever the broker accepted in the first place.
_MAX_REQUEST_BYTES = 16 * 1024 * 1024
# `publish_many` places records as the producer's `DefaultPartitioner` does for `send`, so both agree.
_MURMUR2_SEED = 0x9747B28C  # Kafka's (and aiokafka's) murmur2 seed
# How long the publisher's copy of a topic's partition list holds before it asks the producer's
# metadata again (which aiokafka itself refreshes every `metadata_max_age_ms`, or on an error).
_PARTITIONS_TTL_S = 1.0


def partition_hash(key: bytes) -> int:
    """The default partitioner's hash of `key` (murmur2, positive): its partition is this modulo the
    topic's partition count, as Kafka's and aiokafka's `DefaultPartitioner` pick it."""
    return murmurhash2(key, _MURMUR2_SEED) & 0x7FFFFFFF


def partition_groups(events: Sequence[_E], partitions: Sequence[int], per_record: int) -> list[list[_E]]:
    """`events` in runs of at most `per_record` that share a partition (`partitions[i]` is event i's),
    each run in the events' order: the contents of one batch record each, so per-key order holds."""
    by_partition: dict[int, list[_E]] = {}
    for event, partition in zip(events, partitions, strict=True):
        by_partition.setdefault(partition, []).append(event)
    return [
        group[i : i + per_record] for group in by_partition.values() for i in range(0, len(group), per_record)
    ]


class EventTooLarge(ValueError):
    pass


class EventPublisher:
    def __init__(self, settings: KafkaSettings, client_id: str | None = None) -> None:
        self._settings = settings
        self._client_id = client_id or settings.client_id
        self._producer: AIOKafkaProducer | None = None
        self._unacked = Unacked(self._on_settled)
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
        # The partition is picked here, as the producer's default partitioner would, by
        # `partition_hash` from the partition list kept below: its own pass hashes the key in pure
        # Python and builds two sets of the topic's partitions on every send.
        partitions = self._fresh_partitions(name) or await self._partitions_of(name)
        partition = partitions[partition_hash(record_key) % len(partitions)]
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
        return [partitions[partition_hash(key.encode()) % len(partitions)] for key in keys]

    async def _partition(self, name: str, key: bytes) -> int:
        """The default partitioner's choice for `key` on topic `name`."""
        partitions = await self._partitions_of(name)
        return partitions[partition_hash(key) % len(partitions)]

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
