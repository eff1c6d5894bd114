"""A small producer helper for applications: tell cachemesh that rows of the source of truth changed
(`SourceChanged` on `source.changes.v1`). Needs only aiokafka and `schemas/`, not a running service."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

from schemas.events import MAX_KEYS_PER_EVENT, SourceChanged
from schemas.topics import qualified
from schemas.wire import encode
from services.runtime import clients


def source_changes(
    source: str, ids: Iterable[str | int], reason: str = "update", *, producer: str | None = None
) -> list[SourceChanged]:
    """The events that announce `ids` of `source` changed, MAX_KEYS_PER_EVENT ids each."""
    unique = list(dict.fromkeys(str(i) for i in ids))
    return [
        SourceChanged(source=source, ids=unique[i : i + MAX_KEYS_PER_EVENT], reason=reason, producer=producer)
        for i in range(0, len(unique), MAX_KEYS_PER_EVENT)
    ]


def record_of(event: SourceChanged, namespace: str = "") -> tuple[str, bytes, bytes]:
    """(topic, key, value) of the Kafka record carrying `event`."""
    return qualified(event.topic, namespace), event.kafka_key().encode(), encode(event)


class SourceChangePublisher:
    """`async with SourceChangePublisher("localhost:9092") as p: await p.changed("orders", [42])`.

    Returns once the broker has acknowledged every record (acks=all), so an application can publish
    after its own commit and know the cache will follow.
    """

    def __init__(self, bootstrap: str, *, namespace: str = "", producer: str | None = None) -> None:
        self._kafka = clients.producer(bootstrap, acks="all")
        self._namespace = namespace
        self._producer = producer

    async def __aenter__(self) -> Self:
        await self._kafka.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._kafka.stop()

    async def changed(
        self, source: str, ids: Iterable[str | int], reason: str = "update"
    ) -> list[SourceChanged]:
        events = source_changes(source, ids, reason, producer=self._producer)
        for event in events:
            topic, key, value = record_of(event, self._namespace)
            await self._kafka.send_and_wait(
                topic, value=value, key=key, headers=[("event_type", event.type.encode())]
            )
        return events
