"""Reads the records topics for display with no consumer group: every partition, from the log end at
start, nothing committed, so a dashboard run leaves no group behind on the broker (a group of its own per
run did, with its offsets, for the broker's offset retention: a week by default)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer

from schemas.events import Event
from schemas.topics import qualified
from services.runtime import clients, metrics
from services.runtime.consume import Apply, Dedupe, Skip, admit
from services.runtime.settings import KafkaSettings

log = logging.getLogger(__name__)

# The `group` label of the dashboard's consumed-events series: it reads in no group.
GROUP_LABEL = "dashboard-tail"


class RecordsTail:
    """Hands each event published to `topics` (catalogue names) from `start()` on to `on_event`.

    A record that does not decode is counted and skipped: the services that own these topics
    dead-letter it; a display has nothing to add.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[str],
        on_event: Callable[[Event], None],
        client_id: str,
        *,
        assign_timeout_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self.topics = [qualified(t, settings.topic_namespace) for t in topics]
        self._on_event = on_event
        self._client_id = client_id
        self._assign_timeout_s = assign_timeout_s
        self._dedupe = Dedupe(settings.dedupe_window)
        self._consumer: AIOKafkaConsumer | None = None
        self.processed = 0
        self.undecodable = 0

    async def start(self) -> None:
        """Subscribe (no group: aiokafka assigns every partition, and new ones as they appear) and resolve
        each partition's log end, so that an event published after this returns is read."""
        if self._consumer is not None:
            return
        s = self._settings
        consumer = clients.reader(
            s.bootstrap,
            self._client_id,
            auto_offset_reset="latest",
            max_poll_records=s.max_poll_records,
            request_timeout_ms=s.request_timeout_ms,
            fetch_max_wait_ms=s.fetch_max_wait_ms,
            max_partition_fetch_bytes=max(1024 * 1024, s.max_event_bytes + 16 * 1024),
        )
        consumer.subscribe(self.topics)
        await consumer.start()
        try:
            deadline = time.monotonic() + self._assign_timeout_s
            while not consumer.assignment():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no partitions of {self.topics} after {self._assign_timeout_s} s")
                await asyncio.sleep(0.05)
            for tp in consumer.assignment():
                await consumer.position(tp)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def run(self) -> None:
        if self._consumer is None:
            raise RuntimeError("records tail is not started")
        consumer = self._consumer
        while self._consumer is consumer:
            batches = await consumer.getmany(
                timeout_ms=self._settings.poll_timeout_ms, max_records=self._settings.max_poll_records
            )
            for records in batches.values():
                for record in records:
                    self._take(record.topic, record.value)

    def _take(self, topic: str, value: bytes | None) -> None:
        admission = admit(value, self._settings.max_event_bytes, self._dedupe)
        if isinstance(admission, Apply):
            self._on_event(admission.event)
            self._dedupe.remember(admission.event.event_id)
            self.processed += 1
            outcome = "applied"
        elif isinstance(admission, Skip):
            outcome = admission.outcome
        else:
            self.undecodable += 1
            if self.undecodable == 1:
                log.warning("skipping records that do not decode", extra={"topic": topic})
            outcome = "undecodable"
        metrics.child(metrics.EVENTS_CONSUMED, topic, GROUP_LABEL, outcome).inc()

    def health(self) -> dict[str, object]:
        consumer = self._consumer
        return {
            "group": None,
            "running": consumer is not None,
            "assigned": sorted(str(tp) for tp in consumer.assignment()) if consumer else [],
            "processed": self.processed,
            "undecodable": self.undecodable,
        }
